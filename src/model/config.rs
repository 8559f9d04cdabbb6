//! What a model is: one normalised description of every Llama-family
//! architecture lmt runs, read from a Hugging Face `config.json` (both the
//! `rope_theta`/`rope_scaling` keys and transformers 5's `rope_parameters`)
//! or from GGUF metadata.

use std::path::Path;

use serde_json::Value;

use super::ModelError;

/// The architectures of the Llama family lmt implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3 (and SmolLM, TinyLlama).
    Llama,
    /// Mistral (sliding-window attention).
    Mistral,
    /// Qwen2 / Qwen2.5 (bias on q, k, v).
    Qwen2,
    /// Qwen3 (RMS norm on q and k per head).
    Qwen3,
    /// Phi-3 (fused qkv and gate-up projections).
    Phi3,
}

/// The names accepted in `model_type` / GGUF `general.architecture`.
pub const SUPPORTED: &str = "llama, mistral, qwen2, qwen3, phi3";

impl Arch {
    /// The architecture called `name` (`model_type`, GGUF architecture, or
    /// a `*ForCausalLM` class name).
    pub fn from_name(name: &str) -> Option<Arch> {
        let n = name.to_ascii_lowercase();
        let n = n.strip_suffix("forcausallm").unwrap_or(&n);
        Some(match n {
            "llama" | "smollm" | "tinyllama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "phi3" => Arch::Phi3,
            _ => return None,
        })
    }

    /// The lower-case name, as in `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
        }
    }
}

/// How rotary position embeddings are computed.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// The base θ.
    pub theta: f64,
    /// How many dimensions of each head rotate (the rest pass through).
    pub dim: usize,
    /// Pairs `(2i, 2i+1)` (GGUF Llama) rather than `(i, i + dim/2)` (HF).
    pub interleaved: bool,
    /// Frequency scaling for long contexts.
    pub scaling: RopeScaling,
    /// Per-frequency divisors (GGUF `rope_freqs.weight`: Llama 3 scaling
    /// precomputed by the converter).
    pub freq_factors: Option<Vec<f32>>,
}

/// Long-context frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3's smooth per-frequency scaling.
    Llama3 {
        /// Scale of low frequencies.
        factor: f64,
        /// Wavelength bound below which frequencies are scaled fully.
        low_freq_factor: f64,
        /// Wavelength bound above which frequencies are kept.
        high_freq_factor: f64,
        /// The context length the model was trained on.
        original_max: usize,
    },
    /// Phi-3's LongRoPE: per-frequency factors, short below the original
    /// context length and long beyond, cos/sin scaled by `attention_factor`.
    LongRope {
        /// Factors for positions below `original_max`.
        short: Vec<f64>,
        /// Factors for positions from `original_max` on.
        long: Vec<f64>,
        /// The original context length.
        original_max: usize,
        /// The cos/sin scale.
        attention_factor: f64,
    },
}

/// A normalised model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub arch: Arch,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rows of the output projection: the logit dimension (may exceed the
    /// tokenizer's vocabulary).
    pub vocab_size: usize,
    /// RMS norm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary embeddings.
    pub rope: Rope,
    /// Per layer: the attention window, if the layer uses one.
    pub windows: Vec<Option<usize>>,
    /// The output projection is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q, k and v projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// RMS norm on q and k per head (Qwen3).
    pub qk_norm: bool,
    /// The context length.
    pub max_position_embeddings: usize,
    /// BOS from the model config, if it names one.
    pub bos_token_id: Option<u32>,
    /// EOS ids from the model and generation configs.
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json` (and `generation_config.json` beside
    /// it, for more EOS ids).
    pub fn from_hf_file(path: &Path) -> Result<ModelConfig, ModelError> {
        let json = read_json(path)?;
        let mut cfg = ModelConfig::from_hf_json(&json)
            .map_err(|e| e.in_file(path))?;
        cfg.eos_token_ids = with_generation_eos(path, cfg.eos_token_ids)?;
        Ok(cfg)
    }

    /// The ids its tokenizer takes from the model config.
    pub fn token_ids(&self) -> TokenIds {
        TokenIds { bos: self.bos_token_id, eos: self.eos_token_ids.clone(), context: Some(self.max_position_embeddings) }
    }

    /// Reads the JSON of a Hugging Face `config.json`.
    pub fn from_hf_json(json: &Value) -> Result<ModelConfig, ModelError> {
        let name = json["model_type"]
            .as_str()
            .or_else(|| json["architectures"][0].as_str())
            .ok_or_else(|| ModelError::Config("no `model_type` or `architectures`".into()))?;
        let arch = Arch::from_name(name).ok_or_else(|| ModelError::UnsupportedArch(name.to_string()))?;
        let act = json["hidden_act"].as_str().or_else(|| json["hidden_activation"].as_str()).unwrap_or("silu");
        if act != "silu" && act != "swish" {
            return Err(ModelError::Config(format!("activation `{act}` is not supported (only silu)")));
        }
        let hidden_size = req(json, "hidden_size")?;
        let num_heads = req(json, "num_attention_heads")?;
        let head_dim = opt(json, "head_dim").unwrap_or(hidden_size / num_heads.max(1));
        let num_layers = plausible_layers(req(json, "num_hidden_layers")?)?;
        let max_position_embeddings = opt(json, "max_position_embeddings").unwrap_or(4096);
        // transformers 5 moves the rope keys into `rope_parameters`.
        let rp = &json["rope_parameters"];
        let rope_src = if rp.is_object() { rp } else { &json["rope_scaling"] };
        let theta = num(rp, "rope_theta").or_else(|| num(json, "rope_theta")).unwrap_or(10_000.0);
        let partial = num(rp, "partial_rotary_factor").or_else(|| num(json, "partial_rotary_factor")).unwrap_or(1.0);
        let rot_dim = ((head_dim as f64 * partial) as usize) & !1;
        let scaling = rope_scaling(rope_src, json, rot_dim, max_position_embeddings)?;
        let window = if arch == Arch::Mistral || json["use_sliding_window"].as_bool() == Some(true) {
            opt(json, "sliding_window")
        } else {
            None
        };
        let windows = (0..num_layers)
            .map(|i| match json["layer_types"][i].as_str() {
                Some("full_attention") => None,
                Some("sliding_attention") => opt(json, "sliding_window"),
                _ => window,
            })
            .collect();
        let cfg = ModelConfig {
            arch,
            hidden_size,
            intermediate_size: req(json, "intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads: opt(json, "num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            vocab_size: req(json, "vocab_size")?,
            rms_norm_eps: num(json, "rms_norm_eps").unwrap_or(1e-6),
            rope: Rope { theta, dim: rot_dim, interleaved: false, scaling, freq_factors: None },
            windows,
            tie_word_embeddings: json["tie_word_embeddings"].as_bool().unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || json["attention_bias"].as_bool() == Some(true),
            qk_norm: arch == Arch::Qwen3,
            max_position_embeddings,
            bos_token_id: ids(&json["bos_token_id"]).first().copied(),
            eos_token_ids: ids(&json["eos_token_id"]),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the shapes fit together, so a bad config is an error here and
    /// not a tensor-shape failure mid-forward.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        // Sizes are checked before anything is allocated from them: a file
        // claiming 10⁹ layers is an error, not an abort.
        for (what, v, max) in [
            ("hidden size", self.hidden_size, 1 << 17),
            ("MLP size", self.intermediate_size, 1 << 20),
            ("attention head count", self.num_heads, 1 << 12),
            ("head size", self.head_dim, 1 << 12),
            ("vocabulary", self.vocab_size, 1 << 23),
            ("context length", self.max_position_embeddings, 1 << 24),
        ] {
            if v > max {
                return bad(format!("the {what} {v} is beyond any model lmt runs (at most {max})"));
            }
        }
        plausible_layers(self.num_layers)?;
        if self.num_heads == 0 || self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} attention heads cannot be shared by {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || self.hidden_size == 0 || self.vocab_size == 0 || self.num_layers == 0 {
            return bad("hidden size, head size, vocabulary and layer count must be positive".into());
        }
        if self.rope.dim == 0 || self.rope.dim > self.head_dim {
            return bad(format!("{} rotary dimensions do not fit a head of {}", self.rope.dim, self.head_dim));
        }
        Ok(())
    }

    /// The rotary inverse frequencies for a position (LongRoPE switches
    /// factors at the original context length), and the cos/sin scale.
    pub fn inv_freq(&self, long: bool) -> (Vec<f32>, f32) {
        let d = self.rope.dim;
        let base: Vec<f64> = (0..d).step_by(2).map(|i| 1.0 / self.rope.theta.powf(i as f64 / d as f64)).collect();
        let mut scale = 1.0;
        let mut freqs: Vec<f64> = match &self.rope.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max } => {
                let orig = *original_max as f64;
                let low_wavelen = orig / low_freq_factor;
                let high_wavelen = orig / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::LongRope { short, long: l, attention_factor, .. } => {
                scale = *attention_factor;
                let factors = if long { l } else { short };
                base.iter().zip(factors).map(|(f, k)| f / k).collect()
            }
        };
        if let Some(ff) = &self.rope.freq_factors {
            for (f, k) in freqs.iter_mut().zip(ff) {
                *f /= *k as f64;
            }
        }
        (freqs.into_iter().map(|f| f as f32).collect(), scale as f32)
    }

    /// The rotary tables of this configuration.
    pub fn rope_table(&self) -> RopeTable {
        let long_from = self.long_rope_from();
        RopeTable { short: self.inv_freq(false), long: (long_from < usize::MAX).then(|| self.inv_freq(true)), long_from }
    }

    /// Where LongRoPE switches to its long factors (never for other kinds).
    pub fn long_rope_from(&self) -> usize {
        match &self.rope.scaling {
            RopeScaling::LongRope { original_max, .. } => *original_max,
            _ => usize::MAX,
        }
    }
}

/// The `rope_scaling` (or `rope_parameters`) object.
fn rope_scaling(src: &Value, json: &Value, dim: usize, max_pos: usize) -> Result<RopeScaling, ModelError> {
    if !src.is_object() {
        return Ok(RopeScaling::None);
    }
    let kind = src["rope_type"].as_str().or_else(|| src["type"].as_str()).unwrap_or("default");
    let f = |k: &str| num(src, k);
    let need = |k: &str| f(k).ok_or_else(|| ModelError::Config(format!("rope scaling `{kind}` needs `{k}`")));
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: need("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max: need("original_max_position_embeddings")? as usize,
        },
        "longrope" | "su" => {
            let list = |k: &str| -> Result<Vec<f64>, ModelError> {
                let v: Vec<f64> = src[k].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
                if v.len() != dim / 2 {
                    return Err(ModelError::Config(format!("rope scaling `{kind}`: `{k}` needs {} numbers", dim / 2)));
                }
                Ok(v)
            };
            let original_max = opt(json, "original_max_position_embeddings")
                .or_else(|| f("original_max_position_embeddings").map(|v| v as usize))
                .unwrap_or(max_pos);
            let factor = max_pos as f64 / original_max as f64;
            let attention_factor = f("attention_factor").unwrap_or(if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / (original_max as f64).ln()).sqrt()
            });
            RopeScaling::LongRope { short: list("short_factor")?, long: list("long_factor")?, original_max, attention_factor }
        }
        other => return Err(ModelError::Config(format!("rope scaling `{other}` is not supported (default, linear, llama3, longrope)"))),
    })
}

/// A required positive integer field.
/// Rotary frequencies of a model, computed once: cos and sin for any
/// positions, the same numbers for every runtime.
#[derive(Debug, Clone)]
pub struct RopeTable {
    short: (Vec<f32>, f32),
    long: Option<(Vec<f32>, f32)>,
    long_from: usize,
}

impl RopeTable {
    /// cos and sin for each of `positions`, `rope.dim / 2` values each, row
    /// after row, into `cos` and `sin` (cleared first).
    pub fn fill(&self, positions: impl Iterator<Item = usize>, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        cos.clear();
        sin.clear();
        for p in positions {
            let (freqs, scale) = match &self.long {
                Some((l, s)) if p >= self.long_from => (l, *s),
                _ => (&self.short.0, self.short.1),
            };
            for f in freqs {
                // Angles in f32 as the reference implementations compute them.
                let a = p as f32 * f;
                cos.push(a.cos() * scale);
                sin.push(a.sin() * scale);
            }
        }
    }
}

/// Most layers a model may claim.
pub(crate) const MAX_LAYERS: usize = 1 << 12;

/// `n` when it is a layer count a real model could have.
pub(crate) fn plausible_layers(n: usize) -> Result<usize, ModelError> {
    if n > MAX_LAYERS {
        return Err(ModelError::Config(format!("{n} layers is beyond any model lmt runs (at most {MAX_LAYERS})")));
    }
    Ok(n)
}

fn req(json: &Value, key: &str) -> Result<usize, ModelError> {
    opt(json, key).ok_or_else(|| ModelError::Config(format!("missing or invalid `{key}`")))
}

/// An optional integer field (`null` counts as absent).
fn opt(json: &Value, key: &str) -> Option<usize> {
    json[key].as_u64().map(|v| v as usize)
}

/// An optional number field.
fn num(json: &Value, key: &str) -> Option<f64> {
    json[key].as_f64()
}

/// Token ids given as one number or a list.
/// What a tokenizer takes from a model's config: BOS, the EOS ids, and the
/// context length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenIds {
    /// `bos_token_id`.
    pub bos: Option<u32>,
    /// `eos_token_id` of `config.json` and `generation_config.json`.
    pub eos: Vec<u32>,
    /// `max_position_embeddings`.
    pub context: Option<usize>,
}

impl TokenIds {
    /// Reads them from a `config.json` (and `generation_config.json`)
    /// without the checks a model lmt runs must pass: a remote engine's
    /// model may be of any architecture.
    pub fn from_hf_file(path: &Path) -> Result<TokenIds, ModelError> {
        let json = read_json(path)?;
        let eos = with_generation_eos(path, ids(&json["eos_token_id"]))?;
        Ok(TokenIds { bos: ids(&json["bos_token_id"]).first().copied(), eos, context: opt(&json, "max_position_embeddings") })
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("`{}` is not valid JSON: {e}", path.display())))
}

/// `eos` and the EOS ids of the `generation_config.json` beside `config`.
fn with_generation_eos(config: &Path, mut eos: Vec<u32>) -> Result<Vec<u32>, ModelError> {
    let Some(gen) = config.parent().map(|d| d.join("generation_config.json")).filter(|g| g.is_file()) else { return Ok(eos) };
    for id in ids(&read_json(&gen)?["eos_token_id"]) {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    Ok(eos)
}

fn ids(v: &Value) -> Vec<u32> {
    match v {
        Value::Number(n) => n.as_u64().map(|i| vec![i as u32]).unwrap_or_default(),
        Value::Array(a) => a.iter().filter_map(Value::as_u64).map(|i| i as u32).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_come_from_any_architectures_config() {
        let dir = std::env::temp_dir().join(format!("lmt-token-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.json");
        std::fs::write(&config, r#"{"model_type": "deepseek_v3", "bos_token_id": 0, "eos_token_id": 1, "max_position_embeddings": 163840}"#).unwrap();
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [1, 7]}"#).unwrap();
        assert!(ModelConfig::from_hf_file(&config).is_err(), "lmt does not run this architecture itself");
        let ids = TokenIds::from_hf_file(&config).unwrap();
        assert_eq!(ids, TokenIds { bos: Some(0), eos: vec![1, 7], context: Some(163840) });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
