//! The fuzz run: mutated real templates checked and *run* on a tiny model,
//! and mutated message streams through the language server's reader. No
//! case may panic, abort, pass a memory limit or run past a time limit.
//!
//! CI runs a few hundred cases per target; the full run is
//! `LMT_FUZZ_CASES=20000 cargo test --release --test fuzz_run -- --nocapture`
//! (the seed of each case is printed with any failure; `LMT_FUZZ_SEED`
//! changes the first one). Each target runs in a child process of this test
//! under `ulimit -v` 2 GiB, so an allocation past it aborts the child and
//! fails the test; a case running past 10 s is cancelled (as Ctrl-C would)
//! and fails it too.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mutate::{apply, Rng};
use lmt::interp::{self, RunOptions};
use lmt::model::{LoadOptions, Model};
use lmt::workspace::{FsLoader, Workspace};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Longest a run case may take.
const CASE_LIMIT: Duration = Duration::from_secs(10);

fn cases() -> u64 {
    std::env::var("LMT_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(300)
}

fn first_seed() -> u64 {
    std::env::var("LMT_FUZZ_SEED").ok().and_then(|n| n.parse().ok()).unwrap_or(1)
}

/// Runs test `name` of this binary again in a child with 2 GiB of address
/// space and `LMT_FUZZ_CHILD` set; fails unless the child passes.
fn in_limited_child(name: &str) -> bool {
    if std::env::var_os("LMT_FUZZ_CHILD").is_some() {
        return false;
    }
    let me = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .args(["-c", "ulimit -v 2097152; exec \"$0\" \"$@\"", me.to_str().unwrap(), "--exact", name, "--nocapture", "--test-threads", "1"])
        .env("LMT_FUZZ_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the fuzz run failed ({}):\n{text}", out.status);
    for line in text.lines().filter_map(|l| l.find("fuzz:").map(|i| &l[i..])) {
        println!("{line}");
    }
    true
}

fn seeds() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["examples", "tests/corpus/syntax/ok", "tests/corpus/check/ok", "tests/corpus/run/ok"] {
        if let Ok(rd) = std::fs::read_dir(Path::new(ROOT).join(dir)) {
            files.extend(rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "lmt")));
        }
    }
    files.sort();
    files
}

#[test]
fn mutated_templates_run_without_panics_in_bounded_time_and_memory() {
    if in_limited_child("mutated_templates_run_without_panics_in_bounded_time_and_memory") {
        return;
    }
    let tmp = common::tiny::temp_dir("fuzz-run-model");
    common::write_trained_chat_model(&tmp);
    let model = Model::load_path(&tmp, &LoadOptions::best_device()).unwrap();
    let files = seeds();
    let texts: Vec<(PathBuf, String)> = files.iter().map(|f| (f.clone(), std::fs::read_to_string(f).unwrap())).collect();
    let (mut ran, mut clean, mut errors) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for seed in first_seed()..first_seed() + cases() {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (path, text) = &texts[rng.below(texts.len())];
        let mut text = text.clone();
        for _ in 0..1 + rng.below(6) {
            apply(&mut text, &rng.mutation());
        }
        let ws = Workspace::load_text("fuzz.lmt", &text, Some(path.clone()), &FsLoader::default());
        if ws.has_errors() {
            continue;
        }
        ran += 1;
        let program = lmt::ir::compile(&ws);
        let cancel = Arc::new(AtomicBool::new(false));
        let mut vars = indexmap::IndexMap::new();
        for input in interp::inputs(&program) {
            vars.insert(input.name.clone(), lmt::interp::value::Value::str("fuzz"));
        }
        let opts = RunOptions { vars, seed, cancel: Some(cancel.clone()), ..Default::default() };
        // The watchdog: past the limit the case is cancelled, and fails.
        let done = Arc::new(AtomicBool::new(false));
        let watch = {
            let (cancel, done) = (cancel.clone(), done.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                while !done.load(Ordering::Relaxed) {
                    if t.elapsed() > CASE_LIMIT {
                        cancel.store(true, Ordering::Relaxed);
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                false
            })
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| interp::run(&program, &ws.sources, &model, &opts, &mut |_| {})));
        done.store(true, Ordering::Relaxed);
        let timed_out = watch.join().unwrap();
        let outcome = outcome.unwrap_or_else(|_| panic!("seed {seed}: the run panicked on:\n{text}"));
        assert!(!timed_out, "seed {seed}: the run took over {CASE_LIMIT:?} on:\n{text}");
        match outcome.error {
            None => clean += 1,
            Some(_) => errors += 1,
        }
    }
    println!("fuzz: {} cases, {ran} ran ({clean} to the end, {errors} with a runtime error) in {:.0?}", cases(), started.elapsed());
    assert!(ran > cases() / 10, "too few mutants ran ({ran}): the mutator lost its way");
}

#[test]
fn mutated_message_streams_never_stop_the_reader() {
    if in_limited_child("mutated_message_streams_never_stop_the_reader") {
        return;
    }
    use lmt::lsp::transport::{read_message, Incoming};
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#,
        r#"{"jsonrpc":"2.0","method":"textDocument/didOpen","params":{"textDocument":{"uri":"file:///a.lmt","languageId":"lmt","version":1,"text":"{% gen x %}"}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"textDocument/hover","params":{"textDocument":{"uri":"file:///a.lmt"},"position":{"line":0,"character":4}}}"#,
    ];
    let (mut messages, mut malformed) = (0u64, 0u64);
    for seed in first_seed()..first_seed() + cases() * 10 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut stream = String::new();
        for _ in 0..1 + rng.below(4) {
            let b = bodies[rng.below(bodies.len())];
            stream.push_str(&format!("Content-Length: {}\r\n\r\n{b}", b.len()));
        }
        for _ in 0..1 + rng.below(6) {
            apply(&mut stream, &rng.mutation());
        }
        let mut r = std::io::BufReader::new(stream.as_bytes());
        // Every read consumes input: the stream ends in bounded steps.
        for _ in 0..=stream.len() + 1 {
            match read_message(&mut r) {
                Ok(Incoming::Eof) => break,
                Ok(Incoming::Message(_)) => messages += 1,
                Ok(Incoming::Malformed { .. }) => malformed += 1,
                Err(e) => panic!("seed {seed}: an I/O error from memory: {e}"),
            }
        }
    }
    println!("fuzz: {} streams: {messages} messages, {malformed} malformed answered", cases() * 10);
}
