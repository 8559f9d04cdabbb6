//! The `--json` document of a search: the best run's fields at the top
//! (the shape of a single run), every run ranked under `runs`, and what the
//! search cost under `search`.

use serde_json::{json, Value as J};

use crate::search::{Found, Mode};

/// The document of `found`, a search of kind `mode`.
pub fn search_json(found: &Found, mode: Mode) -> J {
    let mut doc = found.runs.first().map(|r| super::json(&r.outcome.state)).unwrap_or_else(|| json!({}));
    doc["runs"] = found
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut o = super::json(&r.outcome.state);
            o["rank"] = json!(i + 1);
            o["score"] = json!(r.score);
            o
        })
        .collect();
    let u = &found.usage;
    let (kind, size) = match mode {
        Mode::Samples { n, best_of: false } => ("samples", n),
        Mode::Samples { n, best_of: true } => ("best_of", n),
        Mode::Beam { width } => ("beam", width),
    };
    doc["search"] = json!({
        "kind": kind,
        "size": size,
        "runs_started": u.runs,
        "forward_tokens": u.forward_tokens,
        "shared_tokens": u.shared_tokens,
        "batches": u.batches,
        "greedy_logprob": u.greedy_logprob,
    });
    doc
}

/// A single run's `--json` document with its `runs` list of one (the
/// shape a search's document has).
pub fn one_run(mut doc: J) -> J {
    let mut run = doc.clone();
    run["rank"] = json!(1);
    run["score"] = doc["logprob"].clone();
    doc["runs"] = json!([run]);
    doc
}

