//! Regular constraints (regexes, literal choices) as anchored DFAs, with
//! a liveness flag per state (can a match still be reached from it?) and
//! token masks cached per state: for a regex, the mask depends on the state
//! alone, so the cache is exact.
//!
//! The automaton is determinized lazily from regex-automata's Thompson NFA:
//! a state's row of transitions is computed the first time a walk leaves
//! it, so compiling a lexeme with a large counted repetition (a JSON string
//! of `maxLength: 4096`) costs its NFA, not its tens of thousands of DFA
//! states. Rows live in segments that never move, read without locks;
//! only the computation of a new row takes the determinizer's lock. NFAs
//! with look-around assertions (`\b`, inner `^`/`$`) are determinized
//! eagerly by regex-automata instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson::{self, WhichCaptures, NFA};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::Hir;

use super::memo::Memo;
use super::vocab::Vocab;
use super::{EngineError, Limits, TokenMask, TokenSet};

mod counted;
mod literals;
mod product;

use counted::Counted;
use literals::Literals;
pub(crate) use counted::COUNTED_MIN;

/// A state of a [`Dfa`]: an index into its transition table.
pub type DfaState = u32;

/// No state: the transition leads nowhere a match can be reached from.
const DEAD: u32 = u32::MAX;

/// A transition not computed yet.
const UNKNOWN: u32 = u32::MAX - 1;

/// Automata of at most this many states are determinized at once and get
/// a flat table; larger ones are made row by row as walks reach them.
const EAGER_STATES: usize = 128;

/// The bit of a state id that says the state accepts, and the one that
/// says it is complete (accepts, and no byte can follow): walks and the
/// parser test them with no memory access. The other bits index the table.
const ACC: u32 = 1 << 31;
const DONE: u32 = 1 << 30;
const INDEX: u32 = DONE - 1;

/// Per-state flags, kept in the last slot of the state's row.
const ACCEPTING: u32 = 1;
const LIVE: u32 = 2;
const COMPLETE: u32 = 4;
/// The row's transitions are all computed.
const ROW: u32 = 8;

/// A compiled regular constraint: the value must match it in full.
///
/// The transition table is our own, over the automaton's byte classes, with
/// every transition into a state that can no longer reach a match already
/// pointing at a dead sentinel: one step of a trie walk is a few reads.
#[derive(Debug)]
pub struct Dfa {
    /// Byte to class.
    classes: [u8; 256],
    /// Number of classes: the row length, before the flags slot.
    stride: usize,
    table: Table,
    /// Every transition of the table in one array, once all rows are made:
    /// the fast path of [`Dfa::step`] for the many small automata.
    flat: Option<Box<[u32]>>,
    /// The state before any byte.
    start: DfaState,
    /// A match can be reached from the start.
    start_live: bool,
    /// Makes the rows not computed yet; `None` once every row is.
    det: Mutex<Option<Determinizer>>,
    /// The state limit was reached: some transitions were cut (see [`Dfa::check`]).
    overflow: AtomicBool,
    /// Per (vocabulary, state): the tokens that keep a match reachable, and
    /// the trie nodes where a match ends inside a token (see [`Dfa::sets`]).
    sets: Memo<(u64, DfaState, bool), Sets>,
    /// Per (vocabulary, state): the first slice whose every text it takes
    /// without ever matching (see [`Vocab::slicer`]).
    absorbs: Mutex<HashMap<(u64, DfaState), Option<u8>>>,
    /// Per state: its canonical key, if small enough to have one.
    canonical: Mutex<HashMap<DfaState, Option<Arc<[u8]>>>>,
}

/// States per segment of a [`Table`], as a shift: a state's segment and
/// row are two bit operations away.
const SEGMENT_BITS: u32 = 8;
const SEGMENT: usize = 1 << SEGMENT_BITS;

/// Rows of `stride` transitions and a flags slot, in segments of
/// [`SEGMENT`] states that never move once made, so readers need no lock: a
/// segment is published (its pointer stored) before any id that points
/// into it.
#[derive(Debug)]
struct Table {
    width: usize,
    /// Each segment holds `SEGMENT * width` slots; null until made.
    segments: Box<[AtomicPtr<AtomicU32>]>,
    len: AtomicUsize,
    max_states: usize,
}

impl Drop for Table {
    fn drop(&mut self) {
        for seg in self.segments.iter() {
            let p = seg.load(Ordering::Acquire);
            if !p.is_null() {
                let len = SEGMENT * self.width;
                // SAFETY: made by `Box::into_raw` of a slice of this length in `push`.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) });
            }
        }
    }
}

impl Table {
    fn new(stride: usize, max_states: usize) -> Table {
        Table {
            width: stride + 1,
            segments: (0..max_states.div_ceil(SEGMENT)).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            len: AtomicUsize::new(0),
            max_states,
        }
    }

    /// A table of `len` states whose rows are elsewhere (a flat copy).
    fn rowless(stride: usize, len: usize, max_states: usize) -> Table {
        Table { width: stride + 1, segments: Box::new([]), len: AtomicUsize::new(len), max_states }
    }

    /// The segment of state `s` and its index there.
    #[inline(always)]
    fn locate(s: usize) -> (usize, usize) {
        (s >> SEGMENT_BITS, s & (SEGMENT - 1))
    }

    /// The row of an existing state, flags last.
    #[inline(always)]
    fn row(&self, s: DfaState) -> &[AtomicU32] {
        let (k, i) = Table::locate((s & INDEX) as usize);
        let p = self.segments[k].load(Ordering::Acquire);
        // A state id from another automaton must not read freed memory.
        assert!(!p.is_null(), "a state's segment exists");
        // SAFETY: a state id is handed out only after its segment was
        // published in `push`; the segment lives as long as the table and
        // holds `SEGMENT` rows of `width` slots, `i < SEGMENT`.
        unsafe { std::slice::from_raw_parts(p.add(i * self.width), self.width) }
    }

    #[inline]
    fn flags(&self, s: DfaState) -> u32 {
        self.row(s)[self.width - 1].load(Ordering::Acquire)
    }

    /// Adds a state with `flags` and no transitions computed, and returns
    /// its id; `None` past the state limit. Only one writer at a time (the
    /// determinizer's lock, or construction).
    fn push(&self, flags: u32) -> Option<DfaState> {
        let id = self.len.load(Ordering::Relaxed);
        if id >= self.max_states {
            return None;
        }
        let (k, i) = Table::locate(id);
        let width = self.width;
        if self.segments[k].load(Ordering::Acquire).is_null() {
            let seg: Box<[AtomicU32]> = (0..SEGMENT * width).map(|_| AtomicU32::new(UNKNOWN)).collect();
            self.segments[k].store(Box::into_raw(seg) as *mut AtomicU32, Ordering::Release);
        }
        // SAFETY: just made or made before, `SEGMENT * width` slots.
        let seg = unsafe { std::slice::from_raw_parts(self.segments[k].load(Ordering::Acquire), SEGMENT * width) };
        seg[(i + 1) * width - 1].store(flags, Ordering::Release);
        self.len.store(id + 1, Ordering::Release);
        Some(id as DfaState | if flags & ACCEPTING != 0 { ACC } else { 0 } | if flags & COMPLETE != 0 { DONE } else { 0 })
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
}

/// States made by a rule instead of from an NFA ([`Counted`], a literal
/// trie): a state is a short key of NFA-id-shaped numbers, hashed and
/// interned like an NFA state set.
trait Rule: Send + std::fmt::Debug {
    /// Into `out` (empty), the key after `byte`; left empty for none.
    fn next(&self, key: &[StateID], byte: u8, out: &mut Vec<StateID>);
    /// [`ACCEPTING`], [`LIVE`] and [`COMPLETE`] of a key.
    fn flags(&self, key: &[StateID]) -> u32;
}

/// Subset construction over a Thompson NFA without look-around, one row
/// at a time.
struct Determinizer {
    /// Makes the states instead of the NFA (see [`Rule`]).
    rule: Option<Box<dyn Rule>>,
    nfa: NFA,
    /// By NFA state: a match can be reached from it.
    coreachable: Vec<bool>,
    /// A byte of each class.
    reps: Vec<u8>,
    /// By DFA state: its NFA states (sorted).
    sets: Vec<Box<[StateID]>>,
    /// NFA state sets to DFA states ([`DEAD`] for sets that cannot match).
    ids: HashMap<Box<[StateID]>, u32, std::hash::BuildHasherDefault<SetHasher>>,
    /// Scratch for closures: a stamp per NFA state, the work stack, the set.
    seen: Vec<u32>,
    stamp: u32,
    seeds: Vec<StateID>,
    set: Vec<StateID>,
}

/// A multiply-rotate hasher for NFA state sets (SipHash showed in profiles
/// of row computation; the keys are not attacker-chosen hash-flooding
/// material, only sets the determinizer itself builds).
#[derive(Default)]
struct SetHasher(u64);

impl std::hash::Hasher for SetHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(b as u64));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::fmt::Debug for Determinizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Determinizer({} states)", self.sets.len())
    }
}

impl Determinizer {
    fn new(nfa: NFA, reps: Vec<u8>) -> Determinizer {
        let n = nfa.states().len();
        let mut reverse: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, st) in nfa.states().iter().enumerate() {
            successors(st, |j| reverse[j.as_usize()].push(i));
        }
        let mut coreachable = vec![false; n];
        let mut todo: Vec<usize> = (0..n).filter(|&i| matches!(nfa.states()[i], thompson::State::Match { .. })).collect();
        todo.iter().for_each(|&i| coreachable[i] = true);
        while let Some(j) = todo.pop() {
            for &i in &reverse[j] {
                if !coreachable[i] {
                    coreachable[i] = true;
                    todo.push(i);
                }
            }
        }
        Determinizer {
            rule: None,
            seen: vec![0; n],
            nfa,
            coreachable,
            reps,
            sets: Vec::new(),
            ids: HashMap::default(),
            stamp: 0,
            seeds: Vec::new(),
            set: Vec::new(),
        }
    }

    /// Into `out`, the NFA states reached from `seeds` through empty
    /// transitions that read a byte or match (sorted).
    fn close(&mut self, seeds: &mut Vec<StateID>, out: &mut Vec<StateID>) {
        self.stamp += 1;
        out.clear();
        while let Some(id) = seeds.pop() {
            let i = id.as_usize();
            if self.seen[i] == self.stamp {
                continue;
            }
            self.seen[i] = self.stamp;
            match self.nfa.state(id) {
                thompson::State::Union { alternates } => seeds.extend(alternates.iter().copied()),
                thompson::State::BinaryUnion { alt1, alt2 } => seeds.extend([*alt1, *alt2]),
                thompson::State::Capture { next, .. } | thompson::State::Look { next, .. } => seeds.push(*next),
                thompson::State::Fail => {}
                _ => out.push(id),
            }
        }
        out.sort_unstable();
    }

    /// The state set after reading `byte` from DFA state `from`, in `self.set`.
    fn next(&mut self, from: usize, byte: u8) {
        if let Some(r) = &self.rule {
            self.set.clear();
            r.next(&self.sets[from], byte, &mut self.set);
            return;
        }
        let mut seeds = std::mem::take(&mut self.seeds);
        let mut out = std::mem::take(&mut self.set);
        seeds.clear();
        for &id in self.sets[from].iter() {
            let next = match self.nfa.state(id) {
                thompson::State::ByteRange { trans } => trans.matches_byte(byte).then_some(trans.next),
                thompson::State::Sparse(t) => t.matches_byte(byte),
                thompson::State::Dense(t) => t.matches_byte(byte),
                _ => None,
            };
            seeds.extend(next);
        }
        self.close(&mut seeds, &mut out);
        self.seeds = seeds;
        self.set = out;
    }

    fn flags(&self, set: &[StateID]) -> u32 {
        if let Some(r) = &self.rule {
            return r.flags(set);
        }
        let accepting = set.iter().any(|&id| matches!(self.nfa.state(id), thompson::State::Match { .. }));
        let live = set.iter().any(|&id| self.coreachable[id.as_usize()]);
        // Complete: accepting, and no byte leads to a state a match can
        // still be reached from.
        let mut goes_on = false;
        for &id in set {
            let st = self.nfa.state(id);
            if !matches!(st, thompson::State::Match { .. }) {
                successors(st, |n| goes_on |= self.coreachable[n.as_usize()]);
            }
        }
        (accepting as u32 * ACCEPTING) | (live as u32 * LIVE) | ((accepting && !goes_on) as u32 * COMPLETE)
    }
}

/// Every state an NFA state leads to, by a byte or by nothing.
fn successors(st: &thompson::State, mut f: impl FnMut(StateID)) {
    match st {
        thompson::State::ByteRange { trans } => f(trans.next),
        thompson::State::Sparse(t) => t.transitions.iter().for_each(|t| f(t.next)),
        thompson::State::Dense(t) => t.transitions.iter().filter(|&&n| n != StateID::ZERO).for_each(|&n| f(n)),
        thompson::State::Look { next, .. } | thompson::State::Capture { next, .. } => f(*next),
        thompson::State::Union { alternates } => alternates.iter().for_each(|&n| f(n)),
        thompson::State::BinaryUnion { alt1, alt2 } => {
            f(*alt1);
            f(*alt2)
        }
        thompson::State::Fail | thompson::State::Match { .. } => {}
    }
}

/// A state's token set and exits, computed together by one trie walk.
pub type Sets = (Arc<TokenSet>, Arc<Exits>);

/// Entries per generation of a per-automaton cache (a 128k-token mask is
/// 16 KiB: two generations bound one automaton to 16 MiB).
const MAX_CACHED: usize = 512;

/// Entries per generation of the shared tables (32 MiB of masks at 128k tokens).
const MAX_SHARED: usize = 1024;

/// Bytes that must continue from a state for its masks to be shared.
const MIN_SHARED_FANOUT: usize = 32;

/// States reachable from a state, at most, for it to get a canonical key.
const MAX_CANONICAL_STATES: usize = 48;

/// Token sets and exits keyed by (vocabulary, canonical future language):
/// the "inside a JSON string" state of every property lexeme of every
/// schema shares one entry.
type SharedKey = (u64, Arc<[u8]>, bool);
static SHARED: LazyLock<Memo<SharedKey, Sets>> = LazyLock::new(|| Memo::new(MAX_SHARED));

/// Merged tries of what follows exits, keyed by (vocabulary, slice, exit nodes).
type MergedKey = (u64, Option<u8>, Vec<u32>);
static MERGED: LazyLock<Memo<MergedKey, Arc<crate::engine::TokenTrie>>> = LazyLock::new(|| Memo::new(MAX_SHARED));

/// What [`Dfa::takes_all`] found.
enum Taken {
    /// Some text of the slice's kind is refused or matches.
    No,
    /// Every text up to the length is taken.
    UpTo,
    /// Every text of any length is taken; the pairs of (state, phase) met.
    Always(std::collections::HashSet<(DfaState, u8), std::hash::BuildHasherDefault<SetHasher>>),
}

/// Most (state, phase) pairs one slice search visits before giving up.
const MAX_SLICE_SEARCH: usize = 4096;

/// Where a lexeme may end inside a token, and what follows there.
#[derive(Debug, Clone, Default)]
pub struct Exits {
    /// Per token and per place inside it where a match ends (other than
    /// its end), the token's bytes after that place; all in one trie, so
    /// a rest shared by many tokens (`",` after any word) is walked once.
    pub after: Arc<crate::engine::TokenTrie>,
    /// Places with more tokens below than [`MAX_MERGED`]: nodes of the
    /// trie the walk went through (a slice's other tokens, or the whole
    /// vocabulary's), walked from the node itself.
    pub nodes: Vec<u32>,
    /// The slice whose trie `nodes` are in, if not the vocabulary's.
    pub slice: Option<u8>,
}

/// Exits with more trie nodes below than this are not merged: the parser
/// prunes most of a big subtree at its first byte, and copying it would
/// cost more than the walk it saves.
const MAX_MERGED: usize = 512;

impl Exits {
    /// True when no match ends inside a token.
    pub fn is_empty(&self) -> bool {
        self.after.is_empty() && self.nodes.is_empty()
    }

    /// The trie `nodes` belong to.
    pub fn trie<'v>(&self, vocab: &'v Vocab) -> &'v crate::engine::TokenTrie {
        match self.slice {
            Some(i) => &vocab.slicer().slices[i as usize].rest,
            None => vocab.trie(),
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
        Dfa::trie(Literals::new(options), limits)
    }

    /// Compiles a regex syntax tree, anchored at both ends.
    pub(crate) fn from_hir(hir: &Hir, limits: &Limits) -> Result<Dfa, EngineError> {
        if let Some(c) = Counted::of(hir, limits)? {
            return Dfa::counted(c, limits);
        }
        // One compiler per thread: a new one allocates its UTF-8 suffix
        // cache each time (a tenth of a small lexeme's cost).
        thread_local! {
            static COMPILER: std::cell::RefCell<thompson::Compiler> = std::cell::RefCell::new(thompson::Compiler::new());
        }
        let nfa = COMPILER.with_borrow_mut(|compiler| {
            let config = thompson::Config::new().nfa_size_limit(Some(limits.max_automaton_bytes)).shrink(true).which_captures(WhichCaptures::None);
            compiler.configure(config).build_from_hir(hir).map_err(|e| EngineError::TooComplex(format!("regex: {e}")))
        })?;
        if !nfa.look_set_any().is_empty() {
            return Dfa::eager(&nfa, limits);
        }
        let (classes, stride, reps) = class_table(nfa.byte_classes());
        let start_id = nfa.start_anchored();
        let mut det = Determinizer::new(nfa, reps);
        let mut start = Vec::new();
        det.close(&mut vec![start_id], &mut start);
        Dfa::lazy(classes, stride, det, start, limits)
    }

    /// The automaton whose states `det` makes from `start`: at once up to
    /// [`EAGER_STATES`] (then flat), row by row as walks reach them beyond.
    fn lazy(classes: [u8; 256], stride: usize, mut det: Determinizer, start: Vec<StateID>, limits: &Limits) -> Result<Dfa, EngineError> {
        let table = Table::new(stride, limits.max_states);
        let flags = det.flags(&start);
        let id = table.push(flags).ok_or_else(|| EngineError::TooComplex("the automaton may have no states".into()))?;
        let start: Box<[StateID]> = start.into();
        det.ids.insert(start.clone(), id);
        det.sets.push(start);
        let start_live = table.flags(id) & LIVE != 0;
        let mut d = Dfa::with_table(classes, stride, table, None, id, start_live, Some(det));
        let mut made = 0;
        while made < d.table.len() && d.table.len() <= EAGER_STATES {
            d.fill_row(made as DfaState);
            made += 1;
        }
        // Past the limit already: an error now rather than at generation.
        d.check()?;
        if made == d.table.len() {
            d.flatten();
        }
        Ok(d)
    }

    fn with_table(classes: [u8; 256], stride: usize, table: Table, flat: Option<Box<[u32]>>, start: DfaState, start_live: bool, det: Option<Determinizer>) -> Dfa {
        Dfa {
            classes,
            stride,
            start_live,
            table,
            flat,
            start,
            det: Mutex::new(det),
            overflow: AtomicBool::new(false),
            sets: Memo::new(MAX_CACHED),
            absorbs: Mutex::new(HashMap::new()),
            canonical: Mutex::new(HashMap::new()),
        }
    }

    /// Determinizes an NFA with look-around all at once (regex-automata
    /// resolves the assertions).
    fn eager(nfa: &NFA, limits: &Limits) -> Result<Dfa, EngineError> {
        let config = dense::Config::new()
            .start_kind(StartKind::Anchored)
            .match_kind(MatchKind::All)
            .dfa_size_limit(Some(limits.max_automaton_bytes))
            .determinize_size_limit(Some(limits.max_automaton_bytes));
        let dfa = dense::Builder::new().configure(config).build_from_nfa(nfa).map_err(|e| {
            let msg = e.to_string();
            if msg.contains("word boundar") {
                EngineError::Unsupported("Unicode word boundaries (`\\b`) in a constraint; use the ASCII form `(?-u:\\b)`".into())
            } else if msg.contains("unsupported regex feature") {
                EngineError::Unsupported(format!("regex: {msg}"))
            } else {
                EngineError::TooComplex(format!("regex: {msg}"))
            }
        })?;
        let start = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).map_err(|e| EngineError::Regex(e.to_string()))?;
        tabulate(&dfa, start, limits)
    }

    /// The strings `self` matches that `other` does not (both anchored at
    /// both ends), determinized at once within `limits`.
    pub fn difference(&self, other: &Dfa, limits: &Limits) -> Result<Dfa, EngineError> {
        product::difference(self, other, limits)
    }

    /// The strings `self` matches but for `literals`, made as walks reach
    /// them (faster than a [`Dfa::difference`] with their automaton).
    pub fn minus_literals(self: &Arc<Self>, literals: &[&[u8]], limits: &Limits) -> Result<Dfa, EngineError> {
        product::minus_literals(self.clone(), literals, limits)
    }

    /// True when no string matches.
    pub fn is_empty(&self) -> bool {
        !self.is_live(self.start)
    }

    /// The state before any byte.
    pub fn start(&self) -> DfaState {
        self.start
    }

    /// Copies every row into [`Dfa::flat`] and drops the determinizer;
    /// only when every row is made.
    fn flatten(&mut self) {
        let n = self.table.len();
        let mut flat = Vec::with_capacity(n * self.stride);
        for i in 0..n {
            flat.extend(self.table.row(i as DfaState)[..self.stride].iter().map(|t| t.load(Ordering::Acquire)));
        }
        debug_assert!(!flat.contains(&UNKNOWN));
        self.flat = Some(flat.into_boxed_slice());
        // Every reader goes to the flat copy now: free the rows (hundreds of
        // lexemes per schema each held a 256-state segment).
        self.table = Table::rowless(self.stride, n, self.table.max_states);
        *self.det.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The state after `byte`, or `None` when no match can follow.
    #[inline(always)]
    pub fn step(&self, s: DfaState, byte: u8) -> Option<DfaState> {
        let c = self.classes[byte as usize] as usize;
        if let Some(flat) = &self.flat {
            return self.flat_step(flat, s, byte);
        }
        let mut next = self.table.row(s)[c].load(Ordering::Acquire);
        if next == UNKNOWN {
            next = self.fill_row(s)[c].load(Ordering::Acquire);
        }
        (next != DEAD).then_some(next)
    }

    /// [`Dfa::step`] in the flat table.
    #[inline(always)]
    fn flat_step(&self, flat: &[u32], s: DfaState, byte: u8) -> Option<DfaState> {
        let next = flat[(s & INDEX) as usize * self.stride + self.classes[byte as usize] as usize];
        (next != DEAD).then_some(next)
    }

    /// Computes the row of `s` if no one has yet, and returns it.
    #[cold]
    #[inline(never)]
    fn fill_row(&self, s: DfaState) -> &[AtomicU32] {
        let row = self.table.row(s);
        let mut guard = self.det.lock().unwrap_or_else(|e| e.into_inner());
        let flags = row[self.stride].load(Ordering::Acquire);
        let Some(det) = guard.as_mut().filter(|_| flags & ROW == 0) else { return row };
        for c in 0..self.stride {
            det.next((s & INDEX) as usize, det.reps[c]);
            let known = if det.set.is_empty() { Some(DEAD) } else { det.ids.get(det.set.as_slice()).copied() };
            let id = match known {
                Some(id) => id,
                None => {
                    let f = det.flags(&det.set);
                    let key: Box<[StateID]> = det.set.as_slice().into();
                    if f & LIVE == 0 {
                        det.ids.insert(key, DEAD);
                        DEAD
                    } else if let Some(id) = self.table.push(f) {
                        det.sets.push(key.clone());
                        det.ids.insert(key, id);
                        id
                    } else {
                        // Past the state limit: cut here (not remembered),
                        // and say so (see `check`).
                        self.overflow.store(true, Ordering::Release);
                        DEAD
                    }
                }
            };
            row[c].store(id, Ordering::Release);
        }
        row[self.stride].store(flags | ROW, Ordering::Release);
        row
    }

    /// An error once the automaton has outgrown [`Limits::max_states`]:
    /// transitions past the limit were cut, so a refusal may be wrong.
    pub fn check(&self) -> Result<(), EngineError> {
        if self.overflow.load(Ordering::Acquire) {
            return Err(EngineError::TooComplex(format!("an automaton grew past {} states", self.table.max_states)));
        }
        Ok(())
    }

    /// The state after `bytes`, or `None` when no match can follow.
    pub fn feed(&self, mut s: DfaState, bytes: &[u8]) -> Option<DfaState> {
        for &b in bytes {
            s = self.step(s, b)?;
        }
        Some(s)
    }

    /// True when the bytes so far match in full.
    #[inline(always)]
    pub fn is_accepting(&self, s: DfaState) -> bool {
        s & ACC != 0
    }

    /// True when a match can still be reached. Every state [`Dfa::step`]
    /// returns is live; only the start state may not be.
    #[inline(always)]
    pub fn is_live(&self, s: DfaState) -> bool {
        s != self.start || self.start_live
    }

    /// True when the bytes so far match and nothing more can follow.
    #[inline(always)]
    pub fn is_complete(&self, s: DfaState) -> bool {
        s & DONE != 0
    }

    /// Number of states made so far (rows are made as walks reach them).
    pub fn states(&self) -> usize {
        self.table.len()
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
        self.cached(vocab, s, false).0
    }

    /// The first slice (see [`Vocab::slicer`]) whose every text `s` takes,
    /// to the slice's longest token, without ever matching: then every
    /// token of it is allowed and no lexeme ends inside one.
    fn slice_of(&self, vocab: &Vocab, s: DfaState) -> Option<u8> {
        let key = (vocab.id(), s);
        if let Some(&a) = self.absorbs.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return a;
        }
        // Only dense states can take a slice (and are worth the search).
        let dense = (0..=255u8).filter(|&b| self.step(s, b).is_some()).count() >= 64;
        let mut found = None;
        let slices = if dense { &vocab.slicer().slices[..] } else { &[] };
        for (i, sl) in slices.iter().enumerate() {
            match self.takes_all(vocab, s, sl.kind, sl.max_len, i == 0) {
                Taken::No => continue,
                Taken::UpTo => {}
                Taken::Always(seen) => {
                    // Every state met between characters takes any such
                    // text too: the first slice, so the answer is final.
                    if i == 0 {
                        let mut cache = self.absorbs.lock().unwrap_or_else(|e| e.into_inner());
                        seen.into_iter().filter(|&(_, phase)| phase == 0).for_each(|(t, _)| {
                            cache.insert((vocab.id(), t), Some(0));
                        });
                    }
                }
            }
            found = Some(i as u8);
            break;
        }
        self.absorbs.lock().unwrap_or_else(|e| e.into_inner()).insert(key, found);
        found
    }

    /// Whether from `s` every text of `kind` up to `len` bytes (and every
    /// prefix of one) leads to a live state that does not match: a search
    /// over pairs of (state, reader phase), layer by layer. With `first`,
    /// states already known to take the first slice are not searched again.
    fn takes_all(&self, vocab: &Vocab, s: DfaState, kind: crate::engine::SliceKind, len: usize, first: bool) -> Taken {
        type Seen = std::collections::HashSet<(DfaState, u8), std::hash::BuildHasherDefault<SetHasher>>;
        // Held for the search (rows are made under another lock, never this one).
        let cache = first.then(|| self.absorbs.lock().unwrap_or_else(|e| e.into_inner()));
        let known = |t: DfaState| cache.as_ref().is_some_and(|c| c.get(&(vocab.id(), t)) == Some(&Some(0)));
        // Per phase, one byte of each (byte class, next phase): the bytes
        // of a class step alike.
        let moves: Vec<Vec<(u8, u8)>> = (0..8u8)
            .map(|phase| {
                let mut met = [false; 256 * 8];
                (0..=255u8)
                    .filter_map(|b| kind.next(phase, b).map(|p| (b, p)))
                    .filter(|&(b, p)| !std::mem::replace(&mut met[self.classes[b as usize] as usize * 8 + p as usize], true))
                    .collect()
            })
            .collect();
        let mut seen: Seen = Seen::default();
        seen.insert((s, 0));
        let mut layer = vec![(s, 0u8)];
        for _ in 0..len {
            let mut next = Vec::new();
            for &(st, phase) in &layer {
                for &(b, p) in &moves[phase as usize] {
                    match self.step(st, b) {
                        Some(t) if !self.is_accepting(t) => {
                            if seen.insert((t, p)) && !(p == 0 && known(t)) {
                                next.push((t, p));
                            }
                        }
                        _ => return Taken::No,
                    }
                }
            }
            if next.is_empty() {
                return Taken::Always(seen);
            }
            if seen.len() > MAX_SLICE_SEARCH {
                return Taken::No;
            }
            layer = next;
        }
        Taken::UpTo
    }

    /// Token set and exits of `s`, from the caches or from one trie walk.
    /// Exits are the trie nodes, reached from `s`, where the bytes so far
    /// make a match and longer tokens continue below: where a lexeme may end
    /// in the middle of a token.
    pub fn sets(&self, vocab: &Vocab, s: DfaState) -> Sets {
        self.cached(vocab, s, true)
    }

    /// [`Dfa::sets`], with the exits left empty unless `exits`: a whole
    /// regex constraint never needs them, and a dense state of one can have
    /// 100,000 (`[^,]+` ends a match at every node).
    fn cached(&self, vocab: &Vocab, s: DfaState, exits: bool) -> Sets {
        self.sets.get_or((vocab.id(), s, exits), || match self.canonical(s) {
            Some(k) => SHARED.get_or((vocab.id(), k, exits), || self.walk(vocab, s, exits)),
            None => self.walk(vocab, s, exits),
        })
    }

    /// One walk over the trie from `s`: the token set and (if `exits`) the
    /// exits. Dense states that take all text of a slice start from the
    /// slice and walk only the other tokens.
    fn walk(&self, vocab: &Vocab, s: DfaState, exits: bool) -> Sets {
        let slice = self.slice_of(vocab, s);
        let (trie, mut m) = match slice {
            Some(i) => {
                let sl = &vocab.slicer().slices[i as usize];
                (&sl.rest, sl.tokens.clone())
            }
            None => (vocab.trie(), TokenMask::new(vocab.len())),
        };
        let mut x = Vec::new();
        // The flat table's step, without `step`'s test for it at every node.
        let mut stack = Vec::new();
        let mut exit = |i: usize, st: DfaState, kids: bool| {
            if exits && st & ACC != 0 && kids {
                x.push(i as u32);
            }
        };
        match &self.flat {
            Some(flat) => trie.walk_tokens_in(&mut stack, 0, s, |st, b| self.flat_step(flat, st, b), &mut m, &mut exit),
            None => trie.walk_tokens_in(&mut stack, 0, s, |st, b| self.step(st, b), &mut m, &mut exit),
        }
        // What each token holds past each exit, merged into one trie.
        let (big, small): (Vec<u32>, Vec<u32>) = x.into_iter().partition(|&e| trie.subtree(e as usize) > MAX_MERGED);
        // Many states (of many automata) end matches at the same places.
        let after = MERGED.get_or((vocab.id(), slice, small.clone()), || {
            let mut after: Vec<(u32, &[u8])> = Vec::new();
            for &e in &small {
                let (e, depth) = (e as usize, trie.depth(e as usize));
                for n in e + 1..e + trie.subtree(e) {
                    after.extend(trie.tokens_at(n).iter().map(|&t| (t, &vocab.bytes(t)[depth..])));
                }
            }
            Arc::new(crate::engine::TokenTrie::build(after.into_iter()))
        });
        (Arc::new(TokenSet::from_mask(m)), Arc::new(Exits { after, nodes: big, slice }))
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
        self.sets.len()
    }
}

/// Byte to class, the number of classes, and a byte of each class.
fn class_table(bc: &regex_automata::util::alphabet::ByteClasses) -> ([u8; 256], usize, Vec<u8>) {
    let mut classes = [0u8; 256];
    for b in 0..=255u8 {
        classes[b as usize] = bc.get(b);
    }
    let stride = classes.iter().map(|&c| c as usize).max().unwrap_or(0) + 1;
    let mut reps = vec![0u8; stride];
    for b in (0..=255u8).rev() {
        reps[classes[b as usize] as usize] = b;
    }
    (classes, stride, reps)
}

/// Explores the states reachable from `start` and builds the automaton.
fn tabulate(dfa: &dense::DFA<Vec<u32>>, start: StateID, limits: &Limits) -> Result<Dfa, EngineError> {
    let (classes, stride, reps) = class_table(dfa.byte_classes());
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
        check_size(order.len(), raw.len(), limits)?;
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
    let accepting: Vec<bool> = order.iter().map(|&s| dfa.is_match_state(dfa.next_eoi_state(s))).collect();
    Ok(finish(classes, stride, &raw, &accepting))
}

/// An error once an eagerly explored automaton passes the limits.
fn check_size(states: usize, transitions: usize, limits: &Limits) -> Result<(), EngineError> {
    if states > limits.max_states {
        return Err(EngineError::TooComplex(format!("the automaton has more than {} states", limits.max_states)));
    }
    if transitions > limits.max_automaton_bytes / 4 {
        return Err(EngineError::TooComplex(format!("the automaton has more than {} transitions ({states} states)", limits.max_automaton_bytes / 4)));
    }
    Ok(())
}

/// The automaton of explored states (`raw`: `stride` targets per state,
/// [`DEAD`] for none; state 0 the start): works out which states can still
/// reach a match (backwards from the accepting ones), cuts transitions to
/// the others, and flattens the table.
fn finish(classes: [u8; 256], stride: usize, raw: &[u32], accepting: &[bool]) -> Dfa {
    let n = accepting.len();
    // The transitions backwards, in one array by target (no vector per
    // state: products of large objects have thousands of states).
    let mut start = vec![0u32; n + 1];
    raw.iter().filter(|&&t| t != DEAD).for_each(|&t| start[t as usize + 1] += 1);
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut sources = vec![0u32; start[n] as usize];
    for (k, &t) in raw.iter().enumerate() {
        if t != DEAD {
            sources[fill[t as usize] as usize] = (k / stride) as u32;
            fill[t as usize] += 1;
        }
    }
    let mut live = accepting.to_vec();
    let mut queue: Vec<usize> = (0..n).filter(|&i| live[i]).collect();
    while let Some(i) = queue.pop() {
        for &p in &sources[start[i] as usize..start[i + 1] as usize] {
            if !live[p as usize] {
                live[p as usize] = true;
                queue.push(p as usize);
            }
        }
    }
    // Ids carry the accepting bit.
    let complete: Vec<bool> =
        (0..n).map(|i| accepting[i] && raw[i * stride..(i + 1) * stride].iter().all(|&t| t == DEAD || !live[t as usize])).collect();
    let id_of = |t: u32| t | if accepting[t as usize] { ACC } else { 0 } | if complete[t as usize] { DONE } else { 0 };
    let flat = raw.iter().map(|&t| if t != DEAD && live[t as usize] { id_of(t) } else { DEAD }).collect();
    Dfa::with_table(classes, stride, Table::rowless(stride, n, n), Some(flat), id_of(0), live[0], None)
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
        // Small automata are made at once: past the limit is a compile error.
        let small = Limits { max_states: 50, ..Limits::default() };
        assert!(matches!(Dfa::regex("[a-z]{100}", &small), Err(EngineError::TooComplex(_))));
        // Large ones are made as walks reach their rows: the limit is met on the way.
        let limits = Limits { max_states: 2_000, ..Limits::default() };
        let d = Dfa::regex("[a-z]{3000}", &limits).unwrap();
        assert!(d.states() <= EAGER_STATES + 2, "not determinized past what compiling needs: {}", d.states());
        assert!(d.check().is_ok());
        assert!(d.feed(d.start(), &[b'a'; 2_500]).is_none(), "cut at 2,000 states");
        assert!(matches!(d.check(), Err(EngineError::TooComplex(_))));
        let tiny = Limits { max_automaton_bytes: 10_000, ..Limits::default() };
        assert!(matches!(Dfa::regex("(\\w{1,20}\\s){1,20}", &tiny), Err(EngineError::TooComplex(_))));
        // Look-around is determinized at once, within the same limits.
        assert!(matches!(Dfa::regex("(?-u:\\b)[a-z]{100}", &small), Err(EngineError::TooComplex(_))));
    }

    #[test]
    fn lazy_rows_agree_with_an_eager_automaton() {
        // The same language with and without a look-around assertion (which
        // forces regex-automata's eager path): every step and flag agrees,
        // for a small automaton (determinized at once, flat) and a large
        // one (rows made as they are reached).
        for (lazy, eager, len) in [
            ("(?:[a-c]x|b+|c{2,4})[0-9]?", "(?:[a-c]x|b+|c{2,4})[0-9]?(?-u:\\b)", 8),
            ("[a-c]{0,1500}(?:x|yy)", "[a-c]{0,1500}(?:x|yy)(?-u:\\b)", 1600),
        ] {
            let lazy = Dfa::regex(lazy, &Limits::default()).unwrap();
            let eager = Dfa::regex(eager, &Limits::default()).unwrap();
            assert_eq!(lazy.flat.is_some(), len < 100, "the large automaton is made lazily");
            let mut seed = 7u64;
            let mut deepest = 0;
            for _ in 0..100 {
                let mut depth = 0;
                let (mut l, mut e) = (lazy.start(), eager.start());
                for _ in 0..len {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Mostly letters, so walks go deep into the large one.
                    let r = (seed >> 33) as usize % 1000;
                    let b = if r < 998 { b"abc"[r % 3] } else { b"xy019"[r % 5] };
                    match (lazy.step(l, b), eager.step(e, b)) {
                        (Some(a), Some(c)) => (l, e) = (a, c),
                        (None, None) => break,
                        other => panic!("steps disagree on {}: {other:?}", b as char),
                    }
                    assert_eq!(lazy.is_accepting(l), eager.is_accepting(e));
                    assert_eq!(lazy.is_complete(l), eager.is_complete(e));
                    depth += 1;
                }
                deepest = deepest.max(depth);
            }
            assert!(len < 100 || deepest > 1_200, "walks went deep: {deepest}");
        }
    }
}
