//! A finite set of literal strings as a trie: the automaton of `enum`
//! values and `select` choices (states are trie nodes, rows made as walks
//! reach them: no NFA, no subset construction), and the trie that
//! [`super::product::minus_literals`] takes out of a language.

use regex_automata::nfa::thompson::NFA;
use regex_automata::util::primitives::StateID;

use super::product::refine;
use super::{check_size, Determinizer, Dfa, Rule, ACCEPTING, COMPLETE, LIVE};
use crate::engine::{EngineError, Limits};

/// The trie of a set of byte strings.
#[derive(Debug)]
pub(super) struct Literals {
    /// Each node's children (byte, node), in the order they were made.
    kids: Vec<Vec<(u8, u32)>>,
    /// Whether a literal ends at each node.
    ends: Vec<bool>,
    /// Bytes that occur in some literal.
    pub(super) used: [bool; 256],
}

impl Literals {
    /// The trie of `literals` (node 0 the root).
    pub(super) fn new<S: AsRef<[u8]>>(literals: &[S]) -> Literals {
        let mut t = Literals { kids: vec![Vec::new()], ends: vec![false], used: [false; 256] };
        for lit in literals {
            let mut n = 0;
            for &byte in lit.as_ref() {
                t.used[byte as usize] = true;
                n = match t.child(n, byte) {
                    Some(k) => k,
                    None => {
                        t.kids.push(Vec::new());
                        t.ends.push(false);
                        let k = (t.kids.len() - 1) as u32;
                        t.kids[n as usize].push((byte, k));
                        k
                    }
                };
            }
            t.ends[n as usize] = true;
        }
        t
    }

    /// Number of nodes.
    pub(super) fn len(&self) -> usize {
        self.kids.len()
    }

    /// The node after `byte` from `node`, if some literal goes on so.
    #[inline]
    pub(super) fn child(&self, node: u32, byte: u8) -> Option<u32> {
        self.kids[node as usize].iter().find(|(b, _)| *b == byte).map(|&(_, k)| k)
    }

    /// Whether a literal ends at `node`.
    pub(super) fn ends(&self, node: u32) -> bool {
        self.ends[node as usize]
    }
}

impl Rule for Literals {
    fn next(&self, key: &[StateID], byte: u8, out: &mut Vec<StateID>) {
        out.extend(self.child(key[0].as_u32(), byte).map(|k| StateID::new(k as usize).expect("node ids fit")));
    }

    // Every node leads to the end of a literal.
    fn flags(&self, key: &[StateID]) -> u32 {
        let n = key[0].as_usize();
        let end = self.ends[n];
        (end as u32 * ACCEPTING) | LIVE | ((end && self.kids[n].is_empty()) as u32 * COMPLETE)
    }
}

impl Dfa {
    /// The automaton of a trie's literals, over classes that give each byte
    /// of them its own.
    pub(super) fn trie(t: Literals, limits: &Limits) -> Result<Dfa, EngineError> {
        check_size(t.len(), 0, limits)?;
        let (classes, reps) = refine(|x| t.used[x] || t.used[x - 1]);
        let stride = reps.len();
        let mut det = Determinizer::new(NFA::never_match(), reps);
        det.rule = Some(Box::new(t));
        Dfa::lazy(classes, stride, det, vec![StateID::ZERO], limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trie_automaton_agrees_with_the_regex_of_its_options() {
        let l = Limits::default();
        let options = ["", "a", "ab", "abc", "b", "é", "éa", "x\"y", "zzzz"];
        let trie = Dfa::choices(&options, &l).unwrap();
        let escaped: Vec<String> = options.iter().map(|o| regex_syntax::escape(o)).collect();
        let regex = Dfa::regex(&escaped.join("|"), &l).unwrap();
        let alphabet = b"abxz\"\xc3\xa9";
        let mut texts: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..4 {
            let more: Vec<Vec<u8>> = texts.iter().flat_map(|t| alphabet.iter().map(move |&b| [t.as_slice(), &[b]].concat())).collect();
            texts.extend(more);
        }
        for t in &texts {
            let (a, b) = (trie.feed(trie.start(), t), regex.feed(regex.start(), t));
            assert_eq!(a.is_some(), b.is_some(), "live after {}", String::from_utf8_lossy(t));
            if let (Some(a), Some(b)) = (a, b) {
                assert_eq!(trie.is_accepting(a), regex.is_accepting(b), "{}", String::from_utf8_lossy(t));
                assert_eq!(trie.is_complete(a), regex.is_complete(b), "{}", String::from_utf8_lossy(t));
            }
        }
        assert!(trie.is_accepting(trie.start()), "the empty option");
        // Rows are made as walks reach them: 5,000 options compile at once.
        let many: Vec<String> = (0..5000).map(|i| format!("\"option-{i:05}\"")).collect();
        let d = Dfa::choices(&many, &l).unwrap();
        assert!(d.states() <= 200, "{} states made at once", d.states());
        assert!(d.feed(d.start(), b"\"option-04999\"").is_some_and(|s| d.is_complete(s)));
        assert!(d.feed(d.start(), b"\"option-05000\"").is_none());
        let small = Limits { max_states: 1000, ..Limits::default() };
        assert!(matches!(Dfa::choices(&many, &small), Err(EngineError::TooComplex(_))));
    }
}
