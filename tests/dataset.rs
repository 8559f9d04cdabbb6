//! Dataset runs (`lmt run T --inputs rows.jsonl`) as a user runs them: every
//! row once, a killed run resumed, bad rows recorded without stopping the
//! rest, the same records at any `--parallel`, and the shared prefix
//! computed once.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tiny::temp_dir;
use serde_json::Value as J;



/// A template with a shared instruction prefix and one generation per row;
/// `10 // n` fails for `n = 0`.
const TEMPLATE: &str = "{% input n %}Count up from the number given, one number per answer, and explain nothing.\n\
Number: {{ n }} ({{ 10 // n }})\nNext: {% gen next max_tokens=6 %}";

/// A test's folder, its model and the counting template written there:
/// (folder, model directory, template path).
fn setup(name: &str) -> (common::tiny::TempDir, PathBuf, PathBuf) {
    let tmp = temp_dir(name);
    let model = common::cli_model(&tmp.join("model"));
    let template = tmp.join("count.lmt");
    std::fs::write(&template, TEMPLATE).unwrap();
    (tmp, model, template)
}

/// Every line of `path` as JSON (panics on a line that is not).
fn records(path: &Path) -> Vec<J> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "the file ends with a whole line");
    text.lines().enumerate().map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}: {l}", i + 1))).collect()
}

/// Records by id; panics on an id seen twice.
fn by_id(records: Vec<J>) -> HashMap<String, J> {
    let mut out = HashMap::new();
    for r in records {
        let id = r["id"].to_string();
        assert!(out.insert(id.clone(), r).is_none(), "the id {id} is recorded twice");
    }
    out
}

#[test]
fn a_thousand_rows_each_once_through_a_kill_and_a_resume() {
    let (tmp, m, template) = setup("dataset-kill");
    let mut lines: Vec<String> = (1..=1000).map(|i| format!("{{\"id\": \"row-{i}\", \"n\": {i}}}")).collect();
    lines[499] = "{this is not json".into(); // line 500
    lines[699] = "{\"id\": \"zero\", \"n\": 0}".into(); // fails when run
    let rows = tmp.join("rows.jsonl");
    std::fs::write(&rows, lines.join("\n") + "\n").unwrap();
    let out = tmp.join("out.jsonl");
    let args = |resume: bool| {
        let mut a = vec!["run", template.to_str().unwrap(), "--model", m.to_str().unwrap(), "--inputs", rows.to_str().unwrap()];
        a.extend(["--out", out.to_str().unwrap(), "--parallel", "4", "--quiet"]);
        if resume {
            a.push("--resume");
        }
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmt")).args(args(false)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let started = Instant::now();
    // Killed (SIGKILL, no chance to clean up) once a few rows are recorded.
    loop {
        let n = std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
        if n >= 40 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed");
        assert!(started.elapsed() < Duration::from_secs(120), "no rows recorded in 2 minutes");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(status.code().is_none(), "killed by a signal, not finished: {status:?}");
    let before = std::fs::read_to_string(&out).unwrap().lines().count();
    assert!(before < 1000, "{before} rows recorded before the kill");

    let a = args(true);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let (code, _, err) = common::lmt(&a);
    assert_eq!(code, 1, "some rows failed, so the exit status is 1: {err}");
    let got = by_id(records(&out));
    let mut want: Vec<String> = (1..=1000).filter(|&i| i != 500 && i != 700).map(|i| format!("\"row-{i}\"")).collect();
    want.extend(["500".to_string(), "\"zero\"".to_string()]);
    assert_eq!(got.len(), want.len(), "every id exactly once");
    for id in &want {
        assert!(got.contains_key(id), "{id} is missing");
    }
    // The bad line and the failing row are recorded; the rest succeeded.
    assert_eq!(got["500"]["error"]["kind"], "input", "{}", got["500"]);
    assert_eq!(got["500"]["line"], 500);
    assert_eq!(got["\"zero\""]["error"]["code"], "E0801", "{}", got["\"zero\""]);
    let ok: Vec<&J> = got.values().filter(|r| r.get("error").is_none()).collect();
    assert_eq!(ok.len(), 998);
    for r in ok {
        assert!(r["captures"]["next"]["value"].is_string() && r["usage"]["generated_tokens"].as_u64() > Some(0), "{r}");
        assert_eq!(r["inputs"]["n"], r["line"], "a row's inputs are its own");
    }
    // Resuming a finished run does nothing and writes nothing.
    let (code, _, _) = common::lmt(&a);
    assert_eq!(code, 0, "no row ran, so none failed");
    assert_eq!(records(&out).len(), want.len());
}

#[test]
fn records_are_the_same_at_any_parallelism() {
    let (tmp, m, template) = setup("dataset-parallel");
    let rows = tmp.join("rows.jsonl");
    let lines: Vec<String> = (1..=24).map(|i| format!("{{\"n\": {i}}}")).collect();
    std::fs::write(&rows, lines.join("\n")).unwrap();
    let mut runs = Vec::new();
    for parallel in ["1", "8"] {
        let out = tmp.join(format!("p{parallel}.jsonl"));
        let (t, m, r, o) = (template.to_str().unwrap(), m.to_str().unwrap(), rows.to_str().unwrap(), out.to_str().unwrap());
        let (code, _, err) =
            common::lmt(&["run", t, "--model", m, "--inputs", r, "--out", o, "--parallel", parallel, "--temperature", "0.9", "--seed", "7"]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("24 rows: 24 ok, 0 failed"), "{err}");
        // Usage holds timings and batch-dependent reuse counts: the rest must match.
        let mut recs = by_id(records(&out));
        recs.values_mut().for_each(|r| drop(r.as_object_mut().unwrap().remove("usage")));
        runs.push(recs);
    }
    assert_eq!(runs[0].len(), 24);
    for (id, r) in &runs[0] {
        assert_eq!(Some(r), runs[1].get(id), "row {id} differs between --parallel 1 and 8");
    }
    // Sampling really happened: rows differ from each other.
    let values: std::collections::HashSet<String> = runs[0].values().map(|r| r["captures"]["next"]["value"].to_string()).collect();
    assert!(values.len() > 12, "{values:?}");
}

#[test]
fn bad_rows_and_bad_usage_are_explained() {
    let (tmp, m, template) = setup("dataset-bad");
    let m = m.to_str().unwrap();
    let t = template.to_str().unwrap();
    let rows = tmp.join("rows.jsonl");
    let lines = [
        r#"{"id": 1, "n": 3}"#,
        "",
        r#"{"id": 2, "m": 3}"#,
        r#"{"id": 3}"#,
        r#"{"id": [3], "n": 3}"#,
        r#"{"id": 1, "n": 4}"#,
        r#"[1, 2]"#,
        r#"{"id": "x", "n": 5}"#,
    ];
    std::fs::write(&rows, lines.join("\n")).unwrap();
    let r = rows.to_str().unwrap();
    let (code, out, err) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--quiet"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("5 of 7 rows failed"), "{err}");
    let got: Vec<J> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let by_line: HashMap<u64, &J> = got.iter().map(|r| (r["line"].as_u64().unwrap(), r)).collect();
    assert_eq!(by_line.len(), 7, "the blank line is no row");
    let message = |line: u64| by_line[&line]["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(by_line[&1].get("error").is_none() && by_line[&8].get("error").is_none());
    assert!(message(3).contains("no input `m`"), "{}", message(3));
    assert!(message(4).contains("`n` was not given"), "{}", message(4));
    assert!(message(5).contains("must be a string or a number"), "{}", message(5));
    assert!(message(6).contains("used by an earlier row") && by_line[&6]["id"].is_null(), "{}", by_line[&6]);
    assert!(message(7).contains("not a JSON object"), "{}", message(7));
    // `--var` gives every row a value it may leave out.
    let (code, out, _) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--quiet", "--var", "n=5"]);
    assert_eq!(code, 1);
    let row4: J = out.lines().map(|l| serde_json::from_str::<J>(l).unwrap()).find(|r| r["line"] == 4).unwrap();
    assert!(row4.get("error").is_none(), "{row4}");
    assert_eq!(row4["inputs"], serde_json::json!({}), "its record lists the row's own inputs");

    let out = tmp.join("out.jsonl");
    let o = out.to_str().unwrap();
    // A model that does not load leaves no output file in the way of a retry.
    let (code, _, err) = common::lmt(&["run", t, "--model", "/no/such/model", "--inputs", r, "--out", o]);
    assert_eq!(code, 3, "{err}");
    assert!(!out.exists(), "the run created and kept an empty {o}");
    std::fs::write(&out, "").unwrap();
    let (code, _, err) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--out", o]);
    assert_eq!(code, 2);
    assert!(err.contains("exists: pass `--resume`"), "{err}");
    let (code, _, err) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--json"]);
    assert_eq!(code, 2);
    assert!(err.contains("one JSON record per row"), "{err}");
    let (code, _, err) = common::lmt(&["run", t, "--model", m, "--inputs", "/no/such/rows.jsonl"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read `/no/such/rows.jsonl`"), "{err}");
    let (code, _, err) = common::lmt(&["run", t, "--model", m, "--parallel", "4"]);
    assert_eq!(code, 2, "--parallel without --inputs: {err}");
    // A file that is not a run's records is not resumed over.
    std::fs::write(&out, "{\"id\": 1}\nnot a record\n{\"id\": 2}\n").unwrap();
    let (code, _, err) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--out", o, "--resume"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a record"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "{\"id\": 1}\nnot a record\n{\"id\": 2}\n", "left as it was");
    // Rows from standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmt"))
        .args(["run", t, "--model", m, "--inputs", "-", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"{\"n\": 1}\n{\"n\": 2}\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 2);
}

/// The rows' common prefix is computed once, at `--parallel 1` (from the
/// prefix cache) and at `--parallel 8` (once for the rows waiting together):
/// forward tokens ≤ the rows' own tokens plus one copy of the prefix.
#[test]
fn the_shared_prefix_is_computed_once() {
    let tmp = temp_dir("dataset-prefix");
    let dir = common::cli_model(&tmp.join("model"));
    let model = lmt::model::Model::load_path(&dir, &lmt::model::LoadOptions::default()).unwrap();
    let few_shot: String = (1..=12).map(|i| format!("Number: {i}\nNext: {}\n\n", i + 1)).collect();
    let text = format!("{{% input n %}}{few_shot}Number: {{{{ n }}}}\nNext: {{% gen next max_tokens=4 %}}");
    let ws = lmt::workspace::Workspace::load_text("t.lmt", &text, None, &lmt::workspace::FsLoader::default());
    assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
    let program = lmt::ir::compile(&ws);
    let n_rows = 16;
    let rows = || (0..n_rows).map(|i| Ok(json_row(i)));
    // Each row alone, with no cache: its tokens and its forward work.
    let mut alone = Vec::new();
    for i in 0..n_rows {
        let opts = lmt::interp::RunOptions {
            vars: [("n".to_string(), lmt::interp::value::Value::Int(100 + i as i64))].into_iter().collect(),
            ..Default::default()
        };
        let out = lmt::interp::run(&program, &ws.sources, &model, &opts, &mut |_| {});
        assert!(out.error.is_none());
        alone.push(out.state);
    }
    let ids = |r: &lmt::state::Record| r.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    let first = ids(&alone[0]);
    let prefix = alone.iter().map(|r| first.iter().zip(ids(r)).take_while(|(a, b)| **a == *b).count()).min().unwrap() as u64;
    assert!(prefix > 100, "the few-shot prefix is long: {prefix} tokens");
    let unshared: u64 = alone.iter().map(|r| r.usage.forward_tokens).sum();
    let own = unshared - n_rows as u64 * prefix;
    for parallel in [1, 8] {
        let opts = lmt::dataset::DatasetOptions {
            parallel,
            seed: 0,
            temperature: 0.0,
            limits: Default::default(),
            defaults: Default::default(),
            prefix_cache_bytes: 64 << 20,
            cancel: Arc::new(AtomicBool::new(false)),
            search: None,
            score_all: false,
        };
        let mut texts = Vec::new();
        let summary = lmt::dataset::run(&program, &ws.sources, lmt::interp::Backend::local(&model), rows(), &opts, &mut |r| texts.push(r.record["text"].clone())).unwrap();
        assert_eq!((summary.done, summary.failed), (n_rows, 0));
        let forward = summary.usage.forward_tokens + summary.batches.shared_tokens;
        assert!(forward <= own + prefix, "--parallel {parallel}: {forward} forward tokens > {own} own + {prefix} prefix");
        assert!(summary.usage.prefix_cached_tokens >= (n_rows as u64 - 1) * prefix, "{:?}", summary.usage);
        // And the records are what each row gives alone (greedy).
        for r in &alone {
            assert!(texts.contains(&J::String(r.text())), "a row's text differs from its run alone");
        }
        if parallel == 8 {
            assert!(summary.batches.batches < summary.batches.appends, "rows shared passes: {:?}", summary.batches);
        }
    }
}

fn json_row(i: usize) -> lmt::dataset::Row {
    let inputs = [("n".to_string(), lmt::interp::value::Value::Int(100 + i as i64))].into_iter().collect();
    lmt::dataset::Row { line: i + 1, id: J::from(i + 1), inputs: Ok(inputs) }
}

#[test]
fn ctrl_c_keeps_the_rows_done_and_resume_finishes() {
    let (tmp, m, template) = setup("dataset-sigint");
    let rows = tmp.join("rows.jsonl");
    let lines: Vec<String> = (1..=600).map(|i| format!("{{\"n\": {i}}}")).collect();
    std::fs::write(&rows, lines.join("\n")).unwrap();
    let out = tmp.join("out.jsonl");
    let (t, m, r, o) = (template.to_str().unwrap(), m.to_str().unwrap(), rows.to_str().unwrap(), out.to_str().unwrap());
    let (code, _) = common::interrupted_run(&["run", t, "--model", m, "--inputs", r, "--out", o, "--parallel", "3"], 1);
    assert_eq!(code, Some(130));
    let done = records(&out).len();
    assert!(done > 0 && done < 600, "{done} rows recorded before Ctrl-C");
    let (code, _, err) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--out", o, "--parallel", "3", "--resume"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("({done} already recorded)")), "{err}");
    assert_eq!(by_id(records(&out)).len(), 600);
}

#[test]
fn csv_rows_run_like_json_lines() {
    let (tmp, m, template) = setup("dataset-csv");
    let rows = tmp.join("rows.csv");
    std::fs::write(&rows, "id,n\nfirst,1\n\"second, with a comma\",2\nthird,0\n").unwrap();
    let (t, m, r) = (template.to_str().unwrap(), m.to_str().unwrap(), rows.to_str().unwrap());
    let (code, out, err) = common::lmt(&["run", t, "--model", m, "--inputs", r, "--quiet"]);
    assert_eq!(code, 1, "the third row divides by zero: {err}");
    let got = by_id(out.lines().map(|l| serde_json::from_str(l).unwrap()).collect());
    assert_eq!(got.len(), 3);
    assert_eq!(got["\"second, with a comma\""]["inputs"]["n"], 2, "cells read as JSON when they parse");
    assert_eq!(got["\"second, with a comma\""]["line"], 3);
    assert_eq!(got["\"third\""]["error"]["code"], "E0801");
}
