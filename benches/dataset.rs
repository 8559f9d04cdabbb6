//! Dataset runs at `--parallel` 1, 4 and 8 side by side in one run: the
//! extraction template `examples/reviews.lmt` (a shared few-shot prefix,
//! then a JSON value held to a schema) over the 64 rows of
//! `benches/data/reviews64.jsonl`, greedy, through the `lmt` binary as a
//! user runs it. For each level: rows/s (the median of
//! `LMT_BENCH_REPEATS` runs, default 3, the levels alternating, since this
//! kind of machine changes speed from minute to minute), its ratio to
//! `--parallel 1`, the forward tokens (the rows' own, then the shared
//! prefix computed once) and the batched passes; and whether every run
//! wrote the same records as the first `--parallel 1` one (exit status 1
//! when not).
//!
//! ```text
//! cargo bench --bench dataset -- [FILE.gguf …]
//! ```
//! Files: the arguments, else the SmolLM2 Q4_1 file of the tests
//! (`../shared/scripts/fetch-smollm2.sh`). Threads: `LMT_BENCH_THREADS`
//! (default 2), the same at every level.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const LEVELS: [usize; 3] = [1, 4, 8];

fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What one run's summary line and records say.
struct Run {
    rows_per_s: f64,
    /// Forward tokens of the rows, then of the shared prefix.
    forward: (u64, u64),
    passes: u64,
    /// Per row id: its text, captures and error, as written.
    records: BTreeMap<String, String>,
}

/// The number just before `unit` in `line` (`"15.24 rows/s"`).
fn number_before(line: &str, unit: &str) -> Option<f64> {
    let head = &line[..line.find(unit)?];
    head.split_whitespace().last()?.replace(',', "").parse().ok()
}

/// One `lmt run` of the template over the rows at `--parallel p`.
fn run(lmt: &Path, model: &Path, p: usize, threads: usize, out: &Path) -> Result<Run, String> {
    let _ = std::fs::remove_file(out);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(lmt)
        .args(["run", "examples/reviews.lmt", "--inputs", "benches/data/reviews64.jsonl"])
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(["--parallel", &p.to_string(), "--threads", &threads.to_string()])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", lmt.display()))?;
    let err = String::from_utf8_lossy(&output.stderr);
    let line = err.lines().rev().find(|l| l.contains("rows/s")).ok_or_else(|| format!("no summary line: {err}"))?;
    if !output.status.success() {
        return Err(format!("`lmt run` failed: {line}"));
    }
    let field = |unit: &str| number_before(line, unit).ok_or_else(|| format!("no `{unit}` in {line:?}"));
    let text = std::fs::read_to_string(out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
    let mut records = BTreeMap::new();
    for l in text.lines() {
        let r: serde_json::Value = serde_json::from_str(l).map_err(|e| format!("a record is not JSON: {e}"))?;
        let id = r["id"].to_string();
        records.insert(id, format!("{} {} {}", r["text"], r["captures"], r["error"]));
    }
    Ok(Run {
        rows_per_s: field("rows/s")?,
        forward: (field("forward tokens")? as u64, field("shared prefix")? as u64),
        passes: field("batched passes")? as u64,
        records,
    })
}

fn main() {
    let threads = env_usize("LMT_BENCH_THREADS", 2);
    let repeats = env_usize("LMT_BENCH_REPEATS", 3).max(1);
    let lmt = PathBuf::from(env!("CARGO_BIN_EXE_lmt"));
    let mut files: Vec<PathBuf> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).map(PathBuf::from).collect();
    if files.is_empty() {
        let home = PathBuf::from(std::env::var("HOME").unwrap_or_default());
        files.push(home.join(".cache/lmt-test-models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    }
    let out = std::env::temp_dir().join(format!("lmt-bench-dataset-{}.jsonl", std::process::id()));
    let mut table = Vec::new();
    let mut all_same = true;
    for file in &files {
        if !file.is_file() {
            eprintln!("SKIPPED {}: no such file (../shared/scripts/fetch-smollm2.sh fetches it)", file.display());
            continue;
        }
        let name = file.file_name().unwrap_or_default().to_string_lossy().to_string();
        let mut runs: [Vec<Run>; LEVELS.len()] = Default::default();
        for _ in 0..repeats {
            for (i, p) in LEVELS.into_iter().enumerate() {
                match run(&lmt, file, p, threads, &out) {
                    Ok(r) => {
                        eprintln!("{name}: --parallel {p}: {:.2} rows/s", r.rows_per_s);
                        runs[i].push(r);
                    }
                    Err(e) => {
                        eprintln!("{name}: --parallel {p}: {e}");
                        std::process::exit(1);
                    }
                }
            }
        }
        let first = &runs[0][0].records;
        let same = runs.iter().flatten().all(|r| &r.records == first);
        all_same &= same;
        let one = median(runs[0].iter().map(|r| r.rows_per_s).collect());
        let mut row = vec![name];
        for level in &runs {
            let rate = median(level.iter().map(|r| r.rows_per_s).collect());
            let all: Vec<String> = level.iter().map(|r| format!("{:.1}", r.rows_per_s)).collect();
            let (own, shared) = level[0].forward;
            row.push(format!("{rate:.2} ({:.2}×; {}) · {own} + {shared} · {}", rate / one, all.join(" "), level[0].passes));
        }
        row.push(if same { "yes".into() } else { "**no**".into() });
        table.push(row);
    }
    let _ = std::fs::remove_file(&out);
    println!("\n{threads} threads; rows/s, median of {repeats} (× `--parallel 1`; each run) · forward tokens (rows + shared prefix) · batched passes\n");
    println!("| file | `--parallel 1` | `--parallel 4` | `--parallel 8` | same records |");
    println!("|---|---|---|---|---|");
    for r in table {
        println!("| {} |", r.join(" | "));
    }
    if !all_same {
        eprintln!("the records differ between runs: the same seed must give the same records at every --parallel");
        std::process::exit(1);
    }
}
