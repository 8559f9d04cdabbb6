//! lmt's CPU runtime against llama.cpp, side by side in one run, on the
//! same GGUF files and thread count: prefill tokens/s at 128 and 512
//! tokens, greedy decode tokens/s after a short prompt and after 384
//! tokens of context, and batched decode of 1, 4, 8 and 16 sequences
//! (lmt's `Decoder::append_batch`; llama.cpp's `llama_decode` of one token
//! per sequence id, `benches/llama_cpp/batched.cpp`, compiled here once).
//! Prints a Markdown table (and each measurement as it goes).
//!
//! ```text
//! cargo bench --bench runtime -- [FILE.gguf …]
//! ```
//! Files: the arguments, else every `.gguf` in `$LMT_BENCH_MODELS`
//! (default `~/.cache/lmt-bench-models`) plus the SmolLM2 Q4_1 file of the
//! tests. `LMT_BENCH_TINYLLAMA=1` first writes a TinyLlama-1.1B-shaped
//! Q8_0 file (random weights, the Llama-2 tokenizer) there, and a Q4_K_M
//! one by llama.cpp's quantizer; `LMT_BENCH_LOWBIT=1` has llama.cpp's
//! quantizer (`benches/llama_cpp/quantize.cpp`) write SmolLM2 Q3_K_M and
//! Q2_K files there from the Q4_1 one. The baseline is the `bench` harness of
//! `../shared/scripts/llama-cpp/build.sh` (`$LMT_LLAMA_CPP`, default
//! `~/.cache/lmt-llama-cpp`); without it, lmt runs alone. Threads:
//! `LMT_BENCH_THREADS` (default 2). Each figure is the median of
//! `LMT_BENCH_REPEATS` (default 3) runs, the two programs alternating.
//! `LMT_BENCH_PROFILE_BATCH=N` runs only lmt's batched decode of `N`
//! sequences, `LMT_BENCH_REPEATS` times (to profile it);
//! `LMT_BENCH_PROFILE_PREFILL=N` likewise only lmt's prefill of `N` tokens,
//! `LMT_BENCH_PROFILE_DEEP=1` only its decode after `DEEP` tokens (`=N`,
//! N > 1: after N tokens, past what llama.cpp's harness takes).

#[path = "../tests/common/tiny.rs"]
mod tiny;
#[allow(dead_code)]
#[path = "../tests/common/gguf_vocab.rs"]
mod gguf_vocab;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use candle_core::quantized::GgmlDType;
use lmt::model::{Decoder, KvState, LoadOptions, Model};

const DECODE: usize = 64;
const DECODE_PROMPT: &str = "The capital of France is";
/// The context before the second decode figure (the TinyLlama-shaped
/// files hold 512 positions).
const DEEP: usize = 384;

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(default))
}

fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Words until the model's tokenizer counts `n` tokens (the same text goes
/// to llama.cpp, which tokenizes it the same way; its count is printed).
fn text_of(model: &Model, n: usize) -> String {
    const WORDS: &str = "the history of the city began when traders from the north settled along the river and \
        built a market that grew into a port where ships from many countries brought wool grain and \
        stories which the people wrote down in long books kept in the old library near the square";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut text = String::new();
    for i in 0.. {
        let next = format!("{}{}", if text.is_empty() { "" } else { " " }, words[i % words.len()]);
        let longer = format!("{text}{next}");
        if model.tokenizer.encoder.encode(&longer).map_or(usize::MAX, |t| t.len()) > n {
            break;
        }
        text = longer;
    }
    text
}

/// The first index of the largest logit: the largest value by sixteen
/// running maxima (a loop the compiler vectorises), then its first place
/// (the llama.cpp harness does the same, `benches/llama_cpp/batched.cpp`).
/// Eight sequences' argmaxes are a fair share of a batched step.
fn argmax(l: &[f32]) -> u32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = l.chunks_exact(16);
    for c in chunks.clone() {
        for i in 0..16 {
            m[i] = m[i].max(c[i]);
        }
    }
    let top = chunks.remainder().iter().chain(&m).copied().fold(f32::NEG_INFINITY, f32::max);
    l.iter().position(|&v| v == top).unwrap_or(0) as u32
}

fn lmt_prefill(m: &Decoder, ids: &[u32]) -> f64 {
    let mut st = m.new_state();
    let t = Instant::now();
    m.append(&mut st, ids).unwrap();
    ids.len() as f64 / t.elapsed().as_secs_f64()
}

fn lmt_decode(m: &Decoder, prompt: &[u32]) -> f64 {
    let mut st = m.new_state();
    let mut tok = argmax(&m.append(&mut st, prompt).unwrap());
    let t = Instant::now();
    for _ in 0..DECODE {
        tok = argmax(&m.append(&mut st, &[tok]).unwrap());
    }
    DECODE as f64 / t.elapsed().as_secs_f64()
}

/// Tokens/s of `n` sequences decoded together (32 steps after distinct
/// prompts).
fn lmt_batched(m: &Decoder, prompt: &[u32], n: usize) -> f64 {
    let mut states: Vec<KvState> = (0..n).map(|_| m.new_state()).collect();
    let mut next: Vec<Vec<u32>> = Vec::new();
    for (i, st) in states.iter_mut().enumerate() {
        let mut p = prompt.to_vec();
        p.push(100 + i as u32);
        next.push(vec![argmax(&m.append(st, &p).unwrap())]);
    }
    let steps = 32;
    let t = Instant::now();
    for _ in 0..steps {
        let mut refs: Vec<&mut KvState> = states.iter_mut().collect();
        let chunks: Vec<&[u32]> = next.iter().map(Vec::as_slice).collect();
        let logits = m.append_batch(&mut refs, &chunks).unwrap();
        next = logits.iter().map(|l| vec![argmax(l)]).collect();
    }
    (n * steps) as f64 / t.elapsed().as_secs_f64()
}

/// llama.cpp's `bench` on `text`: (tokens, prefill tok/s, decode tok/s).
fn llama_cpp(bench: &Path, file: &Path, n_gen: usize, threads: usize, text: &str) -> Option<(usize, f64, f64)> {
    let out = Command::new(bench).arg(file).arg(n_gen.to_string()).arg(threads.to_string()).arg(text).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!("llama.cpp's bench failed: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or(""));
    }
    let field = |line: &str, key: &str| -> Option<f64> {
        let at = line.find(key)? + key.len();
        line[at..].split_whitespace().next()?.parse().ok()
    };
    let pre = s.lines().find(|l| l.contains("prefill"))?;
    let dec = s.lines().find(|l| l.contains("decode"))?;
    let tokens = pre.split_whitespace().nth(2)?.parse().ok()?;
    Some((tokens, field(pre, "= ")?, field(dec, "= ")?))
}

/// One of lmt's llama.cpp harnesses (`benches/llama_cpp/NAME.cpp`: the
/// batched decode, the quantizer of low-bit mixes), compiled once beside
/// the `bench` harness against its library; `None` when that fails (lmt's
/// figures then stand alone).
fn harness(llama_dir: &Path, name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("benches/llama_cpp/{name}.cpp"));
    let bin = llama_dir.join(format!("lmt-{name}"));
    let stale = |b: &Path| -> bool {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        m(b).is_none() || m(b) < m(&src)
    };
    if stale(&bin) {
        let d = |s: &str| llama_dir.join(s).display().to_string();
        let built = Command::new("g++")
            .args(["-O2", "-std=c++17"])
            .arg(&src)
            .args(["-I", &d("src/include"), "-I", &d("src/ggml/include"), "-L", &d("build/bin")])
            .args(["-lllama", "-lggml", "-lggml-base"])
            .arg(format!("-Wl,-rpath,{}", d("build/bin")))
            .arg("-o")
            .arg(&bin)
            .status()
            .is_ok_and(|s| s.success());
        if !built {
            eprintln!("could not build {}: no llama.cpp {name} harness", src.display());
            return None;
        }
    }
    Some(bin)
}

/// llama.cpp's batched decode of `n` sequences: tokens/s.
fn llama_cpp_batched(harness: &Path, file: &Path, n: usize, threads: usize) -> Option<f64> {
    let out = Command::new(harness).arg(file).arg(n.to_string()).arg("32").arg(threads.to_string()).arg(DECODE_PROMPT).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    let line = s.lines().find(|l| l.contains("tok/s"))?;
    line.split("= ").nth(1)?.split_whitespace().next()?.parse().ok()
}

/// The TinyLlama-shaped files (Q8_0 written here, Q4_K_M by llama.cpp).
fn tinyllama_files(dir: &Path, llama: Option<&Path>) {
    let q8 = dir.join("tinyllama-1.1b-random-q8_0.gguf");
    if !q8.is_file() {
        let tok_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/tokenizers/llama2");
        let tok = tokenizers::Tokenizer::from_file(tok_dir.join("tokenizer.json")).expect("the shared Llama-2 tokenizer");
        let spec = tiny::Spec::tinyllama().with_tokenizer(&tok);
        eprintln!("writing {} (once)…", q8.display());
        let tmp = q8.with_extension("part");
        spec.write_gguf_with(&tmp, GgmlDType::Q8_0, gguf_vocab::metadata(&tok_dir, gguf_vocab::Kind::SpmHf));
        std::fs::rename(&tmp, &q8).unwrap();
    }
    let q4 = dir.join("tinyllama-1.1b-random-q4_k_m.gguf");
    if let (false, Some(l)) = (q4.is_file(), llama) {
        let ok = Command::new(l.join("quantize")).arg(&q8).arg(&q4).arg("q4_k_m").output().is_ok_and(|o| o.status.success());
        assert!(ok, "llama.cpp's quantize failed on {}", q8.display());
    }
}

/// SmolLM2's Q3_K_M and Q2_K mixes, made once by llama.cpp's quantizer
/// from the shipped Q4_1 file (requantized: for speed, not quality).
fn low_bit_files(q4_1: &Path, dir: &Path, quantize: Option<&Path>) {
    let Some(quantize) = quantize else {
        eprintln!("no llama.cpp quantizer: no low-bit files");
        return;
    };
    for ty in ["q3_k_m", "q2_k"] {
        let out = dir.join(format!("smollm2-{ty}.gguf"));
        if !out.is_file() {
            let ok = Command::new(quantize).arg(q4_1).arg(&out).arg(ty).output().is_ok_and(|o| o.status.success());
            assert!(ok, "llama.cpp's quantizer failed to write {}", out.display());
        }
    }
}

fn main() {
    let threads = env_usize("LMT_BENCH_THREADS", 2);
    let repeats = env_usize("LMT_BENCH_REPEATS", 3).max(1);
    let llama_dir = env_path("LMT_LLAMA_CPP", ".cache/lmt-llama-cpp");
    let bench = llama_dir.join("bench");
    let baseline = bench.is_file().then_some(bench.as_path());
    if baseline.is_none() {
        eprintln!("no llama.cpp baseline at {} (../shared/scripts/llama-cpp/build.sh): lmt alone", bench.display());
    }
    let batched_baseline = baseline.and_then(|_| harness(&llama_dir, "batched"));
    let models_dir = env_path("LMT_BENCH_MODELS", ".cache/lmt-bench-models");
    let smol = env_path("LMT_TEST_MODELS", ".cache/lmt-test-models").join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if std::env::var("LMT_BENCH_LOWBIT").is_ok_and(|v| v == "1") && smol.is_file() {
        std::fs::create_dir_all(&models_dir).unwrap();
        low_bit_files(&smol, &models_dir, baseline.and_then(|_| harness(&llama_dir, "quantize")).as_deref());
    }
    let mut files: Vec<PathBuf> =
        std::env::args().skip(1).filter(|a| !a.starts_with("--")).map(PathBuf::from).collect();
    if files.is_empty() {
        std::fs::create_dir_all(&models_dir).unwrap();
        if std::env::var("LMT_BENCH_TINYLLAMA").is_ok_and(|v| v == "1") {
            tinyllama_files(&models_dir, baseline.map(|_| llama_dir.as_path()));
        }
        files.extend(smol.is_file().then_some(smol));
        let mut more: Vec<PathBuf> = std::fs::read_dir(&models_dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "gguf")).collect())
            .unwrap_or_default();
        more.sort();
        files.extend(more);
    }
    let mut rows = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let model = Model::load_path(file, &LoadOptions { threads, ..LoadOptions::default() }).unwrap();
        let m = &model.decoder;
        if let Some(n) = std::env::var("LMT_BENCH_PROFILE_BATCH").ok().and_then(|v| v.parse().ok()) {
            // Only batched decode of `n` sequences, over and over (for a profiler).
            let prompt = model.tokenizer.encoder.encode(DECODE_PROMPT).unwrap();
            for _ in 0..repeats {
                eprintln!("{name}: {n} sequences {:.1} tok/s", lmt_batched(m, &prompt, n));
            }
            continue;
        }
        if let Some(deep) = std::env::var("LMT_BENCH_PROFILE_DEEP").ok().and_then(|v| v.parse::<usize>().ok()) {
            // `1` is the table's depth; a larger figure, that many tokens.
            let deep = if deep <= 1 { DEEP } else { deep };
            let text = format!("{} {DECODE_PROMPT}", text_of(&model, deep));
            let prompt = model.tokenizer.encoder.encode(&text).unwrap();
            for _ in 0..repeats {
                eprintln!("{name}: deep decode {:.1} tok/s", lmt_decode(m, &prompt));
            }
            continue;
        }
        if let Some(n) = std::env::var("LMT_BENCH_PROFILE_PREFILL").ok().and_then(|v| v.parse().ok()) {
            let ids = model.tokenizer.encoder.encode(&text_of(&model, n)).unwrap();
            for _ in 0..repeats {
                eprintln!("{name}: prefill {} tokens {:.1} tok/s", ids.len(), lmt_prefill(m, &ids));
            }
            continue;
        }
        let mut row = vec![name.clone()];
        for n in [128, 512] {
            let text = text_of(&model, n);
            let ids = model.tokenizer.encoder.encode(&text).unwrap();
            lmt_prefill(m, &ids[..ids.len().min(16)]); // warm the caches and threads
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let mut their_n = 0;
            for _ in 0..repeats {
                ours.push(lmt_prefill(m, &ids));
                if let Some((t, p, _)) = baseline.and_then(|b| llama_cpp(b, file, 1, threads, &text)) {
                    their_n = t;
                    theirs.push(p);
                }
            }
            row.push(cell(median(ours), theirs));
            eprintln!("{name}: prefill {} tokens (llama.cpp: {their_n}) done", ids.len());
        }
        // Decode after a short prompt, then after 512 tokens of context
        // (where attention reads a long cache).
        for text in [DECODE_PROMPT.to_string(), format!("{} {DECODE_PROMPT}", text_of(&model, DEEP))] {
            let prompt = model.tokenizer.encoder.encode(&text).unwrap();
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..repeats {
                ours.push(lmt_decode(m, &prompt));
                if let Some((_, _, d)) = baseline.and_then(|b| llama_cpp(b, file, DECODE, threads, &text)) {
                    theirs.push(d);
                }
            }
            row.push(cell(median(ours), theirs));
        }
        let prompt = model.tokenizer.encoder.encode(DECODE_PROMPT).unwrap();
        // Medians of `repeats` runs, the sizes and programs alternating
        // (this machine's speed drifts over seconds).
        let sizes = [1, 4, 8, 16];
        let (mut runs, mut theirs): ([Vec<f64>; 4], [Vec<f64>; 4]) = Default::default();
        for _ in 0..repeats {
            for (i, n) in sizes.into_iter().enumerate() {
                runs[i].push(lmt_batched(m, &prompt, n));
                if let Some(t) = batched_baseline.as_deref().and_then(|h| llama_cpp_batched(h, file, n, threads)) {
                    theirs[i].push(t);
                }
            }
        }
        let ours = runs.map(median);
        let mut batched = String::new();
        for (i, theirs) in theirs.into_iter().enumerate() {
            let sep = if i == 0 { "" } else { " · " };
            batched.push_str(&format!("{sep}{} ({:.1}× one)", cell(ours[i], theirs), ours[i] / ours[0]));
        }
        row.push(batched);
        eprintln!("{}", row.join(" | "));
        rows.push(row);
    }
    println!("\n{threads} threads; lmt / llama.cpp tok/s (ratio), median of {repeats}\n");
    println!("| file | prefill 128 | prefill 512 | decode {DECODE} | decode {DECODE} after {DEEP} | batched decode of 1 · 4 · 8 · 16 sequences |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
}

fn cell(ours: f64, theirs: Vec<f64>) -> String {
    if theirs.is_empty() {
        return format!("{ours:.0}");
    }
    let t = median(theirs);
    format!("{ours:.0} / {t:.0} ({:.2}×)", ours / t)
}
