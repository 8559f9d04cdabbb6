//! JSON generation that ends: `json=` closes an object that lists its keys
//! (as llama.cpp, XGrammar and OpenAI do), `json_open=true` and `lmt match
//! --json-open` keep JSON Schema's validation semantics, and `lmt match
//! --json-schema` agrees with `gen`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::tiny::temp_dir;
use lmt::engine::{Constraint, Limits, Semantics, Whitespace};
use lmt::interp::{self, RunOptions};
use lmt::model::{LoadOptions, Model};
use lmt::workspace::{FsLoader, Workspace};
use serde_json::{json, Value};

fn accepts(schema: &Value, semantics: Semantics, text: &str) -> bool {
    let limits = Limits::default();
    let c = Constraint::json_schema(schema, Whitespace::Compact, semantics, &limits).unwrap();
    let mut m = c.matcher(&limits);
    m.feed(text.as_bytes()).unwrap() && m.is_accepting()
}

#[test]
fn objects_that_list_their_keys_are_closed_unless_the_schema_opens_them() {
    let listed = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    for (text, closed, open) in [(r#"{"a":1}"#, true, true), (r#"{}"#, true, true), (r#"{"a":1,"b":2}"#, false, true), (r#"{"b":2}"#, false, true)] {
        assert_eq!(accepts(&listed, Semantics::Generation, text), closed, "closed: {text}");
        assert_eq!(accepts(&listed, Semantics::Validation, text), open, "open: {text}");
    }
    // Listed properties come in the schema's order when generating.
    let two = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "null"}}, "required": ["b"]});
    for (text, generation, validation) in [
        (r#"{"a":1,"b":true,"c":null}"#, true, true),
        (r#"{"b":true}"#, true, true),
        (r#"{"a":1,"b":true}"#, true, true),
        (r#"{"b":true,"c":null}"#, true, true),
        (r#"{"b":true,"a":1}"#, false, true),
        (r#"{"a":1}"#, false, false),
        (r#"{"a":1,"b":true,}"#, false, false),
        (r#"{,"b":true}"#, false, false),
    ] {
        assert_eq!(accepts(&two, Semantics::Generation, text), generation, "generation: {text}");
        assert_eq!(accepts(&two, Semantics::Validation, text), validation, "validation: {text}");
    }
    // Other keys an open object takes come after the listed ones.
    let open_after = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}});
    assert!(accepts(&open_after, Semantics::Generation, r#"{"a":1,"z":2,"y":3}"#));
    assert!(accepts(&open_after, Semantics::Generation, r#"{"z":2}"#));
    assert!(!accepts(&open_after, Semantics::Generation, r#"{"z":2,"a":1}"#));
    // Nested objects close too (the pydantic shape).
    let nested = json!({"type": "object", "properties": {"address": {"type": "object", "properties": {"street": {"type": "string"}}}}});
    assert!(!accepts(&nested, Semantics::Generation, r#"{"address":{"street":"x","street_address":"y"}}"#));
    assert!(accepts(&nested, Semantics::Validation, r#"{"address":{"street":"x","street_address":"y"}}"#));
    // The schema opens an object: `true`, or a schema for the other keys.
    let opened = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true});
    assert!(accepts(&opened, Semantics::Generation, r#"{"a":1,"b":[true]}"#));
    // Never a key twice, however it is spelt (what `lmt match` reads too).
    for twice in [r#"{"b":1,"b":2}"#, r#"{"a":1,"b":1,"\u0062":2}"#, r#"{"b":{"c":1,"c":2}}"#] {
        assert!(!accepts(&opened, Semantics::Generation, twice), "{twice}");
    }
    assert!(accepts(&opened, Semantics::Generation, r#"{"b":{"b":1},"c":[{"b":2}]}"#));
    let typed = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}});
    assert!(accepts(&typed, Semantics::Generation, r#"{"a":1,"b":"x"}"#));
    assert!(!accepts(&typed, Semantics::Generation, r#"{"a":1,"b":2}"#));
    // Keys by pattern list keys too: nothing else.
    let patterned = json!({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}});
    assert!(accepts(&patterned, Semantics::Generation, r#"{"x-a":1}"#));
    assert!(!accepts(&patterned, Semantics::Generation, r#"{"y":1}"#));
    // An object that lists nothing stays open.
    let bare = json!({"type": "object"});
    assert!(accepts(&bare, Semantics::Generation, r#"{"anything":[1,{"b":null}]}"#));
    // Tuples: no item past the listed ones unless the schema allows them.
    let tuple = json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]});
    assert!(accepts(&tuple, Semantics::Generation, r#"[1,"a"]"#));
    assert!(!accepts(&tuple, Semantics::Generation, r#"[1,"a",true]"#));
    assert!(accepts(&tuple, Semantics::Validation, r#"[1,"a",true]"#));
    let draft4 = json!({"type": "array", "items": [{"type": "integer"}]});
    assert!(!accepts(&draft4, Semantics::Generation, "[1,2]"));
    assert!(accepts(&json!({"type": "array", "items": [{"type": "integer"}], "additionalItems": true}), Semantics::Generation, "[1,2]"));
}

fn lmt(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lmt")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The keys of every object in `v`, depth first.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                out.push(k.clone());
                keys(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
        _ => {}
    }
}

#[test]
fn gen_and_lmt_match_agree_on_closed_objects() {
    let dir = temp_dir("json-closed-model");
    common::write_trained_chat_model(&dir);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]});
    let schema_file: PathBuf = dir.join("schema.json");
    std::fs::write(&schema_file, schema.to_string()).unwrap();
    let tok = dir.join("tokenizer.json");
    let (tok, schema_path) = (tok.to_str().unwrap(), schema_file.to_str().unwrap());
    // A key the schema does not list: closed for match as for gen, open on request.
    let extra = r#"{"a":1,"c":2}"#;
    assert_eq!(lmt(&["match", "--tokenizer", tok, "--json-schema", schema_path, "--text", extra]).0, 1);
    assert_eq!(lmt(&["match", "--tokenizer", tok, "--json-schema", schema_path, "--json-open", "--text", extra]).0, 0);
    // What gen writes at a high temperature: only listed keys, and lmt match accepts each value.
    let model = Model::load_path(&dir, &LoadOptions::default()).unwrap();
    let src = format!("Data: {{% gen v json={schema} max_tokens=60 temperature=2 %}}");
    let ws = Workspace::load_text("t.lmt", &src, None, &FsLoader::default());
    assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
    let program = lmt::ir::compile(&ws);
    let mut finished = 0;
    for seed in 0..12 {
        let opts = RunOptions { seed, ..Default::default() };
        let out = interp::run(&program, &ws.sources, &model, &opts, &mut |_| {});
        let Some(v) = out.state.captures.iter().find(|c| c.name == "v") else { continue };
        let text = v.value.text.clone();
        if let Ok(parsed) = serde_json::from_str::<Value>(&text) {
            finished += 1;
            let mut ks = Vec::new();
            keys(&parsed, &mut ks);
            assert!(ks.iter().all(|k| k == "a" || k == "b"), "seed {seed}: {text}");
            assert_eq!(lmt(&["match", "--tokenizer", tok, "--json-schema", schema_path, "--text", &text]).0, 0, "{text}");
        }
    }
    assert!(finished >= 6, "only {finished} of 12 values finished");
}

/// The keys of every object in `text` (JSON, possibly cut short), decoded:
/// how many there are, and the first key an object holds twice.
/// Independent of the engine's own scan.
fn keys_and_repeat(text: &str) -> (usize, Option<String>) {
    let mut n = 0;
    let repeat = first_repeated_key(text, &mut n);
    (n, repeat)
}

fn first_repeated_key(text: &str, count: &mut usize) -> Option<String> {
    let b = text.as_bytes();
    let mut stack: Vec<Option<Vec<String>>> = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                stack.push(Some(Vec::new()));
                expect_key = true;
            }
            b'[' => stack.push(None),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => expect_key = matches!(stack.last(), Some(Some(_))),
            b'"' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if i >= b.len() {
                    return None;
                }
                if expect_key {
                    let key: String = serde_json::from_slice(&b[start..=i]).unwrap();
                    let Some(Some(keys)) = stack.last_mut() else { unreachable!() };
                    *count += 1;
                    if keys.contains(&key) {
                        return Some(key);
                    }
                    keys.push(key);
                    expect_key = false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

#[test]
fn the_repeat_checker_finds_repeats() {
    assert_eq!(keys_and_repeat(r#"{"a":1,"b":{"a":2},"a":3}"#), (4, Some("a".into())));
    assert_eq!(keys_and_repeat(r#"{"a":"{\"a\":1}","b":[{"a":1},{"a":2}]}"#), (4, None));
    assert_eq!(keys_and_repeat(r#"{"x":{"k":1,"\u006b":2"#), (3, Some("k".into())));
}

#[test]
fn open_objects_never_repeat_a_key() {
    let dir = temp_dir("json-open-model");
    common::write_trained_chat_model(&dir);
    let model = Model::load_path(&dir, &LoadOptions::default()).unwrap();
    // Random open schemas: a few listed properties, other keys of any or
    // of a given type, nested open objects.
    let names = ["a", "b", "name", "age", "x"];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut keys_seen = 0;
    for case in 0..8 {
        let mut props = serde_json::Map::new();
        for n in names {
            if next() % 2 == 0 {
                continue;
            }
            let ty = ["integer", "string", "boolean"][(next() % 3) as usize];
            props.insert(n.to_string(), json!({ "type": ty }));
        }
        let extra = match next() % 3 {
            0 => json!(true),
            1 => json!({"type": "integer"}),
            _ => json!({"type": "object", "additionalProperties": {"type": "boolean"}}),
        };
        // Half the cases draw keys from a pattern of 26 one-letter keys, so
        // that keys meet often: an unguarded sampler repeats one in most
        // samples (the letters stay too many to be used up in 64 tokens).
        let schema = if case % 2 == 0 {
            json!({"type": "object", "properties": props, "additionalProperties": extra})
        } else {
            json!({"type": "object", "patternProperties": {"^[a-z]$": {"type": "integer"}}})
        };
        let src = format!("Data: {{% gen v json={schema} max_tokens=64 temperature=1.5 %}}");
        let ws = Workspace::load_text("t.lmt", &src, None, &FsLoader::default());
        let program = lmt::ir::compile(&ws);
        for seed in 0..10 {
            let opts = RunOptions { seed: case * 100 + seed, ..Default::default() };
            let out = interp::run(&program, &ws.sources, &model, &opts, &mut |_| {});
            // Cut short by max_tokens or not, no object may hold a key twice.
            let Some(v) = out.state.captures.iter().find(|c| c.name == "v") else { panic!("{schema}: no value: {:?}", out.error) };
            let text = &v.value.text;
            let (n, repeat) = keys_and_repeat(text);
            assert_eq!(repeat, None, "{schema}: {text}");
            keys_seen += n;
        }
    }
    assert!(keys_seen > 50, "the samples wrote only {keys_seen} keys");
}
