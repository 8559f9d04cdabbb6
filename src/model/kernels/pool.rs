//! A persistent pool of worker threads for the forward pass: a job is a
//! borrowed closure every thread runs once (`f(thread_index)`), the caller
//! taking part as thread 0. Workers spin briefly between jobs (a forward
//! pass runs a job every few microseconds), then sleep on a condition
//! variable, so an idle model costs no CPU.

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
    /// The current job (valid while `run` waits for it).
    job: Mutex<Option<SendJob>>,
    /// Workers done with the current job.
    done: AtomicUsize,
    /// A worker's job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

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
            job: Mutex::new(None),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
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
        // counted itself done with this generation, after which no worker
        // reads the pointer again. So `f` outlives every use.
        let job: Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f as *const _) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(SendJob(job));
        s.done.store(0, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        struct Wait<'a>(&'a Shared, usize);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                let mut spins = 0u32;
                while self.0.done.load(Ordering::Acquire) < self.1 {
                    spins += 1;
                    if spins < SPIN { std::hint::spin_loop() } else { std::thread::yield_now() }
                }
            }
        }
        let wait = Wait(s, self.threads - 1);
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
            if spins < SPIN {
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
        let job = s.job.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|j| j.0);
        if let Some(job) = job {
            // SAFETY: `run` keeps the closure alive until this worker adds
            // itself to `done` below.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        s.done.fetch_add(1, Ordering::Release);
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
