//! Long counted repetitions (`"…"{0,300}`, `[a-z]{300,}`) determinized
//! with (unit state, count) as the state: a Thompson NFA would hold a copy
//! of the unit per count.

use regex_automata::nfa::thompson::NFA;
use regex_automata::util::primitives::StateID;
use regex_syntax::hir::Hir;

use super::{Determinizer, Dfa, DfaState, Rule, ACCEPTING, COMPLETE, LIVE};
use crate::engine::{EngineError, Limits};

/// Counted repetitions at least this long are run by [`Counted`]: their
/// Thompson NFA would hold a copy of the unit per count (a JSON string of
/// `maxLength: 32767` passed the NFA size limit). Grammars keep them as
/// lexemes of their own, so every property with `maxLength: 255` shares one
/// automaton instead of determinizing a copy merged with its key (1–2 ms
/// each: Snowplow schemas have dozens).
pub(crate) const COUNTED_MIN: u32 = 32;

/// `prefix unit{min,max} suffix` where `unit` is one "character" (every
/// match of it ends it: nothing can follow) and cannot start with the
/// suffix's first byte: the state is where in the prefix, the unit or the
/// suffix the bytes are, and how many units are done — made as walks reach
/// it, like an NFA subset, and keyed the same way (four numbers as NFA ids).
#[derive(Debug)]
pub(super) struct Counted {
    prefix: Vec<u8>,
    unit: Dfa,
    min: u32,
    /// `None`: unbounded; the count then stops at `min`.
    max: Option<u32>,
    suffix: Vec<u8>,
}

/// Where a [`Counted`] automaton is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum At {
    Prefix(u32),
    /// In the unit at its state, after this many units.
    Body(DfaState, u32),
    Suffix(u32),
}

impl Counted {
    /// The counted form of `hir`, when it has that shape, a large count,
    /// and a unit that qualifies.
    pub(super) fn of(hir: &Hir, limits: &Limits) -> Result<Option<Counted>, EngineError> {
        use regex_syntax::hir::{HirKind, Literal};
        let parts = match hir.kind() {
            HirKind::Concat(v) => v.as_slice(),
            _ => std::slice::from_ref(hir),
        };
        let literal = |h: &Hir| match h.kind() {
            HirKind::Literal(Literal(b)) => Some(b.to_vec()),
            _ => None,
        };
        let (prefix, rest) = match parts.first().and_then(literal) {
            Some(p) => (p, &parts[1..]),
            None => (Vec::new(), parts),
        };
        let (rep, suffix) = match rest {
            [r] => (r, Vec::new()),
            [r, q] => match literal(q) {
                Some(q) => (r, q),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let HirKind::Repetition(rep) = rep.kind() else { return Ok(None) };
        if rep.max.unwrap_or(rep.min).max(rep.min) < COUNTED_MIN {
            return Ok(None);
        }
        let unit = Dfa::from_hir(&rep.sub, limits)?;
        // One character: never empty, and no match goes on.
        if unit.is_accepting(unit.start()) || !unit.is_live(unit.start()) || unit.states() > 64 {
            return Ok(None);
        }
        let mut seen = vec![unit.start()];
        let mut i = 0;
        while i < seen.len() {
            for b in 0..=255u8 {
                if let Some(n) = unit.step(seen[i], b) {
                    if unit.is_accepting(n) && !unit.is_complete(n) {
                        return Ok(None);
                    }
                    if !seen.contains(&n) {
                        seen.push(n);
                    }
                }
            }
            i += 1;
        }
        if suffix.first().is_some_and(|&q| unit.step(unit.start(), q).is_some()) {
            return Ok(None);
        }
        Ok(Some(Counted { prefix, unit, min: rep.min, max: rep.max, suffix }))
    }

    fn start(&self) -> At {
        if self.prefix.is_empty() {
            At::Body(self.unit.start(), 0)
        } else {
            At::Prefix(0)
        }
    }

    fn step_at(&self, at: At, byte: u8) -> Option<At> {
        let after_prefix = |i: u32| if i as usize == self.prefix.len() { At::Body(self.unit.start(), 0) } else { At::Prefix(i) };
        match at {
            At::Prefix(i) => (self.prefix[i as usize] == byte).then(|| after_prefix(i + 1)),
            At::Suffix(j) => (self.suffix.get(j as usize) == Some(&byte)).then_some(At::Suffix(j + 1)),
            At::Body(u, n) => {
                if u == self.unit.start() && n >= self.min && self.suffix.first() == Some(&byte) {
                    return Some(At::Suffix(1));
                }
                // A unit begun after the last one could never end: every
                // state made must be live.
                if self.max == Some(n) {
                    return None;
                }
                let next = self.unit.step(u, byte)?;
                if !self.unit.is_accepting(next) {
                    return Some(At::Body(next, n));
                }
                match self.max {
                    Some(m) if n + 1 > m => None,
                    Some(_) => Some(At::Body(self.unit.start(), n + 1)),
                    None => Some(At::Body(self.unit.start(), (n + 1).min(self.min))),
                }
            }
        }
    }

    fn flags_at(&self, at: At) -> u32 {
        let (accepting, complete) = match at {
            At::Prefix(_) => (false, false),
            At::Suffix(j) => (j as usize == self.suffix.len(), j as usize == self.suffix.len()),
            At::Body(u, n) => {
                let done = self.suffix.is_empty() && u == self.unit.start() && n >= self.min;
                (done, done && self.max == Some(n))
            }
        };
        // Every state made is live: more units can always follow up to `max`.
        (accepting as u32 * ACCEPTING) | LIVE | (complete as u32 * COMPLETE)
    }

    fn encode(at: At) -> [StateID; 4] {
        let id = |x: u32| StateID::new(x as usize & 0xFFFF).expect("16 bits");
        match at {
            At::Prefix(i) => [id(0), id(i), id(0), id(0)],
            At::Suffix(j) => [id(2), id(j), id(0), id(0)],
            // The unit's state and the count in 16-bit halves: NFA ids are 31 bits.
            At::Body(u, n) => [id(1), id(u), id(u >> 16), StateID::new(n as usize).expect("counts fit")],
        }
    }

    fn decode(key: &[StateID]) -> At {
        let x = |i: usize| key[i].as_usize() as u32;
        match x(0) {
            0 => At::Prefix(x(1)),
            2 => At::Suffix(x(1)),
            _ => At::Body(x(1) | x(2) << 16, x(3)),
        }
    }
}

impl Rule for Counted {
    fn next(&self, key: &[StateID], byte: u8, out: &mut Vec<StateID>) {
        if let Some(k) = self.step_at(Counted::decode(key), byte) {
            out.extend(Counted::encode(k));
        }
    }

    fn flags(&self, key: &[StateID]) -> u32 {
        self.flags_at(Counted::decode(key))
    }
}

impl Dfa {
    /// The automaton of a counted repetition, over byte classes that refine
    /// the unit's with each byte of the prefix and suffix on its own.
    pub(super) fn counted(c: Counted, limits: &Limits) -> Result<Dfa, EngineError> {
        let special = |b: u8| c.prefix.contains(&b) || c.suffix.contains(&b);
        let (classes, reps) = super::product::refine(|x| c.unit.classes[x] != c.unit.classes[x - 1] || special(x as u8) || special(x as u8 - 1));
        let stride = reps.len();
        let start = Counted::encode(c.start()).to_vec();
        let mut det = Determinizer::new(NFA::never_match(), reps);
        det.rule = Some(Box::new(c));
        Dfa::lazy(classes, stride, det, start, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_counted_repetitions_count_without_an_nfa_copy_each() {
        let l = Limits::default();
        let matches = |d: &Dfa, s: &str| d.feed(d.start(), s.as_bytes()).is_some_and(|st| d.is_accepting(st));
        let s = Dfa::regex(r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})){2,40000}""#, &l).unwrap();
        assert!(s.det.lock().unwrap().as_ref().is_some_and(|d| d.rule.is_some()), "counted, not compiled to an NFA");
        for yes in ["\"ab\"", "\"é\\u00e9\"", "\"\\n\\\"\""] {
            assert!(matches(&s, yes), "{yes}");
        }
        for no in ["\"a\"", "\"\"", "\"a\\\"", "\"a\\u00\"", "ab", "\"ab\"x"] {
            assert!(!matches(&s, no), "{no}");
        }
        let long = |n: usize| format!("\"{}\"", "é".repeat(n));
        assert!(matches(&s, &long(5000)) && s.check().is_ok());
        let end = s.feed(s.start(), long(3).as_bytes()).unwrap();
        assert!(s.is_complete(end));
        // The bounds, exactly; and the state limit, as for any automaton
        // (each count has its own states: a 40,000-character string needs
        // more than the default 200,000).
        let s = Dfa::regex(r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})){2,300}""#, &l).unwrap();
        assert!(matches(&s, &long(300)) && !matches(&s, &long(301)));
        // After the last character only the quote: no character may even begin.
        let full = s.feed(s.start(), long(300)[..601].as_bytes()).unwrap();
        assert_eq!((0..=255u8).filter(|&b| s.step(full, b).is_some()).collect::<Vec<_>>(), vec![b'"']);
        let small = Limits { max_states: 5000, ..Limits::default() };
        let s = Dfa::regex(r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})){2,40000}""#, &small).unwrap();
        assert!(!matches(&s, &long(5000)) && matches!(s.check(), Err(EngineError::TooComplex(_))));
        // No prefix or suffix, unbounded, and a unit of two bytes.
        let at_least = Dfa::regex("[a-z]{300,}", &l).unwrap();
        assert!(!matches(&at_least, &"a".repeat(299)) && matches(&at_least, &"a".repeat(300)) && matches(&at_least, &"z".repeat(5000)));
        let pairs = Dfa::regex("(?:ab){300}", &l).unwrap();
        assert!(matches(&pairs, &"ab".repeat(300)) && !matches(&pairs, &"ab".repeat(299)) && !matches(&pairs, &"ab".repeat(301)));
        let st = pairs.feed(pairs.start(), "ab".repeat(300).as_bytes()).unwrap();
        assert!(pairs.is_complete(st));
        // Units that go on after a match, or a suffix a unit could start:
        // not counted (the ordinary construction, still exact).
        for rx in ["(?:a+){300}", "x[a-z]{0,300}a"] {
            let d = Dfa::regex(rx, &l).unwrap();
            assert!(d.det.lock().unwrap().as_ref().is_none_or(|d| d.rule.is_none()), "{rx}");
        }
        let x = Dfa::regex("x[a-z]{0,300}a", &l).unwrap();
        assert!(matches(&x, "xa") && matches(&x, "xaa") && !matches(&x, "x"));
    }
}
