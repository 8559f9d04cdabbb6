//! Model work on a thread of its own while the caller's thread, the GIL
//! released, watches for Python's signals: Ctrl-C (or any signal handler
//! that raises) stops the work at its next token, and the caller still gets
//! what the work made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use pyo3::prelude::*;

/// How often the waiting thread lets Python run its signal handlers.
const POLL: Duration = Duration::from_millis(20);

/// Runs `work` on a scoped thread and waits for it with the GIL released.
/// When a signal handler raises (KeyboardInterrupt for Ctrl-C), `cancel`
/// is set, the work is still waited for, and the exception comes back
/// beside its result. Python runs signal handlers on the main thread only;
/// a run on another thread is stopped through `event` (a
/// `threading.Event`): once it is set, so is `cancel`.
pub fn interruptible<T: Send>(
    py: Python<'_>,
    cancel: &AtomicBool,
    event: Option<&Py<PyAny>>,
    work: impl FnOnce() -> T + Send,
) -> (T, Option<PyErr>) {
    py.detach(|| {
        std::thread::scope(|scope| {
            let (done, finished) = mpsc::channel::<()>();
            let worker = scope.spawn(move || {
                let result = work();
                let _ = done.send(());
                result
            });
            let mut raised = None;
            while let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(POLL) {
                if raised.is_some() || cancel.load(Ordering::SeqCst) {
                    continue;
                }
                let polled = Python::attach(|py| -> PyResult<bool> {
                    py.check_signals()?;
                    Ok(event.map(|e| e.bind(py).call_method0("is_set").and_then(|v| v.is_truthy())).transpose()?.unwrap_or(false))
                });
                match polled {
                    Ok(false) => {}
                    Ok(true) => cancel.store(true, Ordering::SeqCst),
                    Err(e) => {
                        cancel.store(true, Ordering::SeqCst);
                        raised = Some(e);
                    }
                }
            }
            match worker.join() {
                Ok(result) => (result, raised),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    })
}

/// What a Python iterator over work on another thread reads: the items the
/// work sends, and the flag that stops the work (set on Ctrl-C while
/// waiting, on `stop`, and when the iterator is dropped).
pub struct Feed {
    receiver: Receiver<String>,
    cancel: Arc<AtomicBool>,
}

impl Feed {
    /// The feed of `receiver`, whose work `cancel` stops.
    pub fn new(receiver: Receiver<String>, cancel: Arc<AtomicBool>) -> Feed {
        Feed { receiver, cancel }
    }

    /// The next item, waited for with the GIL released; None once the work
    /// is done. A signal handler that raises (before or while waiting)
    /// stops the work and its exception is returned; the items already sent
    /// can still be read after it.
    pub fn next(&self, py: Python<'_>) -> PyResult<Option<String>> {
        loop {
            if let Err(e) = py.check_signals() {
                self.stop();
                return Err(e);
            }
            match py.detach(|| self.receiver.recv_timeout(POLL)) {
                Ok(item) => return Ok(Some(item)),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(None),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Stops the work.
    pub fn stop(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop();
    }
}
