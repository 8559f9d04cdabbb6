//! `Template.iter_many`: a dataset run on a thread of its own, its rows
//! pulled lazily from a Python iterator and its records handed back to a
//! Python iterator as they complete.

use std::io::{BufRead, Read};
use std::sync::{Arc, Mutex};

use lmt::cli::remote::Loaded;
use lmt::dataset::{self, DatasetOptions, JsonlRows};
use pyo3::prelude::*;
use serde_json::json;

use crate::template::Compiled;
use crate::wait::Feed;

/// Records a `RowStream` holds before its consumer reads them.
const RECORDS_AHEAD: usize = 64;

/// The exception the rows iterator raised, kept for the consumer.
type Raised = Arc<Mutex<Option<PyErr>>>;

/// A Python iterator of JSON lines read as a byte stream: each `next()`
/// (taken with the GIL, on whichever thread reads) is one line. What it
/// raises is kept in `raised` and ends the stream as a read error.
struct PyLines {
    iter: Py<PyAny>,
    line: Vec<u8>,
    at: usize,
    raised: Raised,
}

impl Read for PyLines {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let buf = self.fill_buf()?;
            let n = buf.len().min(out.len());
            out[..n].copy_from_slice(&buf[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for PyLines {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.at == self.line.len() {
            let next = Python::attach(|py| -> PyResult<Option<String>> {
                match self.iter.bind(py).call_method0("__next__") {
                    Ok(line) => line.extract::<String>().map(Some),
                    Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => Ok(None),
                    Err(e) => Err(e),
                }
            });
            self.line.clear();
            self.at = 0;
            match next {
                Ok(Some(line)) => {
                    self.line.extend_from_slice(line.as_bytes());
                    self.line.push(b'\n');
                }
                Ok(None) => {}
                Err(e) => {
                    let message = e.to_string();
                    *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    return Err(std::io::Error::other(format!("the rows raised {message}")));
                }
            }
        }
        Ok(&self.line[self.at..])
    }

    fn consume(&mut self, n: usize) {
        self.at = (self.at + n).min(self.line.len());
    }
}

/// The records of a dataset run as they complete (JSON text, in completion
/// order), then one last `{"summary": …}`. Ctrl-C while waiting raises
/// KeyboardInterrupt and stops the run: rows in flight end cancelled and
/// are left out, the finished ones can still be read. Closing or dropping
/// it stops the run.
#[pyclass(module = "lmt._lmt")]
pub struct RowStream {
    feed: Feed,
    raised: Raised,
}

impl RowStream {
    /// Starts the run over `rows` (a Python iterator of JSON lines).
    pub fn start(c: Arc<Compiled>, loaded: Arc<Loaded>, rows: Py<PyAny>, opts: DatasetOptions) -> RowStream {
        // Bounded: a consumer that lags holds the run back instead of its
        // records piling up (the rows in flight finish into the run's own queue).
        let (send, receiver) = crossbeam_channel::bounded::<String>(RECORDS_AHEAD);
        let raised = Raised::default();
        let cancel = opts.cancel.clone();
        let lines = PyLines { iter: rows, line: Vec::new(), at: 0, raised: raised.clone() };
        std::thread::spawn(move || {
            let reader = JsonlRows::new(lines, c.declared.clone());
            let result = dataset::run(&c.program, &c.sources, loaded.backend(), reader, &opts, &mut |r| {
                if !r.cancelled {
                    let _ = send.send(r.record.to_string());
                }
            });
            let end = match result {
                Ok(s) => json!({"summary": {
                    "done": s.done, "failed": s.failed, "cancelled": s.cancelled,
                    "generated_tokens": s.usage.generated_tokens, "forward_tokens": s.usage.forward_tokens,
                    "shared_prefix_tokens": s.batches.shared_tokens, "prefix_cached_tokens": s.usage.prefix_cached_tokens,
                }}),
                Err(e) => json!({"error": e.to_string()}),
            };
            let _ = send.send(end.to_string());
        });
        RowStream { feed: Feed::new(receiver, cancel), raised }
    }
}

#[pymethods]
impl RowStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next record (or the last `summary`/`error` object) as JSON text.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.feed.next(py)
    }

    /// The exception the rows iterator raised, if it did (taken once).
    fn take_raised(&self) -> Option<PyErr> {
        self.raised.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Stops the run: no new row starts, rows in flight end cancelled.
    fn close(&self) {
        self.feed.stop();
    }
}
