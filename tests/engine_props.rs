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

/// Masks, feeds, forced bytes and rewinds agree with each other: every
/// token a mask allows can be fed and every token it refuses cannot (checked
/// on a sample), forced bytes can be fed, and a rewind restores the mask.
/// Engine errors (limits) are allowed; panics and disagreement are not.
fn exercise(c: &Constraint, vocab: &Vocab, text: &[u8]) {
    let limits = Limits::default();
    let mut m = c.matcher(&limits);
    let mut mask = TokenMask::new(vocab.len());
    if m.mask(vocab, &mut mask).is_err() {
        return;
    }
    let start = m.position();
    for id in (0..vocab.len() as u32).filter(|&id| vocab.is_generable(id) && !vocab.eos().contains(&id)).step_by(7) {
        let bytes = vocab.bytes(id);
        if bytes.is_empty() {
            continue;
        }
        let fed = m.feed(bytes);
        assert_eq!(fed.as_ref().ok().copied().unwrap_or(mask.get(id)), mask.get(id), "token {id} {:?}: mask {} but feed {fed:?}", String::from_utf8_lossy(bytes), mask.get(id));
        m.rewind(start);
    }
    let mut again = TokenMask::new(vocab.len());
    if m.mask(vocab, &mut again).is_ok() {
        assert!((0..vocab.len() as u32).all(|i| again.get(i) == mask.get(i)), "a rewind restores the mask");
    }
    if let Ok(forced) = m.forced_bytes(16) {
        assert!(m.feed(&forced).unwrap_or(true), "forced bytes {forced:?} are accepted");
        m.rewind(start);
    }
    // Feeding text byte by byte and at once agree.
    let whole = m.feed(text);
    m.rewind(start);
    let mut one = Ok(true);
    for b in text {
        one = m.feed(std::slice::from_ref(b));
        if !matches!(one, Ok(true)) {
            break;
        }
    }
    if let (Ok(a), Ok(b)) = (&whole, &one) {
        assert_eq!(a, b, "{:?} fed at once and byte by byte", String::from_utf8_lossy(text));
    }
}

/// Runs `check` on `cases` values of `strategy`; returns how many compiled.
fn run_cases<T: std::fmt::Debug>(strategy: impl Strategy<Value = T>, cases: u32, check: impl Fn(T) -> bool) -> (u32, u32) {
    use std::cell::Cell;
    let compiled = Cell::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases, ..ProptestConfig::default() });
    runner
        .run(&strategy, |v| {
            compiled.set(compiled.get() + u32::from(check(v)));
            Ok(())
        })
        .unwrap();
    (compiled.get(), cases)
}

#[test]
fn any_schema_compiles_or_errors() {
    let vocab = Vocab::from_tokenizer(&common::trained_byte_level());
    let strategy = (schema(), 0u8..3, "[\\[\\]{}\",:0-9a-z ]{0,24}");
    let (compiled, cases) = run_cases(strategy, 300, |(s, ws, text)| {
        let ws = match ws {
            0 => Whitespace::Compact,
            1 => Whitespace::Flexible(3),
            _ => Whitespace::Any,
        };
        match Constraint::json_schema(&s, ws, Semantics::Validation, &Limits::default()) {
            Ok(c) => {
                exercise(&c, &vocab, text.as_bytes());
                true
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                false
            }
        }
    });
    // About half the random schemas are valid (the others name bogus types,
    // bad patterns, missing refs): a change that refused them all would
    // leave the properties above unchecked.
    assert!(compiled * 3 >= cases, "only {compiled}/{cases} random schemas compiled");
}

#[test]
fn any_gbnf_compiles_or_errors() {
    let vocab = Vocab::from_tokenizer(&common::trained_byte_level());
    let item = prop_oneof![
        Just("\"x\"".to_string()), Just("[a-z]".to_string()), Just("/[0-9]+/".to_string()), Just(".".to_string()),
        "[a-d]".prop_map(|r| r), Just("( a | b )".to_string()), Just("c*".to_string()), Just("d{2,3}".to_string()),
        Just("a?".to_string()), Just("\"\"".to_string()), Just("( root )+".to_string()),
    ];
    // Rules `a` to `d`, each a random sequence (references may recurse).
    let strategy = (prop::collection::vec(prop::collection::vec(item, 0..4), 4), "[a-z0-9x.]{0,12}");
    let (compiled, cases) = run_cases(strategy, 300, |(bodies, text)| {
        let src: String = std::iter::once("root ::= a | b\n".to_string())
            .chain(bodies.iter().zip(["a", "b", "c", "d"]).map(|(items, name)| format!("{name} ::= {}\n", items.join(" "))))
            .collect();
        let mut diags = Vec::new();
        let g = lmt::syntax::gbnf::parse(&src, 0, lmt::span::FileId(0), &mut diags);
        match Constraint::grammar(&lmt::engine::Grammar::from(&g), "root", &Limits::default()) {
            Ok(c) => {
                exercise(&c, &vocab, text.as_bytes());
                true
            }
            Err(_) => false,
        }
    });
    // Every rule is defined; grammars with no finite derivation (`a ::= a`)
    // and those past the engine's bounds are refused: about 38 % compile.
    assert!(compiled * 4 >= cases, "only {compiled}/{cases} random grammars compiled");
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
    let c = Constraint::grammar(&lmt::engine::Grammar::from(&g), "root", &Limits::default()).expect("a chain of 5,000 rules compiles");
    let mut m = c.matcher(&Limits::default());
    assert!(m.feed(b"xxxx").unwrap());
    assert!(!m.is_accepting());
    assert!(m.feed(&b"x".repeat(4996)).unwrap());
    assert!(m.feed(b"end").unwrap() && m.is_accepting());
}
