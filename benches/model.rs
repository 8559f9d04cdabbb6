//! lmt's decoder against candle-transformers' `quantized_llama`, side by
//! side in one run, on a TinyLlama-1.1B-shaped model with random weights
//! that this bench generates (Q8_0 and Q4_K GGUF files, cached under the
//! target directory). Measures prefill and decode tokens/s, and prints the
//! memory-bandwidth limit for decode (weight bytes read per token over the
//! bandwidth measured here) so the figures can be read as a share of it.
//!
//! `cargo bench --bench model` (all of it: several minutes on 2 cores);
//! `LMT_BENCH_SMALL=1` uses a model 1/4 the width, for a quick look.

#[path = "../tests/common/tiny.rs"]
mod tiny;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use criterion::{BenchmarkId, Criterion, Throughput};
use lmt::model::Decoder;

const PREFILL: usize = 64;
/// Decode steps before the context is reset (untimed), so every decode
/// step runs at a context of 64 to 96 tokens for both implementations.
const DECODE_SPAN: usize = 32;

fn spec() -> tiny::Spec {
    let mut s = tiny::Spec::tinyllama();
    if std::env::var_os("LMT_BENCH_SMALL").is_some() {
        s.hidden /= 4;
        s.intermediate = 1536;
        s.heads /= 4;
    }
    s
}

/// The GGUF file for `ty`, generated once and kept.
fn model_file(ty: GgmlDType) -> PathBuf {
    let s = spec();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-models");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("llama-{}x{}-{ty:?}.gguf", s.hidden, s.layers));
    if !path.is_file() {
        eprintln!("generating {} (once)…", path.display());
        let t = Instant::now();
        let tmp = path.with_extension("part");
        s.write_gguf(&tmp, ty);
        std::fs::rename(&tmp, &path).unwrap();
        eprintln!("  done in {:.1?}", t.elapsed());
    }
    path
}

fn baseline(path: &Path) -> ModelWeights {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap()
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + salt * 104_729) % 32000).collect()
}

/// Read bandwidth of this machine in bytes/s: every core summing its share
/// of a buffer far larger than the caches.
fn bandwidth() -> f64 {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let buf: Vec<u64> = (0..(1usize << 27)).map(|i| i as u64).collect(); // 1 GiB
    let chunk = buf.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = buf.chunks(chunk).map(|c| s.spawn(move || c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (buf.len() * 8) as f64 / best
}

fn main() {
    let mut c = Criterion::default().configure_from_args().sample_size(10).warm_up_time(Duration::from_secs(1));
    let bw = bandwidth();
    eprintln!("read bandwidth: {:.1} GB/s ({} threads)", bw / 1e9, std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    for ty in [GgmlDType::Q8_0, GgmlDType::Q4K] {
        let path = model_file(ty);
        let ours = Decoder::load(&path, &Device::Cpu).unwrap();
        let mut theirs = baseline(&path);
        let per_token = ours.weight_bytes() as f64;
        eprintln!(
            "{ty:?}: {:.0} MB of weights read per decoded token → bandwidth limit {:.1} tokens/s",
            per_token / 1e6,
            bw / per_token
        );
        let prompt = tokens(PREFILL, 1);
        let mut g = c.benchmark_group(format!("prefill-{ty:?}"));
        g.throughput(Throughput::Elements(PREFILL as u64));
        g.bench_function(BenchmarkId::new("lmt", PREFILL), |b| {
            b.iter(|| ours.append(&mut ours.new_state(), &prompt).unwrap())
        });
        g.bench_function(BenchmarkId::new("candle-quantized_llama", PREFILL), |b| {
            let x = Tensor::new(prompt.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            b.iter(|| theirs.forward(&x, 0).unwrap())
        });
        g.finish();

        let steps = tokens(DECODE_SPAN, 2);
        let mut g = c.benchmark_group(format!("decode-{ty:?}"));
        g.throughput(Throughput::Elements(1));
        g.bench_function("lmt", |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut st = ours.new_state();
                for i in 0..iters as usize {
                    if i % DECODE_SPAN == 0 {
                        st = ours.new_state();
                        ours.append(&mut st, &prompt).unwrap();
                    }
                    let t = Instant::now();
                    std::hint::black_box(ours.append(&mut st, &[steps[i % DECODE_SPAN]]).unwrap());
                    spent += t.elapsed();
                }
                spent
            })
        });
        g.bench_function("candle-quantized_llama", |b| {
            let x = Tensor::new(prompt.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for i in 0..iters as usize {
                    if i % DECODE_SPAN == 0 {
                        // Position 0 resets its cache.
                        theirs.forward(&x, 0).unwrap();
                    }
                    let step = Tensor::new(&[steps[i % DECODE_SPAN]], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
                    let t = Instant::now();
                    std::hint::black_box(theirs.forward(&step, PREFILL + i % DECODE_SPAN).unwrap());
                    spent += t.elapsed();
                }
                spent
            })
        });
        g.finish();
    }
    c.final_summary();
}
