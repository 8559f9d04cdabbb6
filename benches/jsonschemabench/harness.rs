//! The JSONSchemaBench harness: every schema compiled with JSON Schema's
//! validation semantics (objects open, keys free to repeat, as llguidance
//! has them: like for like), each instance walked token by token through
//! the real masks, timed. Shared by the bench binary (`main.rs`) and its
//! test (`tests/bench_harness.rs`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use lmt::cli::matching::{walk, Walk};
use lmt::engine::{Constraint, Limits, Semantics, Vocab, Whitespace};
use lmt::model::tokenizer::TextEncoder;

/// Every schema file in `dir`, compiled and walked with its valid and
/// invalid instances through `tokenizer`; one summary (JSON and text).
pub fn bench(dir: &Path, tokenizer: &Path) -> Result<(serde_json::Value, String), String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let limits = Limits::default();
    let (vocab, tok) = Vocab::load(tokenizer).map_err(|e| e.to_string())?;
    let enc = TextEncoder::new(&tok);
    let (mut compiled, mut compile_ms, mut mask_us) = (0usize, Vec::new(), Vec::new());
    let mut reasons: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    let (mut valid_ok, mut valid_n, mut invalid_ok, mut invalid_n) = (0, 0, 0, 0);
    let mut failures: Vec<String> = Vec::new();
    // The slowest masks (µs, file, token index) and compiles (ms, file).
    let mut slowest: Vec<(f64, String, usize)> = Vec::new();
    let mut slowest_compiles: Vec<(f64, String, usize)> = Vec::new();
    for f in &files {
        let doc: serde_json::Value = match std::fs::read_to_string(f).ok().and_then(|t| serde_json::from_str(&t).ok()) {
            Some(d) => d,
            None => {
                reasons.entry("file is not JSON".into()).or_insert((0, f.display().to_string())).0 += 1;
                continue;
            }
        };
        let t0 = Instant::now();
        let c = match Constraint::json_schema(&doc["schema"], Whitespace::Any, Semantics::Validation, &limits).map(Constraint::allowing_repeated_keys) {
            Ok(c) => c,
            Err(e) => {
                let reason = e.to_string();
                let key = reason.split(':').take(2).collect::<Vec<_>>().join(":");
                let example = format!("{}: {}", f.file_name().unwrap_or_default().to_string_lossy(), truncate(&reason, 160));
                reasons.entry(key).or_insert((0, example)).0 += 1;
                continue;
            }
        };
        let name = f.file_name().unwrap_or_default().to_string_lossy().into_owned();
        compile_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        keep_slowest(&mut slowest_compiles, (t0.elapsed().as_secs_f64() * 1e3, name.clone(), 0));
        compiled += 1;
        for t in doc["tests"].as_array().into_iter().flatten() {
            let valid = t["valid"].as_bool().unwrap_or(false);
            let text = serde_json::to_string(&t["data"]).map_err(|e| e.to_string())?;
            let ids = enc.encode(&text)?;
            let mut m = c.matcher(&limits);
            let before = mask_us.len();
            let result = walk(&mut m, &vocab, &ids, &mut mask_us);
            for (k, &us) in mask_us[before..].iter().enumerate() {
                keep_slowest(&mut slowest, (us, name.clone(), k));
            }
            let accepted = match result {
                Ok(Walk::Accepted { .. }) => true,
                Ok(_) => false,
                Err(e) => {
                    failures.push(format!("{}: {e}", f.display()));
                    false
                }
            };
            if valid {
                valid_n += 1;
                valid_ok += accepted as usize;
                if !accepted && failures.len() < 20 {
                    failures.push(format!("{}: valid instance refused: {}", f.display(), truncate(&text, 120)));
                }
            } else {
                invalid_n += 1;
                invalid_ok += !accepted as usize;
                if accepted && failures.len() < 20 {
                    failures.push(format!("{}: invalid instance accepted: {}", f.display(), truncate(&text, 120)));
                }
            }
        }
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let summary = serde_json::json!({
        "schemas": files.len(),
        "compiled": compiled,
        "compile_errors": files.len() - compiled,
        "compile_ms_p50": round(pct(&mut compile_ms, 0.5)),
        "compile_ms_p99": round(pct(&mut compile_ms, 0.99)),
        "mask_count": mask_us.len(),
        "mask_us_p50": round(pct(&mut mask_us, 0.5)),
        "mask_us_p90": round(pct(&mut mask_us, 0.9)),
        "mask_us_p99": round(pct(&mut mask_us, 0.99)),
        "mask_us_max": round(pct(&mut mask_us, 1.0)),
        "valid_accepted": valid_ok,
        "valid_total": valid_n,
        "invalid_rejected": invalid_ok,
        "invalid_total": invalid_n,
    });
    let mut text = String::new();
    let s = &summary;
    text.push_str(&format!(
        "schemas {}: compiled {}, compile errors {}\ncompile ms p50 {} p99 {}\nmasks {}: µs p50 {} p90 {} p99 {} max {}\nvalid accepted {}/{}, invalid rejected {}/{}\n",
        s["schemas"], s["compiled"], s["compile_errors"], s["compile_ms_p50"], s["compile_ms_p99"], s["mask_count"],
        s["mask_us_p50"], s["mask_us_p90"], s["mask_us_p99"], s["mask_us_max"], valid_ok, valid_n, invalid_ok, invalid_n
    ));
    if !reasons.is_empty() {
        text.push_str("compile errors by reason:\n");
        let mut by: Vec<_> = reasons.into_iter().collect();
        by.sort_by_key(|e| std::cmp::Reverse(e.1 .0));
        for (r, (n, example)) in by {
            text.push_str(&format!("  {n:4}  {r}\n        e.g. {example}\n"));
        }
    }
    text.push_str("slowest compiles:\n");
    for (ms, file, _) in &slowest_compiles {
        text.push_str(&format!("  {ms:10.1} ms  {file}\n"));
    }
    text.push_str("slowest masks:\n");
    for (us, file, k) in &slowest {
        text.push_str(&format!("  {us:10.1} µs  {file} token {k}\n"));
    }
    for f in failures {
        text.push_str(&format!("  {f}\n"));
    }
    Ok((summary, text))
}

/// Keeps the five largest entries of `top`, largest first.
fn keep_slowest(top: &mut Vec<(f64, String, usize)>, entry: (f64, String, usize)) {
    if top.len() < 5 || entry.0 > top[top.len() - 1].0 {
        top.push(entry);
        top.sort_by(|a, b| b.0.total_cmp(&a.0));
        top.truncate(5);
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn truncate(s: &str, n: usize) -> String {
    let cut = lmt::span::floor_char_boundary(s, n);
    if cut < s.len() {
        format!("{}…", &s[..cut])
    } else {
        s.to_string()
    }
}
