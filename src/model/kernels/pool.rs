//! A persistent pool of worker threads for the forward pass: a job is a
//! borrowed closure every thread runs once (`f(thread_index)`), the caller
//! taking part as thread 0. Workers spin briefly between jobs (a forward
//! pass runs a job every few microseconds), then sleep on a condition
//! variable, so an idle model costs no CPU. A job is handed out and
//! collected without locks or shared counters: the job's pointer is
//! published by the generation number, and each worker reports done in a
//! cache line of its own (a pass hands out ≈ 150 jobs of a few µs, so on
//! many cores a mutex or a counter every worker bumps costs as much as the
//! work).

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
    /// Per worker (index − 1), the generation it last finished.
    done: Box<[Line]>,
    /// A worker's job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers go to sleep without spinning until the next job (see
    /// [`Pool::rest`]).
    rest: AtomicBool,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: every field but `job` is `Sync`; `job` is written only by the
// thread in `Pool::run` holding `busy`, after every worker has reported the
// previous generation done and before the new generation is published
// (a release), and read by a worker only after it has seen that generation
// (an acquire) and before it reports it done: a write never overlaps a read.
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
            done: (1..threads.max(1)).map(|_| Line(AtomicUsize::new(0))).collect(),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            rest: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
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

    /// Runs `f(i)` once on each thread `i` in `0..threads()` and returns
    /// when all have finished. A panic in any of them is raised here.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 {
            return f(0);
        }
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY (lifetime erasure): the pointer is published to workers
        // below and read by each at most once per generation; `Wait` makes
        // this function return (or unwind) only after every worker has
        // reported this generation done, after which no worker reads the
        // pointer again. So `f` outlives every use.
        let job: Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f as *const _) };
        // SAFETY: no worker reads `job` now: each has reported the last
        // generation done (the previous `run` waited for that, holding
        // `busy` as this one does) and reads it again only after the
        // generation published below (see `Shared`'s `Sync`).
        unsafe { *s.job.get() = Some(SendJob(job)) };
        s.rest.store(false, Ordering::Relaxed);
        let generation = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        struct Wait<'a>(&'a [Line], usize);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                for w in self.0 {
                    let mut spins = 0u32;
                    while w.0.load(Ordering::Acquire) != self.1 {
                        spins += 1;
                        if spins < SPIN { std::hint::spin_loop() } else { std::thread::yield_now() }
                    }
                }
            }
        }
        // Only the workers that started (`threads` counts them).
        let wait = Wait(&s.done[..self.threads - 1], generation);
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
        let mut spins = 0u32;
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
            while s.generation.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        seen = s.generation.load(Ordering::Acquire);
        // SAFETY: this generation's job was written before it was published
        // and is not written again before this worker reports it done.
        let job = unsafe { (*s.job.get()).as_ref().map(|j| j.0) };
        if let Some(job) = job {
            // SAFETY: `run` keeps the closure alive until this worker
            // reports done below.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        s.done[index - 1].0.store(seen, Ordering::Release);
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
