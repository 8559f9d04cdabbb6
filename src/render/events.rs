//! A run as a stream of JSON objects, one per line (`lmt run --events`):
//! `start`, then `text`, `role` and `capture` as they happen, `error` when
//! one stopped the run, and always a last `done` carrying the fields of the
//! `--json` document. Each object names itself in its `event` field.

use indexmap::IndexMap;
use serde_json::{json, Value as J};

use super::{capture_json, json as record_json};
use crate::diagnostic::JsonDiagnostic;
use crate::span::SourceMap;
use crate::interp::value::Value;
use crate::interp::{Event, RunError};
use crate::state::{Origin, TokenKind};

/// Turns a run's [`Event`]s into event objects, keeping the token counts
/// that each `text` event carries.
#[derive(Debug, Default)]
pub struct EventStream {
    generated_tokens: u64,
    forced_tokens: u64,
    /// Tokens since the last generated text: all forced, or not.
    pending_forced: Option<bool>,
}

impl EventStream {
    /// The `start` event: the template, the model, the input values and
    /// the seed.
    pub fn start(template: &str, model: &str, inputs: &IndexMap<String, Value>, seed: u64) -> J {
        let inputs: serde_json::Map<String, J> = inputs.iter().map(|(k, v)| (k.clone(), v.to_json())).collect();
        json!({"event": "start", "template": template, "model": model, "inputs": inputs, "seed": seed})
    }

    /// The object for `e`, if it is one the stream carries (tokens are
    /// counted into the next `text` event instead).
    pub fn event(&mut self, e: &Event<'_>) -> Option<J> {
        match e {
            Event::Token(t) => {
                match t.kind {
                    TokenKind::Forced => self.forced_tokens += 1,
                    TokenKind::Sampled | TokenKind::Healed => self.generated_tokens += 1,
                    TokenKind::Prompt => {}
                }
                let forced = t.kind == TokenKind::Forced;
                self.pending_forced = Some(self.pending_forced.unwrap_or(true) && forced);
                None
            }
            Event::Text { text, origin, hidden } => {
                let origin = match origin {
                    Origin::Generated if self.pending_forced.take() == Some(true) => "forced",
                    Origin::Generated => "generated",
                    Origin::Template => "template",
                    Origin::Variable => "variable",
                    Origin::Role => "role",
                    Origin::Bos => "bos",
                };
                Some(json!({
                    "event": "text",
                    "text": text,
                    "origin": origin,
                    "hidden": hidden,
                    "generated_tokens": self.generated_tokens,
                    "forced_tokens": self.forced_tokens,
                }))
            }
            Event::RoleOpen(role) => Some(json!({"event": "role", "role": role, "state": "opened"})),
            Event::RoleClose(role) => Some(json!({"event": "role", "role": role, "state": "closed"})),
            Event::Capture(c) => {
                let mut o = json!({"event": "capture", "name": c.name, "list": c.list});
                merge(&mut o, capture_json(c));
                Some(o)
            }
            Event::Done(record) => {
                let mut o = json!({"event": "done"});
                merge(&mut o, record_json(record));
                Some(o)
            }
        }
    }

    /// The `error` event: the error as a diagnostic (code, kind, message,
    /// file, line, column, help).
    pub fn error(e: &RunError, sources: &SourceMap) -> J {
        let d = e.to_diagnostic();
        let mut o = json!({"event": "error", "kind": e.kind});
        merge(&mut o, serde_json::to_value(JsonDiagnostic::new(&d, sources)).unwrap_or(J::Null));
        o
    }
}

/// Adds `from`'s fields to the object `to` (keeping `to`'s on a clash).
fn merge(to: &mut J, from: J) {
    if let (J::Object(to), J::Object(from)) = (to, from) {
        for (k, v) in from {
            to.entry(k).or_insert(v);
        }
    }
}
