//! `Template.stream`: a run on a thread of its own, its events (`lmt run
//! --events`' objects) read one at a time by a Python iterator.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;


use lmt::cli::remote::Loaded;
use lmt::interp::{self, Event, RunOptions};
use lmt::render::EventStream;
use pyo3::prelude::*;

use crate::template::Compiled;
use crate::wait::Feed;

/// Events an `Events` holds before its reader reads them.
const EVENTS_AHEAD: usize = 4096;

/// The events of a run as it happens: `start`, then `text`, `role` and
/// `capture`, `error` when one stopped it, and a last `done`. Ctrl-C while
/// waiting raises KeyboardInterrupt and stops the run at its next token;
/// the events up to its `done` (finish reason `cancelled`) can still be
/// read. Closing or dropping the iterator stops the run.
#[pyclass(module = "lmt._lmt")]
pub struct Events {
    feed: Feed,
}

impl Events {
    /// Starts the run on its thread.
    pub fn start(c: Arc<Compiled>, loaded: Arc<Loaded>, spec: String, opts: RunOptions, cancel: Arc<AtomicBool>) -> Events {
        // Bounded: a reader that lags holds the run back instead of its
        // events piling up.
        let (send, receiver) = crossbeam_channel::bounded::<String>(EVENTS_AHEAD);
        std::thread::spawn(move || {
            let start = EventStream::start(&c.name, &spec, &opts.vars, opts.seed);
            let _ = send.send(start.to_string());
            let mut stream = EventStream::default();
            // `done` goes after the `error` event, once the run has returned.
            let mut done = None;
            let outcome = interp::run_with(&c.program, &c.sources, loaded.backend(), None, &opts, &mut |e: Event<'_>| {
                match stream.event(&e) {
                    Some(o) if matches!(e, Event::Done(_)) => done = Some(o),
                    Some(o) => {
                        let _ = send.send(o.to_string());
                    }
                    None => {}
                }
            });
            if let Some(e) = &outcome.error {
                let _ = send.send(EventStream::error(e, &c.sources).to_string());
            }
            if let Some(o) = done {
                let _ = send.send(o.to_string());
            }
        });
        Events { feed: Feed::new(receiver, cancel) }
    }
}

#[pymethods]
impl Events {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next event as JSON text; None (StopIteration) after `done`.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.feed.next(py)
    }

    /// Stops the run at its next token (its remaining events can still be read).
    fn close(&self) {
        self.feed.stop();
    }
}
