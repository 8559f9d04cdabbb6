//! Soft regex bias (`bias={"(?i)sorry": -5.0}`): a logit offset for every
//! token that extends a match of the pattern in progress — the
//! generalisation of token-id logit bias that llama.cpp PR #1397 asked for.
//!
//! A match may begin at the start of a token or right after the token's
//! leading white space (so `(?i)sorry` biases `" Sorry"`), and continues
//! across tokens. A token is biased when, after all its bytes, a match is
//! still possible, or when a match completed inside it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::dfa::{Dfa, DfaState};
use super::vocab::Vocab;
use super::{EngineError, Limits};

/// Matches in progress tracked per pattern; more are dropped (the bias is
/// soft, so this only makes it weaker on pathological patterns).
const MAX_ACTIVE: usize = 4;

/// Biased tokens, cached by (pattern, matches in progress).
type BiasCache = Mutex<HashMap<(usize, Vec<DfaState>), Arc<Vec<u32>>>>;

/// Compiled bias patterns with their offsets.
#[derive(Debug)]
pub struct Bias {
    patterns: Vec<(Dfa, f32)>,
    cache: BiasCache,
}

/// Where each pattern's matches stand after the tokens so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BiasState {
    active: Vec<Vec<DfaState>>,
}

#[derive(Clone, Copy)]
struct Walk {
    /// Matches in progress (each has consumed bytes of this token, except at the root).
    conts: [Option<DfaState>; MAX_ACTIVE],
    /// Only white space so far in this token: a fresh match may still start.
    ws_only: bool,
    /// A match completed inside this token.
    completed: bool,
}

impl Walk {
    fn biased(&self) -> bool {
        self.completed || self.conts.iter().any(Option::is_some)
    }
}

impl Bias {
    /// Compiles `(regex, offset)` pairs.
    pub fn new(patterns: &[(&str, f32)], limits: &Limits) -> Result<Bias, EngineError> {
        let patterns = patterns.iter().map(|(r, v)| Ok((Dfa::regex(r, limits)?, *v))).collect::<Result<_, EngineError>>()?;
        Ok(Bias { patterns, cache: Mutex::new(HashMap::new()) })
    }

    /// The state before any token.
    pub fn start(&self) -> BiasState {
        BiasState { active: vec![Vec::new(); self.patterns.len()] }
    }

    /// Calls `add(token, offset)` for every biased token given the tokens so
    /// far; a token biased by several patterns gets each offset.
    pub fn apply(&self, vocab: &Vocab, state: &BiasState, mut add: impl FnMut(u32, f32)) {
        for (i, (dfa, value)) in self.patterns.iter().enumerate() {
            let key = (i, state.active[i].clone());
            let cached = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
            let tokens = match cached {
                Some(t) => t,
                None => {
                    let t = Arc::new(biased_tokens(dfa, vocab, &state.active[i]));
                    let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                    // Bounded like every cache of the engine: start over when full.
                    if cache.len() >= 1024 {
                        cache.clear();
                    }
                    cache.insert(key, t.clone());
                    t
                }
            };
            for &t in tokens.iter() {
                add(t, *value);
            }
        }
    }

    /// Moves the matches on past the bytes of one token.
    pub fn advance(&self, state: &mut BiasState, token: &[u8]) {
        for (i, (dfa, _)) in self.patterns.iter().enumerate() {
            let mut w = Walk::root(&state.active[i]);
            for &b in token {
                w = w.step(dfa, b);
            }
            state.active[i] = w.conts.iter().flatten().copied().collect();
        }
    }
}

impl Walk {
    fn root(active: &[DfaState]) -> Walk {
        let mut conts = [None; MAX_ACTIVE];
        for (slot, s) in conts.iter_mut().zip(active) {
            *slot = Some(*s);
        }
        Walk { conts, ws_only: true, completed: false }
    }

    fn step(self, dfa: &Dfa, b: u8) -> Walk {
        let mut next = [None; MAX_ACTIVE];
        let mut n = 0;
        let mut push = |s: DfaState| {
            if n < MAX_ACTIVE && !next[..n].contains(&Some(s)) {
                next[n] = Some(s);
                n += 1;
            }
        };
        for s in self.conts.iter().flatten() {
            if let Some(t) = dfa.step(*s, b) {
                push(t);
            }
        }
        // A fresh match may start at the token's first byte, or after its
        // leading white space.
        if self.ws_only {
            if let Some(t) = dfa.step(dfa.start(), b) {
                push(t);
            }
        }
        let completed = self.completed || next.iter().flatten().any(|s| dfa.is_accepting(*s));
        // Drop finished matches that cannot go on.
        let mut conts = [None; MAX_ACTIVE];
        let mut k = 0;
        for s in next.iter().flatten() {
            if !dfa.is_complete(*s) {
                conts[k] = Some(*s);
                k += 1;
            }
        }
        Walk { conts, ws_only: self.ws_only && b.is_ascii_whitespace(), completed }
    }
}

fn biased_tokens(dfa: &Dfa, vocab: &Vocab, active: &[DfaState]) -> Vec<u32> {
    let mut out = Vec::new();
    vocab.trie().walk(
        Walk::root(active),
        |w, b| {
            let next = w.step(dfa, b);
            // Past the leading white space with no match in progress and
            // none completed: nothing below can be biased.
            let dead = !next.biased() && !next.ws_only;
            (!dead).then_some(next)
        },
        |tok, w| {
            if w.biased() {
                out.push(tok);
            }
        },
    );
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::vocab::{Encoding, TokenKind};

    fn vocab(words: &[&str]) -> Vocab {
        Vocab::from_parts(
            words.iter().map(|w| w.as_bytes().to_vec()).collect(),
            vec![TokenKind::Normal; words.len()],
            Encoding::Plain,
            vec![],
        )
    }

    #[test]
    fn biases_tokens_inside_a_match_in_progress() {
        let v = vocab(&["N", "NO", "NE", " None", "Hello", "(", "ONE", " sorry", "Sorry", "is"]);
        let bias = Bias::new(&[("NONE", -4.5), ("(?i)sorry", -5.0)], &Limits::default()).unwrap();
        let mut st = bias.start();
        let collect = |st: &BiasState| {
            let mut got = Vec::new();
            bias.apply(&v, st, |t, x| got.push((t, x)));
            got.sort_by_key(|p| p.0);
            got
        };
        // From the start: N, NO start NONE; " sorry" and "Sorry" start sorry;
        // " None" does not (case), "is" does not ("s" mid-word cannot start).
        assert_eq!(collect(&st), vec![(0, -4.5), (1, -4.5), (7, -5.0), (8, -5.0)]);
        bias.advance(&mut st, b"NO");
        // "NE" completes NONE; "ONE" does not continue "NO".
        let got = collect(&st);
        assert!(got.contains(&(2, -4.5)), "{got:?}");
        assert!(!got.contains(&(6, -4.5)), "{got:?}");
        bias.advance(&mut st, b"NE");
        assert!(st.active[0].is_empty(), "a finished match stops biasing");
    }
}
