//! Views of a run's [`Record`], each derived from it and never the reverse:
//! the JSON document (`lmt run --json`), the self-contained HTML report
//! (`--html`), and the terminal styles the CLI streams with.

mod events;
mod html;
mod runs;

pub use events::EventStream;
pub use html::{html, html_runs};
pub use runs::{one_run, search_json};

use serde_json::{json, Map, Value as J};

use crate::state::{CaptureRecord, Record};

/// The JSON document of a run: `text`, `messages`, `captures`, `tokens`,
/// `usage`, `finish_reason` (and `logprob`, `logprob_all` when scored, and
/// `error` when one stopped it).
///
/// A capture assigned once is an object; one appended to (`gen xs[]`) is a
/// list of them, in order.
pub fn json(state: &Record) -> J {
    let mut captures = Map::new();
    for c in &state.captures {
        let entry = capture_json(c);
        if c.list {
            match captures.entry(c.name.clone()).or_insert_with(|| J::Array(Vec::new())) {
                J::Array(a) => a.push(entry),
                slot => *slot = J::Array(vec![entry]),
            }
        } else {
            captures.insert(c.name.clone(), entry);
        }
    }
    let mut doc = json!({
        "text": state.text(),
        "messages": state.messages,
        "captures": captures,
        "tokens": state.tokens.iter().map(|t| {
            let mut o = json!({"id": t.id, "text": t.text, "origin": t.origin, "kind": t.kind});
            if let Some(lp) = t.logprob {
                o["logprob"] = json!(lp);
            }
            o
        }).collect::<Vec<_>>(),
        "usage": state.usage,
        "logprob": state.logprob,
        "finish_reason": state.finish_reason.as_str(),
    });
    if let Some(lp) = state.logprob_all {
        doc["logprob_all"] = json!(lp);
    }
    if let Some(e) = &state.error {
        doc["error"] = e.to_json();
    }
    doc
}

/// A capture's value and metadata.
pub fn capture_json(c: &CaptureRecord) -> J {
    let m = &c.value.meta;
    json!({
        "value": c.value.text,
        "logprob": m.logprob,
        "tokens": m.tokens,
        "finish_reason": m.finish_reason.map(|r| r.as_str()),
        "stop": m.stop,
        "choices": m.choices,
    })
}

/// Terminal styles (ANSI) for streamed output; empty strings when plain.
#[derive(Debug, Clone, Copy)]
pub struct Styles {
    /// Before generated text.
    pub generated: &'static str,
    /// Before a role header.
    pub role: &'static str,
    /// Before hidden text.
    pub hidden: &'static str,
    /// Back to normal.
    pub reset: &'static str,
}

impl Styles {
    /// Colours on a terminal, nothing otherwise.
    pub fn new(color: bool) -> Styles {
        if color {
            Styles { generated: "\x1b[1;32m", role: "\x1b[1;35m", hidden: "\x1b[2m", reset: "\x1b[0m" }
        } else {
            Styles { generated: "", role: "", hidden: "", reset: "" }
        }
    }
}
