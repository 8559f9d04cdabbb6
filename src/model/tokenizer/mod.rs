//! Encoding text into token ids the safe way: text from templates, variables
//! and generation goes through the normalizer, pre-tokenizer and model only,
//! never through the added-token matcher, so it can never become a special
//! or added token (a role marker cannot be forged). The SentencePiece
//! "dummy prefix" (a `▁` prepended to every call) is left out: text is
//! encoded piece by piece and a leading space is written only where wanted.
//!
//! A tokenizer comes from a Hugging Face `tokenizer.json` (with the
//! `tokenizer_config.json`, `chat_template.jinja` and model configs beside
//! it) or from a GGUF file's metadata (`gguf.rs`; SentencePiece GGUFs encode
//! with llama.cpp's merge rule, `spm.rs`).

mod gguf;
mod spm;

use std::path::Path;
use std::sync::Arc;

use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

pub use gguf::{known_pre_tokenizers, GgufModel, GgufVocab, TokenType};
pub use spm::Spm;

use crate::engine::TokenKind;
use crate::model::{ModelError, TokenIds};

/// Encodes untrusted text with a tokenizer's model, never its added tokens.
#[derive(Clone)]
pub struct TextEncoder {
    tok: Tokenizer,
    pre: Option<PreTokenizerWrapper>,
    spm: Option<Arc<SpmText>>,
}

/// llama.cpp's SentencePiece encoding of a GGUF vocabulary.
struct SpmText {
    spm: Spm,
    /// Whether a stretch of text after a special token (or at the start)
    /// begins with a space (`tokenizer.ggml.add_space_prefix`).
    add_space_prefix: bool,
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEncoder").finish_non_exhaustive()
    }
}

impl TextEncoder {
    /// An encoder for `tok`.
    pub fn new(tok: &Tokenizer) -> TextEncoder {
        let pre = tok.get_pre_tokenizer().cloned().map(without_prepend);
        TextEncoder { tok: tok.clone(), pre, spm: None }
    }

    /// An encoder for a SentencePiece GGUF vocabulary: `tok` for its added
    /// tokens, `spm` for text.
    fn with_spm(tok: &Tokenizer, spm: Spm, add_space_prefix: bool) -> TextEncoder {
        TextEncoder { spm: Some(Arc::new(SpmText { spm, add_space_prefix })), ..TextEncoder::new(tok) }
    }

    /// The token ids of `text`, with no special or added token among them
    /// and no dummy-prefix space.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode_with(text, false)
    }

    /// The ids the tokenizer gives `text` as one stretch between added
    /// tokens: the SentencePiece dummy prefix included where the tokenizer
    /// adds one (as Hugging Face does after a special token), still never
    /// an added or special token.
    pub fn encode_split(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode_with(text, true)
    }

    /// Template text (trusted): special and added tokens written in it are
    /// those tokens, as the model's own tokenizer reads them; nothing is
    /// added around it. Each id with the byte offset in `text` where its
    /// token starts.
    pub fn encode_template(&self, text: &str) -> Result<Vec<(u32, usize)>, String> {
        let Some(spm) = &self.spm else {
            let enc = self.tok.encode(text, false).map_err(|e| e.to_string())?;
            return Ok(enc.get_ids().iter().copied().zip(enc.get_offsets().iter().map(|o| o.0)).collect());
        };
        // llama.cpp: added tokens are cut out first; every stretch of text
        // at the start or after one begins with the prefix space.
        let pts = self.tok.get_added_vocabulary().extract_and_normalize::<NormalizerWrapper>(None, text);
        let mut out = Vec::new();
        for (piece, (start, end), toks) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            match toks {
                Some(toks) => out.extend(toks.iter().map(|t| (t.id, start))),
                None => {
                    let prefix = spm.add_space_prefix;
                    let ids = self.encode_with(piece, true)?;
                    // The prefix space is not in the text: the first token
                    // starts at the stretch's start.
                    let mut at = start as isize - isize::from(prefix);
                    for id in ids {
                        out.push((id, (at.max(start as isize) as usize).min(end)));
                        at += self.piece_len(id) as isize;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Bytes of text a SentencePiece token stands for.
    fn piece_len(&self, id: u32) -> usize {
        let piece = self.tok.id_to_token(id).unwrap_or_default();
        if piece.len() == 6 && piece.starts_with("<0x") && piece.ends_with('>') {
            return 1;
        }
        piece.replace('▁', " ").len()
    }

    fn encode_with(&self, text: &str, prefix: bool) -> Result<Vec<u32>, String> {
        if let Some(s) = &self.spm {
            // No text, no prefix space (llama.cpp makes no fragment of it).
            if text.is_empty() {
                return Ok(Vec::new());
            }
            let mut escaped = String::with_capacity(text.len() + 3);
            if prefix && s.add_space_prefix {
                escaped.push('▁');
            }
            escaped.push_str(&text.replace(' ', "▁"));
            let mut ids = Vec::new();
            s.spm.tokenize(&escaped, &mut ids);
            return Ok(ids);
        }
        let mut pts = PreTokenizedString::from(text);
        if let Some(n) = self.tok.get_normalizer() {
            if prefix {
                pts.normalize(|s| n.normalize(s)).map_err(|e| e.to_string())?;
            } else {
                pts.normalize(|s| normalize_without_prefix(n, s)).map_err(|e| e.to_string())?;
            }
        }
        let original = self.tok.get_pre_tokenizer();
        if let Some(p) = if prefix { original } else { self.pre.as_ref() } {
            p.pre_tokenize(&mut pts).map_err(|e| e.to_string())?;
        }
        let model = self.tok.get_model();
        pts.tokenize(|s| tokenizers::Model::tokenize(model, s.get())).map_err(|e| e.to_string())?;
        Ok(pts
            .get_splits(OffsetReferential::Original, OffsetType::None)
            .into_iter()
            .flat_map(|(_, _, toks)| toks.iter().flatten().map(|t| t.id))
            .collect())
    }
}

/// Applies normalizer `n` but for a SentencePiece `Prepend("▁")`.
fn normalize_without_prefix(n: &NormalizerWrapper, s: &mut tokenizers::NormalizedString) -> tokenizers::Result<()> {
    match n {
        NormalizerWrapper::Prepend(_) => Ok(()),
        NormalizerWrapper::Sequence(seq) => {
            for inner in seq.as_ref() {
                normalize_without_prefix(inner, s)?;
            }
            Ok(())
        }
        other => other.normalize(s),
    }
}

/// The pre-tokenizer with Metaspace's prefix space turned off.
fn without_prepend(p: PreTokenizerWrapper) -> PreTokenizerWrapper {
    match p {
        PreTokenizerWrapper::Metaspace(mut m) => {
            m.set_prepend_scheme(PrependScheme::Never);
            PreTokenizerWrapper::Metaspace(m)
        }
        PreTokenizerWrapper::Sequence(mut seq) => {
            for inner in seq.as_mut() {
                *inner = without_prepend(inner.clone());
            }
            PreTokenizerWrapper::Sequence(seq)
        }
        other => other,
    }
}

/// A chat template and where it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplateSource {
    /// The Jinja source.
    pub text: String,
    /// Where it came from (a file, a GGUF key), for messages and `lmt model info`.
    pub origin: String,
}

/// A model's tokenizer with everything the runtime needs beside it: the
/// byte table shared with the grammar engine, the safe encoder, and the
/// BOS / EOS / end-of-turn ids from the configs.
#[derive(Debug, Clone)]
pub struct ModelTokenizer {
    /// The Hugging Face tokenizer (vocabulary and added tokens; encode text
    /// through [`ModelTokenizer::encoder`]).
    pub tokenizer: tokenizers::Tokenizer,
    /// Safe encoding of untrusted text.
    pub encoder: TextEncoder,
    /// Exact bytes of every token (shared with the engine).
    pub vocab: std::sync::Arc<crate::engine::Vocab>,
    /// BOS, when the tokenizer starts every sequence with one.
    pub bos: Option<u32>,
    /// The named BOS token, which chat templates may write (`bos_token`),
    /// whether or not plain prompts start with it.
    pub bos_token: Option<u32>,
    /// Ids that end generation.
    pub eos: Vec<u32>,
    /// Ids that end a chat turn (EOS included).
    pub eot: Vec<u32>,
    /// The chat template, if the model has one.
    pub chat_template: Option<ChatTemplateSource>,
    /// Other templates the model names (`tokenizer.chat_template.NAME` in a
    /// GGUF, a list in `tokenizer_config.json`): `tool_use`, say.
    pub named_templates: Vec<(String, ChatTemplateSource)>,
    /// Where the tokenizer was read from.
    pub origin: String,
}

/// Tokenizer classes of transformers that follow `add_bos_token` from
/// `tokenizer_config.json` (they rebuild their post-processor from it);
/// every other class adds what its `tokenizer.json` post-processor adds.
const CLASSES_WITH_ADD_BOS: &[&str] = &[
    "LlamaTokenizer",
    "LlamaTokenizerFast",
    "CodeLlamaTokenizer",
    "CodeLlamaTokenizerFast",
    "GemmaTokenizer",
    "GemmaTokenizerFast",
    "CohereTokenizer",
    "CohereTokenizerFast",
];

impl ModelTokenizer {
    /// Loads `tokenizer.json` and what lies beside it: `tokenizer_config.json`
    /// (special tokens, `add_bos_token`) and the chat template
    /// (`chat_template.jinja`, else `chat_template.json`, else the config's
    /// `chat_template`, as transformers reads them), with EOS ids also taken
    /// from the model config and `generation_config.json`.
    pub fn load(path: &Path, cfg: &TokenIds) -> Result<ModelTokenizer, ModelError> {
        let tok = Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer(format!("cannot load `{}`: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| ModelError::Tokenizer(format!("`{}` is not valid JSON: {e}", config_path.display())))?,
            Err(_) => serde_json::Value::Null,
        };
        let named = |key: &str| -> Option<u32> {
            let v = &config[key];
            let name = v.as_str().or_else(|| v["content"].as_str())?;
            tok.token_to_id(name)
        };
        // BOS exactly where transformers puts one: `add_bos_token` for the
        // classes that honour it, else whatever the post-processor adds.
        let probe = tok.encode("a", true).map(|e| e.get_ids().first().copied()).ok().flatten();
        let probe_bos = probe.filter(|&id| tok.get_added_tokens_decoder().get(&id).is_some_and(|t| t.special));
        let class = config["tokenizer_class"].as_str().unwrap_or("");
        let bos = match config["add_bos_token"].as_bool() {
            Some(add) if CLASSES_WITH_ADD_BOS.contains(&class) => add.then(|| named("bos_token").or(probe_bos)).flatten(),
            _ => probe_bos,
        };
        let vocab = crate::engine::Vocab::from_tokenizer(&tok);
        let mut eos: Vec<u32> = named("eos_token").into_iter().collect();
        if eos.is_empty() {
            // The common EOS names only when the tokenizer config names none.
            eos.extend(vocab.eos());
        }
        eos.extend(&cfg.eos);
        let chat_template = read_chat_template(dir, &config)?;
        let bos_token = named("bos_token").or(cfg.bos);
        let origin = dir.join("tokenizer_config.json").display().to_string();
        let named_templates = config["chat_template"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["name"].as_str()?.to_string(), t["template"].as_str()?.to_string())))
            .filter(|(n, _)| n != "default")
            .map(|(n, text)| (n, ChatTemplateSource { text, origin: origin.clone() }))
            .collect();
        Ok(ModelTokenizer::assemble(
            TextEncoder::new(&tok),
            tok,
            vocab,
            bos,
            bos_token,
            eos,
            chat_template,
            path.display().to_string(),
        )
        .with_named_templates(named_templates))
    }

    /// The tokenizer stored in a GGUF file's metadata (read from `origin`),
    /// as llama.cpp reads it.
    pub fn from_gguf(v: &GgufVocab, origin: &Path) -> Result<ModelTokenizer, ModelError> {
        let (tok, spm) = v.build()?;
        let encoder = match spm {
            Some(spm) => TextEncoder::with_spm(&tok, spm, v.add_space_prefix),
            None => TextEncoder::new(&tok),
        };
        let vocab = crate::engine::Vocab::from_tokenizer(&tok);
        let eos: Vec<u32> = v.eos.into_iter().chain(v.eot.iter().copied()).collect();
        let chat_template = v.chat_template.as_ref().map(|t| ChatTemplateSource {
            text: t.clone(),
            origin: format!("`tokenizer.chat_template` in {}", origin.display()),
        });
        let named = v
            .named_templates
            .iter()
            .map(|(n, text)| {
                (n.clone(), ChatTemplateSource { text: text.clone(), origin: format!("`tokenizer.chat_template.{n}` in {}", origin.display()) })
            })
            .collect();
        Ok(ModelTokenizer::assemble(
            encoder,
            tok,
            vocab,
            v.bos.filter(|_| v.add_bos),
            v.bos,
            eos,
            chat_template,
            format!("the GGUF metadata of {}", origin.display()),
        )
        .with_named_templates(named))
    }

    /// The same tokenizer with another chat template (`--chat-template`).
    pub fn with_chat_template(mut self, template: ChatTemplateSource) -> ModelTokenizer {
        self.chat_template = Some(template);
        self
    }

    fn with_named_templates(mut self, named: Vec<(String, ChatTemplateSource)>) -> ModelTokenizer {
        self.named_templates = named;
        self
    }

    /// The chat template `choice` names: a Jinja file, else one of the
    /// model's named templates.
    pub fn choose_chat_template(self, choice: &Path) -> Result<ModelTokenizer, ModelError> {
        if choice.is_file() {
            let t = read_template_file(choice)?;
            return Ok(self.with_chat_template(t));
        }
        let name = choice.to_string_lossy();
        match self.named_templates.iter().find(|(n, _)| *n == name) {
            Some((_, t)) => {
                let t = t.clone();
                Ok(self.with_chat_template(t))
            }
            None => {
                let names: Vec<&str> = self.named_templates.iter().map(|(n, _)| n.as_str()).collect();
                Err(ModelError::MissingFile {
                    path: choice.to_path_buf(),
                    what: format!(
                        "a chat template file, or the name of one of the model's templates ({})",
                        if names.is_empty() { "it names none".to_string() } else { names.join(", ") }
                    ),
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        encoder: TextEncoder,
        tok: Tokenizer,
        mut vocab: crate::engine::Vocab,
        bos: Option<u32>,
        bos_token: Option<u32>,
        named_eos: Vec<u32>,
        chat_template: Option<ChatTemplateSource>,
        origin: String,
    ) -> ModelTokenizer {
        let mut eos: Vec<u32> = Vec::new();
        for id in named_eos {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let mut eot = eos.clone();
        for name in ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>"] {
            if let Some(id) = tok.token_to_id(name) {
                if !eot.contains(&id) && vocab.kind(id) == TokenKind::Special {
                    eot.push(id);
                }
            }
        }
        vocab.set_eos(eos.clone());
        ModelTokenizer {
            encoder,
            tokenizer: tok,
            vocab: Arc::new(vocab),
            bos,
            bos_token,
            eos,
            eot,
            chat_template,
            named_templates: Vec::new(),
            origin,
        }
    }
}

/// The chat template of a Hugging Face directory, by transformers' order:
/// `chat_template.jinja`, then `chat_template.json` (`{"chat_template": …}`),
/// then `chat_template` in `tokenizer_config.json` (a string, or a list of
/// named templates of which `default` is used).
fn read_chat_template(dir: &Path, config: &serde_json::Value) -> Result<Option<ChatTemplateSource>, ModelError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return read_template_file(&jinja).map(Some);
    }
    let json_path = dir.join("chat_template.json");
    if json_path.is_file() {
        let text = std::fs::read_to_string(&json_path).map_err(|e| ModelError::io(&json_path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Tokenizer(format!("`{}` is not valid JSON: {e}", json_path.display())))?;
        if let Some(t) = template_value(&json["chat_template"]) {
            return Ok(Some(ChatTemplateSource { text: t, origin: json_path.display().to_string() }));
        }
    }
    Ok(template_value(&config["chat_template"])
        .map(|text| ChatTemplateSource { text, origin: dir.join("tokenizer_config.json").display().to_string() }))
}

/// A template given as a string, or as a list of named ones (the `default`).
fn template_value(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .or(list.first())
            .and_then(|t| t["template"].as_str().map(String::from)),
        _ => None,
    }
}

/// Reads a Jinja chat template file.
pub fn read_template_file(path: &Path) -> Result<ChatTemplateSource, ModelError> {
    const MAX: u64 = 1 << 20;
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    if !meta.is_file() || meta.len() > MAX {
        return Err(ModelError::Tokenizer(format!("`{}` is not a chat template file of at most 1 MiB", path.display())));
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    Ok(ChatTemplateSource { text, origin: path.display().to_string() })
}

/// Turns token bytes into text as they arrive: holds back an incomplete
/// UTF-8 sequence until its last byte comes, so streamed text never shows
/// a replacement character that the next token would have completed.
#[derive(Debug, Clone, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds `bytes`; returns the text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes (not merely incomplete): show them as
                        // U+FFFD and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The held-back bytes, lossily, at the end of the stream.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
