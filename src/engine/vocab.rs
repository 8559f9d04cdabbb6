//! The exact byte string of every token, read from a Hugging Face
//! `tokenizer.json`, and the token trie over those bytes. Built once per
//! tokenizer and shared by the grammar engine and the model runtime.
//!
//! Byte tables are built here rather than through the tokenizer's decoder:
//! the ByteLevel decoder is lossy on partial UTF-8 and `decode_stream`
//! withholds bytes until they form valid UTF-8.

use std::collections::HashMap;
use std::path::Path;

use super::trie::TokenTrie;
use super::EngineError;

/// What kind of token an id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A piece of the model's vocabulary: text.
    Normal,
    /// An added token that is not special (e.g. runs of spaces): text too.
    Added,
    /// A special token (BOS, EOS, role markers): never produced from text
    /// and never generated through a constraint.
    Special,
    /// An id the tokenizer does not define (holes, logits past the vocabulary).
    Unused,
}

/// How a tokenizer spells bytes in its vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// GPT-2's byte-to-unicode map (GPT-2, Llama-3, Qwen).
    ByteLevel,
    /// `▁` for space and `<0xNN>` byte-fallback pieces (Llama-2, Mistral, Phi-3).
    SentencePiece,
    /// Pieces are their UTF-8 text.
    Plain,
}

/// The vocabulary as bytes.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Unique per vocabulary built: keys the mask caches of shared automata.
    id: u64,
    bytes: Vec<Vec<u8>>,
    kinds: Vec<TokenKind>,
    encoding: Encoding,
    trie: TokenTrie,
    eos: Vec<u32>,
    slicer: std::sync::OnceLock<Slicer>,
    quoted: std::sync::OnceLock<Vec<u32>>,
}

/// Slices of the vocabulary, precomputed: where an automaton state takes
/// any text of a slice's kind up to its length, its token set is the slice
/// plus a walk over the other tokens only (the idea of llguidance's
/// slicer). Most of a 128k vocabulary is text, so a JSON string's state
/// walks a few thousand tokens instead of all of them.
#[derive(Debug, Clone)]
pub struct Slicer {
    /// Tried in order: the first a state takes is used.
    pub slices: Vec<Slice>,
}

/// Tokens whose bytes are all text of one kind, no longer than a length.
#[derive(Debug, Clone)]
pub struct Slice {
    /// Which bytes.
    pub kind: SliceKind,
    /// The longest token in it, in bytes.
    pub max_len: usize,
    /// Its tokens.
    pub tokens: super::TokenMask,
    /// The trie of every other generable token.
    pub rest: TokenTrie,
}

/// The text a slice's tokens are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceKind {
    /// Printable ASCII but `"` and `\\`.
    Plain,
    /// Plain, and well-formed UTF-8 characters past ASCII.
    Text,
}

impl SliceKind {
    /// The phase of a text reader after `byte` in phase `phase` (0 between
    /// characters, others inside one), or `None` if the kind has no such
    /// text. Text ends in phase 0.
    pub fn next(self, phase: u8, byte: u8) -> Option<u8> {
        let cont = |lo: u8, hi: u8, to: u8| (lo..=hi).contains(&byte).then_some(to);
        match (self, phase) {
            (_, 0) if (0x20..=0x7E).contains(&byte) && byte != b'"' && byte != b'\\' => Some(0),
            (SliceKind::Plain, _) => None,
            (_, 0) => match byte {
                0xC2..=0xDF => Some(1),
                0xE0 => Some(4),
                0xE1..=0xEC | 0xEE..=0xEF => Some(2),
                0xED => Some(5),
                0xF0 => Some(6),
                0xF1..=0xF3 => Some(3),
                0xF4 => Some(7),
                _ => None,
            },
            (_, 1) => cont(0x80, 0xBF, 0),
            (_, 2) => cont(0x80, 0xBF, 1),
            (_, 3) => cont(0x80, 0xBF, 2),
            (_, 4) => cont(0xA0, 0xBF, 1),
            (_, 5) => cont(0x80, 0x9F, 1),
            (_, 6) => cont(0x90, 0xBF, 2),
            (_, 7) => cont(0x80, 0x8F, 2),
            _ => None,
        }
    }

    /// True when `bytes` is whole text of this kind.
    pub fn contains(self, bytes: &[u8]) -> bool {
        bytes.iter().try_fold(0u8, |phase, &b| self.next(phase, b)) == Some(0)
    }
}

/// Text tokens up to this many bytes make a second text slice, for states
/// that take only so much more (a string's `maxLength`).
const SHORT_TEXT: usize = 16;

impl Vocab {
    /// Reads `tokenizer.json` (a file, or a directory holding it) and the
    /// `tokenizer_config.json` beside it, if any, for the EOS token.
    pub fn load(path: &Path) -> Result<(Vocab, tokenizers::Tokenizer), EngineError> {
        let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
        let tok = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| EngineError::Tokenizer(format!("cannot load `{}`: {e}", file.display())))?;
        let mut vocab = Vocab::from_tokenizer(&tok);
        if let Some(dir) = file.parent() {
            if let Ok(text) = std::fs::read_to_string(dir.join("tokenizer_config.json")) {
                if let Ok(cfg) = serde_json::from_str::<serde_json::Value>(&text) {
                    let name = match &cfg["eos_token"] {
                        serde_json::Value::String(s) => Some(s.clone()),
                        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
                        _ => None,
                    };
                    if let Some(id) = name.and_then(|n| tok.token_to_id(&n)) {
                        vocab.eos = vec![id];
                    }
                }
            }
        }
        Ok((vocab, tok))
    }

    /// The byte table of a loaded tokenizer, with its slices made. EOS is
    /// taken from common names (`</s>`, `<|endoftext|>`, …) until
    /// [`Vocab::set_eos`] says otherwise.
    pub fn from_tokenizer(tok: &tokenizers::Tokenizer) -> Vocab {
        let encoding = detect_encoding(tok);
        let pieces = tok.get_vocab(false);
        let added = tok.get_added_tokens_decoder();
        let size = pieces.values().chain(added.keys()).map(|&i| i as usize + 1).max().unwrap_or(0);
        let mut bytes = vec![Vec::new(); size];
        let mut kinds = vec![TokenKind::Unused; size];
        let byte_map = byte_level_decoder();
        for (piece, &id) in &pieces {
            bytes[id as usize] = piece_bytes(piece, encoding, &byte_map);
            kinds[id as usize] = TokenKind::Normal;
        }
        for (&id, t) in &added {
            bytes[id as usize] = t.content.as_bytes().to_vec();
            kinds[id as usize] = if t.special { TokenKind::Special } else { TokenKind::Added };
        }
        let eos = ["</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>"]
            .iter()
            .filter_map(|n| tok.token_to_id(n))
            .filter(|&id| kinds[id as usize] == TokenKind::Special)
            .take(1)
            .collect();
        let vocab = Vocab::from_parts(bytes, kinds, encoding, eos);
        // The slices now (29 ms for Llama-3's 128k tokens, 5 % of loading
        // it), not in the first mask that walks a text state.
        vocab.slicer();
        vocab
    }

    /// A vocabulary from explicit parts (tests, other tokenizer formats).
    pub fn from_parts(bytes: Vec<Vec<u8>>, kinds: Vec<TokenKind>, encoding: Encoding, eos: Vec<u32>) -> Vocab {
        let generable = bytes.iter().zip(&kinds).enumerate().filter_map(|(id, (b, k))| {
            (matches!(k, TokenKind::Normal | TokenKind::Added) && !b.is_empty()).then_some((id as u32, b.as_slice()))
        });
        let trie = TokenTrie::build(generable);
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Vocab { id, bytes, kinds, encoding, trie, eos, slicer: std::sync::OnceLock::new(), quoted: std::sync::OnceLock::new() }
    }

    /// A number unique to this vocabulary (caches are keyed by it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of token ids the tokenizer defines (a model's logit dimension
    /// may be larger).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes of token `id` (empty for unknown ids).
    pub fn bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The kind of token `id`.
    pub fn kind(&self, id: u32) -> TokenKind {
        self.kinds.get(id as usize).copied().unwrap_or(TokenKind::Unused)
    }

    /// How the vocabulary spells bytes.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// The trie of tokens a constraint may produce (normal and non-special
    /// added tokens with at least one byte).
    pub fn trie(&self) -> &TokenTrie {
        &self.trie
    }

    /// The slices (all text, short text, plain) with the trie of the other
    /// tokens of each, built on first use (at load for a real tokenizer).
    pub fn slicer(&self) -> &Slicer {
        self.slicer.get_or_init(|| {
            let slice = |kind: SliceKind, limit: usize| {
                let mut tokens = super::TokenMask::new(self.len());
                let mut max_len = 0;
                let mut rest = Vec::new();
                for id in (0..self.len() as u32).filter(|&id| self.is_generable(id)) {
                    let b = self.bytes(id);
                    if b.len() <= limit && kind.contains(b) {
                        tokens.set(id);
                        max_len = max_len.max(b.len());
                    } else {
                        rest.push((id, b));
                    }
                }
                Slice { kind, max_len, tokens, rest: TokenTrie::build(rest.into_iter()) }
            };
            Slicer { slices: vec![slice(SliceKind::Text, usize::MAX), slice(SliceKind::Text, SHORT_TEXT), slice(SliceKind::Plain, usize::MAX)] }
        })
    }

    /// The generable tokens whose bytes hold a `"` (those that can close a
    /// JSON string), made on first use.
    pub fn tokens_with_quote(&self) -> &[u32] {
        self.quoted.get_or_init(|| (0..self.len() as u32).filter(|&t| self.is_generable(t) && self.bytes(t).contains(&b'"')).collect())
    }

    /// End-of-sequence ids (allowed where a constraint accepts).
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Replaces the end-of-sequence ids (e.g. from `generation_config.json`).
    pub fn set_eos(&mut self, ids: Vec<u32>) {
        self.eos = ids;
    }

    /// True when a constraint may produce `id` as text.
    pub fn is_generable(&self, id: u32) -> bool {
        matches!(self.kind(id), TokenKind::Normal | TokenKind::Added) && !self.bytes(id).is_empty()
    }

    /// True for special and added tokens: ids that untrusted text must never
    /// produce (role markers and the like).
    pub fn is_special_or_added(&self, id: u32) -> bool {
        matches!(self.kind(id), TokenKind::Special | TokenKind::Added)
    }

    /// Concatenated bytes of a token sequence.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|&i| self.bytes(i).iter().copied()).collect()
    }
}

fn detect_encoding(tok: &tokenizers::Tokenizer) -> Encoding {
    use tokenizers::DecoderWrapper as D;
    fn of(d: &D) -> Option<Encoding> {
        match d {
            D::ByteLevel(_) => Some(Encoding::ByteLevel),
            D::Metaspace(_) | D::ByteFallback(_) => Some(Encoding::SentencePiece),
            D::Replace(r) if format!("{r:?}").contains('▁') => Some(Encoding::SentencePiece),
            D::Sequence(s) => s.get_decoders().iter().find_map(of),
            _ => None,
        }
    }
    tok.get_decoder().and_then(of).unwrap_or(Encoding::Plain)
}

/// GPT-2's unicode-to-byte map: printable bytes stand for themselves, the
/// others were shifted to U+0100 and up.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u8> = (b'!'..=b'~').chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut map: HashMap<char, u8> = printable.iter().map(|&b| (b as char, b)).collect();
    let mut n = 0u32;
    for b in 0..=255u8 {
        if !printable.contains(&b) {
            map.insert(char::from_u32(256 + n).expect("valid"), b);
            printable.push(b);
            n += 1;
        }
    }
    map
}

fn piece_bytes(piece: &str, encoding: Encoding, byte_map: &HashMap<char, u8>) -> Vec<u8> {
    match encoding {
        Encoding::ByteLevel => {
            let mut out = Vec::with_capacity(piece.len());
            for c in piece.chars() {
                match byte_map.get(&c) {
                    Some(&b) => out.push(b),
                    None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
            out
        }
        Encoding::SentencePiece => {
            if let Some(hex) = piece.strip_prefix("<0x").and_then(|r| r.strip_suffix('>')) {
                if hex.len() == 2 {
                    if let Ok(b) = u8::from_str_radix(hex, 16) {
                        return vec![b];
                    }
                }
            }
            piece.replace('▁', " ").into_bytes()
        }
        Encoding::Plain => piece.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::SliceKind;

    #[test]
    fn slice_kinds_take_exactly_their_text() {
        for ok in ["plain text!", "", "a~b#c"] {
            assert!(SliceKind::Plain.contains(ok.as_bytes()) && SliceKind::Text.contains(ok.as_bytes()), "{ok:?}");
        }
        for text in ["é", "日本語", "😀 ok", "\u{10FFFF}", "\u{E000}\u{D7FF}"] {
            assert!(SliceKind::Text.contains(text.as_bytes()) && !SliceKind::Plain.contains(text.as_bytes()), "{text:?}");
        }
        // Quotes, backslashes, controls; partial, overlong, surrogate and
        // out-of-range sequences are in no slice.
        for bad in [&b"\""[..], b"a\\b", b"\n", b"\x7f", b"\xc3", b"\xe6\x97", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"] {
            assert!(!SliceKind::Text.contains(bad) && !SliceKind::Plain.contains(bad), "{bad:?}");
        }
    }
}
