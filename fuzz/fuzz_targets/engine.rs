//! `cargo fuzz run engine`: any bytes, read as a JSON Schema and as a GBNF
//! grammar, either compile or give an error, and whatever compiles answers
//! feeds and forced bytes without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lmt::engine::{Constraint, Limits, Semantics, Whitespace};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut compiled = Vec::new();
    if let Ok(schema) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(c) = Constraint::json_schema(&schema, Whitespace::Any, Semantics::Validation, &limits) {
            compiled.push(c);
        }
    }
    let mut diags = Vec::new();
    let g = lmt::syntax::gbnf::parse(text, 0, lmt::span::FileId(0), &mut diags);
    if let Some(first) = g.rules.first() {
        if let Ok(c) = Constraint::grammar(&lmt::engine::Grammar::from(&g), &first.name, &limits) {
            compiled.push(c);
        }
    }
    for c in compiled {
        let mut m = c.matcher(&limits);
        let _ = m.forced_bytes(32);
        let _ = m.feed(&data[..data.len().min(64)]);
        let _ = m.is_complete();
    }
});
