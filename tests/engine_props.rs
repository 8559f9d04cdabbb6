//! Whatever schema or grammar a user writes, the engine compiles it or says
//! why; it never panics, and what it compiles answers masks and feeds.

mod common;

use lmt::engine::{Constraint, Limits, Semantics, TokenMask, Vocab, Whitespace};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Schema-like JSON: keywords with plausible and implausible values.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({})),
        Just(json!(true)),
        Just(json!(false)),
        prop::sample::select(vec!["string", "integer", "number", "boolean", "null", "object", "array", "bogus"]).prop_map(|t| json!({"type": t})),
        (any::<i64>(), any::<i64>()).prop_map(|(a, b)| json!({"type": "integer", "minimum": a, "maximum": b})),
        (any::<u64>(), any::<u64>()).prop_map(|(a, b)| json!({"type": "string", "minLength": a % 200, "maxLength": b})),
        prop::sample::select(vec!["^a+$", "[0-9]{2,}", "(x|y)*z", "\\d+", "^$", "a{3", "\""]).prop_map(|p| json!({"type": "string", "pattern": p})),
        prop::sample::select(vec!["date", "date-time", "email", "uuid", "ipv4", "unknown"]).prop_map(|f| json!({"type": "string", "format": f})),
        prop::collection::vec(any::<i8>(), 0..4).prop_map(|v| json!({"enum": v})),
        Just(json!({"$ref": "#"})),
        Just(json!({"$ref": "#/nowhere"})),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            (prop::collection::btree_map("[a-c]{1,2}", inner.clone(), 0..4), prop::collection::vec("[a-d]{1,2}", 0..3), any::<Option<bool>>())
                .prop_map(|(props, req, extra)| {
                    let mut o = json!({"type": "object", "properties": props, "required": req});
                    if let Some(x) = extra {
                        o["additionalProperties"] = json!(x);
                    }
                    o
                }),
            (inner.clone(), any::<u8>(), any::<u8>()).prop_map(|(i, a, b)| json!({"type": "array", "items": i, "minItems": a % 4, "maxItems": b % 6})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"anyOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"allOf": v})),
            prop::collection::vec(inner, 1..3).prop_map(|v| json!({"prefixItems": v})),
        ]
    })
}

fn exercise(c: &Constraint, vocab: &Vocab, text: &[u8]) {
    let limits = Limits::default();
    let mut m = c.matcher(&limits);
    let mut mask = TokenMask::new(vocab.len());
    let _ = m.mask(vocab, &mut mask);
    let _ = m.feed(text);
    let _ = m.forced_bytes(16);
    let _ = m.mask(vocab, &mut mask);
    let _ = m.mask_after_prefix(vocab, b"{", &mut mask);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn any_schema_compiles_or_errors(s in schema(), ws in 0u8..3, text in "[\\[\\]{}\",:0-9a-z ]{0,24}") {
        let vocab = Vocab::from_tokenizer(&common::trained_byte_level());
        let ws = match ws { 0 => Whitespace::Compact, 1 => Whitespace::Flexible(3), _ => Whitespace::Any };
        if let Ok(c) = Constraint::json_schema(&s, ws, Semantics::Validation, &Limits::default()) {
            exercise(&c, &vocab, text.as_bytes());
        }
    }

    #[test]
    fn any_gbnf_compiles_or_errors(rules in prop::collection::vec(("[a-d]", prop::collection::vec(prop_oneof![
        Just("\"x\"".to_string()), Just("[a-z]".to_string()), Just("/[0-9]+/".to_string()), Just(".".to_string()),
        "[a-d]".prop_map(|r| r), Just("( a | b )".to_string()), Just("c*".to_string()), Just("d{2,3}".to_string()),
        Just("a?".to_string()), Just("\"\"".to_string()), Just("( root )+".to_string()),
    ], 0..4)), 1..5), text in "[a-z0-9x.]{0,12}") {
        let src: String = std::iter::once("root ::= a | b\n".to_string())
            .chain(rules.iter().map(|(name, items)| format!("{name} ::= {}\n", items.join(" "))))
            .collect();
        let mut diags = Vec::new();
        let g = lmt::syntax::gbnf::parse(&src, 0, lmt::span::FileId(0), &mut diags);
        let vocab = Vocab::from_tokenizer(&common::trained_byte_level());
        if let Ok(c) = Constraint::grammar(&lmt::engine::Grammar::from(&g), "root", &Limits::default()) {
            exercise(&c, &vocab, text.as_bytes());
        }
    }
}

#[test]
fn long_chains_of_rules_compile() {
    // 5,000 rules, each referring to the next: no recursion may follow the chain.
    let mut src = String::from("root ::= r0\n");
    for i in 0..5000 {
        src.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
    }
    src.push_str("r5000 ::= \"end\"\n");
    let mut diags = Vec::new();
    let g = lmt::syntax::gbnf::parse(&src, 0, lmt::span::FileId(0), &mut diags);
    assert!(diags.is_empty());
    let c = Constraint::grammar(&lmt::engine::Grammar::from(&g), "root", &Limits::default());
    if let Ok(c) = c {
        let mut m = c.matcher(&Limits::default());
        assert!(m.feed(b"xxxx").unwrap());
    }
}
