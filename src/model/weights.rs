//! Loading weights: a Hugging Face safetensors directory (one file or
//! sharded with an index) or a GGUF file, into one structure. Every linear
//! layer is a `QMatMul`, so GGUF-quantized and plain tensors share one code
//! path in the decoder.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::config::{Arch, ModelConfig, Rope, RopeScaling};
use super::kernels::QType;
use super::ModelError;

/// A linear layer: `x W^T (+ b)`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub w: QMatMul,
    pub b: Option<Tensor>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = self.w.forward(x)?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// Projections that read the same input: fused (one matmul, outputs side by
/// side) or apart (GGUF files whose q/k/v or gate/up have different types).
#[derive(Debug, Clone)]
pub(crate) enum Proj {
    Fused(Linear, Vec<usize>),
    Split(Vec<Linear>),
}

impl Proj {
    /// The outputs of each part, in order.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        match self {
            Proj::Fused(l, sizes) => {
                let y = l.forward(x)?;
                let mut start = 0;
                sizes
                    .iter()
                    .map(|&n| {
                        let part = y.narrow(candle_core::D::Minus1, start, n);
                        start += n;
                        part
                    })
                    .collect()
            }
            Proj::Split(ls) => ls.iter().map(|l| l.forward(x)).collect(),
        }
    }
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub attn_norm: Tensor,
    pub qkv: Proj,
    pub o: Linear,
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub mlp_norm: Tensor,
    pub gate_up: Proj,
    pub down: Linear,
}

/// The embedding table: dense, or as a GGUF file quantized it.
#[derive(Debug, Clone)]
pub(crate) enum Embed {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
}

/// All weights of a decoder.
#[derive(Debug, Clone)]
pub(crate) struct Weights {
    pub embed: Embed,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub lm_head: QMatMul,
    /// Bytes of weights read per decoded token (for bandwidth figures): the
    /// matrices, not the embedding table (one row per token).
    pub bytes: usize,
}

impl Weights {
    /// The same weights with every dense tensor in `dtype` (quantized
    /// blocks stay as they are).
    pub fn to_dtype(self, dtype: DType) -> Result<Weights, ModelError> {
        let t = |x: Tensor| x.to_dtype(dtype);
        let lin = |l: Linear| -> candle_core::Result<Linear> {
            Ok(Linear { w: matmul_to(l.w, dtype)?, b: l.b.map(t).transpose()? })
        };
        let proj = |p: Proj| -> candle_core::Result<Proj> {
            Ok(match p {
                Proj::Fused(l, sizes) => Proj::Fused(lin(l)?, sizes),
                Proj::Split(ls) => Proj::Split(ls.into_iter().map(lin).collect::<Result<_, _>>()?),
            })
        };
        let layers = self
            .layers
            .into_iter()
            .map(|l| -> candle_core::Result<Layer> {
                Ok(Layer {
                    attn_norm: t(l.attn_norm)?,
                    qkv: proj(l.qkv)?,
                    o: lin(l.o)?,
                    q_norm: l.q_norm.map(t).transpose()?,
                    k_norm: l.k_norm.map(t).transpose()?,
                    mlp_norm: t(l.mlp_norm)?,
                    gate_up: proj(l.gate_up)?,
                    down: lin(l.down)?,
                })
            })
            .collect::<Result<_, _>>()?;
        let embed = match self.embed {
            Embed::Dense(e) => Embed::Dense(t(e)?),
            q => q,
        };
        Ok(Weights { embed, layers, norm: t(self.norm)?, lm_head: matmul_to(self.lm_head, dtype)?, bytes: self.bytes })
    }
}

fn matmul_to(m: QMatMul, dtype: DType) -> candle_core::Result<QMatMul> {
    Ok(match m {
        QMatMul::Tensor(w) | QMatMul::TensorF16(w) => QMatMul::Tensor(w.to_dtype(dtype)?),
        q => q,
    })
}

/// The safetensors files of a model directory: `model.safetensors`, or the
/// shards named by `model.safetensors.index.json`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Config(format!("`{}` is not valid JSON: {e}", index.display())))?;
        let files: BTreeSet<&str> =
            json["weight_map"].as_object().into_iter().flatten().filter_map(|(_, v)| v.as_str()).collect();
        if files.is_empty() {
            return Err(ModelError::Config(format!("`{}` has no `weight_map`", index.display())));
        }
        return files
            .into_iter()
            .map(|f| {
                let p = dir.join(f);
                if p.is_file() {
                    Ok(p)
                } else {
                    Err(ModelError::MissingFile { path: p, what: "a weight shard named by the index".into() })
                }
            })
            .collect();
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(ModelError::MissingFile {
        path: single,
        what: "the weights (model.safetensors or model.safetensors.index.json)".into(),
    })
}

/// Loads a safetensors model directory's weights for `cfg`, each tensor
/// in `dtype`, or as stored when `None`.
pub(crate) fn load_safetensors(
    files: &[PathBuf],
    cfg: &ModelConfig,
    device: &Device,
    dtype: Option<DType>,
) -> Result<Weights, ModelError> {
    // SAFETY: the files are mapped read-only; lmt never writes to them. A
    // file changed by another process while mapped is outside our control,
    // as for every mmap-based loader (candle, safetensors, llama.cpp).
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(files) }
        .map_err(|e| ModelError::Weights(format!("cannot read safetensors: {e}")))?;
    let names: BTreeSet<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let get = |name: &str| -> Result<Tensor, ModelError> {
        if !names.contains(name) {
            return Err(ModelError::Weights(format!("tensor `{name}` is missing")));
        }
        st.load(name, device)
            .and_then(|t| match dtype {
                Some(d) => t.to_dtype(d),
                None if matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) => Ok(t),
                None => t.to_dtype(DType::F32),
            })
            .map_err(|e| ModelError::Weights(format!("tensor `{name}`: {e}")))
    };
    let mut bytes = 0usize;
    let mut linear = |w: Tensor, b: Option<Tensor>, rows: usize, cols: usize, name: &str| -> Result<Linear, ModelError> {
        check_shape(&w, &[rows, cols], name)?;
        bytes += w.elem_count() * w.dtype().size_in_bytes();
        Ok(Linear { w: QMatMul::Tensor(w), b })
    };
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let (qn, kvn) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let embed = get("model.embed_tokens.weight")?;
    check_shape(&embed, &[cfg.vocab_size, h], "model.embed_tokens.weight")?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}");
        let cat = |parts: Vec<Tensor>| Tensor::cat(&parts, 0).map_err(ModelError::from);
        let qkv = if cfg.arch == Arch::Phi3 {
            get(&format!("{p}.self_attn.qkv_proj.weight"))?
        } else {
            let [q, k, v] = ["q", "k", "v"].map(|n| get(&format!("{p}.self_attn.{n}_proj.weight")));
            cat(vec![q?, k?, v?])?
        };
        let bias = if cfg.qkv_bias {
            let [q, k, v] = ["q", "k", "v"].map(|n| get(&format!("{p}.self_attn.{n}_proj.bias")));
            Some(cat(vec![q?, k?, v?])?)
        } else {
            None
        };
        let qkv = Proj::Fused(linear(qkv, bias, qn + 2 * kvn, h, &format!("{p} qkv"))?, vec![qn, kvn, kvn]);
        let o = linear(get(&format!("{p}.self_attn.o_proj.weight"))?, None, h, qn, &format!("{p}.self_attn.o_proj"))?;
        let m = cfg.intermediate_size;
        let gate_up = if cfg.arch == Arch::Phi3 {
            get(&format!("{p}.mlp.gate_up_proj.weight"))?
        } else {
            cat(vec![get(&format!("{p}.mlp.gate_proj.weight"))?, get(&format!("{p}.mlp.up_proj.weight"))?])?
        };
        let gate_up = Proj::Fused(linear(gate_up, None, 2 * m, h, &format!("{p} gate/up"))?, vec![m, m]);
        let down = linear(get(&format!("{p}.mlp.down_proj.weight"))?, None, h, m, &format!("{p}.mlp.down_proj"))?;
        let (q_norm, k_norm) = if cfg.qk_norm {
            (Some(get(&format!("{p}.self_attn.q_norm.weight"))?), Some(get(&format!("{p}.self_attn.k_norm.weight"))?))
        } else {
            (None, None)
        };
        layers.push(Layer {
            attn_norm: get(&format!("{p}.input_layernorm.weight"))?,
            qkv,
            o,
            q_norm,
            k_norm,
            mlp_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
            gate_up,
            down,
        });
    }
    // Tied checkpoints sometimes ship a copy of the embeddings as
    // `lm_head.weight`; it is not read.
    let lm_head = if cfg.tie_word_embeddings { embed.clone() } else { get("lm_head.weight")? };
    let lm_head = linear(lm_head, None, cfg.vocab_size, h, "lm_head.weight")?.w;
    Ok(Weights { embed: Embed::Dense(embed), layers, norm: get("model.norm.weight")?, lm_head, bytes })
}

/// GGML tensor types lmt does not read, by their GGUF ids (ggml.h), to
/// name them in the error.
const UNREAD_TYPES: [(u32, &str); 17] = [
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

/// The header of the GGUF file at `path` (metadata and tensor
/// descriptions; no weights are read), from `file`.
pub(crate) fn read_gguf(path: &Path, file: &mut File) -> Result<gguf_file::Content, ModelError> {
    gguf_file::Content::read(file).map_err(|e| {
        let e = e.to_string();
        // candle's reader stops at the first tensor of a type it has no block for.
        // (Its first line: candle adds a backtrace when RUST_BACKTRACE is set.)
        let first = e.lines().next().unwrap_or_default();
        let id = first.strip_prefix("unknown dtype for tensor ").and_then(|n| n.trim().parse::<u32>().ok());
        match id {
            Some(id) => {
                let name = UNREAD_TYPES.iter().find(|(i, _)| *i == id).map_or("an unknown type", |(_, n)| n);
                let read: Vec<&str> = QType::ALL.iter().map(|t| t.name()).collect();
                ModelError::Weights(format!(
                    "`{}` stores tensors as {name} (GGML type {id}), which lmt does not read; it reads GGUF files \
                     of {} (e.g. the Q4_K_M or Q8_0 file of the same model)",
                    path.display(),
                    read.join(", ")
                ))
            }
            None => ModelError::Weights(format!("`{}` is not a readable GGUF file: {e}", path.display())),
        }
    })
}

/// A GGUF file's configuration and weights.
pub(crate) fn load_gguf(path: &Path, device: &Device) -> Result<(ModelConfig, Weights, gguf_file::Content), ModelError> {
    let mut layers = Vec::new();
    let (cfg, mut weights, content) = load_gguf_each(path, device, |_, l| {
        layers.push(l);
        Ok(())
    })?;
    weights.layers = layers;
    Ok((cfg, weights, content))
}

/// [`load_gguf`] handing each layer to `each` as soon as it is read, in
/// order, and returning the other weights with no layers: a caller that
/// converts each layer and drops it holds one layer of loaded tensors at a
/// time (later layers are read into the memory earlier ones freed). `each`
/// also gets the bytes of the file's matrices as its header describes them
/// (at most the file's size: a header that claims more fails when the
/// tensor is read), to size what it converts them into.
pub(crate) fn load_gguf_each(
    path: &Path,
    device: &Device,
    mut each: impl FnMut(usize, Layer) -> Result<(), ModelError>,
) -> Result<(ModelConfig, Weights, gguf_file::Content), ModelError> {
    let mut file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let content = read_gguf(path, &mut file)?;
    let mut cfg = gguf_config(&content)?;
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    let matrices = content.tensor_infos.values().filter(|t| t.shape.rank() == 2);
    let matrix_bytes = matrices.fold(0usize, |sum, t| sum.saturating_add(stored_bytes(t).unwrap_or(usize::MAX)));
    let matrix_bytes = matrix_bytes.min(usize::try_from(file_len).unwrap_or(usize::MAX));
    let mut r = GgufReader { content: &content, file, file_len, device, bytes: 0 };
    let lin = |t: QTensor, b: Option<Tensor>| -> Result<Linear, ModelError> { Ok(Linear { w: QMatMul::from_qtensor(t)?, b }) };
    let embed_q = r.q("token_embd.weight")?;
    if embed_q.shape().dims() != [cfg.vocab_size, cfg.hidden_size] {
        return Err(ModelError::Weights(format!(
            "tensor `token_embd.weight` has shape {:?}, the config says {:?}",
            embed_q.shape().dims(),
            [cfg.vocab_size, cfg.hidden_size]
        )));
    }
    let (qn, kvn) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let m = cfg.intermediate_size;
    for i in 0..cfg.num_layers {
        let p = format!("blk.{i}");
        let qkv = if r.has(&format!("{p}.attn_qkv.weight")) {
            let b = r.bias(&format!("{p}.attn_qkv"))?;
            Proj::Fused(lin(r.q(&format!("{p}.attn_qkv.weight"))?, b)?, vec![qn, kvn, kvn])
        } else {
            let mut ws = Vec::new();
            let mut bs = Vec::new();
            for n in ["attn_q", "attn_k", "attn_v"] {
                bs.push(r.bias(&format!("{p}.{n}"))?);
                ws.push(r.q(&format!("{p}.{n}.weight"))?);
            }
            fused_or_split(ws, bs, device)?
        };
        let gate_up = if r.has(&format!("{p}.ffn_gate.weight")) {
            let ws = vec![r.q(&format!("{p}.ffn_gate.weight"))?, r.q(&format!("{p}.ffn_up.weight"))?];
            fused_or_split(ws, vec![None, None], device)?
        } else {
            // Phi-3: `ffn_up` holds gate and up side by side.
            Proj::Fused(lin(r.q(&format!("{p}.ffn_up.weight"))?, None)?, vec![m, m])
        };
        let (q_norm, k_norm) = if cfg.qk_norm {
            (Some(r.dense(&format!("{p}.attn_q_norm.weight"))?), Some(r.dense(&format!("{p}.attn_k_norm.weight"))?))
        } else {
            (None, None)
        };
        each(matrix_bytes, Layer {
            attn_norm: r.dense(&format!("{p}.attn_norm.weight"))?,
            qkv,
            o: lin(r.q(&format!("{p}.attn_output.weight"))?, None)?,
            q_norm,
            k_norm,
            mlp_norm: r.dense(&format!("{p}.ffn_norm.weight"))?,
            gate_up,
            down: lin(r.q(&format!("{p}.ffn_down.weight"))?, None)?,
        })?;
    }
    let norm = r.dense("output_norm.weight")?;
    let embed_q = Arc::new(embed_q);
    let lm_head = if r.has("output.weight") {
        // Decoding reads one embedding row per token, not the table.
        r.bytes -= embed_q.storage_size_in_bytes();
        QMatMul::from_qtensor(r.q("output.weight")?)?
    } else {
        QMatMul::from_arc(embed_q.clone())?
    };
    if r.has("rope_freqs.weight") {
        let f = r.dense("rope_freqs.weight")?.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        cfg.rope.freq_factors = Some(f);
    }
    let bytes = r.bytes;
    Ok((cfg, Weights { embed: Embed::Quantized(embed_q), layers: Vec::new(), norm, lm_head, bytes }, content))
}

/// The bytes a tensor takes in a GGUF file as its header describes it
/// (`None` when the count overflows).
fn stored_bytes(info: &gguf_file::TensorInfo) -> Option<usize> {
    (info.shape.elem_count() / info.ggml_dtype.block_size().max(1)).checked_mul(info.ggml_dtype.type_size())
}

/// Reads tensors from a GGUF file, counting the bytes read.
struct GgufReader<'a> {
    content: &'a gguf_file::Content,
    file: File,
    file_len: u64,
    device: &'a Device,
    bytes: usize,
}

impl GgufReader<'_> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// A tensor as stored (quantized or not).
    fn q(&mut self, name: &str) -> Result<QTensor, ModelError> {
        // The size the header claims is checked against the file before
        // anything is allocated for it.
        if let Some(info) = self.content.tensor_infos.get(name) {
            let end = stored_bytes(info).and_then(|b| (self.content.tensor_data_offset + info.offset).checked_add(b as u64));
            let len = self.file_len;
            if end.is_none_or(|e| e > len) {
                return Err(ModelError::Weights(format!(
                    "tensor `{name}` ({:?}, {:?}) runs past the end of the file ({len} bytes)",
                    info.ggml_dtype,
                    info.shape.dims()
                )));
            }
        }
        let t = self
            .content
            .tensor(&mut self.file, name, self.device)
            .map_err(|e| ModelError::Weights(format!("tensor `{name}`: {e}")))?;
        self.bytes += t.storage_size_in_bytes();
        Ok(t)
    }

    /// A tensor dequantized (norms, biases).
    fn dense(&mut self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.q(name)?.dequantize(self.device)?)
    }

    /// `{prefix}.bias`, if the file has it.
    fn bias(&mut self, prefix: &str) -> Result<Option<Tensor>, ModelError> {
        let name = format!("{prefix}.bias");
        if self.has(&name) { self.dense(&name).map(Some) } else { Ok(None) }
    }
}

/// One matmul for projections that read the same input: block-quantized
/// rows are independent runs of bytes, so matrices of one type stack by
/// concatenating their data. Mixed types (llama.cpp's `_M` mixes) stay apart.
fn fused_or_split(ws: Vec<QTensor>, bs: Vec<Option<Tensor>>, device: &Device) -> Result<Proj, ModelError> {
    let dtype = ws[0].dtype();
    let dims: Vec<(usize, usize)> = ws.iter().map(|w| w.shape().dims2()).collect::<Result<_, _>>()?;
    let cols = dims[0].1;
    let same = ws.iter().zip(&dims).all(|(w, d)| w.dtype() == dtype && d.1 == cols);
    let all_bias = bs.iter().all(Option::is_some);
    let no_bias = bs.iter().all(Option::is_none);
    if !same || !(all_bias || no_bias) {
        let parts = ws
            .into_iter()
            .zip(bs)
            .map(|(w, b)| Ok(Linear { w: QMatMul::from_qtensor(w)?, b }))
            .collect::<Result<_, ModelError>>()?;
        return Ok(Proj::Split(parts));
    }
    let mut data = Vec::new();
    for w in &ws {
        data.extend_from_slice(&w.data()?);
    }
    let rows: Vec<usize> = dims.iter().map(|d| d.0).collect();
    let storage = QStorage::from_data(std::borrow::Cow::Owned(data), device, dtype)?;
    let w = QMatMul::from_qtensor(QTensor::new(storage, (rows.iter().sum::<usize>(), cols))?)?;
    let b = if all_bias { Some(Tensor::cat(&bs.iter().flatten().collect::<Vec<_>>(), 0)?) } else { None };
    Ok(Proj::Fused(Linear { w, b }, rows))
}

/// The configuration stored in GGUF metadata (llama.cpp's keys).
pub(crate) fn gguf_config(content: &gguf_file::Content) -> Result<ModelConfig, ModelError> {
    let md = &content.metadata;
    let arch_name = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .ok_or_else(|| ModelError::Config("GGUF metadata has no `general.architecture`".into()))?;
    let arch = Arch::from_name(&arch_name).ok_or_else(|| ModelError::UnsupportedArch(arch_name.clone()))?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let u = |k: &str| md.get(&key(k)).and_then(|v| v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from))).map(|v| v as usize);
    let f = |k: &str| md.get(&key(k)).and_then(|v| v.to_f32().ok());
    let need = |k: &str| u(k).ok_or_else(|| ModelError::Config(format!("GGUF metadata has no `{}`", key(k))));
    let hidden_size = need("embedding_length")?;
    let num_heads = need("attention.head_count")?;
    let head_dim = u("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
    let num_layers = super::config::plausible_layers(need("block_count")?)?;
    let vocab_size = content
        .tensor_infos
        .get("token_embd.weight")
        .map(|t| t.shape.dims()[0])
        .ok_or_else(|| ModelError::Weights("tensor `token_embd.weight` is missing".into()))?;
    let window = u("attention.sliding_window");
    let tok = |k: &str| md.get(k).and_then(|v| v.to_u32().ok());
    let cfg = ModelConfig {
        arch,
        hidden_size,
        intermediate_size: need("feed_forward_length")?,
        num_layers,
        num_heads,
        num_kv_heads: u("attention.head_count_kv").unwrap_or(num_heads),
        head_dim,
        vocab_size,
        rms_norm_eps: f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64,
        rope: Rope {
            theta: f("rope.freq_base").unwrap_or(10_000.0) as f64,
            dim: u("rope.dimension_count").unwrap_or(head_dim),
            // llama.cpp's converter permutes q/k rows of Llama-type models
            // into the interleaved layout; Qwen and Phi-3 keep NeoX halves.
            interleaved: matches!(arch, Arch::Llama | Arch::Mistral),
            scaling: RopeScaling::None,
            freq_factors: None,
        },
        windows: vec![window; num_layers],
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        qk_norm: content.tensor_infos.contains_key("blk.0.attn_q_norm.weight"),
        max_position_embeddings: u("context_length").unwrap_or(4096),
        bos_token_id: tok("tokenizer.ggml.bos_token_id"),
        eos_token_ids: tok("tokenizer.ggml.eos_token_id").into_iter().collect(),
    };
    cfg.validate()?;
    Ok(cfg)
}

/// An error unless `t` has shape `dims`.
fn check_shape(t: &Tensor, dims: &[usize], name: &str) -> Result<(), ModelError> {
    if t.dims() != dims {
        return Err(ModelError::Weights(format!("tensor `{name}` has shape {:?}, the config says {dims:?}", t.dims())));
    }
    Ok(())
}
