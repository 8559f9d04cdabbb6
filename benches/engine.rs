//! lmt's grammar engine against llguidance, side by side in one run, on the
//! same JSON Schemas (JSONSchemaBench, `../shared/data/jsonschema`), the same
//! regexes, the same tokenizer (Llama-3, 128k) and the same token
//! sequences. llguidance gets a token environment built from lmt's own byte
//! table, so both see exactly the same vocabulary.
//!
//! `cargo bench --bench engine` prints the distribution table (compile and
//! per-mask p50/p99, the MaskBench measures), then criterion's timings.
//! Needs the shared data; says so and stops when it is missing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use criterion::Criterion;
use lmt::engine::{Constraint, Limits, Semantics, TokenKind, TokenMask, Vocab, Whitespace};
use lmt::model::tokenizer::TextEncoder;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

fn data_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LMT_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data")));
    dir.is_dir().then_some(dir)
}

/// llguidance's token environment from lmt's byte table: special tokens
/// carry llguidance's 0xFF marker.
fn llg_env(v: &Vocab) -> TokEnv {
    let words: Vec<Vec<u8>> = (0..v.len() as u32)
        .map(|i| match v.kind(i) {
            TokenKind::Special => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], v.bytes(i)].concat(),
            TokenKind::Unused => Vec::new(),
            _ => v.bytes(i).to_vec(),
        })
        .collect();
    let info = TokRxInfo::new(v.len() as u32, v.eos()[0]);
    Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)))
}

struct Stats {
    compiled: usize,
    compile_ms: Vec<f64>,
    mask_us: Vec<f64>,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One schema's valid instances as token sequences.
struct Case {
    schema: serde_json::Value,
    instances: Vec<Vec<u32>>,
}

fn load_cases(dir: &std::path::Path, enc: &TextEncoder) -> Vec<Case> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .filter_map(|f| {
            let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()?;
            let instances = doc["tests"]
                .as_array()?
                .iter()
                .filter(|t| t["valid"].as_bool() == Some(true))
                .map(|t| enc.encode(&serde_json::to_string(&t["data"]).unwrap()).unwrap())
                .collect();
            Some(Case { schema: doc["schema"].clone(), instances })
        })
        .collect()
}

/// Compiles every case (timing it) and, for cases selected by `only`, walks
/// each valid instance with `walk`, which times one mask per token into the
/// vector it is given and stops at the first token refused.
fn run<C>(
    cases: &[Case],
    only: Option<&[bool]>,
    mut compile: impl FnMut(&serde_json::Value) -> Option<C>,
    mut walk: impl FnMut(&C, &[u32], &mut Vec<f64>),
) -> (Stats, Vec<bool>) {
    let mut s = Stats { compiled: 0, compile_ms: Vec::new(), mask_us: Vec::new() };
    let mut ok = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let t0 = Instant::now();
        let Some(compiled) = compile(&c.schema) else {
            ok.push(false);
            continue;
        };
        s.compile_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        s.compiled += 1;
        ok.push(true);
        if only.is_some_and(|o| !o[i]) {
            continue;
        }
        for toks in &c.instances {
            walk(&compiled, toks, &mut s.mask_us);
        }
    }
    (s, ok)
}

fn run_lmt(cases: &[Case], vocab: &Vocab, only: Option<&[bool]>) -> (Stats, Vec<bool>) {
    let limits = Limits::default();
    let mut mask = TokenMask::new(vocab.len());
    let compile = |schema: &serde_json::Value| Constraint::json_schema(schema, Whitespace::Any, Semantics::Validation, &limits).ok().map(Constraint::allowing_repeated_keys);
    run(cases, only, compile, |cons, toks, times| {
        let mut m = cons.matcher(&limits);
        for &t in toks {
            let t0 = Instant::now();
            m.mask(vocab, &mut mask).unwrap();
            times.push(t0.elapsed().as_secs_f64() * 1e6);
            if !mask.get(t) || !m.feed(vocab.bytes(t)).unwrap() {
                break;
            }
        }
    })
}

fn run_llg(cases: &[Case], factory: &llguidance::ParserFactory, only: Option<&[bool]>) -> (Stats, Vec<bool>) {
    let compile = |schema: &serde_json::Value| {
        let grammar = llguidance::api::TopLevelGrammar::from_json_schema(schema.clone());
        factory.create_parser(grammar).ok()
    };
    run(cases, only, compile, |parser, toks, times| {
        let mut m = llguidance::Matcher::new(Ok(parser.deep_clone()));
        for &t in toks {
            let t0 = Instant::now();
            let Ok(mask) = m.compute_mask() else { break };
            times.push(t0.elapsed().as_secs_f64() * 1e6);
            if !mask.is_allowed(t) || m.consume_token(t).is_err() {
                break;
            }
        }
    })
}

fn row(name: &str, total: usize, s: &mut Stats) -> String {
    format!(
        "| {name} | {}/{total} | {:.2} | {:.2} | {} | {:.1} | {:.1} | {:.1} | {:.0} |",
        s.compiled,
        pct(&mut s.compile_ms, 0.5),
        pct(&mut s.compile_ms, 0.99),
        s.mask_us.len(),
        pct(&mut s.mask_us, 0.5),
        pct(&mut s.mask_us, 0.9),
        pct(&mut s.mask_us, 0.99),
        pct(&mut s.mask_us, 1.0),
    )
}

fn main() {
    let Some(data) = data_dir() else {
        eprintln!("SKIPPED: benches/engine.rs needs ../shared/data (or LMT_SHARED_DATA)");
        return;
    };
    let (vocab, tok) = Vocab::load(&data.join("tokenizers/llama3")).unwrap();
    let enc = TextEncoder::new(&tok);
    let t0 = Instant::now();
    let env = llg_env(&vocab);
    let factory = llguidance::ParserFactory::new_simple(&env).unwrap();
    let llg_setup = t0.elapsed().as_secs_f64();
    let cases = load_cases(&data.join("jsonschema"), &enc);
    let total = cases.len();

    // Compile everything with both; time masks on the schemas both compile.
    let (mut lmt_first, lmt_ok) = run_lmt(&cases, &vocab, Some(&vec![false; total]));
    let (mut llg_first, llg_ok) = run_llg(&cases, &factory, Some(&vec![false; total]));
    let both: Vec<bool> = lmt_ok.iter().zip(&llg_ok).map(|(a, b)| *a && *b).collect();
    let (mut lmt_s, _) = run_lmt(&cases, &vocab, Some(&both));
    let (mut llg_s, _) = run_llg(&cases, &factory, Some(&both));
    println!("JSONSchemaBench, Llama-3 tokenizer, one thread; masks on the {} schemas both compile", both.iter().filter(|b| **b).count());
    println!("(llguidance token environment set-up: {llg_setup:.2} s)\n");
    println!("| engine | compiled | compile ms p50 | compile ms p99 | masks | mask µs p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!("{}", row("lmt", total, &mut lmt_s));
    println!("{}", row("llguidance 1.9.1", total, &mut llg_s));
    // The table's compiles are each schema's second in the process; the
    // first ones met colder caches (lmt interns lexemes and parsed regexes).
    for (name, st) in [("lmt", &mut lmt_first), ("llguidance 1.9.1", &mut llg_first)] {
        println!("first compiles, {name}: {} compiled, ms p50 {:.2} p99 {:.2}", st.compiled, pct(&mut st.compile_ms, 0.5), pct(&mut st.compile_ms, 0.99));
    }

    // Regexes: compile and masks along a matching text.
    let regexes: &[(&str, &str)] = &[
        ("[12][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", "2024-07-15"),
        ("\\{\"name\": \"[A-Za-z ]{1,40}\", \"age\": (0|[1-9][0-9]?)\\}", "{\"name\": \"Ada Lovelace\", \"age\": 36}"),
        ("NONE|\\([^,()]+, [^,()]+, [^,()]+\\)(<\\|>\\([^,()]+, [^,()]+, [^,()]+\\))*", "(Marie Curie, discovered, polonium)<|>(Curie, born in, Warsaw)"),
        ("[a-z]+( [a-z]+)*\\.", "the quick brown fox jumps over the lazy dog."),
    ];
    let limits = Limits::default();
    let mut lr = Stats { compiled: 0, compile_ms: Vec::new(), mask_us: Vec::new() };
    let mut gr = Stats { compiled: 0, compile_ms: Vec::new(), mask_us: Vec::new() };
    let mut mask = TokenMask::new(vocab.len());
    for (rx, text) in regexes {
        let toks = enc.encode(text).unwrap();
        let t0 = Instant::now();
        let c = Constraint::regex(rx, &limits).unwrap();
        lr.compile_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        lr.compiled += 1;
        let mut m = c.matcher(&limits);
        for &t in &toks {
            let t0 = Instant::now();
            m.mask(&vocab, &mut mask).unwrap();
            lr.mask_us.push(t0.elapsed().as_secs_f64() * 1e6);
            assert!(mask.get(t) && m.feed(vocab.bytes(t)).unwrap(), "{rx}");
        }
        let t0 = Instant::now();
        let p = factory.create_parser(llguidance::api::TopLevelGrammar::from_regex(rx)).unwrap();
        gr.compile_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        gr.compiled += 1;
        let mut m = llguidance::Matcher::new(Ok(p));
        for &t in &toks {
            let t0 = Instant::now();
            let mk = m.compute_mask().unwrap();
            gr.mask_us.push(t0.elapsed().as_secs_f64() * 1e6);
            assert!(mk.is_allowed(t), "{rx}");
            m.consume_token(t).unwrap();
        }
    }
    println!("\nRegexes ({} patterns, masks along a matching text; first use, so cold caches count)\n", regexes.len());
    println!("| engine | compiled | compile ms p50 | compile ms p99 | masks | mask µs p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!("{}", row("lmt", regexes.len(), &mut lr));
    println!("{}", row("llguidance 1.9.1", regexes.len(), &mut gr));

    // Criterion: compiling and walking one mid-sized schema, both engines.
    let case = cases.iter().zip(&both).find(|(c, b)| **b && !c.instances.is_empty() && c.instances[0].len() > 30).map(|(c, _)| c);
    let mut crit = Criterion::default().sample_size(20).configure_from_args();
    if let Some(case) = case {
        let mut g = crit.benchmark_group("json_schema_walk");
        g.bench_function("lmt", |b| {
            b.iter(|| {
                let c = Constraint::json_schema(&case.schema, Whitespace::Any, Semantics::Validation, &limits).unwrap().allowing_repeated_keys();
                let mut m = c.matcher(&limits);
                let mut mask = TokenMask::new(vocab.len());
                for &t in &case.instances[0] {
                    m.mask(&vocab, &mut mask).unwrap();
                    m.feed(vocab.bytes(t)).unwrap();
                }
            })
        });
        g.bench_function("llguidance", |b| {
            b.iter(|| {
                let p = factory.create_parser(llguidance::api::TopLevelGrammar::from_json_schema(case.schema.clone())).unwrap();
                let mut m = llguidance::Matcher::new(Ok(p));
                for &t in &case.instances[0] {
                    let _ = m.compute_mask().unwrap();
                    m.consume_token(t).unwrap();
                }
            })
        });
        g.finish();
    }
    crit.final_summary();
}
