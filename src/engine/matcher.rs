//! One interface over every constraint: compile once ([`Constraint`]),
//! then run a [`Matcher`] per generated value — masks, feeding bytes,
//! acceptance, and checkpoints to rewind to.

use std::sync::Arc;

use super::context_free::Cfg;
use super::dfa::{Dfa, DfaState};
use super::earley::{Parser, Tables};
use super::json_keys::KeyScan;
use super::json_schema::{schema_grammar, Semantics, Whitespace};
use super::vocab::Vocab;
use super::grammar::Grammar;
use super::{EngineError, Limits, TokenMask};

/// A compiled constraint, shareable between generations.
#[derive(Debug, Clone)]
pub struct Constraint {
    automaton: Automaton,
    /// JSON whose objects may take keys the grammar cannot tell apart: the
    /// matcher keeps them from repeating ([`KeyScan`]).
    json_keys: bool,
}

#[derive(Debug, Clone)]
enum Automaton {
    /// A regex or a list of literal choices.
    Regular(Arc<Dfa>),
    /// A context-free grammar (GBNF, JSON Schema).
    ContextFree(Arc<Tables>),
}

impl Constraint {
    /// A regex the value must match in full.
    pub fn regex(pattern: &str, limits: &Limits) -> Result<Constraint, EngineError> {
        Ok(Constraint { automaton: Automaton::Regular(Arc::new(Dfa::regex(pattern, limits)?)), json_keys: false })
    }

    /// Literal options, one of which the value must be.
    pub fn choices<S: AsRef<[u8]>>(options: &[S], limits: &Limits) -> Result<Constraint, EngineError> {
        Ok(Constraint { automaton: Automaton::Regular(Arc::new(Dfa::choices(options, limits)?)), json_keys: false })
    }

    /// A grammar (GBNF lowered with `Grammar::from`, or built) starting at
    /// rule `start`.
    pub fn grammar(g: &Grammar, start: &str, limits: &Limits) -> Result<Constraint, EngineError> {
        let tables = Tables::new(Cfg::new(g, start, limits)?);
        Ok(Constraint { automaton: Automaton::ContextFree(Arc::new(tables)), json_keys: false })
    }

    /// JSON valid against `schema`, with objects closed or open as
    /// `objects` says where the schema is silent, and no key twice in an
    /// object.
    pub fn json_schema(schema: &serde_json::Value, ws: Whitespace, semantics: Semantics, limits: &Limits) -> Result<Constraint, EngineError> {
        let g = schema_grammar(schema, ws, semantics)?;
        let mut c = Constraint::grammar(&g.grammar, "root", limits)?;
        c.json_keys = g.other_keys;
        Ok(c)
    }

    /// The same constraint without the check that keys never repeat: what
    /// JSON Schema validation and llguidance accept, for the
    /// JSONSchemaBench comparison (`cargo bench --bench jsonschemabench`, the engine bench).
    pub fn allowing_repeated_keys(mut self) -> Constraint {
        self.json_keys = false;
        self
    }

    /// A matcher at the start of the value.
    pub fn matcher(&self, limits: &Limits) -> Matcher {
        let engine = match &self.automaton {
            Automaton::Regular(d) => Engine::Regular { dfa: d.clone(), states: vec![d.start()] },
            Automaton::ContextFree(t) => Engine::ContextFree(Parser::new(t.clone(), limits.max_row_items)),
        };
        Matcher { engine, text: self.json_keys.then(Vec::new) }
    }
}

/// The progress of one value through its constraint.
#[derive(Debug, Clone)]
pub struct Matcher {
    engine: Engine,
    /// The bytes so far, kept where keys must not repeat.
    text: Option<Vec<u8>>,
}

#[derive(Debug, Clone)]
enum Engine {
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
        match &mut self.engine {
            Engine::Regular { dfa, states } => {
                dfa.mask(vocab, *states.last().expect("start state"), out);
                dfa.check()?;
            }
            Engine::ContextFree(p) => p.mask(vocab, out)?,
        }
        self.forbid_repeated_keys(vocab, out)
    }

    /// Takes out of `out` every token that would repeat a key in its JSON
    /// object, or begin a key that only a repeat could finish.
    fn forbid_repeated_keys(&mut self, vocab: &Vocab, out: &mut TokenMask) -> Result<(), EngineError> {
        // A text that repeats a key already cannot come from a mask; the
        // scan then has nothing to add.
        let Some(Ok(scan)) = self.text.as_deref().map(KeyScan::of) else { return Ok(()) };
        for (t, prefix, keys) in scan.screen(vocab, out) {
            let here = self.engine.position();
            let ok = self.engine.feed(vocab.bytes(t))? && self.engine.finishes_new_key(&prefix, &keys)?;
            self.engine.rewind(here);
            if !ok {
                out.unset(t);
            }
        }
        Ok(())
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
        match &mut self.engine {
            Engine::Regular { dfa, states } => {
                let s = *states.last().expect("state");
                trie.walk_tokens_in(&mut Vec::new(), node, s, |st, b| dfa.step(st, b), out, |_, _, _| {});
                Ok(())
            }
            Engine::ContextFree(p) => p.allow_below(trie, node, &mut Vec::new(), out),
        }
    }

    /// The bytes that must come next whatever is generated, up to `limit`:
    /// while the value is not complete and exactly one byte can follow. The
    /// interpreter feeds them as forced text instead of sampling.
    pub fn forced_bytes(&mut self, limit: usize) -> Result<Vec<u8>, EngineError> {
        if let Engine::Regular { dfa, states } = &self.engine {
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
    /// and returns `false`. In JSON, bytes that repeat a key of their
    /// object, or begin a key that only a repeat could finish, cannot come.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<bool, EngineError> {
        let here = self.engine.position();
        if !self.engine.feed(bytes)? {
            return Ok(false);
        }
        let Some(text) = &self.text else { return Ok(true) };
        let mut scan = KeyScan::of(text).unwrap_or_default();
        let ok = match scan.feed(bytes) {
            Err(_) => false,
            Ok(()) => match scan.key_in_progress().filter(|(p, keys)| keys.iter().any(|k| k.starts_with(p))) {
                Some((prefix, keys)) => {
                    let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
                    self.engine.finishes_new_key(prefix, &keys)?
                }
                None => true,
            },
        };
        if !ok {
            self.engine.rewind(here);
            return Ok(false);
        }
        if let Some(text) = &mut self.text {
            text.extend_from_slice(bytes);
        }
        Ok(true)
    }

    /// True when the bytes so far are a whole value.
    pub fn is_accepting(&self) -> bool {
        match &self.engine {
            Engine::Regular { dfa, states } => dfa.is_accepting(*states.last().expect("state")),
            Engine::ContextFree(p) => p.is_accepting(),
        }
    }

    /// True when the value is accepted and nothing more can follow.
    pub fn is_complete(&self) -> bool {
        match &self.engine {
            Engine::Regular { dfa, states } => dfa.is_complete(*states.last().expect("state")),
            Engine::ContextFree(p) => p.is_accepting() && !p.can_continue(),
        }
    }

    /// Bytes consumed so far: a checkpoint for [`Matcher::rewind`].
    pub fn position(&self) -> usize {
        self.engine.position()
    }

    /// Forgets every byte after the first `position` (O(1) for both engines).
    pub fn rewind(&mut self, position: usize) {
        self.engine.rewind(position);
        if let Some(text) = &mut self.text {
            text.truncate(position);
        }
    }
}

impl Engine {
    /// Consumes `bytes` if the automaton or grammar takes them.
    fn feed(&mut self, bytes: &[u8]) -> Result<bool, EngineError> {
        match self {
            Engine::Regular { dfa, states } => match dfa.feed(*states.last().expect("state"), bytes) {
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
            Engine::ContextFree(p) => p.feed(bytes),
        }
    }

    fn position(&self) -> usize {
        match self {
            Engine::Regular { states, .. } => states.len() - 1,
            Engine::ContextFree(p) => p.len() - 1,
        }
    }

    fn rewind(&mut self, position: usize) {
        match self {
            Engine::Regular { states, .. } => states.truncate(position + 1),
            Engine::ContextFree(p) => p.truncate(position + 1),
        }
    }

    /// True when the key being written (its bytes so far, `prefix`, which
    /// begins some of `keys`) can end as a key not in `keys`: the search
    /// follows only bytes that keep it the beginning of one of them, as any
    /// other byte makes it a new key (every automaton state made is live).
    fn finishes_new_key(&mut self, prefix: &[u8], keys: &[Vec<u8>]) -> Result<bool, EngineError> {
        let here = self.position();
        let escaped = prefix.iter().rev().take_while(|&&c| c == b'\\').count() % 2 == 1;
        for b in 0..=255u8 {
            if !self.feed(&[b])? {
                continue;
            }
            let ok = if b == b'"' && !escaped {
                !keys.iter().any(|k| k == prefix)
            } else {
                let longer = [prefix, &[b]].concat();
                !keys.iter().any(|k| k.starts_with(&longer)) || self.finishes_new_key(&longer, keys)?
            };
            self.rewind(here);
            if ok {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
