//! The `lmt` binary as a user runs it: exit codes, both output formats,
//! standard input, and a file with five independent errors.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn lmt(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lmt"));
    cmd.args(args).env("NO_COLOR", "1").env_remove("CLICOLOR_FORCE").current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("lmt runs");
    if let Some(text) = stdin {
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn write_temp(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lmt-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const FIVE_ERRORS: &str = "Hello.\n{% gen a max_tokns=5 %}\n  {{ 1 + }}\n{% or %}\n{% gen y regex=\"[0-9\" %}\n    {{ nope }}\n";

#[test]
fn five_independent_errors_are_all_reported_in_json() {
    let p = write_temp("five.lmt", FIVE_ERRORS);
    let out = lmt(&["check", "--format", "json", p.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let got: Vec<(String, u64, u64)> = lines
        .iter()
        .map(|d| (d["code"].as_str().unwrap().to_string(), d["line"].as_u64().unwrap(), d["column"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("E0301".to_string(), 2, 10),
            ("E0104".to_string(), 3, 10),
            ("E0204".to_string(), 4, 1),
            ("E0401".to_string(), 5, 17),
            ("E0501".to_string(), 6, 8),
        ]
    );
    for d in &lines {
        for key in ["file", "code", "severity", "message", "line", "column", "end_line", "end_column", "help"] {
            assert!(d.get(key).is_some(), "missing `{key}` in {d}");
        }
        assert_eq!(d["severity"], "error");
        assert!(d["end_line"].as_u64() >= d["line"].as_u64());
    }
}

#[test]
fn five_independent_errors_are_all_reported_for_people() {
    let p = write_temp("five_human.lmt", FIVE_ERRORS);
    let out = lmt(&["check", p.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    for (code, place) in [("E0301", ":2:10]"), ("E0104", ":3:10]"), ("E0204", ":4:1]"), ("E0401", ":5:17]"), ("E0501", ":6:8]")] {
        let at = err.find(code).unwrap_or_else(|| panic!("{code} missing:\n{err}"));
        assert!(err[at..].contains(place), "{code} not at {place}:\n{err}");
    }
    assert!(err.contains("5 errors found"), "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes with NO_COLOR:\n{err}");
    assert!(err.contains("did you mean `max_tokens`?"), "{err}");
}

#[test]
fn exit_codes() {
    let ok = lmt(&["check", "examples/hello.lmt"], None);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(ok.stderr.is_empty());

    let warn = write_temp("warn.lmt", "{% select s in [\"only\"] %}\n");
    let out = lmt(&["check", warn.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "warnings alone do not fail");
    assert!(String::from_utf8_lossy(&out.stderr).contains("W0701"));

    let missing = lmt(&["check", "no/such/file.lmt"], None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read `no/such/file.lmt`"));

    let usage = lmt(&["check", "--format", "yaml", "x.lmt"], None);
    assert_eq!(usage.status.code(), Some(2));
    let none = lmt(&["check"], None);
    assert_eq!(none.status.code(), Some(2));
}

#[test]
fn reads_standard_input() {
    let out = lmt(&["check", "--format", "json", "-"], Some("{% if x %}"));
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\"file\":\"<stdin>\""), "{text}");
    assert!(text.contains("E0201") && text.contains("E0501"), "{text}");
}

#[test]
fn emits_ast_and_ir() {
    let ast = lmt(&["check", "--emit", "ast", "examples/hello.lmt"], None);
    let ast = String::from_utf8(ast.stdout).unwrap();
    assert!(ast.contains("Gen city stop=\"\\n\" max_tokens=10"), "{ast}");
    let ir = lmt(&["check", "--emit", "ir", "examples/hello.lmt"], None);
    let ir = String::from_utf8(ir.stdout).unwrap();
    assert!(ir.contains("GEN city opts=[stop,max_tokens]"), "{ir}");
    assert!(ir.trim_end().ends_with("; 1:1") || ir.contains("HALT"), "{ir}");
}

#[test]
fn explains_codes() {
    let out = lmt(&["explain", "E0201"], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("unclosed-block"));
    let bad = lmt(&["explain", "E9999"], None);
    assert_eq!(bad.status.code(), Some(2));
}

/// A reader that goes away (`lmt explain | true`) ends lmt quietly: exit 0,
/// no panic message (println! used to panic on the broken pipe).
#[test]
fn a_closed_stdout_pipe_is_a_quiet_exit() {
    for args in [&["explain"][..], &["explain", "E0101"], &["match", "--regex", "[a-z]+", "--text", "abc"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lmt"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end before lmt writes.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
    }
}
