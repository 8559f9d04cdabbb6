//! The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`),
//! read as llama.cpp reads it: `gpt2` (byte-level BPE with merges, split
//! first by the regexes of the pre-tokenizer named in `tokenizer.ggml.pre`)
//! and `llama` (SentencePiece pieces with scores and `<0xNN>` bytes). The
//! result is a Hugging Face `Tokenizer` (vocabulary, added tokens, byte
//! table) and, for SentencePiece, llama.cpp's own merge rule beside it.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use super::spm::Spm;
use crate::model::ModelError;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// Ordinary vocabulary.
    Normal,
    /// The unknown token.
    Unknown,
    /// Control tokens: BOS, EOS, role markers. Never made from text.
    Control,
    /// Added text tokens, matched in text as one token.
    UserDefined,
    /// Reserved, never produced.
    Unused,
    /// `<0xNN>` byte pieces.
    Byte,
}

impl TokenType {
    fn from_i32(v: i32) -> TokenType {
        match v {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// Which tokenizer algorithm the file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufModel {
    /// Byte-level BPE (`gpt2`).
    Bpe,
    /// SentencePiece BPE with scores (`llama`).
    Spm,
}

/// Everything the GGUF metadata says about the tokenizer.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// The algorithm.
    pub model: GgufModel,
    /// `tokenizer.ggml.pre`, for BPE.
    pub pre: Option<String>,
    /// Token texts as stored.
    pub tokens: Vec<String>,
    /// Token types.
    pub types: Vec<TokenType>,
    /// SentencePiece scores (zero when absent).
    pub scores: Vec<f32>,
    /// BPE merges, `"left right"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` and `eom_token_id`.
    pub eot: Vec<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// Whether a BOS starts every prompt (the key, else llama.cpp's default
    /// for the model and pre-tokenizer).
    pub add_bos: bool,
    /// SentencePiece's prefix space (`tokenizer.ggml.add_space_prefix`).
    pub add_space_prefix: bool,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.chat_template.NAME` templates, by name.
    pub named_templates: Vec<(String, String)>,
    /// llama.cpp's Phi-3 rule (by `general.name`): special tokens swallow
    /// the white space after them, as Phi-3's own tokenizer does.
    pub rstrip_specials: bool,
}

/// A pre-tokenizer llama.cpp knows: its names in `tokenizer.ggml.pre`, the
/// regexes it splits with in order, and whether a word that is itself a
/// token skips the merges.
struct PreTokenizer {
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    ignore_merges: bool,
}

const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizers of llama.cpp's `llama-vocab.cpp` that lmt reproduces,
/// by the names its converter writes.
const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        names: &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx", "smaug-bpe"],
        regexes: &[LLAMA3_SPLIT],
        ignore_merges: true,
    },
    PreTokenizer {
        names: &["qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "kormo", "solar-open"],
        regexes: &[QWEN2_SPLIT],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        regexes: &[r"\p{N}", GPT2_SPLIT],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "mellum"],
        regexes: &[GPT2_SPLIT],
        ignore_merges: false,
    },
    PreTokenizer { names: &["default"], regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"], ignore_merges: false },
    PreTokenizer {
        names: &["deepseek-coder"],
        regexes: &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["deepseek-v3"],
        regexes: &[
            r"\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["falcon"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SPLIT, "[0-9][0-9][0-9]"],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["tekken"],
        regexes: &[r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
        ignore_merges: true,
    },
    PreTokenizer {
        names: &["gpt-4o", "llama4"],
        regexes: &[r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
        ignore_merges: false,
    },
    PreTokenizer { names: &["chatglm-bpe", "glm4"], regexes: &[LLAMA3_SPLIT], ignore_merges: true },
    PreTokenizer { names: &["poro-chat", "bloom", "gpt3-finnish"], regexes: &[" ?[^(\\s|.,!?…。，、।۔،)]+"], ignore_merges: false },
    PreTokenizer { names: &["viking"], regexes: &[" ?[^(\\s|.,!?…。，、।۔،)]+", r"\p{N}"], ignore_merges: false },
    PreTokenizer {
        names: &["seed-coder"],
        regexes: &[r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"],
        ignore_merges: false,
    },
];

/// The names of the pre-tokenizers lmt reads, for messages.
pub fn known_pre_tokenizers() -> Vec<&'static str> {
    PRE_TOKENIZERS.iter().flat_map(|p| p.names.iter().copied()).collect()
}

fn bad(key: &str, what: &str) -> ModelError {
    ModelError::Tokenizer(format!(
        "GGUF metadata `{key}` {what}; pass a tokenizer.json with --tokenizer to use another tokenizer"
    ))
}

/// An integer id of any integer type, as writers differ.
fn as_id(v: &Value) -> Option<u32> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x),
        Value::U64(x) => u32::try_from(x).ok(),
        Value::I8(x) => u32::try_from(x).ok(),
        Value::I16(x) => u32::try_from(x).ok(),
        Value::I32(x) => u32::try_from(x).ok(),
        Value::I64(x) => u32::try_from(x).ok(),
        _ => None,
    }
}

impl GgufVocab {
    /// Reads the tokenizer keys of `content`; `None` when the file has no
    /// tokenizer at all (`tokenizer.ggml.model` absent).
    pub fn read(content: &Content) -> Result<Option<GgufVocab>, ModelError> {
        let md = &content.metadata;
        let Some(model) = md.get("tokenizer.ggml.model") else { return Ok(None) };
        let model_name = model.to_string().map_err(|_| bad("tokenizer.ggml.model", "is not a string"))?;
        let model = match model_name.as_str() {
            "gpt2" => GgufModel::Bpe,
            "llama" => GgufModel::Spm,
            other => {
                return Err(bad(
                    "tokenizer.ggml.model",
                    &format!("names `{other}`, a tokenizer lmt does not read from GGUF (it reads `gpt2` and `llama`)"),
                ))
            }
        };
        let strings = |key: &str| -> Result<Option<Vec<String>>, ModelError> {
            let Some(v) = md.get(key) else { return Ok(None) };
            let list = v.to_vec().map_err(|_| bad(key, "is not an array"))?;
            list.iter()
                .map(|x| x.to_string().cloned().map_err(|_| bad(key, "holds a value that is not a string")))
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
        };
        let mut tokens = strings("tokenizer.ggml.tokens")?.ok_or_else(|| bad("tokenizer.ggml.tokens", "is missing"))?;
        // As llama.cpp: an empty token gets a placeholder text of its own.
        for (i, t) in tokens.iter_mut().enumerate().filter(|(_, t)| t.is_empty()) {
            *t = format!("[EMPTY_{i}]");
        }
        if tokens.is_empty() {
            return Err(bad("tokenizer.ggml.tokens", "is empty"));
        }
        let n = tokens.len();
        // A value per token: `default` for each when the key is absent.
        fn per_token<T: Clone>(md: &HashMap<String, Value>, key: &str, n: usize, default: T, what: &str, read: impl Fn(&Value) -> Option<T>) -> Result<Vec<T>, ModelError> {
            let Some(v) = md.get(key) else { return Ok(vec![default; n]) };
            let list = v.to_vec().map_err(|_| bad(key, "is not an array"))?;
            if list.len() < n {
                return Err(bad(key, &format!("has {} entries for {n} tokens", list.len())));
            }
            list.iter().take(n).map(|x| read(x).ok_or_else(|| bad(key, &format!("holds a value that is not {what}")))).collect()
        }
        let types = per_token(md, "tokenizer.ggml.token_type", n, TokenType::Normal, "an i32", |x| x.to_i32().ok().map(TokenType::from_i32))?;
        let scores = per_token(md, "tokenizer.ggml.scores", n, 0.0, "a number", |x| match x {
            Value::F32(f) => Some(*f),
            Value::I32(i) => Some(*i as f32),
            _ => None,
        })?;
        let merges = strings("tokenizer.ggml.merges")?.unwrap_or_default();
        if model == GgufModel::Bpe && merges.is_empty() {
            return Err(bad("tokenizer.ggml.merges", "is missing (a `gpt2` tokenizer needs its merges)"));
        }
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            match md.get(key) {
                None => Ok(None),
                Some(v) => match as_id(v) {
                    Some(i) if (i as usize) < n => Ok(Some(i)),
                    // llama.cpp writes -1 for "none" in some files.
                    _ if matches!(v, Value::I32(-1) | Value::I64(-1)) => Ok(None),
                    Some(i) => Err(bad(key, &format!("is {i}, past the {n} tokens"))),
                    None => Err(bad(key, "is not an integer")),
                },
            }
        };
        let flag = |key: &str| -> Result<Option<bool>, ModelError> {
            md.get(key).map(|v| v.to_bool().map_err(|_| bad(key, "is not a boolean"))).transpose()
        };
        let pre = match md.get("tokenizer.ggml.pre") {
            Some(v) => Some(v.to_string().map_err(|_| bad("tokenizer.ggml.pre", "is not a string"))?.clone()),
            None => None,
        };
        let default_bos = match model {
            GgufModel::Spm => true,
            GgufModel::Bpe => pre.as_deref().and_then(pre_tokenizer).is_some_and(|p| p.names[0] == "llama3"),
        };
        let text = |key: &str| -> Result<Option<String>, ModelError> {
            md.get(key).map(|v| v.to_string().cloned().map_err(|_| bad(key, "is not a string"))).transpose()
        };
        let mut named_templates: Vec<(String, String)> = Vec::new();
        for (k, v) in md {
            if let Some(name) = k.strip_prefix("tokenizer.chat_template.") {
                named_templates.push((name.to_string(), v.to_string().map_err(|_| bad(k, "is not a string"))?.clone()));
            }
        }
        named_templates.sort();
        let model_name = text("general.name")?.unwrap_or_default().to_lowercase();
        Ok(Some(GgufVocab {
            rstrip_specials: model_name.contains("phi-3") || model_name.contains("phi3"),
            model,
            pre,
            eot: [id("tokenizer.ggml.eot_token_id")?, id("tokenizer.ggml.eom_token_id")?].into_iter().flatten().collect(),
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?.unwrap_or(default_bos),
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(model == GgufModel::Spm),
            chat_template: text("tokenizer.chat_template")?,
            named_templates,
            tokens,
            types,
            scores,
            merges,
        }))
    }

    /// The Hugging Face tokenizer for this vocabulary and, for SentencePiece,
    /// the llama.cpp merge rule that encodes text.
    pub fn build(&self) -> Result<(Tokenizer, Option<Spm>), ModelError> {
        let vocab: ahash::AHashMap<String, u32> = self.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let hf_err = |e: tokenizers::Error| ModelError::Tokenizer(format!("cannot build the GGUF tokenizer: {e}"));
        let (mut tok, spm) = match self.model {
            GgufModel::Bpe => {
                let name = self.pre.as_deref().unwrap_or("default");
                let pre = pre_tokenizer(name).ok_or_else(|| {
                    bad(
                        "tokenizer.ggml.pre",
                        &format!(
                            "names the pre-tokenizer `{name}`, which lmt does not know (it knows {})",
                            known_pre_tokenizers().join(", ")
                        ),
                    )
                })?;
                let mut merges = Vec::with_capacity(self.merges.len());
                for m in &self.merges {
                    // As llama.cpp: split at the first space after the first byte.
                    let at = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
                    let Some(at) = at else { return Err(bad("tokenizer.ggml.merges", &format!("holds `{m}`, which is not two tokens"))) };
                    merges.push((m[..at].to_string(), m[at + 1..].to_string()));
                }
                let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(pre.ignore_merges).build().map_err(hf_err)?;
                let mut tok = Tokenizer::new(bpe);
                let mut parts = Vec::new();
                for r in pre.regexes {
                    let pattern = SplitPattern::Regex((*r).to_string());
                    parts.push(PreTokenizerWrapper::Split(Split::new(pattern, SplitDelimiterBehavior::Isolated, false).map_err(hf_err)?));
                }
                parts.push(PreTokenizerWrapper::ByteLevel(tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, false)));
                tok.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(PreSequence::new(parts))));
                tok.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
                (tok, None)
            }
            GgufModel::Spm => {
                let mut b = BPE::builder().vocab_and_merges(vocab, Vec::new()).byte_fallback(true);
                if let Some(u) = self.unk {
                    b = b.unk_token(self.tokens[u as usize].clone());
                }
                let mut tok = Tokenizer::new(b.build().map_err(hf_err)?);
                let replace = || Replace::new(" ", "▁").map_err(hf_err);
                let normalizer = if self.add_space_prefix {
                    NormalizerWrapper::Sequence(tokenizers::normalizers::Sequence::new(vec![
                        NormalizerWrapper::Prepend(Prepend::new("▁".into())),
                        NormalizerWrapper::Replace(replace()?),
                    ]))
                } else {
                    NormalizerWrapper::Replace(replace()?)
                };
                tok.with_normalizer(Some(normalizer)).map_err(hf_err)?;
                let mut decoders = vec![
                    DecoderWrapper::Replace(tokenizers::normalizers::Replace::new("▁", " ").map_err(hf_err)?),
                    DecoderWrapper::ByteFallback(ByteFallback::new()),
                    DecoderWrapper::Fuse(Fuse::new()),
                ];
                if self.add_space_prefix {
                    decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
                }
                tok.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(decoders))));
                (tok, Some(Spm::new(&self.tokens, &self.scores, self.unk)))
            }
        };
        // Control and unknown tokens are special; user-defined ones are
        // added text, matched whole as llama.cpp does.
        // llama.cpp strips after every one of them for Phi-3 but these.
        let rstrip = |text: &str| self.rstrip_specials && !matches!(text, "<unk>" | "<s>" | "<|endoftext|>");
        let added: Vec<AddedToken> = self
            .types
            .iter()
            .zip(&self.tokens)
            .filter_map(|(ty, text)| match ty {
                TokenType::Control | TokenType::Unknown => Some(AddedToken::from(text.clone(), true).rstrip(rstrip(text))),
                TokenType::UserDefined => Some(AddedToken::from(text.clone(), false).normalized(false).rstrip(rstrip(text))),
                _ => None,
            })
            .collect();
        let (special, plain): (Vec<AddedToken>, Vec<AddedToken>) = added.into_iter().partition(|t| t.special);
        tok.add_special_tokens(special).map_err(hf_err)?;
        tok.add_tokens(plain).map_err(hf_err)?;
        Ok((tok, spm))
    }
}

fn pre_tokenizer(name: &str) -> Option<&'static PreTokenizer> {
    PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name))
}
