//! The model runtime: a Llama-family decoder of lmt's own on candle, with a
//! KV state that appends, truncates, forks and scores; loading from a
//! Hugging Face directory, a GGUF file or the hub cache; the tokenizer
//! layer; and the sampler.
//!
//! It knows tensors and token ids, not templates. Only the interpreter
//! drives it. candle-transformers is its test oracle and benchmark
//! baseline, never a dependency of the runtime.

mod batch;
mod candle_graph;
mod config;
mod cpu;
mod decoder;
pub mod hub;
mod info;
pub mod remote;
pub mod kernels;
mod kv;
pub mod tokenizer;
mod sample;
mod weights;

use std::path::{Path, PathBuf};

use candle_core::Device;

pub use batch::{BatchStats, Batcher, Forward, Member};
pub use config::{Arch, ModelConfig, Rope, RopeScaling, TokenIds, SUPPORTED};
pub use decoder::{log_softmax, Decoder, ForwardStats, KvState, Runtime};
pub use hub::{GgufPick, HubEnv, ModelSpec, DEFAULT_MODEL};
pub use info::{ModelInfo, WeightType};
pub use sample::{top_n, Sampled, Sampler, SamplingParams};
pub use weights::safetensors_files;

use crate::model::tokenizer::{GgufVocab, ModelTokenizer};

/// Why a model could not be loaded or run.
#[derive(Debug)]
pub enum ModelError {
    /// A file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file the model needs is not there.
    MissingFile {
        /// Where it was looked for.
        path: PathBuf,
        /// What it is.
        what: String,
    },
    /// A configuration that cannot describe a model lmt runs.
    Config(String),
    /// An architecture lmt does not implement.
    UnsupportedArch(String),
    /// Weights that do not match the configuration.
    Weights(String),
    /// The tokenizer could not be loaded.
    Tokenizer(String),
    /// Resolving or downloading from the Hugging Face hub failed.
    Hub(String),
    /// The sequence reached the model's context length.
    ContextFull {
        /// The context length.
        max: usize,
    },
    /// A misuse of the runtime (bad token id, no logits yet).
    Runtime(String),
    /// A tensor operation failed.
    Candle(candle_core::Error),
}

impl ModelError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> ModelError {
        if source.kind() == std::io::ErrorKind::NotFound {
            return ModelError::MissingFile { path: path.to_path_buf(), what: "a model file".into() };
        }
        ModelError::Io { path: path.to_path_buf(), source }
    }

    /// The same error, saying which file it came from.
    pub fn in_file(self, path: &Path) -> ModelError {
        match self {
            ModelError::Config(m) => ModelError::Config(format!("{}: {m}", path.display())),
            ModelError::Tokenizer(m) => ModelError::Tokenizer(format!("{}: {m}", path.display())),
            other => other,
        }
    }
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::Io { path, source } => write!(f, "cannot read `{}`: {source}", path.display()),
            ModelError::MissingFile { path, what } => write!(f, "`{}` not found ({what})", path.display()),
            ModelError::Config(m) => write!(f, "bad model config: {m}"),
            ModelError::UnsupportedArch(a) => {
                write!(f, "model architecture `{a}` is not supported (lmt runs: {SUPPORTED})")
            }
            ModelError::Weights(m) => write!(f, "bad weights: {m}"),
            ModelError::Tokenizer(m) => write!(f, "tokenizer: {m}"),
            ModelError::Hub(m) => write!(f, "{m}"),
            ModelError::ContextFull { max } => write!(f, "the sequence reached the model's context length ({max} tokens)"),
            ModelError::Runtime(m) => write!(f, "{m}"),
            ModelError::Candle(e) => write!(f, "tensor error: {e}"),
        }
    }
}

impl std::error::Error for ModelError {}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> ModelError {
        ModelError::Candle(e)
    }
}

/// Where and how to run a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The device (CPU unless a `cuda` build asks for a GPU).
    pub device: Device,
    /// A `tokenizer.json` (or a directory holding one) to use instead of
    /// the model's own tokenizer.
    pub tokenizer: Option<PathBuf>,
    /// A Jinja chat template file (or the name of one of the model's
    /// named templates) to use instead of the model's default.
    pub chat_template: Option<PathBuf>,
    /// Threads of the CPU runtime (0: the physical cores).
    pub threads: usize,
    /// What runs the forward pass.
    pub runtime: Runtime,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions { device: Device::Cpu, tokenizer: None, chat_template: None, threads: 0, runtime: Runtime::Auto }
    }
}

impl LoadOptions {
    /// Options for the best device this build has: the first CUDA GPU in a
    /// `cuda` build when one is present, else the CPU.
    pub fn best_device() -> LoadOptions {
        #[cfg(feature = "cuda")]
        if let Ok(d) = Device::new_cuda(0) {
            return LoadOptions { device: d, ..LoadOptions::default() };
        }
        LoadOptions::default()
    }
}

/// A loaded model: the decoder and its tokenizer.
#[derive(Debug, Clone)]
pub struct Model {
    /// Weights and configuration.
    pub decoder: Decoder,
    /// Encoding, decoding and the special ids.
    pub tokenizer: ModelTokenizer,
    /// Where it was loaded from.
    pub source: PathBuf,
}

impl Model {
    /// Loads what `spec` names (resolving hub ids through the cache, and
    /// downloading when allowed).
    pub fn load(spec: &ModelSpec, opts: &LoadOptions) -> Result<Model, ModelError> {
        let path = spec.local_path(&HubEnv::from_process())?;
        Model::load_path(&path, opts)
    }

    /// Loads a model directory or a `.gguf` file. The tokenizer is
    /// `opts.tokenizer` when given; else a directory's `tokenizer.json`;
    /// else the GGUF file's own (`tokenizer.ggml.*`); else, for a GGUF
    /// without one, the `tokenizer.json` beside it.
    pub fn load_path(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
        let weights = weights_path(path)?;
        let (decoder, gguf) = Decoder::load_with_vocab(&weights, opts)?;
        let tokenizer = load_tokenizer(path, &weights, gguf.as_ref(), &decoder.config, opts)?;
        Ok(Model { decoder, tokenizer, source: weights })
    }
}

/// The tokenizer of the model at `path` (weights in `weights`): the one
/// `opts` names, else a directory's `tokenizer.json`, else the GGUF's own,
/// else a `tokenizer.json` beside the GGUF; with `opts`' chat template.
pub(crate) fn load_tokenizer(
    path: &Path,
    weights: &Path,
    gguf: Option<&GgufVocab>,
    cfg: &ModelConfig,
    opts: &LoadOptions,
) -> Result<ModelTokenizer, ModelError> {
    let json = |p: &Path| if p.is_dir() { p.join("tokenizer.json") } else { p.to_path_buf() };
    let beside = weights.parent().map(|d| d.join("tokenizer.json")).filter(|p| p.is_file());
    let tokenizer = if let Some(t) = &opts.tokenizer {
        let file = json(t);
        if !file.is_file() {
            return Err(ModelError::MissingFile { path: file, what: "the tokenizer given with --tokenizer".into() });
        }
        ModelTokenizer::load(&file, &cfg.token_ids())?
    } else if path.is_dir() && path.join("tokenizer.json").is_file() {
        ModelTokenizer::load(&path.join("tokenizer.json"), &cfg.token_ids())?
    } else if let Some(v) = gguf {
        ModelTokenizer::from_gguf(v, weights)?
    } else if let Some(file) = beside {
        ModelTokenizer::load(&file, &cfg.token_ids())?
    } else {
        return Err(ModelError::MissingFile {
            path: json(path),
            what: "the tokenizer (this model has no tokenizer.ggml metadata: put tokenizer.json beside the weights \
                   or pass --tokenizer)"
                .into(),
        });
    };
    match &opts.chat_template {
        Some(t) => tokenizer.choose_chat_template(t),
        None => Ok(tokenizer),
    }
}

/// The weights a path names: a `.gguf` file; a directory with `config.json`
/// (safetensors); or a directory holding exactly one `.gguf` file.
pub fn weights_path(path: &Path) -> Result<PathBuf, ModelError> {
    if !path.is_dir() || path.join("config.json").is_file() {
        return Ok(path.to_path_buf());
    }
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| ModelError::io(path, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")) && p.is_file())
        .collect();
    ggufs.sort();
    match ggufs.len() {
        0 => Ok(path.to_path_buf()),
        1 => Ok(ggufs.remove(0)),
        _ => Err(ModelError::Config(format!(
            "`{}` has no config.json and holds {} .gguf files ({}): name the one to load",
            path.display(),
            ggufs.len(),
            ggufs.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

impl Decoder {
    /// Loads weights only: a Hugging Face directory (`config.json` and
    /// safetensors) or a `.gguf` file.
    pub fn load(path: &Path, device: &Device) -> Result<Decoder, ModelError> {
        Decoder::load_with(path, &LoadOptions { device: device.clone(), ..LoadOptions::default() })
    }

    /// Loads weights only, on the device, threads and runtime `opts` names.
    pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<Decoder, ModelError> {
        Decoder::load_with_vocab(path, opts).map(|(d, _)| d)
    }

    /// Loads weights, and the tokenizer a GGUF file carries, if any.
    fn load_with_vocab(path: &Path, opts: &LoadOptions) -> Result<(Decoder, Option<GgufVocab>), ModelError> {
        let device = &opts.device;
        if path.is_dir() {
            let cfg = ModelConfig::from_hf_file(&path.join("config.json"))?;
            let files = safetensors_files(path)?;
            // Tensors as stored (16-bit stays 16-bit); candle's graph
            // converts what it needs.
            let weights = weights::load_safetensors(&files, &cfg, device, None)?;
            Ok((Decoder::new(cfg, weights, device, opts.runtime, opts.threads)?, None))
        } else if path.is_file() && Decoder::runs_on_cpu(device, opts.runtime) {
            // Each layer is converted as soon as it is read: the next one is
            // read into the memory it freed, and the file's weights are never
            // all held twice (nor touched fresh twice).
            let mut arena = None;
            let mut layers = Vec::new();
            let (cfg, weights, content) = weights::load_gguf_each(path, device, |matrix_bytes, l| {
                let arena = arena.get_or_insert_with(|| kernels::Arena::with_capacity(matrix_bytes));
                layers.push(cpu::Layer::convert(layers.len(), &l, arena)?);
                Ok(())
            })?;
            let vocab = GgufVocab::read(&content).map_err(|e| e.in_file(path))?;
            let model = cpu::Model::assemble(&cfg, weights, layers, arena.unwrap_or_default(), opts.threads)?;
            Ok((Decoder::on_cpu(cfg, model, device), vocab))
        } else if path.is_file() {
            let (cfg, weights, content) = weights::load_gguf(path, device)?;
            let vocab = GgufVocab::read(&content).map_err(|e| e.in_file(path))?;
            Ok((Decoder::new(cfg, weights, device, opts.runtime, opts.threads)?, vocab))
        } else {
            Err(ModelError::MissingFile { path: path.to_path_buf(), what: "a model directory or .gguf file".into() })
        }
    }
}
