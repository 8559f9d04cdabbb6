//! Products of automata, explored at once: the difference of two regular
//! languages, which regex syntax cannot say (JSON Schema needs it for "any
//! key but these names and patterns"), and its fast case, a language minus
//! a finite set of literals.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::literals::Literals;
use super::{check_size, finish, Dfa, DfaState, SetHasher, DEAD, INDEX};
use crate::engine::{EngineError, Limits};

/// The automaton of the strings `a` accepts and `b` does not: the product
/// of the two, explored at once from their start states, over byte classes
/// that refine both.
pub(super) fn difference(a: &Dfa, b: &Dfa, limits: &Limits) -> Result<Dfa, EngineError> {
    let (classes, reps) = refine(|x| a.classes[x] != a.classes[x - 1] || b.classes[x] != b.classes[x - 1]);
    // `None` for `b`: no string of `b` starts with what was read.
    let start = b.is_live(b.start()).then(|| b.start());
    // Pairs as one number, hashed by multiply-rotate (SipHash was a third
    // of the compile time of schemas with large products).
    let mut ids: HashMap<u64, u32, BuildHasherDefault<SetHasher>> = HashMap::default();
    let product = explore(a, &reps, start, limits, |order, na, sb, byte| {
        let nb = sb.and_then(|sb| b.step(sb, byte));
        let fresh = order.len() as u32;
        *ids.entry((na as u64) << 32 | nb.unwrap_or(DEAD) as u64).or_insert_with(|| {
            order.push((na, nb));
            fresh
        })
    })?;
    b.check()?;
    Ok(match product {
        Some((order, raw)) => {
            let accepting: Vec<bool> = order.iter().map(|&(sa, sb)| a.is_accepting(sa) && !sb.is_some_and(|sb| b.is_accepting(sb))).collect();
            finish(classes, reps.len(), &raw, &accepting)
        }
        None => finish(classes, reps.len(), &vec![DEAD; reps.len()], &[false]),
    })
}

/// The automaton of the strings `a` accepts but for `literals`: the
/// product of `a` with the literals' trie, made without a table of pairs
/// (a trie node is reached from one pair only, its parent's; past the
/// trie the pairs are `a`'s states). "Any key but the listed names" of
/// a large object costs its names' bytes, not a determinized alternation.
pub(super) fn minus_literals(a: &Dfa, literals: &[&[u8]], limits: &Limits) -> Result<Dfa, EngineError> {
    let trie = Literals::new(literals);
    check_size(trie.len(), 0, limits)?;
    // `a`'s classes with each byte of the literals in a class of its own.
    let (classes, reps) = refine(|x| a.classes[x] != a.classes[x - 1] || trie.used[x] || trie.used[x - 1]);
    // The trie node, or `OFF` once off the trie; off it, each of `a`'s
    // states (by index) has one pair, or `OFF` for none yet.
    const OFF: u32 = u32::MAX;
    let mut off: Vec<u32> = Vec::new();
    let product = explore(a, &reps, 0, limits, |order, na, node, byte| {
        match (node != OFF).then(|| trie.child(node, byte)).flatten() {
            Some(k) => {
                order.push((na, k));
                order.len() as u32 - 1
            }
            None => {
                let at = (na & INDEX) as usize;
                if at >= off.len() {
                    off.resize(at + 1, OFF);
                }
                if off[at] == OFF {
                    off[at] = order.len() as u32;
                    order.push((na, OFF));
                }
                off[at]
            }
        }
    })?;
    Ok(match product {
        Some((order, raw)) => {
            let accepting: Vec<bool> = order.iter().map(|&(sa, node)| a.is_accepting(sa) && (node == OFF || !trie.ends(node))).collect();
            finish(classes, reps.len(), &raw, &accepting)
        }
        None => finish(classes, reps.len(), &vec![DEAD; reps.len()], &[false]),
    })
}

/// Byte classes that start a new class at each byte `x` where `split(x)`
/// (never at 0), and a byte of each class.
pub(super) fn refine(split: impl Fn(usize) -> bool) -> ([u8; 256], Vec<u8>) {
    let mut classes = [0u8; 256];
    let mut reps = vec![0u8];
    for x in 1..256 {
        if split(x) {
            reps.push(x as u8);
        }
        classes[x] = (reps.len() - 1) as u8;
    }
    (classes, reps)
}

/// The pairs of `a`'s states and another automaton's (`P`) reachable from
/// both starts, breadth-first over the class representatives `reps`, and
/// each pair's row of targets ([`DEAD`] where `a` has none). `next` gives
/// the id of the pair after `byte` (`a` already at `na`), pushing it to the
/// order when new. `None` when `a` matches nothing at all.
#[allow(clippy::type_complexity)]
fn explore<P: Copy>(
    a: &Dfa,
    reps: &[u8],
    start: P,
    limits: &Limits,
    mut next: impl FnMut(&mut Vec<(DfaState, P)>, DfaState, P, u8) -> u32,
) -> Result<Option<(Vec<(DfaState, P)>, Vec<u32>)>, EngineError> {
    if !a.is_live(a.start()) {
        return Ok(None);
    }
    let mut order = vec![(a.start(), start)];
    let mut raw: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        check_size(order.len(), raw.len(), limits)?;
        let (sa, sp) = order[i];
        i += 1;
        for &byte in reps {
            let id = match a.step(sa, byte) {
                Some(na) => next(&mut order, na, sp, byte),
                None => DEAD,
            };
            raw.push(id);
        }
    }
    a.check()?;
    Ok(Some((order, raw)))
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
        let string = Dfa::regex(r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#, &l).unwrap();
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
        let ab = Dfa::regex("a|ab", &l).unwrap();
        assert!(ab.minus_literals(&[b"a", b"ab"], &l).unwrap().is_empty());
        let small = Limits { max_states: 3, ..Limits::default() };
        assert!(matches!(string.minus_literals(&lits, &small), Err(EngineError::TooComplex(_))));
    }
}
