//! What a model is, read from metadata alone (`lmt model info`): the GGUF
//! header and tensor table, or `config.json` and the safetensors headers.
//! No weight data is read.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::kernels::QType;
use super::{load_tokenizer, safetensors_files, weights_path, LoadOptions, ModelConfig, ModelError};
use crate::model::tokenizer::{GgufVocab, ModelTokenizer};

/// Tensors of one storage type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightType {
    /// The type's name (`Q4_1`, `F32`, `BF16`…).
    pub name: String,
    /// How many tensors.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// A model described from its metadata.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The weights file or directory.
    pub weights: PathBuf,
    /// The normalised configuration.
    pub config: ModelConfig,
    /// Number of parameters (elements of every tensor).
    pub parameters: u64,
    /// Storage types, most bytes first.
    pub weight_types: Vec<WeightType>,
    /// The tokenizer (with its chat template and where it came from).
    pub tokenizer: ModelTokenizer,
}

impl ModelInfo {
    /// Describes the model at `path` (a directory or `.gguf`), with the
    /// tokenizer `opts` selects as loading would.
    pub fn read(path: &Path, opts: &LoadOptions) -> Result<ModelInfo, ModelError> {
        let weights = weights_path(path)?;
        let mut types: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        let mut parameters = 0u64;
        let (config, gguf) = if weights.is_dir() {
            let config = ModelConfig::from_hf_file(&weights.join("config.json"))?;
            for file in safetensors_files(&weights)? {
                for (dtype, elems, bytes) in safetensors_header(&file)? {
                    parameters += elems;
                    let e = types.entry(dtype).or_default();
                    e.0 += 1;
                    e.1 += bytes;
                }
            }
            (config, None)
        } else {
            let mut f = std::fs::File::open(&weights).map_err(|e| ModelError::io(&weights, e))?;
            let content = super::weights::read_gguf(&weights, &mut f)?;
            for t in content.tensor_infos.values() {
                let elems = t.shape.elem_count() as u64;
                parameters += elems;
                let bytes = elems / t.ggml_dtype.block_size() as u64 * t.ggml_dtype.type_size() as u64;
                let name = QType::from_ggml(t.ggml_dtype)
                    .map_or_else(|| format!("{:?}", t.ggml_dtype).to_uppercase(), |q| q.name().into());
                let e = types.entry(name).or_default();
                e.0 += 1;
                e.1 += bytes;
            }
            let config = super::weights::gguf_config(&content).map_err(|e| e.in_file(&weights))?;
            (config, GgufVocab::read(&content).map_err(|e| e.in_file(&weights))?)
        };
        let tokenizer = load_tokenizer(path, &weights, gguf.as_ref(), &config, opts)?;
        let mut weight_types: Vec<WeightType> =
            types.into_iter().map(|(name, (tensors, bytes))| WeightType { name, tensors, bytes }).collect();
        weight_types.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
        Ok(ModelInfo { weights, config, parameters, weight_types, tokenizer })
    }
}

/// `(dtype, elements, bytes)` of every tensor in a safetensors file's
/// header, without reading the data.
fn safetensors_header(path: &Path) -> Result<Vec<(String, u64, u64)>, ModelError> {
    // A header is JSON of at most 100 MB (the safetensors format's limit).
    const MAX_HEADER: u64 = 100_000_000;
    let bad = |m: &str| ModelError::Weights(format!("`{}`: {m}", path.display()));
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| bad("too short for a safetensors header"))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(bad(&format!("header of {n} bytes is past the format's limit")));
    }
    let mut text = Vec::new();
    f.take(n).read_to_end(&mut text).map_err(|e| ModelError::io(path, e))?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| bad(&format!("header is not JSON: {e}")))?;
    let mut out = Vec::new();
    for (name, t) in json.as_object().into_iter().flatten() {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t["dtype"].as_str().unwrap_or("?").to_string();
        let elems: u64 = t["shape"].as_array().into_iter().flatten().filter_map(|d| d.as_u64()).product();
        let offsets: Vec<u64> = t["data_offsets"].as_array().into_iter().flatten().filter_map(|d| d.as_u64()).collect();
        let bytes = match offsets[..] {
            [a, b] if b >= a => b - a,
            _ => return Err(bad(&format!("tensor `{name}` has no valid data_offsets"))),
        };
        out.push((dtype, elems, bytes));
    }
    Ok(out)
}
