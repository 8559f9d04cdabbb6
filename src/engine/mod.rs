//! The token-level grammar engine: which tokens may come next so that the
//! generated value provably matches its constraint.
//!
//! It knows bytes and token ids, not tensors or templates. [`Vocab`] holds
//! the exact bytes of every token and the token trie. A [`Constraint`] is
//! compiled once: regexes and literal choices become a [`Dfa`]; grammars (GBNF
//! lowered into the engine's [`Grammar`] IR) and JSON Schemas
//! ([`schema_grammar`]) become a [`Cfg`] of DFA lexemes run
//! by the Earley [`Parser`]. A [`Matcher`] per generated value writes masks
//! into a [`TokenMask`] sized to the model's logit dimension, consumes bytes,
//! and rewinds. [`StopMatcher`] finds stop strings and regexes across token
//! boundaries; [`Bias`] is the soft regex bias. [`Limits`] bounds the work.

mod bias;
mod context_free;
mod dfa;
mod earley;
mod gbnf_out;
mod grammar;
mod json_keys;
mod json_schema;
mod matcher;
mod memo;
mod stop;
mod trie;
mod vocab;

pub use bias::{Bias, BiasState};
pub use context_free::{Cfg, Perm, Production, Sym};
pub use earley::{Parser, Tables};
pub use gbnf_out::{choices_gbnf, gbnf_after, grammar_gbnf, regex_gbnf};
pub use grammar::{Expr, Grammar, Rule};
pub use json_schema::{schema_grammar, Semantics, SchemaGrammar, Whitespace, UNSUPPORTED as UNSUPPORTED_KEYWORDS, VALIDATION as VALIDATION_KEYWORDS};
pub use matcher::{Constraint, Matcher};
pub use dfa::{Dfa, DfaState, Exits};
pub use stop::{StopEvent, StopMatcher};
pub use trie::TokenTrie;
pub use vocab::{Encoding, Slice, SliceKind, Slicer, TokenKind, Vocab};

/// Why the engine refused something.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineError {
    /// A regex that does not parse or uses what automata cannot do.
    Regex(String),
    /// A feature the engine cannot enforce exactly (named in the message).
    Unsupported(String),
    /// A constraint past the limits (states, memory, nesting).
    TooComplex(String),
    /// Nothing can satisfy the constraint (from this point).
    Unsatisfiable(String),
    /// A token the constraint does not allow was committed.
    Rejected(String),
    /// The tokenizer could not be loaded.
    Tokenizer(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Regex(m) => write!(f, "invalid regex: {m}"),
            EngineError::Unsupported(m) => write!(f, "unsupported: {m}"),
            EngineError::TooComplex(m) => write!(f, "constraint too complex: {m}"),
            EngineError::Unsatisfiable(m) => write!(f, "unsatisfiable constraint: {m}"),
            EngineError::Rejected(m) => write!(f, "rejected: {m}"),
            EngineError::Tokenizer(m) => write!(f, "tokenizer: {m}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// Bounds on the work a constraint may cause, so hostile input is an error
/// with a message, not a hang.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most DFA states explored per constraint.
    pub max_states: usize,
    /// Most bytes for one automaton (NFA, DFA, determinization).
    pub max_automaton_bytes: usize,
    /// Deepest regex nesting.
    pub max_nesting: usize,
    /// Most Earley items in one parse state.
    pub max_row_items: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_states: 200_000, max_automaton_bytes: 16 << 20, max_nesting: 128, max_row_items: 100_000 }
    }
}

/// A cached set of token ids: a list when small (most lexeme states allow a
/// handful of tokens), a bitset when not; adding a small one to a mask then
/// costs its size, not the vocabulary's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSet {
    /// Ascending ids.
    Sparse(Vec<u32>),
    /// A bitset over the vocabulary.
    Dense(TokenMask),
}

/// Sets with fewer ids than this are kept as lists.
const SPARSE_MAX: usize = 512;

impl TokenSet {
    /// The set of the ids in `mask`, in the cheaper form.
    pub fn from_mask(mask: TokenMask) -> TokenSet {
        if mask.count() < SPARSE_MAX {
            TokenSet::Sparse(mask.ones().collect())
        } else {
            TokenSet::Dense(mask)
        }
    }

    /// Allows every id of the set in `out`.
    pub fn add_to(&self, out: &mut TokenMask) {
        match self {
            TokenSet::Sparse(ids) => ids.iter().for_each(|&t| out.set(t)),
            TokenSet::Dense(m) => out.union_with(m),
        }
    }

    /// Makes `out` exactly this set (ids past its length dropped).
    pub fn copy_to(&self, out: &mut TokenMask) {
        match self {
            TokenSet::Sparse(ids) => {
                out.clear();
                ids.iter().for_each(|&t| out.set(t));
            }
            TokenSet::Dense(m) => out.copy_prefix(m),
        }
    }

}

/// A set of token ids as a packed bitset, sized to a model's logit
/// dimension (which may exceed the vocabulary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u64>,
    len: usize,
}

impl TokenMask {
    /// An empty mask over `len` ids.
    pub fn new(len: usize) -> TokenMask {
        TokenMask { words: vec![0; len.div_ceil(64)], len }
    }

    /// Number of ids it covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it covers no ids.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allows `id` (ignored past the end).
    pub fn set(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 64] |= 1 << (i % 64);
        }
    }

    /// Forbids `id`.
    pub fn unset(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 64] &= !(1 << (i % 64));
        }
    }

    /// True when `id` is allowed.
    pub fn get(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Forbids everything.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Copies `other` into the front of `self` and forbids the rest.
    pub fn copy_prefix(&mut self, other: &TokenMask) {
        let n = other.words.len().min(self.words.len());
        self.words[..n].copy_from_slice(&other.words[..n]);
        self.words[n..].fill(0);
        // `other` may have been longer.
        self.trim();
    }

    /// Drops the bits past the end, in the last word.
    fn trim(&mut self) {
        if !self.len.is_multiple_of(64) {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u64 << (self.len % 64)) - 1;
            }
        }
    }

    /// Allows every id `other` allows (over the shorter length).
    pub fn union_with(&mut self, other: &TokenMask) {
        self.words.iter_mut().zip(&other.words).for_each(|(a, b)| *a |= b);
        // `other` may have been longer.
        self.trim();
    }

    /// Number of allowed ids.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The packed bits: id `i` is bit `i % 64` of word `i / 64` (none set
    /// past [`TokenMask::len`]).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// The allowed ids, ascending.
    pub fn ones(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                Some((w * 64) as u32 + b)
            })
        })
    }

}
