//! A persistent pool of worker threads for the forward pass: a job is a
//! borrowed closure each thread runs at most once (`f(thread_index)`), the
//! caller always, as thread 0. Workers spin briefly between jobs (a forward
//! pass runs a job every few microseconds), then sleep on a condition
//! variable, so an idle model costs no CPU. A job is handed out and
//! collected without locks or shared counters: the job's pointer is
//! published by the generation number, and each worker takes part and
//! reports done in a cache line of its own (a pass hands out ≈ 150 jobs of
//! a few µs, so on many cores a mutex or a counter every worker bumps
//! costs as much as the work).
//!
//! A worker that has not started a job when the caller has finished its
//! own part is left out of it: on a machine busy with other programs a
//! worker may wait milliseconds for a core, and a pass that waited for it
//! at each of its ≈ 150 jobs ran 2–50× slower beside one or two busy
//! programs on two cores (llama.cpp's decode: 3.6× and 33×). So jobs share
//! their work out through counters the threads claim from, never by
//! thread index: whoever takes part does all of it.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The job as the workers see it: a pointer to the caller's closure with
/// its lifetime erased (see `Pool::run` for why that is sound).
type Job = *const (dyn Fn(usize) + Sync + 'static);

struct Shared {
    /// Bumped once per job; a worker runs a job when it sees a new value.
    generation: AtomicUsize,
    /// The current job: written by `Pool::run` only while no worker can
    /// read it (see `run`), read by workers after they see its generation.
    job: UnsafeCell<Option<SendJob>>,
    /// Per worker (index − 1), its part in the latest generation it knows
    /// of: [`taking_part`], [`done`] or [`left_out`] by the caller, which
    /// finished that generation without it (see [`Pool::run`]).
    part: Box<[Line]>,
    /// A worker's job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers go to sleep without spinning until the next job (see
    /// [`Pool::rest`]).
    rest: AtomicBool,
    /// Bumped by [`Pool::ready`]: sleeping workers wake and spin.
    nudges: AtomicUsize,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    /// Times a worker woke from `wake` (the tests watch nudges with it).
    #[cfg(test)]
    wakeups: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A worker's `part` in generation `g`: it has started the job.
const fn taking_part(g: usize) -> usize {
    3 * g
}

/// A worker's `part` in generation `g`: it has finished the job.
const fn done(g: usize) -> usize {
    3 * g + 1
}

/// A worker's `part` in generation `g`: the caller finished the job
/// before the worker started it, which then never reads it.
const fn left_out(g: usize) -> usize {
    3 * g + 2
}

/// The generation a `part` mark is about.
const fn generation_of(mark: usize) -> usize {
    mark / 3
}

// SAFETY: every field but `job` is `Sync`; `job` is written only by the
// thread in `Pool::run` holding `busy`, after every worker has reported the
// previous generation done or been left out of it and before the new
// generation is published (a release), and read by a worker only after it
// has seen that generation (an acquire) and taken part in it (its `part`
// moved from the previous generation's settled mark to this one's, which
// the caller then waits on), and before it reports it done: a write never
// overlaps a read.
unsafe impl Sync for Shared {}

/// An atomic alone in its cache lines (128 bytes: adjacent-line prefetch
/// pairs them), so workers reporting done do not contend.
#[repr(align(128))]
struct Line(AtomicUsize);

struct SendJob(Job);
// SAFETY: the pointee is `Sync` (shared by reference across threads is
// what it is for), and `run` keeps it alive while any worker can read it.
unsafe impl Send for SendJob {}

/// Worker threads plus the calling thread.
pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time (several decoders may share a pool).
    busy: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads)
    }
}

/// How long a worker spins for the next job before it sleeps.
const SPIN: u32 = 1 << 16;

impl Pool {
    /// A pool running jobs on `threads` threads (the caller and
    /// `threads - 1` workers); 0 means the physical cores.
    pub fn new(threads: usize) -> Pool {
        let threads = if threads == 0 { physical_cores() } else { threads };
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            part: (1..threads.max(1)).map(|_| Line(AtomicUsize::new(done(0)))).collect(),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            rest: AtomicBool::new(false),
            nudges: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            #[cfg(test)]
            wakeups: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        // A worker the system refuses to start leaves the pool smaller, not
        // the program dead; indices stay dense (spawning stops there).
        let mut workers = Vec::new();
        for i in 1..threads {
            let s = shared.clone();
            match std::thread::Builder::new().name(format!("lmt-worker-{i}")).spawn(move || worker(&s, i)) {
                Ok(h) => workers.push(h),
                Err(_) => break,
            }
        }
        let threads = workers.len() + 1;
        Pool { threads, shared, workers, busy: Mutex::new(()) }
    }

    /// Threads a job runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Lets the workers sleep at once instead of spinning for the next
    /// job: the caller knows none comes soon, and other threads of the
    /// process (a dataset run's rows, between batched passes) want the
    /// cores. The next [`Pool::run`] wakes them.
    pub fn rest(&self) {
        self.shared.rest.store(true, Ordering::Relaxed);
    }

    /// Workers asleep now, and the times a worker has woken.
    #[cfg(test)]
    pub(crate) fn sleeps(&self) -> (usize, usize) {
        (self.shared.sleepers.load(Ordering::SeqCst), self.shared.wakeups.load(Ordering::SeqCst))
    }

    /// Wakes sleeping workers to spin for a job the caller expects soon,
    /// on cores that have just fallen idle (a dataset run's rows all but
    /// one waiting for the next batched pass): a worker woken by the job
    /// itself starts it tens of microseconds late, and the caller starts
    /// the pass's first products without it.
    pub fn ready(&self) {
        let s = &*self.shared;
        s.rest.store(false, Ordering::Relaxed);
        s.nudges.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
    }

    /// Runs `f(i)` on the calling thread (`i = 0`) and on each worker `i`
    /// in `1..threads()` that starts before the caller has finished its
    /// own `f(0)`; returns when every thread that started has finished. A
    /// panic in any of them is raised here. `f` must share its work out
    /// dynamically (a worker may be left out; see the module's comment).
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 {
            return f(0);
        }
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY (lifetime erasure): the pointer is published to workers
        // below and read at most once per generation, only by a worker that
        // took part in it; `Wait` makes this function return (or unwind)
        // only after every worker has either reported this generation done
        // or been left out of it (then it never reads the pointer), and no
        // worker reads it again after. So `f` outlives every use.
        let job: Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f as *const _) };
        // SAFETY: no worker reads `job` now: each has reported the last
        // generation done or was left out of it (the previous `run` settled
        // that, holding `busy` as this one does), and reads it again only
        // after taking part in the generation published below (see
        // `Shared`'s `Sync`).
        unsafe { *s.job.get() = Some(SendJob(job)) };
        s.rest.store(false, Ordering::Relaxed);
        let generation = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        /// Settles each worker's part in the generation once the caller's
        /// own is done (or unwinding): left out if it has not started,
        /// else waited for.
        struct Wait<'a>(&'a [Line], usize);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                let g = self.1;
                for part in self.0 {
                    // `part` holds generation `g − 1`'s settled mark until
                    // the worker takes part or the caller leaves it out.
                    let t = part.0.load(Ordering::Acquire);
                    let started =
                        generation_of(t) == g || part.0.compare_exchange(t, left_out(g), Ordering::AcqRel, Ordering::Acquire).is_err();
                    if !started {
                        continue;
                    }
                    let mut spins = 0u32;
                    while part.0.load(Ordering::Acquire) != done(g) {
                        spins += 1;
                        if spins < SPIN { std::hint::spin_loop() } else { std::thread::yield_now() }
                    }
                }
            }
        }
        // Only the workers that started (`threads` counts them).
        let wait = Wait(&s.part[..self.threads - 1], generation);
        f(0);
        drop(wait);
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a model worker thread panicked");
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        // `nudged`: the nudges this spell of spinning has answered. One that
        // comes later, even between the `rest` check and the sleep below,
        // keeps the worker awake for another spell.
        let (mut spins, mut nudged) = (0u32, s.nudges.load(Ordering::SeqCst));
        loop {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            spins += 1;
            if spins < SPIN && !s.rest.load(Ordering::Relaxed) {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen
                && !s.stop.load(Ordering::SeqCst)
                && s.nudges.load(Ordering::SeqCst) == nudged
            {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            #[cfg(test)]
            s.wakeups.fetch_add(1, Ordering::Relaxed);
            // Woken by a job, or told one comes soon: spin for it again.
            (spins, nudged) = (0, s.nudges.load(Ordering::SeqCst));
        }
        seen = s.generation.load(Ordering::Acquire);
        // Take part unless the caller has finished the job without this
        // worker (then wait for the next). While `part` still holds the
        // last generation's settled mark, `seen` is the job in the slot: the
        // caller settles every worker's part before it publishes another.
        let part = &s.part[index - 1].0;
        let t = part.load(Ordering::Acquire);
        if generation_of(t) + 1 != seen || part.compare_exchange(t, taking_part(seen), Ordering::AcqRel, Ordering::Acquire).is_err() {
            continue;
        }
        // SAFETY: this generation's job was written before it was published
        // and is not written again before this worker, which took part in
        // it, reports it done.
        let job = unsafe { (*s.job.get()).as_ref().map(|j| j.0) };
        if let Some(job) = job {
            // SAFETY: `run` keeps the closure alive until this worker
            // reports done below.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        part.store(done(seen), Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Physical cores this process may run on (logical CPUs when the topology
/// cannot be read).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut cores = std::collections::BTreeSet::new();
    for cpu in 0..logical.max(1) * 4 {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
        if let Ok(s) = std::fs::read_to_string(path) {
            cores.insert(s.trim().to_string());
        }
    }
    if cores.is_empty() { logical } else { cores.len().min(logical) }
}
