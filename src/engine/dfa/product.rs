//! Products of automata: the difference of two regular languages, which
//! regex syntax cannot say (JSON Schema needs it for "any key but these
//! names and patterns"), explored at once; and its common case, a language
//! minus a finite set of literals, made as walks reach it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use regex_automata::nfa::thompson::NFA;
use regex_automata::util::primitives::StateID;

use super::literals::Literals;
use super::{check_size, finish, Determinizer, Dfa, DfaState, Rule, SetHasher, ACCEPTING, COMPLETE, DEAD, LIVE};
use crate::engine::{EngineError, Limits};

/// The automaton of the strings `a` accepts and `b` does not: the product
/// of the two, explored at once from their start states, over byte classes
/// that refine both.
pub(super) fn difference(a: &Dfa, b: &Dfa, limits: &Limits) -> Result<Dfa, EngineError> {
    let (classes, reps) = refine(|x| a.classes[x] != a.classes[x - 1] || b.classes[x] != b.classes[x - 1]);
    // `None` for `b`: no string of `b` starts with what was read.
    let start = b.is_live(b.start()).then(|| b.start());
    if !a.is_live(a.start()) {
        return Ok(finish(classes, reps.len(), &vec![DEAD; reps.len()], &[false]));
    }
    // Pairs as one number, hashed by multiply-rotate (SipHash was a third
    // of the compile time of schemas with large products).
    let key = |(sa, sb): (DfaState, Option<DfaState>)| (sa as u64) << 32 | sb.unwrap_or(DEAD) as u64;
    let mut order = vec![(a.start(), start)];
    let mut ids: HashMap<u64, u32, BuildHasherDefault<SetHasher>> = HashMap::from_iter([(key(order[0]), 0)]);
    let mut raw: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        check_size(order.len(), raw.len(), limits)?;
        let (sa, sb) = order[i];
        i += 1;
        for &byte in &reps {
            let Some(na) = a.step(sa, byte) else {
                raw.push(DEAD);
                continue;
            };
            let next = (na, sb.and_then(|sb| b.step(sb, byte)));
            let fresh = order.len() as u32;
            raw.push(*ids.entry(key(next)).or_insert_with(|| {
                order.push(next);
                fresh
            }));
        }
    }
    a.check()?;
    b.check()?;
    let accepting: Vec<bool> = order.iter().map(|&(sa, sb)| a.is_accepting(sa) && !sb.is_some_and(|sb| b.is_accepting(sb))).collect();
    Ok(finish(classes, reps.len(), &raw, &accepting))
}

/// The automaton of the strings `a` accepts but for `literals`: pairs of
/// `a`'s state and a node of the literals' trie, made as walks reach them
/// (an object's "any other key" is rarely walked past a few names, and the
/// eager product of Kubernetes' hundreds of objects was half their compile).
pub(super) fn minus_literals(a: Arc<Dfa>, literals: &[&[u8]], limits: &Limits) -> Result<Dfa, EngineError> {
    let trie = Literals::new(literals);
    check_size(trie.len(), 0, limits)?;
    // `a`'s classes with each byte of the literals in a class of its own.
    let (classes, reps) = refine(|x| a.classes[x] != a.classes[x - 1] || trie.used[x] || trie.used[x - 1]);
    let stride = reps.len();
    let start = Minus::key(a.start(), 0).to_vec();
    let minus = Minus { a, trie, reps: reps.clone(), live: RefCell::new(HashMap::default()) };
    let mut det = Determinizer::new(NFA::never_match(), reps);
    det.rule = Some(Box::new(minus));
    Dfa::lazy(classes, stride, det, start, limits)
}

/// A pair of `a`'s state and a trie node ([`OFF`] once off the trie).
#[derive(Debug)]
struct Minus {
    a: Arc<Dfa>,
    trie: Literals,
    reps: Vec<u8>,
    /// Pairs known to lead to a string `a` takes and the trie does not.
    live: RefCell<HashMap<(DfaState, u32), bool, BuildHasherDefault<SetHasher>>>,
}

/// No trie node: what was read is no literal's prefix.
const OFF: u32 = u32::MAX;

impl Minus {
    fn key(sa: DfaState, node: u32) -> [StateID; 4] {
        let id = |x: u32| StateID::new(x as usize & 0xFFFF).expect("16 bits");
        [id(sa), id(sa >> 16), id(node), id(node >> 16)]
    }

    fn decode(key: &[StateID]) -> (DfaState, u32) {
        let x = |i: usize| key[i].as_usize() as u32;
        (x(0) | x(1) << 16, x(2) | x(3) << 16)
    }

    /// The pair after `byte`, if `a` goes on.
    fn step(&self, (sa, node): (DfaState, u32), byte: u8) -> Option<(DfaState, u32)> {
        let na = self.a.step(sa, byte)?;
        Some((na, if node == OFF { OFF } else { self.trie.child(node, byte).unwrap_or(OFF) }))
    }

    fn accepting(&self, (sa, node): (DfaState, u32)) -> bool {
        self.a.is_accepting(sa) && (node == OFF || !self.trie.ends(node))
    }

    /// Whether some string `a` takes from `sa` is not one the trie takes
    /// from `node`. Off the trie every live state of `a` is; on it the
    /// search goes one trie level deeper a step, so it ends.
    fn is_live(&self, pair: (DfaState, u32)) -> bool {
        if pair.1 == OFF || self.accepting(pair) {
            return true;
        }
        if let Some(&known) = self.live.borrow().get(&pair) {
            return known;
        }
        let live = self.reps.iter().any(|&b| self.step(pair, b).is_some_and(|next| self.is_live(next)));
        self.live.borrow_mut().insert(pair, live);
        live
    }
}

impl Rule for Minus {
    fn next(&self, key: &[StateID], byte: u8, out: &mut Vec<StateID>) {
        if let Some(next) = self.step(Minus::decode(key), byte) {
            out.extend(Minus::key(next.0, next.1));
        }
    }

    fn flags(&self, key: &[StateID]) -> u32 {
        let pair = Minus::decode(key);
        let accepting = self.accepting(pair);
        let live = self.is_live(pair);
        let goes_on = self.reps.iter().any(|&b| self.step(pair, b).is_some_and(|next| self.is_live(next)));
        (accepting as u32 * ACCEPTING) | (live as u32 * LIVE) | ((accepting && !goes_on) as u32 * COMPLETE)
    }
}

/// Byte classes that start a new class at each byte `x` where `split(x)`
/// (never at 0), and a byte of each class.
pub(super) fn refine(split: impl Fn(usize) -> bool) -> ([u8; 256], Vec<u8>) {
    let mut classes = [0u8; 256];
    let mut reps = vec![0u8];
    for (x, class) in classes.iter_mut().enumerate().skip(1) {
        if split(x) {
            reps.push(x as u8);
        }
        *class = (reps.len() - 1) as u8;
    }
    (classes, reps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difference_matches_exactly_what_one_takes_and_the_other_does_not() {
        let l = Limits::default();
        let a = Dfa::regex("[a-z]+", &l).unwrap();
        let b = Dfa::regex("ab|abc|x.*|é", &l).unwrap();
        let d = a.difference(&b, &l).unwrap();
        let matches = |s: &str| d.feed(d.start(), s.as_bytes()).is_some_and(|st| d.is_accepting(st));
        for yes in ["a", "abd", "ac", "abcd", "ba", "y"] {
            assert!(matches(yes), "{yes}");
        }
        for no in ["", "ab", "abc", "x", "xyz", "A", "é", "ab1"] {
            assert!(!matches(no), "{no}");
        }
        // "x…" can never match again: the walk stops at once, as with any automaton.
        assert!(d.step(d.start(), b'x').is_none());
        // Complete where nothing may follow: after "ab" more letters may.
        let ab = d.feed(d.start(), b"ab").unwrap();
        assert!(!d.is_accepting(ab) && !d.is_complete(ab));
        // Minus everything, nothing is left.
        assert!(a.difference(&Dfa::regex("(?s:.)*", &l).unwrap(), &l).unwrap().is_empty());
        assert!(!d.is_empty());
        // The product is bounded like any eager automaton.
        let big = Dfa::regex("[a-z]{0,300}", &l).unwrap();
        let small = Limits { max_states: 50, ..Limits::default() };
        assert!(matches!(big.difference(&b, &small), Err(EngineError::TooComplex(_))));
    }

    #[test]
    fn minus_literals_agrees_with_the_difference() {
        let l = Limits::default();
        let string = Arc::new(Dfa::regex(r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#, &l).unwrap());
        let names: Vec<String> = ["feature", "feat", "", "é", "a\\\"b", "x"].iter().map(|n| serde_json::to_string(n).unwrap()).collect();
        let lits: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
        let fast = string.minus_literals(&lits, &l).unwrap();
        let slow = string.difference(&Dfa::choices(&lits, &l).unwrap(), &l).unwrap();
        let matches = |d: &Dfa, s: &[u8]| d.feed(d.start(), s).is_some_and(|st| d.is_accepting(st));
        // Every string of up to three bytes from a small alphabet, quoted and not.
        let alphabet = b"\"\\afetux\xc3\xa9 ";
        let mut texts: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..3 {
            let more: Vec<Vec<u8>> = texts.iter().flat_map(|t| alphabet.iter().map(move |&b| [t.as_slice(), &[b]].concat())).collect();
            texts.extend(more);
        }
        texts.extend(names.iter().map(|n| n.as_bytes().to_vec()));
        for t in texts.iter().flat_map(|t| [t.clone(), [b"\"", t.as_slice(), b"\""].concat()]) {
            assert_eq!(matches(&fast, &t), matches(&slow, &t), "{}", String::from_utf8_lossy(&t));
            assert_eq!(fast.feed(fast.start(), &t).is_some(), slow.feed(slow.start(), &t).is_some(), "live after {}", String::from_utf8_lossy(&t));
        }
        for n in &names {
            assert!(!matches(&fast, n.as_bytes()) && matches(&string, n.as_bytes()), "{n}");
        }
        assert!(matches(&fast, b"\"features\""));
        // Minus every string of a finite language, nothing is left; bounded like any product.
        let ab = Arc::new(Dfa::regex("a|ab", &l).unwrap());
        assert!(ab.minus_literals(&[b"a", b"ab"], &l).unwrap().is_empty());
        let small = Limits { max_states: 3, ..Limits::default() };
        assert!(matches!(string.minus_literals(&lits, &small), Err(EngineError::TooComplex(_))));
    }
}
