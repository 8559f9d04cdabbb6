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
        let mut pts = PreTokenizedString::from(text);
        if let Some(n) = self.tok.get_normalizer() {
            pts.normalize(|s| normalize_without_prefix(n, s)).map_err(|e| e.to_string())?;
        }
        if let Some(p) = &self.pre {
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
