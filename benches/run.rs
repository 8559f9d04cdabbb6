//! The interpreter's model use, side by side in one run:
//!
//! 1. **Cache reuse**: the "six vehicles" program (Outlines #667) run by lmt
//!    on one KV state, against re-sending the whole prompt for each `gen`
//!    (how LmScript drives Outlines): the same greedy tokens, counted and timed.
//! 2. **Constraint overhead**: the same generation unconstrained, with a
//!    regex, and with a JSON Schema, on the same model (tokens/s).
//!
//! The model is Llama-shaped with random weights (written here as
//! safetensors, 8 layers, hidden 512) with the shared Llama-2 tokenizer
//! (32k vocabulary), or a tokenizer trained here when that is absent.
//!
//! `cargo bench --bench run`

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Instant;

use criterion::Criterion;
use lmt::interp::{self, RunOptions};
use lmt::model::{LoadOptions, Model};
use lmt::workspace::{FsLoader, Workspace};

const VEHICLES: &str = "Here are 6 vehicles, each with the length of its name:\n{% for i in range(6) -%}\n{{ i + 1 }}. {% gen vehicle[] stop=[\"\\n\", \" (\"] max_tokens=12 %} ({{ vehicle[-1] | trim | len }} letters)\n{% end %}";

fn model_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-run-model");
    let tok_src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/tokenizers/llama2/tokenizer.json");
    if !dir.join("model.safetensors").is_file() {
        std::fs::create_dir_all(&dir).unwrap();
        let tok = if tok_src.is_file() {
            tokenizers::Tokenizer::from_file(&tok_src).unwrap()
        } else {
            eprintln!("NOTE: shared Llama-2 tokenizer absent; using a small BPE vocabulary trained here");
            common::trained_byte_level()
        };
        let mut s = common::tiny::Spec::small("llama");
        s.hidden = 512;
        s.intermediate = 1376;
        s.layers = 8;
        s.heads = 8;
        s.kv_heads = 4;
        s.head_dim = 64;
        s.vocab = tok.get_vocab_size(true);
        s.write_hf(&dir);
        tok.save(dir.join("tokenizer.json"), false).unwrap();
    }
    dir
}

fn run(model: &Model, src: &str) -> lmt::state::Record {
    let ws = Workspace::load_text("bench.lmt", src, None, &FsLoader::default());
    assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
    let program = lmt::ir::compile(&ws);
    let out = interp::run(&program, &ws.sources, model, &RunOptions::default(), &mut |_| {});
    assert!(out.error.is_none(), "{:?}", out.error);
    out.state
}

/// The LmScript/Outlines way: for each gen, a fresh cache and the whole
/// prompt so far re-encoded, then the same greedy tokens generated.
/// Returns the tokens fed through the model.
fn resend(model: &Model, state: &lmt::state::Record) -> u64 {
    let tok = &model.tokenizer;
    let m = &model.decoder;
    let mut fed = 0u64;
    let mut prompt = String::new();
    let mut prev_end = 0;
    let text = state.text();
    for c in &state.captures {
        // The prompt before this value, and the value's own tokens.
        let at = text[prev_end..].find(&c.value.text).map_or(prev_end, |i| prev_end + i);
        prompt.push_str(&text[prev_end..at]);
        let ids: Vec<u32> = tok.bos.into_iter().chain(tok.encoder.encode_split(&prompt).unwrap()).collect();
        let mut st = m.new_state();
        let mut logits = m.append(&mut st, &ids).unwrap();
        fed += ids.len() as u64;
        for &t in &c.value.meta.tokens {
            let _ = lmt::model::log_softmax(&logits);
            logits = m.append(&mut st, &[t]).unwrap();
            fed += 1;
        }
        prompt.push_str(&c.value.text);
        prev_end = at + c.value.text.len();
    }
    fed
}

fn main() {
    let mut c = Criterion::default().sample_size(10).configure_from_args();
    let model = Model::load_path(&model_dir(), &LoadOptions::best_device()).unwrap();
    let state = run(&model, VEHICLES);
    let u = &state.usage;
    eprintln!(
        "six vehicles: lmt feeds {} tokens in {} passes (sequence {}, rewound {}); re-sending feeds {}",
        u.forward_tokens,
        u.forward_passes,
        u.sequence_tokens,
        u.rewound_tokens,
        resend(&model, &state)
    );
    let mut g = c.benchmark_group("six_vehicles");
    g.bench_function("lmt_one_kv_state", |b| b.iter(|| run(&model, VEHICLES)));
    g.bench_function("resend_prompt_per_gen", |b| b.iter(|| resend(&model, &state)));
    g.finish();

    // `partial=true`: a random model rarely closes the JSON value within
    // 48 tokens, and an unfinished value is otherwise the run's error.
    let programs = [
        ("unconstrained", "Write: {% gen x max_tokens=48 %}"),
        ("regex", "Write: {% gen x regex=\"[a-z ,.]{1,400}\" max_tokens=48 %}"),
        ("json_schema", "Write: {% gen x json={\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}} max_tokens=48 partial=true %}"),
    ];
    let mut g = c.benchmark_group("constraint_overhead");
    for (name, src) in programs {
        let s = run(&model, src);
        let u = &s.usage;
        eprintln!(
            "{name}: {} tokens ({} sampled, {} forced), mask {:.2} ms total, {:.3} ms/token of {:.1} ms/token",
            u.generated_tokens + u.forced_tokens,
            u.generated_tokens,
            u.forced_tokens,
            u.mask_ms,
            u.mask_ms / (u.generated_tokens.max(1) as f64),
            u.total_ms / ((u.generated_tokens + u.forced_tokens).max(1) as f64)
        );
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                let mut tokens = 0;
                for _ in 0..iters {
                    let s = run(&model, src);
                    tokens += s.usage.generated_tokens + s.usage.forced_tokens;
                }
                // Time per token, so runs that stop early compare fairly.
                t.elapsed().div_f64(tokens as f64 / iters as f64)
            })
        });
    }
    g.finish();
    c.final_summary();
}
