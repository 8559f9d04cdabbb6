//! The stdlib's regexes and grammars, checked through `lmt match` (the real
//! tokenizer path and the masks generation uses) with inputs that must
//! match and inputs that must not.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use common::tiny::{temp_dir, TempDir};

/// A tokenizer trained here, saved once for the `lmt match` runs.
fn tokenizer() -> &'static PathBuf {
    static TOK: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    &TOK.get_or_init(|| {
        let dir = temp_dir("stdlib-tokenizer");
        let path = dir.join("tokenizer.json");
        common::trained_byte_level().save(&path, false).unwrap();
        (dir, path)
    })
    .1
}

/// `lmt match` with `constraint` (e.g. `["--grammar", "std/json#json"]`) on `text`.
fn accepts(constraint: &[&str], text: &str) -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_lmt"))
        .arg("match")
        .arg("--tokenizer")
        .arg(tokenizer())
        .args(constraint)
        .arg(format!("--text={text}"))
        .arg("--json")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => true,
        Some(1) => {
            let doc: serde_json::Value = serde_json::from_str(&report).unwrap_or_else(|e| panic!("{e}: {report}"));
            assert_eq!(doc["accepted"], false, "{report}");
            false
        }
        other => panic!("lmt match {constraint:?} --text {text:?}: exit {other:?}: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn regexes() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("integer", &["0", "-7", "2024"], &["", "01", "-", "1.5", "+3"]),
        ("number", &["0", "-1.25", "3e8", "6.02E-23"], &["1.", ".5", "01", "1e"]),
        ("date", &["2024-02-29", "2000-02-29", "1999-12-31", "2024-04-30"], &["2024-13-01", "2024-1-01", "24-01-01", "2024-02-31", "2023-02-29", "1900-02-29", "2024-04-31", "2024-00-10"]),
        ("time", &["23:59", "00:00:59"], &["24:00", "12:60", "1:00"]),
        ("email", &["ada@example.com", "a.b+c@x-y.co.uk"], &["ada@", "@x.com", "ada@example", "a b@x.com"]),
        ("url", &["https://example.com", "http://x.org:8080/a/b?c=d"], &["example.com", "ftp://x.org", "https://"]),
        ("uuid", &["123e4567-e89b-12d3-a456-426655440000"], &["123e4567e89b12d3a456426655440000", "XYZe4567-e89b-12d3-a456-426655440000"]),
        ("identifier", &["_x", "abc123"], &["1abc", "a-b", ""]),
        ("quoted", &["\"\"", "\"a \\\"b\\\"\""], &["\"a", "\"a\"b\""]),
        ("word", &["Hello"], &["two words", ""]),
        ("line", &["", "anything at all"], &["two\nlines"]),
    ];
    for (name, good, bad) in cases {
        let c = format!("std/regex#{name}");
        for g in *good {
            assert!(accepts(&["--regex-from", &c], g), "std/regex {name} should accept {g:?}");
        }
        for b in *bad {
            assert!(!accepts(&["--regex-from", &c], b), "std/regex {name} should refuse {b:?}");
        }
    }
}

#[test]
fn grammars() {
    let value = ["--grammar", "std/json#json"];
    for ok in ["{}", "[1, -2.5e3, true, null]", "{\"a\": {\"b\": [\"c\"]}}", "\"\\u00e9\""] {
        assert!(accepts(&value, ok), "std/json {ok}");
    }
    for bad in ["{", "[1,]", "01", "{'a': 1}", "nul"] {
        assert!(!accepts(&value, bad), "std/json {bad}");
    }
    let object = ["--grammar", "std/json#json.object"];
    assert!(accepts(&object, "{\"k\": 1}") && !accepts(&object, "[1]"));

    let san = ["--grammar", "std/chess#san"];
    for ok in ["e4", "Nf3", "exd5", "O-O", "O-O-O", "Qh4#", "e8=Q+", "Nbd7", "R1a3"] {
        assert!(accepts(&san, ok), "std/chess {ok}");
    }
    for bad in ["e9", "Ni3", "O-O-O-O", "xe4", "e8=K", ""] {
        assert!(!accepts(&san, bad), "std/chess {bad}");
    }

    let call = ["--grammar", "std/chat#tool_call"];
    assert!(accepts(&call, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}"));
    assert!(accepts(&call, "{\"name\": \"now\", \"arguments\": {}}"));
    assert!(!accepts(&call, "{\"name\": \"9bad\", \"arguments\": {}}"));
    assert!(!accepts(&call, "{\"arguments\": {}, \"name\": \"x\"}"));
}

#[test]
fn every_stdlib_regex_and_grammar_is_tested() {
    let src = std::fs::read_to_string(file!()).unwrap();
    for name in lmt::stdlib::names() {
        let text = lmt::stdlib::get(name).unwrap();
        let ws = lmt::workspace::Workspace::load_text(name, text, None, &lmt::workspace::FsLoader::default());
        for node in &ws.module(ws.root).template.body {
            let tested = match node {
                lmt::syntax::ast::Node::Grammar(g) => format!("\"{name}#{}", g.name.name),
                lmt::syntax::ast::Node::Set { target, .. } => format!("(\"{}\", &[", target.name.name),
                _ => continue,
            };
            assert!(src.contains(&tested), "{name}: no test has `{tested}`");
        }
    }
    // And `lmt match` names a missing module clearly.
    let out = Command::new(env!("CARGO_BIN_EXE_lmt"))
        .args(["match", "--tokenizer"])
        .arg(tokenizer())
        .args(["--grammar", "std/jsno#json", "--text", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no stdlib module `std/jsno`"));
}
