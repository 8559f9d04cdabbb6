//! One interface over every constraint: compile once ([`Constraint`]),
//! then run a [`Matcher`] per generated value — masks, feeding bytes,
//! acceptance, and checkpoints to rewind to.

use std::sync::Arc;

use super::cfg::Cfg;
use super::dfa::{Dfa, DfaState};
use super::earley::{Parser, Tables};
use super::json_schema::{schema_grammar, Objects, Whitespace};
use super::vocab::Vocab;
use super::{EngineError, Limits, TokenMask};
use crate::syntax::gbnf::Grammar;

/// A compiled constraint, shareable between generations.
#[derive(Debug, Clone)]
pub enum Constraint {
    /// A regex or a list of literal choices.
    Regular(Arc<Dfa>),
    /// A context-free grammar (GBNF, JSON Schema).
    ContextFree(Arc<Tables>),
}

impl Constraint {
    /// A regex the value must match in full.
    pub fn regex(pattern: &str, limits: &Limits) -> Result<Constraint, EngineError> {
        Ok(Constraint::Regular(Arc::new(Dfa::regex(pattern, limits)?)))
    }

    /// Literal options, one of which the value must be.
    pub fn choices<S: AsRef<[u8]>>(options: &[S], limits: &Limits) -> Result<Constraint, EngineError> {
        Ok(Constraint::Regular(Arc::new(Dfa::choices(options, limits)?)))
    }

    /// A GBNF grammar starting at rule `start`.
    pub fn grammar(g: &Grammar, start: &str, limits: &Limits) -> Result<Constraint, EngineError> {
        Ok(Constraint::ContextFree(Arc::new(Tables::new(Cfg::from_gbnf(g, start, limits)?))))
    }

    /// JSON valid against `schema`, with objects closed or open as
    /// `objects` says where the schema is silent.
    pub fn json_schema(schema: &serde_json::Value, ws: Whitespace, objects: Objects, limits: &Limits) -> Result<Constraint, EngineError> {
        let g = schema_grammar(schema, ws, objects)?;
        Constraint::grammar(&g, "root", limits)
    }

    /// A matcher at the start of the value.
    pub fn matcher(&self, limits: &Limits) -> Matcher {
        match self {
            Constraint::Regular(d) => Matcher::Regular { dfa: d.clone(), states: vec![d.start()] },
            Constraint::ContextFree(t) => Matcher::ContextFree(Parser::new(t.clone(), limits.max_row_items)),
        }
    }
}

/// The progress of one value through its constraint.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// Through a DFA: the state after each byte.
    Regular {
        /// The automaton.
        dfa: Arc<Dfa>,
        /// States after 0, 1, … bytes.
        states: Vec<DfaState>,
    },
    /// Through the Earley parser.
    ContextFree(Parser),
}

impl Matcher {
    /// Writes the allowed next tokens (EOS where the value may end) into `out`.
    pub fn mask(&mut self, vocab: &Vocab, out: &mut TokenMask) -> Result<(), EngineError> {
        match self {
            Matcher::Regular { dfa, states } => {
                dfa.mask(vocab, *states.last().expect("start state"), out);
                dfa.check()
            }
            Matcher::ContextFree(p) => p.mask(vocab, out),
        }
    }

    /// Token healing: the tokens whose bytes start with `prefix` (the bytes
    /// of the prompt tokens just backed out) and go on with bytes this
    /// constraint allows; a token equal to `prefix` is allowed too. Used for
    /// the first token of a generation only; `prefix` itself is not fed.
    pub fn mask_after_prefix(&mut self, vocab: &Vocab, prefix: &[u8], out: &mut TokenMask) -> Result<(), EngineError> {
        out.clear();
        let trie = vocab.trie();
        let Some(node) = trie.find(prefix) else { return Ok(()) };
        trie.tokens_at(node).iter().for_each(|&t| out.set(t));
        match self {
            Matcher::Regular { dfa, states } => {
                let s = *states.last().expect("state");
                trie.walk_tokens_in(&mut Vec::new(), node, s, |st, b| dfa.step(st, b), out, |_, _, _| {});
                Ok(())
            }
            Matcher::ContextFree(p) => p.allow_below(trie, node, &mut Vec::new(), out),
        }
    }

    /// The bytes that must come next whatever is generated, up to `limit`:
    /// while the value is not complete and exactly one byte can follow. The
    /// interpreter feeds them as forced text instead of sampling.
    pub fn forced_bytes(&mut self, limit: usize) -> Result<Vec<u8>, EngineError> {
        if let Matcher::Regular { dfa, states } = self {
            return Ok(dfa.forced_bytes(*states.last().expect("state"), limit));
        }
        let start = self.position();
        let mut out = Vec::new();
        while out.len() < limit && !self.is_accepting() {
            let here = self.position();
            let mut only = None;
            for b in 0..=255u8 {
                if self.feed(&[b])? {
                    self.rewind(here);
                    if only.is_some() {
                        only = None;
                        break;
                    }
                    only = Some(b);
                }
            }
            let Some(b) = only else { break };
            self.feed(&[b])?;
            out.push(b);
        }
        self.rewind(start);
        Ok(out)
    }

    /// Consumes `bytes` if they can come next; otherwise consumes nothing
    /// and returns `false`.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<bool, EngineError> {
        match self {
            Matcher::Regular { dfa, states } => match dfa.feed(*states.last().expect("state"), bytes) {
                None => dfa.check().map(|()| false),
                Some(_) => {
                    let mut s = *states.last().expect("state");
                    for &b in bytes {
                        s = dfa.step(s, b).expect("checked");
                        states.push(s);
                    }
                    Ok(true)
                }
            },
            Matcher::ContextFree(p) => p.feed(bytes),
        }
    }

    /// True when the bytes so far are a whole value.
    pub fn is_accepting(&self) -> bool {
        match self {
            Matcher::Regular { dfa, states } => dfa.is_accepting(*states.last().expect("state")),
            Matcher::ContextFree(p) => p.is_accepting(),
        }
    }

    /// True when the value is accepted and nothing more can follow.
    pub fn is_complete(&self) -> bool {
        match self {
            Matcher::Regular { dfa, states } => dfa.is_complete(*states.last().expect("state")),
            Matcher::ContextFree(p) => p.is_accepting() && !p.can_continue(),
        }
    }

    /// Bytes consumed so far: a checkpoint for [`Matcher::rewind`].
    pub fn position(&self) -> usize {
        match self {
            Matcher::Regular { states, .. } => states.len() - 1,
            Matcher::ContextFree(p) => p.len() - 1,
        }
    }

    /// Forgets every byte after the first `position` (O(1) for both engines).
    pub fn rewind(&mut self, position: usize) {
        match self {
            Matcher::Regular { states, .. } => states.truncate(position + 1),
            Matcher::ContextFree(p) => p.truncate(position + 1),
        }
    }
}
