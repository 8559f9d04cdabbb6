//! The real SmolLM2-135M-Instruct GGUF as users have it, with nothing
//! beside it (`../shared/scripts/fetch-smollm2.sh`): the examples run with
//! its own tokenizer and ChatML template, and pydantic-style schemas give
//! JSON that ends. Says SKIPPED without the file (a failure under
//! `LMT_REQUIRE_ALL=1`).

mod common;

use std::path::Path;
use std::process::Command;

use lmt::interp::{self, RunOptions};
use lmt::model::{LoadOptions, Model};
use lmt::workspace::{FsLoader, Workspace};
use serde_json::{json, Value};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_examples_run_on_the_lone_gguf() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    // A directory with nothing but the GGUF in it.
    let dir = common::tiny::temp_dir("smollm2-lone");
    let lone = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::os::unix::fs::symlink(&gguf, &lone).unwrap();
    for example in ["trip", "chat", "vehicles"] {
        let out = Command::new(env!("CARGO_BIN_EXE_lmt"))
            .args(["run", &format!("{ROOT}/examples/{example}.lmt"), "--model", lone.to_str().unwrap(), "--json", "--quiet"])
            .args(["--var", "question=What is a KV cache?"].iter().filter(|_| example == "chat"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{example}: {stderr}");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let tokens = doc["tokens"].as_array().unwrap();
        // The prompt starts as llama.cpp's would (no BOS) or with the
        // template's own role marker.
        let id = |t: &Value| t["id"].as_u64().unwrap();
        if example == "vehicles" {
            // A plain prompt starts as llama.cpp's: no BOS before it.
            assert_ne!(id(&tokens[0]), 1, "{example}: no <|im_start|> before a plain prompt");
        } else {
            let role = |i: u64| tokens.iter().any(|t| id(t) == i && t["origin"] == "role");
            assert!(role(1) && role(2), "{example}: ChatML role tokens <|im_start|>=1, <|im_end|>=2");
            assert_eq!(id(&tokens[0]), 1, "{example}: the conversation opens with <|im_start|>");
        }
        assert!(!doc["captures"].as_object().unwrap().is_empty(), "{example}: no captures");
    }
}

#[test]
fn lmt_model_info_describes_the_gguf_from_its_metadata() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_lmt")).args(["model", "info", "--model", gguf.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    for want in ["llama · 30 layers", "Q4_1", "8192 tokens", "49152 tokens", "none added (the named BOS is 1 \"<|im_start|>\")", "2 \"<|im_end|>\"", "tokenizer.chat_template", "<|im_start|>"] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // About 135 M parameters.
    let params = text.lines().find(|l| l.starts_with("parameters")).unwrap();
    assert!(params.contains("(134.5 M)") || params.contains("(134.") || params.contains("(135."), "{params}");
}

/// Pydantic-style schemas: nested objects list their properties and
/// required keys and say nothing of `additionalProperties`; some fields carry
/// the bounds pydantic writes for `Field(max_length=…)` and `conlist(…,
/// max_length=…)`.
fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("a person with an address", json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
            "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "maxLength": 10}}, "required": ["street", "city"]}},
            "required": ["name", "age", "address"]})),
        ("an order with line items", json!({"type": "object", "properties": {
            "order_id": {"type": "string", "maxLength": 12}, "customer": {"type": "string", "maxLength": 40},
            "items": {"type": "array", "items": {"type": "object", "properties": {"product": {"type": "string", "maxLength": 30}, "quantity": {"type": "integer"}, "price": {"type": "number"}}, "required": ["product", "quantity", "price"]}, "maxItems": 3},
            "total": {"type": "number"}}, "required": ["order_id", "items", "total"]})),
        ("an event with a date", json!({"type": "object", "properties": {
            "title": {"type": "string"}, "date": {"type": "string", "format": "date"}, "location": {"type": "string"},
            "attendees": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 5}}, "required": ["title", "date"]})),
        ("a book and its author", json!({"type": "object", "properties": {
            "title": {"type": "string"}, "author": {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}}, "required": ["name"]},
            "year": {"type": "integer"}, "genres": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5}}, "required": ["title", "author", "year"]})),
        ("a weather report", json!({"type": "object", "properties": {
            "city": {"type": "string"}, "temperature": {"type": "number"}, "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
            "wind": {"type": "object", "properties": {"speed": {"type": "number"}, "direction": {"type": "string", "maxLength": 10}}, "required": ["speed"]}},
            "required": ["city", "temperature", "conditions"]})),
        ("a user profile with settings", json!({"type": "object", "properties": {
            "username": {"type": "string", "maxLength": 30}, "email": {"type": "string", "format": "email", "maxLength": 40},
            "settings": {"type": "object", "properties": {"theme": {"enum": ["light", "dark"]}, "notifications": {"type": "boolean"}}, "required": ["theme", "notifications"]}},
            "required": ["username", "settings"]})),
    ]
}

#[test]
fn pydantic_style_schemas_give_json_that_ends() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    let model = Model::load_path(&gguf, &LoadOptions::default()).unwrap();
    let mut runs = 0;
    for (what, schema) in schemas() {
        let src = format!(
            "{{% user %}}Give a short, realistic example of {what} as a JSON object.{{% end %}}{{% assistant %}}{{% gen v json={schema} max_tokens=200 %}}{{% end %}}"
        );
        let ws = Workspace::load_text("t.lmt", &src, Some(Path::new(ROOT).join("t.lmt")), &FsLoader::default());
        assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
        let program = lmt::ir::compile(&ws);
        // Greedy, then five seeds at 0.7.
        let settings = [(0.0, 0)].into_iter().chain((1..=5).map(|s| (0.7, s)));
        for (temperature, seed) in settings {
            let opts = RunOptions { seed, temperature, ..Default::default() };
            let out = interp::run(&program, &ws.sources, &model, &opts, &mut |_| {});
            assert!(out.error.is_none(), "{what} (t={temperature}, seed {seed}): {:?}", out.error);
            let v = &out.state.captures.iter().find(|c| c.name == "v").expect("the capture").value;
            let text = &v.text;
            assert!(v.meta.tokens.len() < 200, "{what} (t={temperature}, seed {seed}): reached max_tokens: {text}");
            let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
            valid(&doc, &schema).unwrap_or_else(|e| panic!("{what} (t={temperature}, seed {seed}): {e}: {text}"));
            no_duplicate_keys(text).unwrap_or_else(|k| panic!("{what}: key {k:?} twice in one object: {text}"));
            runs += 1;
        }
    }
    assert_eq!(runs, 36);
}

/// A validator for the keywords these schemas use, written apart from the
/// engine: types, properties (closed), required, items, enum.
fn valid(v: &Value, s: &Value) -> Result<(), String> {
    if let Some(options) = s["enum"].as_array() {
        return if options.contains(v) { Ok(()) } else { Err(format!("{v} is not one of {options:?}")) };
    }
    match s["type"].as_str() {
        Some("object") => {
            let m = v.as_object().ok_or(format!("{v} is not an object"))?;
            let props = s["properties"].as_object().unwrap();
            for r in s["required"].as_array().into_iter().flatten() {
                if !m.contains_key(r.as_str().unwrap()) {
                    return Err(format!("`{r}` is missing"));
                }
            }
            for (k, x) in m {
                valid(x, props.get(k).ok_or(format!("`{k}` is not a listed property"))?)?;
            }
            Ok(())
        }
        Some("array") => v.as_array().ok_or(format!("{v} is not an array"))?.iter().try_for_each(|x| valid(x, &s["items"])),
        Some("string") => {
            let t = v.as_str().ok_or(format!("{v} is not a string"))?;
            match s["format"].as_str() {
                Some("date") => {
                    let ok = t.len() == 10 && t.as_bytes()[4] == b'-' && t.as_bytes()[7] == b'-';
                    if ok { Ok(()) } else { Err(format!("{t:?} is not a date")) }
                }
                Some("email") => if t.contains('@') { Ok(()) } else { Err(format!("{t:?} is not an email")) },
                _ => Ok(()),
            }
        }
        Some("integer") => v.as_i64().map(|_| ()).ok_or(format!("{v} is not an integer")),
        Some("number") => v.as_f64().map(|_| ()).ok_or(format!("{v} is not a number")),
        Some("boolean") => v.as_bool().map(|_| ()).ok_or(format!("{v} is not a boolean")),
        other => Err(format!("type {other:?} is not handled here")),
    }
}

/// Parses JSON text keeping every key as written: the first key that an
/// object holds twice, if any.
fn no_duplicate_keys(text: &str) -> Result<(), String> {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn string(b: &[u8], i: &mut usize) -> String {
        let start = *i;
        *i += 1;
        while b[*i] != b'"' {
            *i += if b[*i] == b'\\' { 2 } else { 1 };
        }
        *i += 1;
        serde_json::from_slice::<String>(&b[start..*i]).unwrap()
    }
    fn value(b: &[u8], i: &mut usize) -> Result<(), String> {
        ws(b, i);
        match b[*i] {
            b'{' => {
                *i += 1;
                let mut seen = std::collections::HashSet::new();
                loop {
                    ws(b, i);
                    if b[*i] == b'}' {
                        *i += 1;
                        return Ok(());
                    }
                    if b[*i] == b',' {
                        *i += 1;
                        ws(b, i);
                    }
                    let k = string(b, i);
                    if !seen.insert(k.clone()) {
                        return Err(k);
                    }
                    ws(b, i);
                    *i += 1; // ':'
                    value(b, i)?;
                }
            }
            b'[' => {
                *i += 1;
                loop {
                    ws(b, i);
                    match b[*i] {
                        b']' => {
                            *i += 1;
                            return Ok(());
                        }
                        b',' => *i += 1,
                        _ => value(b, i)?,
                    }
                }
            }
            b'"' => {
                string(b, i);
                Ok(())
            }
            _ => {
                while *i < b.len() && !b",}] \n\t\r".contains(&b[*i]) {
                    *i += 1;
                }
                Ok(())
            }
        }
    }
    value(text.as_bytes(), &mut 0)
}

#[test]
fn the_duplicate_key_checker_finds_duplicates() {
    assert_eq!(no_duplicate_keys(r#"{"a":1,"b":{"c":[1,{"d":2,"d":3}]}}"#), Err("d".into()));
    assert_eq!(no_duplicate_keys(r#"{"a":1,"b":{"a":2}}"#), Ok(()));
    assert_eq!(no_duplicate_keys(r#"{"a\u0062":1,"ab":2}"#), Err("ab".into()));
}

/// Greedy parity with llama.cpp on the real Q4_1 file
/// (`smollm2/llamacpp_q4_1.json`): fed llama.cpp's own greedy tokens, lmt's
/// top token is llama.cpp's at every step where llama.cpp's top-1 leads
/// its top-2 by at least `CLEAR` logits, on one and two threads.
///
/// Why 0.25 and not 0.1: llama.cpp is not reproducible at 0.1 itself. Its
/// build here (`../shared/scripts/llama-cpp/build.sh`, same harness) gives
/// margins that differ from these goldens by 0.11 on average and 0.67 at
/// most, and picks another token at a step whose golden margin is 0.245.
/// lmt differs from the goldens by 0.125 on average (0.50 at most) and
/// from the local llama.cpp by 0.129; its three disagreements with the
/// goldens are at margins 0.060, 0.149 and 0.196.
#[test]
fn greedy_tokens_match_llama_cpp_wherever_its_margin_is_clear() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    let Some(data) = common::shared_data() else { return };
    let goldens: Value = serde_json::from_str(&std::fs::read_to_string(data.join("smollm2/llamacpp_q4_1.json")).unwrap()).unwrap();
    const CLEAR: f64 = 0.25;
    let argmax = |l: &[f32]| l.iter().enumerate().fold(0, |b, (j, &v)| if v > l[b] { j } else { b }) as u64;
    for threads in [1, 2] {
        let opts = LoadOptions { threads, ..LoadOptions::default() };
        let m = lmt::model::Decoder::load_with(&gguf, &opts).unwrap();
        let mut checked = 0;
        for case in goldens["greedy"].as_array().unwrap() {
            let ids = |k: &str| case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>();
            let (prompt, greedy) = (ids("prompt_ids"), ids("greedy_ids"));
            let margins: Vec<f64> = case["margins"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let mut st = m.new_state();
            let mut logits = m.append(&mut st, &prompt).unwrap();
            for (i, &want) in greedy.iter().enumerate() {
                if margins[i] >= CLEAR {
                    let got = argmax(&logits);
                    assert_eq!(
                        got,
                        want as u64,
                        "{:?} step {i} (llama.cpp margin {:.3}, {threads} threads): lmt's logits {:.4} for {got}, {:.4} for {want}",
                        case["prompt"].as_str(),
                        margins[i],
                        logits[got as usize],
                        logits[want as usize]
                    );
                    checked += 1;
                }
                logits = m.append(&mut st, &[want]).unwrap();
            }
        }
        assert!(checked > 100, "only {checked} steps checked");
    }
}
