//! Regular constraints (regexes, literal choices) as anchored DFAs from
//! regex-automata, with a liveness table (can a match still be reached from
//! this state?) and token masks cached per DFA state: for a regex, the mask
//! depends on the state alone, so the cache is exact.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::Hir;

use super::vocab::Vocab;
use super::{EngineError, Limits, TokenMask, TokenSet};

/// A state of a [`Dfa`]: an index into its transition table.
pub type DfaState = u32;

/// No state: the transition leads nowhere a match can be reached from.
const DEAD: u32 = u32::MAX;

/// A compiled regular constraint: the value must match it in full.
///
/// The transition table is our own, over the automaton's byte classes, with
/// every transition into a state that can no longer reach a match already
/// pointing at a dead sentinel: one step of a trie walk is two array reads.
#[derive(Debug)]
pub struct Dfa {
    /// Byte to class.
    classes: [u8; 256],
    /// Number of classes: the row length of `trans`.
    stride: usize,
    /// `trans[state * stride + class]`: the next state, or [`DEAD`].
    trans: Vec<u32>,
    /// By state: a match is still reachable.
    live: Vec<bool>,
    /// By state: the bytes so far are a match.
    accepting: Vec<bool>,
    /// By state: a match, and no byte can follow.
    complete: Vec<bool>,
    /// Per (vocabulary, state): the tokens that keep a match reachable, and
    /// the trie nodes where a match ends inside a token (see [`Dfa::sets`]).
    sets: Mutex<HashMap<(u64, DfaState), Sets>>,
    /// Per state: whether it takes any plain text up to the longest plain
    /// token without ever matching (see [`Vocab::slicer`]).
    absorbs: Mutex<HashMap<DfaState, bool>>,
    /// Per state: its canonical key, if small enough to have one.
    canonical: Mutex<HashMap<DfaState, Option<Arc<[u8]>>>>,
}

/// A state's token set and exits, computed together by one trie walk.
pub type Sets = (Arc<TokenSet>, Arc<Exits>);


/// Most entries per per-automaton cache (a 128k-token mask is 16 KiB: this
/// bounds one automaton to 16 MiB).
const MAX_CACHED: usize = 1024;

/// Entries in the shared table (32 MiB of masks at 128k tokens).
const MAX_SHARED: usize = 2048;

/// Bytes that must continue from a state for its masks to be shared.
const MIN_SHARED_FANOUT: usize = 32;

/// States reachable from a state, at most, for it to get a canonical key.
const MAX_CANONICAL_STATES: usize = 48;

/// Token sets and exits keyed by (vocabulary, canonical future language):
/// the "inside a JSON string" state of every property lexeme of every
/// schema shares one entry.
type SharedKey = (u64, Arc<[u8]>);
static SHARED: LazyLock<Mutex<HashMap<SharedKey, Sets>>> = LazyLock::new(Default::default);

/// Looks `key` up in `table`, or makes, stores and returns it; past `cap`
/// entries the table starts over.
fn memo<K: std::hash::Hash + Eq, V: Clone>(table: &Mutex<HashMap<K, V>>, key: K, cap: usize, make: impl FnOnce() -> V) -> V {
    if let Some(v) = table.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return v.clone();
    }
    let v = make();
    let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
    if t.len() >= cap {
        t.clear();
    }
    t.insert(key, v.clone());
    v
}

/// Where a lexeme may end inside a token: nodes of the vocabulary's trie, or
/// of the slicer's trie of non-plain tokens (`rest`).
#[derive(Debug, Clone, Default)]
pub struct Exits {
    /// The nodes are in [`crate::engine::Slicer::rest`], not the full trie.
    pub rest: bool,
    /// Trie nodes with children where the bytes so far make a match.
    pub nodes: Vec<u32>,
}

impl Exits {
    /// The trie the nodes belong to.
    pub fn trie<'v>(&self, vocab: &'v Vocab) -> &'v crate::engine::TokenTrie {
        if self.rest {
            &vocab.slicer().rest
        } else {
            vocab.trie()
        }
    }
}

impl Dfa {
    /// Compiles `pattern` (Rust regex syntax), anchored at both ends.
    pub fn regex(pattern: &str, limits: &Limits) -> Result<Dfa, EngineError> {
        let hir = regex_syntax::ParserBuilder::new()
            .nest_limit(limits.max_nesting as u32)
            .build()
            .parse(pattern)
            .map_err(|e| EngineError::Regex(e.to_string()))?;
        Dfa::from_hir(&hir, limits)
    }

    /// Compiles a list of literal options (matched as bytes, never as a regex).
    pub fn choices<S: AsRef<[u8]>>(options: &[S], limits: &Limits) -> Result<Dfa, EngineError> {
        if options.is_empty() {
            return Err(EngineError::Unsatisfiable("there are no options to choose from".into()));
        }
        let alts = options.iter().map(|o| Hir::literal(o.as_ref().to_vec().into_boxed_slice())).collect();
        Dfa::from_hir(&Hir::alternation(alts), limits)
    }

    /// Compiles a regex syntax tree, anchored at both ends.
    pub(crate) fn from_hir(hir: &Hir, limits: &Limits) -> Result<Dfa, EngineError> {
        let nfa = thompson::Compiler::new()
            .configure(thompson::Config::new().nfa_size_limit(Some(limits.max_automaton_bytes)).shrink(true))
            .build_from_hir(hir)
            .map_err(|e| EngineError::TooComplex(format!("regex: {e}")))?;
        let config = dense::Config::new()
            .start_kind(StartKind::Anchored)
            .match_kind(MatchKind::All)
            .dfa_size_limit(Some(limits.max_automaton_bytes))
            .determinize_size_limit(Some(limits.max_automaton_bytes));
        let dfa = dense::Builder::new().configure(config).build_from_nfa(&nfa).map_err(|e| {
            let msg = e.to_string();
            if msg.contains("word boundar") {
                EngineError::Unsupported("Unicode word boundaries (`\\b`) in a constraint; use the ASCII form `(?-u:\\b)`".into())
            } else if msg.contains("unsupported regex feature") {
                EngineError::Unsupported(format!("regex: {msg}"))
            } else {
                EngineError::TooComplex(format!("regex: {msg}"))
            }
        })?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| EngineError::Regex(e.to_string()))?;
        tabulate(&dfa, start, limits)
    }

    /// The state before any byte (states are numbered from it).
    pub fn start(&self) -> DfaState {
        0
    }

    /// The state after `byte`, or `None` when no match can follow.
    #[inline]
    pub fn step(&self, s: DfaState, byte: u8) -> Option<DfaState> {
        let next = self.trans[s as usize * self.stride + self.classes[byte as usize] as usize];
        (next != DEAD).then_some(next)
    }

    /// The state after `bytes`, or `None` when no match can follow.
    pub fn feed(&self, mut s: DfaState, bytes: &[u8]) -> Option<DfaState> {
        for &b in bytes {
            s = self.step(s, b)?;
        }
        Some(s)
    }

    /// True when the bytes so far match in full.
    pub fn is_accepting(&self, s: DfaState) -> bool {
        self.accepting[s as usize]
    }

    /// True when a match can still be reached.
    pub fn is_live(&self, s: DfaState) -> bool {
        self.live[s as usize]
    }

    /// True when the bytes so far match and nothing more can follow.
    pub fn is_complete(&self, s: DfaState) -> bool {
        self.complete[s as usize]
    }

    /// Bytes that must come next whatever is generated (at most `limit`):
    /// while the state does not accept and exactly one byte keeps it alive.
    pub fn forced_bytes(&self, mut s: DfaState, limit: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < limit && !self.is_accepting(s) {
            let mut only = None;
            for b in 0..=255u8 {
                if let Some(n) = self.step(s, b) {
                    if only.is_some() {
                        return out;
                    }
                    only = Some((b, n));
                }
            }
            match only {
                Some((b, n)) => {
                    out.push(b);
                    s = n;
                }
                None => break,
            }
        }
        out
    }

    /// A canonical description of the language accepted from `s`: the
    /// automaton reachable from it, states numbered in breadth-first order,
    /// transitions over real bytes. Equal keys mean equal futures (in any
    /// automaton), so masks can be shared. `None` past a few dozen states.
    fn canonical(&self, s: DfaState) -> Option<Arc<[u8]>> {
        if let Some(k) = self.canonical.lock().unwrap_or_else(|e| e.into_inner()).get(&s) {
            return k.clone();
        }
        // Only dense states are worth sharing: where few bytes continue,
        // the trie walk is cheaper than the key.
        if (0..=255u8).filter(|&b| self.step(s, b).is_some()).count() < MIN_SHARED_FANOUT {
            self.canonical.lock().unwrap_or_else(|e| e.into_inner()).insert(s, None);
            return None;
        }
        let mut order = vec![s];
        let mut ids: HashMap<DfaState, u32> = HashMap::from([(s, 0)]);
        let mut out: Vec<u8> = Vec::new();
        let mut i = 0;
        while i < order.len() && order.len() <= MAX_CANONICAL_STATES {
            let st = order[i];
            i += 1;
            out.push(self.is_accepting(st) as u8);
            let targets: Vec<u32> = (0..=255u8)
                .map(|b| match self.step(st, b) {
                    None => u32::MAX,
                    Some(n) => {
                        let next = ids.len() as u32;
                        *ids.entry(n).or_insert_with(|| {
                            order.push(n);
                            next
                        })
                    }
                })
                .collect();
            // Runs of bytes with the same target: (first, last, target).
            let mut b = 0;
            while b < 256 {
                let mut e = b;
                while e + 1 < 256 && targets[e + 1] == targets[b] {
                    e += 1;
                }
                out.extend_from_slice(&[b as u8, e as u8]);
                out.extend_from_slice(&targets[b].to_le_bytes());
                b = e + 1;
            }
        }
        let key: Option<Arc<[u8]>> = (order.len() <= MAX_CANONICAL_STATES).then(|| Arc::from(out.into_boxed_slice()));
        self.canonical.lock().unwrap_or_else(|e| e.into_inner()).insert(s, key.clone());
        key
    }

    /// The tokens that keep a match reachable from `s` (no EOS), computed
    /// once per state (and once per future language, across automata).
    pub fn token_set(&self, vocab: &Vocab, s: DfaState) -> Arc<TokenSet> {
        self.sets(vocab, s).0
    }

    /// True when `s` takes every plain text (see [`Vocab::slicer`]) of up
    /// to `len` bytes, and never matches on the way: then every plain token
    /// is allowed and no lexeme ends inside one.
    fn absorbs_plain(&self, s: DfaState, len: usize) -> bool {
        if let Some(&a) = self.absorbs.lock().unwrap_or_else(|e| e.into_inner()).get(&s) {
            return a;
        }
        let plain: Vec<u8> = (0..=255u8).filter(|&b| crate::engine::vocab::is_plain_byte(b)).collect();
        let mut seen: std::collections::HashSet<DfaState> = std::collections::HashSet::from([s]);
        let mut layer = vec![s];
        let mut ok = true;
        'depth: for _ in 0..len {
            let mut next = Vec::new();
            for &st in &layer {
                for &b in &plain {
                    match self.step(st, b) {
                        Some(t) if !self.is_accepting(t) => {
                            if seen.insert(t) {
                                next.push(t);
                            }
                        }
                        _ => {
                            ok = false;
                            break 'depth;
                        }
                    }
                }
            }
            if next.is_empty() || seen.len() > 4096 {
                ok = ok && next.is_empty();
                break;
            }
            layer = next;
        }
        self.absorbs.lock().unwrap_or_else(|e| e.into_inner()).insert(s, ok);
        ok
    }

    /// Token set and exits of `s`, from the caches or from one trie walk.
    /// Exits are the trie nodes, reached from `s`, where the bytes so far
    /// make a match and longer tokens continue below: where a lexeme may end
    /// in the middle of a token.
    pub fn sets(&self, vocab: &Vocab, s: DfaState) -> Sets {
        memo(&self.sets, (vocab.id(), s), MAX_CACHED, || match self.canonical(s) {
            Some(k) => memo(&SHARED, (vocab.id(), k), MAX_SHARED, || self.walk(vocab, s)),
            None => self.walk(vocab, s),
        })
    }

    /// One walk over the trie from `s`: the token set and the exits. Dense
    /// states that take any plain text start from the plain slice and walk
    /// only the other tokens.
    fn walk(&self, vocab: &Vocab, s: DfaState) -> Sets {
        let slicer = vocab.slicer();
        let sliced = (0..=255u8).filter(|&b| self.step(s, b).is_some()).count() >= 64 && self.absorbs_plain(s, slicer.max_plain_len);
        let (trie, mut m) = if sliced { (&slicer.rest, slicer.plain.clone()) } else { (vocab.trie(), TokenMask::new(vocab.len())) };
        let mut x = Vec::new();
        trie.walk_nodes(0, s, |st, b| self.step(st, b), |i, st| {
            for &t in trie.tokens_at(i) {
                m.set(t);
            }
            if self.is_accepting(st) && trie.has_children(i) {
                x.push(i as u32);
            }
        });
        (Arc::new(TokenSet::from_mask(m)), Arc::new(Exits { rest: sliced, nodes: x }))
    }

    /// Writes into `out` the tokens that keep a match reachable from `s`
    /// (EOS where `s` accepts). `out` may be longer than the vocabulary:
    /// ids past it are never allowed.
    pub fn mask(&self, vocab: &Vocab, s: DfaState, out: &mut TokenMask) {
        self.token_set(vocab, s).copy_to(out);
        if self.is_accepting(s) {
            for &e in vocab.eos() {
                out.set(e);
            }
        }
    }

    /// Number of states whose token sets are cached (for tests and statistics).
    pub fn cached_masks(&self) -> usize {
        self.sets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Explores the states reachable from `start`, works out which can still
/// reach a match (backwards from the accepting ones), and builds the table
/// of live transitions.
fn tabulate(dfa: &dense::DFA<Vec<u32>>, start: StateID, limits: &Limits) -> Result<Dfa, EngineError> {
    let mut classes = [0u8; 256];
    for b in 0..=255u8 {
        classes[b as usize] = dfa.byte_classes().get(b);
    }
    let stride = classes.iter().map(|&c| c as usize).max().unwrap_or(0) + 1;
    let mut reps = vec![0u8; stride];
    for b in (0..=255u8).rev() {
        reps[classes[b as usize] as usize] = b;
    }
    // Breadth-first numbering of the reachable states. regex-automata's ids
    // are premultiplied by the stride, so `id >> stride2` indexes a vector
    // (hashing every transition showed in compile profiles).
    let stride2 = dfa.stride2();
    const UNSET: u32 = u32::MAX;
    let mut index: Vec<u32> = Vec::new();
    let number = |n: StateID, next: u32, index: &mut Vec<u32>| -> (u32, bool) {
        let k = n.as_usize() >> stride2;
        if k >= index.len() {
            index.resize(k + 1, UNSET);
        }
        if index[k] == UNSET {
            index[k] = next;
            (next, true)
        } else {
            (index[k], false)
        }
    };
    let mut order: Vec<StateID> = vec![start];
    number(start, 0, &mut index);
    let mut raw: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        if order.len() > limits.max_states || raw.len() > limits.max_automaton_bytes / 4 {
            return Err(EngineError::TooComplex(format!("the automaton has more than {} states", limits.max_states.min(order.len()))));
        }
        let s = order[i];
        i += 1;
        for &b in &reps {
            let n = dfa.next_state(s, b);
            if dfa.is_dead_state(n) || dfa.is_quit_state(n) {
                raw.push(DEAD);
                continue;
            }
            let (id, new) = number(n, order.len() as u32, &mut index);
            if new {
                order.push(n);
            }
            raw.push(id);
        }
    }
    let n = order.len();
    let accepting: Vec<bool> = order.iter().map(|&s| dfa.is_match_state(dfa.next_eoi_state(s))).collect();
    let mut reverse: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (k, &t) in raw.iter().enumerate() {
        if t != DEAD {
            reverse[t as usize].push((k / stride) as u32);
        }
    }
    let mut live = accepting.clone();
    let mut queue: Vec<usize> = (0..n).filter(|&i| live[i]).collect();
    while let Some(i) = queue.pop() {
        for &p in &reverse[i] {
            if !live[p as usize] {
                live[p as usize] = true;
                queue.push(p as usize);
            }
        }
    }
    let trans: Vec<u32> = raw.into_iter().map(|t| if t != DEAD && live[t as usize] { t } else { DEAD }).collect();
    let complete = (0..n).map(|i| accepting[i] && trans[i * stride..(i + 1) * stride].iter().all(|&t| t == DEAD)).collect();
    Ok(Dfa {
        complete,
        classes,
        stride,
        trans,
        live,
        accepting,
        sets: Mutex::new(HashMap::new()),
        absorbs: Mutex::new(HashMap::new()),
        canonical: Mutex::new(HashMap::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy_vocab() -> Vocab {
        let words = ["a", "b", "ab", "ba", "abc", "1", "12", "123", "x", " "];
        let bytes = words.iter().map(|w| w.as_bytes().to_vec()).chain([b"</s>".to_vec()]).collect();
        let mut kinds = vec![super::super::vocab::TokenKind::Normal; words.len()];
        kinds.push(super::super::vocab::TokenKind::Special);
        Vocab::from_parts(bytes, kinds, super::super::vocab::Encoding::Plain, vec![words.len() as u32])
    }

    #[test]
    fn regex_masks_steps_and_eos() {
        let v = toy_vocab();
        let d = Dfa::regex("ab?c?|[0-9]{2,3}", &Limits::default()).unwrap();
        let mut m = TokenMask::new(v.len() + 5);
        d.mask(&v, d.start(), &mut m);
        let allowed: Vec<u32> = m.ones().collect();
        // a, ab, abc, 1, 12, 123 — not b, ba, x, space, EOS.
        assert_eq!(allowed, vec![0, 2, 4, 5, 6, 7]);
        let s = d.feed(d.start(), b"1").unwrap();
        assert!(!d.is_accepting(s));
        let s2 = d.feed(s, b"2").unwrap();
        assert!(d.is_accepting(s2) && !d.is_complete(s2));
        d.mask(&v, s2, &mut m);
        assert!(m.get(10), "EOS where the regex accepts");
        assert!(m.get(5) && !m.get(6), "one more digit at most");
        assert!(d.is_complete(d.feed(s2, b"3").unwrap()));
        assert_eq!(d.cached_masks(), 2);
    }

    #[test]
    fn choices_are_literal_and_forced_bytes_follow() {
        let d = Dfa::choices(&["a.b", "a.c"], &Limits::default()).unwrap();
        assert!(d.feed(d.start(), b"axb").is_none(), "`.` is literal");
        assert_eq!(d.forced_bytes(d.start(), 10), b"a.");
        let r = Dfa::regex("\\{\"name\": \"[a-z]+\"\\}", &Limits::default()).unwrap();
        assert_eq!(r.forced_bytes(r.start(), 100), b"{\"name\": \"");
        assert!(matches!(Dfa::choices::<&str>(&[], &Limits::default()), Err(EngineError::Unsatisfiable(_))));
    }

    #[test]
    fn limits_bound_the_automaton() {
        let small = Limits { max_states: 50, ..Limits::default() };
        assert!(matches!(Dfa::regex("[a-z]{100}", &small), Err(EngineError::TooComplex(_))));
        let tiny = Limits { max_automaton_bytes: 10_000, ..Limits::default() };
        assert!(matches!(Dfa::regex("(\\w{1,20}\\s){1,20}", &tiny), Err(EngineError::TooComplex(_))));
    }
}
