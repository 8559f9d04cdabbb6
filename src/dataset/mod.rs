//! Runs of one template over many input rows: several rows in flight on
//! threads of their own, their forward passes batched together
//! ([`Batcher`]) and their common prompt prefix computed once (its prefix
//! cache); each row's record handed back as it completes.
//!
//! A row's seed is derived from the base seed and its id, and a row's
//! logits do not depend on the rows beside it, so a row's record is the
//! same whatever the number of rows in flight.

mod csv;
mod rows;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use indexmap::IndexMap;
use serde_json::{json, Value as J};

pub use csv::CsvRows;
pub use rows::{check_inputs, recorded, JsonlRows, Row, RowKey, MAX_LINE};

use crate::diagnostic::JsonDiagnostic;
use crate::engine::Limits;
use crate::interp::Backend;
use crate::interp::value::Value;
use crate::interp::{self, RunError, RunOptions};
use crate::ir::Program;
use crate::model::{BatchStats, Batcher};
use crate::search::{self, Mode};
use crate::span::SourceMap;
use crate::state::{FinishReason, Record, Usage};

/// How to run the rows.
#[derive(Debug, Clone)]
pub struct DatasetOptions {
    /// Rows in flight at once (≥ 1).
    pub parallel: usize,
    /// Base seed: each row's seed is derived from it and the row's id.
    pub seed: u64,
    /// Default temperature.
    pub temperature: f32,
    /// Engine limits of each row's run.
    pub limits: Limits,
    /// Values every row gets unless it gives its own.
    pub defaults: IndexMap<String, Value>,
    /// Bytes of K/V the shared prefix cache may hold.
    pub prefix_cache_bytes: usize,
    /// Set to stop: rows in flight end cancelled (and are not recorded),
    /// no new row starts.
    pub cancel: Arc<AtomicBool>,
    /// A search over whole runs for each row (`--samples`, `--beam`), with
    /// its length penalty.
    pub search: Option<(Mode, f64)>,
    /// Score every token of each row's run (`logprob_all`).
    pub score_all: bool,
}

/// What became of one row.
#[derive(Debug, Clone)]
pub struct RowResult {
    /// The row's record, one JSON object: `id`, `line`, `inputs`, `text`,
    /// `captures`, `messages`, `usage`, `logprob`, `finish_reason`, and
    /// `error` when it failed.
    pub record: J,
    /// Whether it failed (its error is in the record).
    pub failed: bool,
    /// Whether it was cancelled midway (its record should not be kept:
    /// a resumed run does it again).
    pub cancelled: bool,
    /// Its usage (zero for a row that never ran).
    pub usage: Usage,
}

/// Totals of a dataset run.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Rows completed (recorded), failed or not.
    pub done: usize,
    /// Rows whose record holds an error.
    pub failed: usize,
    /// Rows cut short by a cancel (not recorded).
    pub cancelled: usize,
    /// The batcher's counters (shared prefix tokens, batches).
    pub batches: BatchStats,
    /// The rows' usage, summed.
    pub usage: Usage,
}

/// The seed of the row `id` in a run with base seed `seed` (FNV-1a over
/// the id's JSON text, mixed with the base): stable across runs, machines
/// and `--parallel`.
pub fn row_seed(seed: u64, id: &J) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.to_string().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Runs `program` over `rows`, `opts.parallel` at a time, and calls
/// `on_row` on this thread with each row's result as it completes (in
/// completion order). Rows that cannot be read end the run with that error
/// after the rows in flight finish.
pub fn run<I>(
    program: &Program,
    sources: &SourceMap,
    backend: Backend<'_>,
    rows: I,
    opts: &DatasetOptions,
    on_row: &mut dyn FnMut(&RowResult),
) -> Result<Summary, std::io::Error>
where
    I: Iterator<Item = std::io::Result<Row>> + Send,
{
    // Local rows batch their passes; a remote engine batches its requests itself.
    let batcher = match backend {
        Backend::Local { model, .. } => Some(Batcher::new(&model.decoder, opts.prefix_cache_bytes)),
        Backend::Remote(_) => None,
    };
    let declared = interp::inputs(program);
    let rows = Mutex::new(rows);
    let read_error: Mutex<Option<std::io::Error>> = Mutex::new(None);
    let mut summary = Summary::default();
    let (send, receive) = mpsc::channel::<RowResult>();
    std::thread::scope(|scope| {
        for k in 0..opts.parallel.max(1) {
            let send = send.clone();
            let (rows, read_error, batcher, declared) = (&rows, &read_error, batcher.as_ref(), &declared);
            // Named, so that a profile or a debugger tells rows from the model's workers.
            let row_thread = std::thread::Builder::new().name("lmt-row".into());
            let spawned = row_thread.spawn_scoped(scope, move || loop {
                if opts.cancel.load(Ordering::SeqCst) {
                    return;
                }
                let next = rows.lock().unwrap_or_else(|e| e.into_inner()).next();
                let row = match next {
                    None => return,
                    Some(Ok(row)) => row,
                    Some(Err(e)) => {
                        *read_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        opts.cancel.store(true, Ordering::SeqCst);
                        return;
                    }
                };
                // A fault of lmt in one row is that row's error, not the run's end.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_row(program, sources, backend, batcher, declared, &row, opts)
                }));
                let result = ran.unwrap_or_else(|_| RowResult {
                    record: json!({"id": row.id, "line": row.line, "error": {"kind": "internal", "message": "lmt failed on this row (a bug: please report it)"}}),
                    failed: true,
                    cancelled: false,
                    usage: Usage::default(),
                });
                if send.send(result).is_err() {
                    return;
                }
            });
            // Fewer threads (the system refused one) still run every row.
            if let Err(e) = spawned {
                if k == 0 {
                    let e = std::io::Error::new(e.kind(), format!("no thread could be started for the rows ({e})"));
                    *read_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
                break;
            }
        }
        drop(send);
        for result in receive {
            if result.cancelled {
                summary.cancelled += 1;
            } else {
                summary.done += 1;
                summary.failed += usize::from(result.failed);
                summary.usage.add_counters(&result.usage);
            }
            on_row(&result);
        }
    });
    summary.batches = batcher.map(|b| b.stats()).unwrap_or_default();
    match read_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// One row, start to end, on this thread.
fn run_row(
    program: &Program,
    sources: &SourceMap,
    backend: Backend<'_>,
    batcher: Option<&Batcher<'_>>,
    declared: &[interp::InputDecl],
    row: &Row,
    opts: &DatasetOptions,
) -> RowResult {
    let mut vars = opts.defaults.clone();
    let inputs = match &row.inputs {
        Ok(values) => {
            // The row's values over the defaults: an input either gives is given.
            vars.extend(values.iter().map(|(k, v)| (k.clone(), v.clone())));
            check_inputs(&vars, declared).map(|()| values)
        }
        Err(e) => Err(e.clone()),
    };
    let inputs_json = |values: &IndexMap<String, Value>| -> J { values.iter().map(|(k, v)| (k.clone(), v.to_json())).collect::<serde_json::Map<_, _>>().into() };
    let values = match inputs {
        Ok(values) => values,
        Err(message) => {
            let given = row.inputs.as_ref().map_or(J::Null, inputs_json);
            let record = json!({"id": row.id, "line": row.line, "inputs": given, "error": {"kind": "input", "message": message}});
            return RowResult { record, failed: true, cancelled: false, usage: Usage::default() };
        }
    };
    let run_opts = RunOptions {
        vars,
        seed: row_seed(opts.seed, &row.id),
        temperature: opts.temperature,
        limits: opts.limits.clone(),
        cancel: Some(opts.cancel.clone()),
        score_all: opts.score_all,
    };
    if let Some((mode, alpha)) = opts.search {
        return search_row(program, sources, backend, batcher, row, inputs_json(values), &run_opts, mode, alpha);
    }
    let outcome = match (backend, batcher) {
        (Backend::Local { model, .. }, Some(batcher)) => {
            let member = batcher.join();
            interp::run_on(program, sources, model, &member, &run_opts, &mut |_| {})
        }
        _ => interp::run_with(program, sources, backend, None, &run_opts, &mut |_| {}),
    };
    let state = &outcome.state;
    let record = record_json(row, inputs_json(values), state, outcome.error.as_ref(), sources);
    RowResult {
        record,
        failed: outcome.error.is_some(),
        cancelled: state.finish_reason == FinishReason::Cancelled,
        usage: state.usage.clone(),
    }
}

/// A row searched over whole runs: the best run's record, with `runs`
/// (every run kept, best first, without token lists) and `search`; its
/// usage counts the forward work of every run the search started.
#[allow(clippy::too_many_arguments)]
fn search_row(
    program: &Program,
    sources: &SourceMap,
    backend: Backend<'_>,
    batcher: Option<&Batcher<'_>>,
    row: &Row,
    inputs: J,
    run_opts: &RunOptions,
    mode: Mode,
    alpha: f64,
) -> RowResult {
    let found = match (backend, batcher) {
        (Backend::Local { model, .. }, Some(batcher)) => Some(search::run_in(program, sources, model, batcher, run_opts, mode, alpha)),
        (Backend::Remote(r), _) => {
            let search = search::SearchOptions { mode, length_penalty: alpha, prefix_cache_bytes: 0 };
            search::run_remote(program, sources, r, run_opts, &search)
        }
        (Backend::Local { .. }, None) => None,
    };
    let Some(found) = found else {
        let record = json!({"id": row.id, "line": row.line, "inputs": inputs, "error": {"kind": "search", "message": "this search cannot run on this model"}});
        return RowResult { record, failed: true, cancelled: false, usage: Usage::default() };
    };
    let cancelled = run_opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst));
    let Some(best) = found.runs.first() else {
        let record = json!({"id": row.id, "line": row.line, "inputs": inputs, "error": {"kind": "search", "message": "the search found no run"}});
        return RowResult { record, failed: true, cancelled, usage: Usage::default() };
    };
    let state = &best.outcome.state;
    let mut record = record_json(row, inputs, state, best.outcome.error.as_ref(), sources);
    let doc = crate::render::search_json(&found, mode);
    let mut runs = doc["runs"].clone();
    for r in runs.as_array_mut().into_iter().flatten() {
        if let J::Object(o) = r {
            o.remove("tokens");
        }
    }
    record["runs"] = runs;
    record["search"] = doc["search"].clone();
    let mut usage = state.usage.clone();
    usage.forward_tokens = found.usage.forward_tokens;
    usage.prefix_cached_tokens = found.usage.shared_tokens;
    RowResult { record, failed: best.outcome.error.is_some(), cancelled: cancelled || state.finish_reason == FinishReason::Cancelled, usage }
}

/// A row's record: the `--json` document's fields less the token list,
/// with the row's id, line and inputs, and the error as a diagnostic.
fn record_json(row: &Row, inputs: J, state: &Record, error: Option<&RunError>, sources: &SourceMap) -> J {
    let mut record = json!({"id": row.id, "line": row.line, "inputs": inputs});
    let doc = crate::render::json(state);
    if let (J::Object(r), J::Object(d)) = (&mut record, doc) {
        for (k, v) in d {
            if k != "tokens" && k != "error" {
                r.insert(k, v);
            }
        }
        if let Some(e) = error {
            let mut err = serde_json::to_value(JsonDiagnostic::new(&e.to_diagnostic(), sources)).unwrap_or(J::Null);
            err["kind"] = json!(e.kind);
            r.insert("error".into(), err);
        }
    }
    record
}
