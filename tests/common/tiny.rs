//! Tiny random models in the real file formats, built in process: a Hugging
//! Face directory (config.json + safetensors) and GGUF files at any ggml
//! type. Shared by the model tests and the model benchmark.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use serde_json::json;

/// The shape of a tiny model.
#[derive(Debug, Clone)]
pub struct Spec {
    pub arch: &'static str,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub tied: bool,
    pub llama3_rope: bool,
    /// Mistral's attention window.
    pub window: Option<usize>,
    pub seed: u64,
    /// The BOS and EOS ids the configs name (a tokenizer paired with the
    /// model must have special tokens there: see [`Spec::with_tokenizer`]).
    pub bos: Option<u32>,
    pub eos: u32,
}

impl Spec {
    /// A small model of `arch` with its family's distinguishing features.
    pub fn small(arch: &'static str) -> Spec {
        let mut s = Spec {
            arch,
            hidden: 64,
            intermediate: 96,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            vocab: 300,
            tied: false,
            llama3_rope: false,
            window: None,
            seed: 7,
            bos: Some(1),
            eos: 2,
        };
        match arch {
            "llama" => {
                s.tied = true;
                s.llama3_rope = true;
            }
            "qwen3" => s.head_dim = 24, // head_dim ≠ hidden / heads
            "phi3" => s.kv_heads = 4,   // fused qkv, no GQA (as Phi-3 mini)
            // A window shorter than the test sequences, so it is exercised.
            "mistral" => s.window = Some(6),
            _ => {}
        }
        s
    }

    /// TinyLlama-1.1B's shape (for benchmarks).
    pub fn tinyllama() -> Spec {
        Spec {
            arch: "llama",
            hidden: 2048,
            intermediate: 5632,
            layers: 22,
            heads: 32,
            kv_heads: 4,
            head_dim: 64,
            vocab: 32000,
            tied: false,
            llama3_rope: false,
            window: None,
            seed: 11,
            bos: Some(1),
            eos: 2,
        }
    }

    /// This shape for `tok`: its vocabulary size, its `</s>` as EOS, no BOS
    /// (the trained test tokenizers have none).
    pub fn with_tokenizer(mut self, tok: &tokenizers::Tokenizer) -> Spec {
        self.vocab = tok.get_vocab_size(true);
        self.eos = tok.token_to_id("</s>").expect("the test tokenizer has </s>");
        self.bos = None;
        self
    }

    /// The Hugging Face `config.json`, with every key the
    /// candle-transformers configs of each family require.
    pub fn config_json(&self) -> serde_json::Value {
        let mut c = json!({
            "architectures": [format!("{}ForCausalLM", match self.arch {
                "llama" => "Llama", "mistral" => "Mistral", "qwen2" => "Qwen2", "qwen3" => "Qwen3", "phi3" => "Phi3", other => other,
            })],
            "model_type": self.arch,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 512,
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
            "attention_bias": false,
            "sliding_window": null,
            "use_sliding_window": false,
            "max_window_layers": self.layers,
            "rope_scaling": null,
        });
        if self.llama3_rope {
            c["rope_theta"] = json!(500000.0);
            c["rope_scaling"] = json!({
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64
            });
        }
        match self.arch {
            // candle's qwen2 wants a number here.
            "qwen2" => c["sliding_window"] = json!(4096),
            "mistral" => c["sliding_window"] = json!(self.window),
            _ => {}
        }
        c
    }

    /// Every tensor under its Hugging Face name, in generation order: shape,
    /// spread and centre of its random values.
    pub fn hf_layout(&self) -> Vec<(String, Vec<usize>, f32, f32)> {
        let mut t = Vec::new();
        let (h, m, d) = (self.hidden, self.intermediate, self.head_dim);
        let (qn, kvn) = (self.heads * d, self.kv_heads * d);
        let lin = 1.0 / (h as f32).sqrt();
        let mut put = |name: String, shape: &[usize], scale: f32, offset: f32| t.push((name, shape.to_vec(), scale, offset));
        put("model.embed_tokens.weight".into(), &[self.vocab, h], 0.5, 0.0);
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            if self.arch == "phi3" {
                put(format!("{p}.self_attn.qkv_proj.weight"), &[qn + 2 * kvn, h], lin, 0.0);
                put(format!("{p}.mlp.gate_up_proj.weight"), &[2 * m, h], lin, 0.0);
            } else {
                put(format!("{p}.self_attn.q_proj.weight"), &[qn, h], lin, 0.0);
                put(format!("{p}.self_attn.k_proj.weight"), &[kvn, h], lin, 0.0);
                put(format!("{p}.self_attn.v_proj.weight"), &[kvn, h], lin, 0.0);
                put(format!("{p}.mlp.gate_proj.weight"), &[m, h], lin, 0.0);
                put(format!("{p}.mlp.up_proj.weight"), &[m, h], lin, 0.0);
            }
            if self.arch == "qwen2" {
                put(format!("{p}.self_attn.q_proj.bias"), &[qn], 0.2, 0.0);
                put(format!("{p}.self_attn.k_proj.bias"), &[kvn], 0.2, 0.0);
                put(format!("{p}.self_attn.v_proj.bias"), &[kvn], 0.2, 0.0);
            }
            if self.arch == "qwen3" {
                put(format!("{p}.self_attn.q_norm.weight"), &[d], 0.2, 1.0);
                put(format!("{p}.self_attn.k_norm.weight"), &[d], 0.2, 1.0);
            }
            put(format!("{p}.self_attn.o_proj.weight"), &[h, qn], 1.0 / (qn as f32).sqrt(), 0.0);
            put(format!("{p}.mlp.down_proj.weight"), &[h, m], 1.0 / (m as f32).sqrt(), 0.0);
            put(format!("{p}.input_layernorm.weight"), &[h], 0.2, 1.0);
            put(format!("{p}.post_attention_layernorm.weight"), &[h], 0.2, 1.0);
        }
        put("model.norm.weight".into(), &[h], 0.2, 1.0);
        if !self.tied {
            put("lm_head.weight".into(), &[self.vocab, h], lin, 0.0);
        }
        t
    }

    /// Random weights under Hugging Face names.
    pub fn hf_tensors(&self) -> HashMap<String, Tensor> {
        let mut rng = Rng(self.seed);
        self.hf_layout().into_iter().map(|(name, shape, scale, offset)| (name, rng.tensor(&shape, scale, offset))).collect()
    }

    /// Writes a Hugging Face model directory (no tokenizer) under `dir`.
    pub fn write_hf(&self, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&self.config_json()).unwrap()).unwrap();
        candle_core::safetensors::save(&self.hf_tensors(), dir.join("model.safetensors")).unwrap();
        dir.to_path_buf()
    }

    /// Writes a GGUF file of a Llama model at ggml type `ty` (norms stay
    /// F32, as llama.cpp keeps them), with q/k rows permuted as llama.cpp's
    /// converter does. Tensors are made and quantized one at a time, so a
    /// TinyLlama-sized file needs little more memory than its own size.
    pub fn write_gguf(&self, path: &Path, ty: GgmlDType) {
        self.write_gguf_with(path, ty, Vec::new());
    }

    /// [`Spec::write_gguf`] with more metadata (a tokenizer's, say).
    pub fn write_gguf_with(&self, path: &Path, ty: GgmlDType, extra: Vec<(String, gguf_file::Value)>) {
        // llama.cpp's converter permutes q/k only for Llama-type models.
        let permute_qk = matches!(self.arch, "llama" | "mistral");
        let mut rng = Rng(self.seed);
        let permute = |t: &Tensor, heads: usize| {
            let (rows, cols) = t.dims2().unwrap();
            t.reshape((heads, 2, rows / heads / 2, cols)).unwrap().transpose(1, 2).unwrap().reshape((rows, cols)).unwrap()
        };
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        for (name, shape, scale, offset) in self.hf_layout() {
            let t = rng.tensor(&shape, scale, offset);
            let t = if permute_qk && name.ends_with("q_proj.weight") {
                permute(&t, self.heads)
            } else if permute_qk && name.ends_with("k_proj.weight") {
                permute(&t, self.kv_heads)
            } else {
                t
            };
            let gguf_name = gguf_name(&name);
            let dtype = if shape.len() == 1 || shape[shape.len() - 1] % ty.block_size() != 0 { GgmlDType::F32 } else { ty };
            tensors.push((gguf_name, QTensor::quantize(&t, dtype).unwrap()));
        }
        self.write_gguf_tensors_with(path, &tensors, extra);
    }

    /// Writes `tensors` with this spec's llama.cpp metadata.
    pub fn write_gguf_tensors(&self, path: &Path, tensors: &[(String, QTensor)]) {
        self.write_gguf_tensors_with(path, tensors, Vec::new());
    }

    fn write_gguf_tensors_with(&self, path: &Path, tensors: &[(String, QTensor)], extra: Vec<(String, gguf_file::Value)>) {
        use gguf_file::Value as V;
        // llama.cpp files Mistral under `llama`.
        let a = if self.arch == "mistral" { "llama" } else { self.arch };
        let md: Vec<(String, V)> = vec![
            ("general.architecture".into(), V::String(a.into())),
            (format!("{a}.embedding_length"), V::U32(self.hidden as u32)),
            (format!("{a}.feed_forward_length"), V::U32(self.intermediate as u32)),
            (format!("{a}.block_count"), V::U32(self.layers as u32)),
            (format!("{a}.attention.head_count"), V::U32(self.heads as u32)),
            (format!("{a}.attention.head_count_kv"), V::U32(self.kv_heads as u32)),
            (format!("{a}.attention.key_length"), V::U32(self.head_dim as u32)),
            (format!("{a}.attention.layer_norm_rms_epsilon"), V::F32(1e-5)),
            (format!("{a}.rope.dimension_count"), V::U32(self.head_dim as u32)),
            (format!("{a}.rope.freq_base"), V::F32(10000.0)),
            (format!("{a}.context_length"), V::U32(512)),
            ("tokenizer.ggml.eos_token_id".into(), V::U32(self.eos)),
        ];
        let mut md = md;
        if let Some(b) = self.bos {
            md.push(("tokenizer.ggml.bos_token_id".into(), V::U32(b)));
        }
        // Later entries win, as a converter's tokenizer keys would.
        md.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        md.extend(extra);
        let md_refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut f = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
    }
}

/// llama.cpp's name for a Hugging Face Llama tensor.
fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").expect("a layer tensor");
    let (i, part) = rest.split_once('.').unwrap();
    let part = match part {
        "self_attn.qkv_proj.weight" => "attn_qkv.weight",
        "mlp.gate_up_proj.weight" => "ffn_up.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{i}.{part}")
}

/// A seeded generator for weights (same numbers on every machine).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `offset ± scale·√3` (standard deviation `scale`).
    pub fn tensor(&mut self, shape: &[usize], scale: f32, offset: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let k = scale * 3f32.sqrt();
        let v: Vec<f32> = (0..n).map(|_| offset + (self.next_f32() * 2.0 - 1.0) * k).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }
}

/// A temporary directory, unique to this call, removed when dropped.
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh temporary directory under the target dir.
pub fn temp_dir(name: &str) -> TempDir {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}
