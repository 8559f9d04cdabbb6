//! `lmt complete`: load a model and continue a plain prompt, no template.
//! The quickest check that a model spec resolves, loads and generates.

use std::io::Write;
use std::time::Instant;

use crate::model::{Model, ModelSpec, Sampler, SamplingParams, DEFAULT_MODEL};
use crate::model::tokenizer::Utf8Stream;

/// Exit code: the model could not be loaded or failed while running.
pub const EXIT_MODEL_ERROR: i32 = 3;

/// Arguments of `lmt complete`.
#[derive(Debug, clap::Args)]
pub struct CompleteArgs {
    /// The prompt to continue (only the model summary is printed without one).
    pub prompt: Option<String>,
    /// Which model.
    #[command(flatten)]
    pub model: super::run::ModelArgs,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0, value_parser = super::run::temperature)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens below this share of the most likely one.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The model spec from `--model`, `$LMT_MODEL`, or the default.
pub fn model_spec(arg: Option<&str>) -> String {
    arg.map(String::from)
        .or_else(|| std::env::var("LMT_MODEL").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| DEFAULT_MODEL.to_string())
}

/// Runs `lmt complete`.
pub fn run(args: &CompleteArgs) -> i32 {
    match complete(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_MODEL_ERROR
        }
    }
}

fn complete(args: &CompleteArgs) -> Result<(), Box<dyn std::error::Error>> {
    let spec_text = model_spec(args.model.model.as_deref());
    if super::remote::is_url(&spec_text) {
        return Err(format!("`--model {spec_text}` names a remote engine: `lmt complete` continues a prompt on a model loaded here (`lmt run` takes remote engines)").into());
    }
    let spec = ModelSpec::parse(&spec_text)?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
        top_alternatives: 0,
    };
    let mut sampler = Sampler::new(params)?;
    eprintln!("loading {spec_text} …");
    let started = Instant::now();
    let model = Model::load(&spec, &args.model.load_options())?;
    let cfg = &model.decoder.config;
    eprintln!(
        "{} · {} layers · hidden {} · {} heads ({} kv) · {} logits · {:.0} MB weights · {:?}, {}{} · from {} · loaded in {:.1?}",
        cfg.arch.name(),
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.vocab_size,
        model.decoder.weight_bytes() as f64 / 1e6,
        model.decoder.device().location(),
        model.decoder.runtime_name(),
        match model.decoder.threads() {
            1 => String::new(),
            n => format!(", {n} threads"),
        },
        model.source.display(),
        started.elapsed()
    );
    let Some(prompt) = &args.prompt else { return Ok(()) };
    let tok = &model.tokenizer;
    let mut ids: Vec<u32> = tok.bos.into_iter().collect();
    ids.extend(tok.encoder.encode(prompt)?);
    let m = &model.decoder;
    let mut st = m.new_state();
    let t0 = Instant::now();
    let mut logits = m.append(&mut st, &ids)?;
    let prefill = t0.elapsed();
    let mut out = std::io::stdout().lock();
    let mut text = Utf8Stream::default();
    write!(out, "{prompt}")?;
    let mut finish = "max_tokens";
    let mut generated = 0;
    let t1 = Instant::now();
    while generated < args.max_tokens {
        let s = sampler.sample(&logits, None, &[])?;
        if tok.eos.contains(&s.token) {
            finish = "eos";
            break;
        }
        generated += 1;
        write!(out, "{}", text.push(tok.vocab.bytes(s.token)))?;
        out.flush()?;
        logits = m.append(&mut st, &[s.token])?;
    }
    writeln!(out, "{}", text.finish())?;
    let decode = t1.elapsed().as_secs_f64();
    eprintln!(
        "{} prompt tokens in {:.2?} · {generated} generated ({:.1} tokens/s) · finish: {finish}",
        ids.len(),
        prefill,
        if decode > 0.0 { generated as f64 / decode } else { 0.0 }
    );
    Ok(())
}
