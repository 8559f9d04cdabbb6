//! Encoding text into token ids the safe way: text from templates, variables
//! and generation goes through the normalizer, pre-tokenizer and model only,
//! never through the added-token matcher, so it can never become a special
//! or added token (a role marker cannot be forged). The SentencePiece
//! "dummy prefix" (a `▁` prepended to every call) is left out: text is
//! encoded piece by piece and a leading space is written only where wanted.

use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

/// Encodes untrusted text with a tokenizer's model, never its added tokens.
#[derive(Clone)]
pub struct TextEncoder {
    tok: Tokenizer,
    pre: Option<PreTokenizerWrapper>,
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
        TextEncoder { tok: tok.clone(), pre }
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

    fn encode_with(&self, text: &str, prefix: bool) -> Result<Vec<u32>, String> {
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

/// A model's tokenizer with everything the runtime needs beside it: the
/// byte table shared with the grammar engine, the safe encoder, and the
/// BOS / EOS / end-of-turn ids from the configs.
#[derive(Debug, Clone)]
pub struct ModelTokenizer {
    /// The Hugging Face tokenizer.
    pub tokenizer: tokenizers::Tokenizer,
    /// Safe encoding of untrusted text.
    pub encoder: TextEncoder,
    /// Exact bytes of every token (shared with the engine).
    pub vocab: std::sync::Arc<crate::engine::Vocab>,
    /// BOS, when the tokenizer starts sequences with one.
    pub bos: Option<u32>,
    /// Ids that end generation.
    pub eos: Vec<u32>,
    /// Ids that end a chat turn (EOS included).
    pub eot: Vec<u32>,
    /// The chat template from `tokenizer_config.json`, if any.
    pub chat_template: Option<String>,
}

impl ModelTokenizer {
    /// Loads `tokenizer.json` and the `tokenizer_config.json` beside it,
    /// with EOS ids also taken from the model config.
    pub fn load(path: &std::path::Path, cfg: &crate::model::ModelConfig) -> Result<ModelTokenizer, crate::model::ModelError> {
        use crate::engine::TokenKind;
        use crate::model::ModelError;
        let tok = Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer(format!("cannot load `{}`: {e}", path.display())))?;
        let mut vocab = crate::engine::Vocab::from_tokenizer(&tok);
        let config: serde_json::Value = path
            .parent()
            .and_then(|d| std::fs::read_to_string(d.join("tokenizer_config.json")).ok())
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null);
        let named = |key: &str| -> Option<u32> {
            let v = &config[key];
            let name = v.as_str().or_else(|| v["content"].as_str())?;
            tok.token_to_id(name)
        };
        let mut eos: Vec<u32> = Vec::new();
        // The common EOS names only when the tokenizer config names none.
        let fallback = if named("eos_token").is_none() { vocab.eos().to_vec() } else { Vec::new() };
        for id in named("eos_token").into_iter().chain(cfg.eos_token_ids.iter().copied()).chain(fallback) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        // An id that is ordinary text (a config naming a plain token as
        // EOS, as test fixtures do) cannot end generation: its text would
        // be lost, and constraints would allow it as an end.
        eos.retain(|&id| (id as usize) >= vocab.len() || !vocab.is_generable(id));
        // BOS: `add_bos_token` when the config says; else whatever the
        // tokenizer's post-processor puts first; else the named BOS token
        // when it is a token of its own (Llama 3's `<|begin_of_text|>`),
        // not Qwen's `<|endoftext|>` that doubles as EOS.
        let probe = tok.encode("a", true).map(|e| e.get_ids().first().copied()).ok().flatten();
        let probe_bos = probe.filter(|&id| vocab.kind(id) == TokenKind::Special);
        let named_bos = named("bos_token").or(cfg.bos_token_id);
        let bos = match config["add_bos_token"].as_bool() {
            Some(true) => named_bos.or(probe_bos),
            Some(false) => None,
            None => probe_bos.or(named_bos.filter(|id| !eos.contains(id))),
        };
        let mut eot = eos.clone();
        for name in ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"] {
            if let Some(id) = tok.token_to_id(name) {
                if !eot.contains(&id) && vocab.kind(id) == TokenKind::Special {
                    eot.push(id);
                }
            }
        }
        vocab.set_eos(eos.clone());
        let chat_template = match &config["chat_template"] {
            serde_json::Value::String(s) => Some(s.clone()),
            // A list of named templates: the default one.
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .or(list.first())
                .and_then(|t| t["template"].as_str().map(String::from)),
            _ => None,
        };
        Ok(ModelTokenizer {
            encoder: TextEncoder::new(&tok),
            tokenizer: tok,
            vocab: std::sync::Arc::new(vocab),
            bos,
            eos,
            eot,
            chat_template,
        })
    }
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
