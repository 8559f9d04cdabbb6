//! An Earley recognizer over lexemes, fed one byte at a time. A row is the
//! parse state after some number of bytes: Earley items, and the lexeme
//! scans in progress. Scans are grouped by (lexeme, start row) — every item
//! of a row that expects the same lexeme shares one automaton state — and a
//! scan that reaches an accepting state completes its lexeme *and* goes on,
//! so no lexeme boundary is ever chosen too early.
//!
//! Rows live in two arenas (items, scans) with a row table, so a mask's trie
//! walk pushes a row per byte and truncates on the way back up without
//! allocating. Nullable symbols follow Aycock and Horspool: predicting one
//! also advances past it.
//!
//! Permutations (objects whose members may come in any order) would need a
//! nonterminal per set of members written; the parser makes those as parses
//! reach them, numbered after the grammar's own, in tables of its own.

use std::collections::HashMap;
use std::sync::Arc;

/// End of a chain of items.
const NONE: u32 = u32::MAX;

use super::context_free::{add_member, has_member, Cfg, Sym};
use super::dfa::DfaState;
use super::trie::TokenTrie;
use super::vocab::Vocab;
use super::{EngineError, TokenMask};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item {
    /// Dotted rule id: production's base + dot position.
    dotted: u32,
    /// The row where the production started.
    origin: u32,
}

#[derive(Debug, Clone, Copy)]
struct Scan {
    lexeme: u32,
    origin: u32,
    state: DfaState,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    items: u32,
    scans: u32,
    accepting: bool,
}

/// Dotted-rule tables for a grammar, built once.
#[derive(Debug)]
pub struct Tables {
    cfg: Cfg,
    /// First dotted id of each production.
    base: Vec<u32>,
    /// The symbol after the dot, `None` at the end.
    next: Vec<Option<Sym>>,
    /// The production of each dotted id.
    prod: Vec<u32>,
}

impl Tables {
    /// Builds the tables of `cfg`.
    pub fn new(cfg: Cfg) -> Tables {
        let mut base = Vec::new();
        let mut next = Vec::new();
        let mut prod = Vec::new();
        for (i, p) in cfg.productions.iter().enumerate() {
            base.push(next.len() as u32);
            for k in 0..=p.rhs.len() {
                next.push(p.rhs.get(k).copied());
                prod.push(i as u32);
            }
        }
        Tables { cfg, base, next, prod }
    }

    /// The grammar.
    pub fn cfg(&self) -> &Cfg {
        &self.cfg
    }
}

/// A recognizer for one generated value.
#[derive(Debug, Clone)]
pub struct Parser {
    t: Arc<Tables>,
    items: Vec<Item>,
    scans: Vec<Scan>,
    rows: Vec<Row>,
    /// Stamps for "already predicted / started in this row".
    generation: u32,
    predicted: Vec<u32>,
    started: Vec<u32>,
    /// Per dotted rule: (generation, last item of the current row with it).
    head: Vec<(u32, u32)>,
    /// Parallel to `items`: the previous item of the same row and dotted
    /// rule, for duplicate checks without clearing a set per row.
    chain: Vec<u32>,
    completed: Vec<(u32, u32)>,
    max_row_items: usize,
    /// Nonterminals and productions made for permutations.
    ext: Ext,
}

/// Most dotted rules the parser may make for permutations.
const MAX_EXPANDED: usize = 1 << 20;

/// The permutation states a parser has reached: nonterminal ids from the
/// grammar's count on, dotted ids from the tables' count on.
#[derive(Debug, Clone, Default)]
struct Ext {
    /// (permutation, members written) → nonterminal of the state past the first item.
    ids: HashMap<(u32, Box<[u64]>), u32>,
    /// Per permutation state: the entries first (one per permutation, the
    /// grammar's own nonterminals), then the made ones in id order.
    nts: Vec<PermState>,
    /// Per made dotted id: the symbol after the dot, and the left side.
    next: Vec<Option<Sym>>,
    lhs: Vec<u32>,
    /// Set when [`MAX_EXPANDED`] was reached: the expansions since are
    /// partial, so every later step is an error.
    overflow: bool,
}

#[derive(Debug, Clone)]
struct PermState {
    perm: u32,
    first: bool,
    set: Box<[u64]>,
    nullable: bool,
    nt: u32,
    /// The first dotted id of each production, once expanded.
    bases: Option<Vec<u32>>,
}

impl Parser {
    /// A parser at the start of the grammar.
    pub fn new(t: Arc<Tables>, max_row_items: usize) -> Parser {
        let n_nt = t.cfg.names.len();
        let n_lex = t.cfg.lexemes.len();
        let n_dotted = t.next.len();
        let mut p = Parser {
            t,
            items: Vec::new(),
            scans: Vec::new(),
            rows: Vec::new(),
            generation: 0,
            predicted: vec![0; n_nt],
            started: vec![0; n_lex],
            head: vec![(0, 0); n_dotted],
            chain: Vec::new(),
            completed: Vec::new(),
            max_row_items,
            ext: Ext::default(),
        };
        for (k, perm) in p.t.cfg.perms.iter().enumerate() {
            let set = vec![0; perm.required.len()].into();
            let nullable = p.t.cfg.nullable[perm.entry as usize];
            p.ext.nts.push(PermState { perm: k as u32, first: true, set, nullable, nt: perm.entry, bases: None });
        }
        p.begin_row();
        let start = p.t.cfg.start;
        for &prod in &p.t.cfg.by_lhs[start as usize].clone() {
            let d = p.t.base[prod as usize];
            p.add(Item { dotted: d, origin: 0 });
        }
        p.predicted[start as usize] = p.generation;
        p.closure();
        p
    }

    /// Number of rows: bytes consumed plus one.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Always false: there is at least the first row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// True when the bytes so far form a whole sentence of the grammar.
    pub fn is_accepting(&self) -> bool {
        self.rows.last().is_some_and(|r| r.accepting)
    }

    /// True when more bytes can still be consumed.
    pub fn can_continue(&self) -> bool {
        let r = self.rows.len() - 1;
        self.scan_range(r).start < self.scan_range(r).end
    }

    /// Forgets everything after the first `rows` rows (a rewind).
    pub fn truncate(&mut self, rows: usize) {
        if rows < self.rows.len() && rows > 0 {
            let r = self.rows[rows];
            self.items.truncate(r.items as usize);
            self.chain.truncate(r.items as usize);
            self.scans.truncate(r.scans as usize);
            self.rows.truncate(rows);
        }
    }

    /// Consumes one byte; on `false` nothing was consumed (the byte cannot
    /// come next).
    pub fn step(&mut self, byte: u8) -> Result<bool, EngineError> {
        let before = self.rows.len();
        let r = before - 1;
        self.begin_row();
        self.completed.clear();
        let range = self.scan_range(r);
        let mut advanced = false;
        for k in range {
            let sc = self.scans[k];
            let dfa = &self.t.cfg.lexemes[sc.lexeme as usize];
            if let Some(s) = dfa.step(sc.state, byte) {
                advanced = true;
                if dfa.is_accepting(s) {
                    self.completed.push((sc.lexeme, sc.origin));
                }
                // A finished lexeme that cannot go on is not scanned further.
                if !dfa.is_complete(s) {
                    self.scans.push(Scan { state: s, ..sc });
                }
            }
        }
        let here = self.rows.len() as u32 - 1;
        if !advanced {
            // No scan could take the byte: it is refused (unless an
            // automaton cut its transitions at its state limit).
            let cut = self.scans[self.scan_range(r)].iter().try_for_each(|sc| self.t.cfg.lexemes[sc.lexeme as usize].check());
            self.truncate(before);
            return cut.map(|()| false);
        }
        let completed = std::mem::take(&mut self.completed);
        for &(lex, origin) in &completed {
            for k in self.item_range(origin as usize) {
                let it = self.items[k];
                if self.next(it.dotted) == Some(Sym::Lex(lex)) {
                    self.add(Item { dotted: it.dotted + 1, origin: it.origin });
                }
            }
        }
        self.completed = completed;
        self.closure();
        if self.ext.overflow {
            self.truncate(before);
            return Err(too_many_states());
        }
        if self.item_range(here as usize).len() > self.max_row_items {
            self.truncate(before);
            return Err(EngineError::TooComplex(format!("a parse state grew past {} items", self.max_row_items)));
        }
        Ok(true)
    }

    /// Consumes `bytes`, or nothing at all if one of them cannot come next.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<bool, EngineError> {
        let before = self.rows.len();
        for &b in bytes {
            if !self.step(b)? {
                self.truncate(before);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The tokens that can come next (EOS where the grammar accepts), into `out`.
    ///
    /// A token either stays inside one of the row's lexeme scans to its
    /// last byte — that set depends on the lexeme's automaton state alone
    /// and is cached — or ends the lexeme at some byte and continues with
    /// what the grammar allows after it. The row after the lexeme ends is the
    /// same wherever in a token that happens, so it is built once per scan,
    /// and the parser walks the cached trie of what tokens hold after such
    /// an end (each distinct rest of a token once, however many tokens
    /// share it).
    pub fn mask(&mut self, vocab: &Vocab, out: &mut TokenMask) -> Result<(), EngineError> {
        out.clear();
        let here = self.rows.len() - 1;
        let scans: Vec<Scan> = self.scans[self.scan_range(here)].to_vec();
        for sc in scans {
            let dfa = &self.t.cfg.lexemes[sc.lexeme as usize];
            let (set, exits) = dfa.sets(vocab, sc.state);
            set.add_to(out);
            if exits.is_empty() || !self.push_completion(sc.lexeme, sc.origin)? {
                self.truncate(here + 1);
                continue;
            }
            let mut stack = Vec::new();
            let walked = std::iter::once((&*exits.after, 0))
                .chain(exits.nodes.iter().map(|&n| (exits.trie(vocab), n as usize)))
                .try_for_each(|(trie, node)| self.allow_below(trie, node, &mut stack, out));
            self.truncate(here + 1);
            walked?;
        }
        if self.is_accepting() {
            vocab.eos().iter().for_each(|&e| out.set(e));
        }
        self.scans[self.scan_range(here)].iter().try_for_each(|sc| self.t.cfg.lexemes[sc.lexeme as usize].check())
    }

    /// Allows in `out` every token below trie node `node` whose remaining
    /// bytes the parser takes from its current row; the rows are as before
    /// afterwards. `stack` is scratch space, reused across calls.
    pub fn allow_below(&mut self, trie: &TokenTrie, node: usize, stack: &mut Vec<u32>, out: &mut TokenMask) -> Result<(), EngineError> {
        let base = self.rows.len();
        let mut error = None;
        trie.walk_tokens_in(
            stack,
            node,
            base as u32 - 1,
            |parent, b| {
                if error.is_some() {
                    return None;
                }
                self.truncate(parent as usize + 1);
                match self.step(b) {
                    Ok(true) => Some(self.rows.len() as u32 - 1),
                    Ok(false) => None,
                    Err(e) => {
                        error = Some(e);
                        None
                    }
                }
            },
            out,
            |_, _, _| {},
        );
        self.truncate(base);
        error.map_or(Ok(()), Err)
    }

    /// Pushes the row reached when lexeme `lex`, scanned from row `origin`,
    /// ends here — without the other scans of the current row. Returns
    /// whether anything can follow in it.
    fn push_completion(&mut self, lex: u32, origin: u32) -> Result<bool, EngineError> {
        self.begin_row();
        for k in self.item_range(origin as usize) {
            let it = self.items[k];
            if self.next(it.dotted) == Some(Sym::Lex(lex)) {
                self.add(Item { dotted: it.dotted + 1, origin: it.origin });
            }
        }
        self.closure();
        let here = self.rows.len() - 1;
        if self.ext.overflow {
            return Err(too_many_states());
        }
        if self.item_range(here).len() > self.max_row_items {
            return Err(EngineError::TooComplex(format!("a parse state grew past {} items", self.max_row_items)));
        }
        Ok(!self.scan_range(here).is_empty())
    }

    fn begin_row(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.predicted.fill(0);
            self.started.fill(0);
            self.head.fill((0, 0));
            self.generation = 1;
        }
        self.rows.push(Row { items: self.items.len() as u32, scans: self.scans.len() as u32, accepting: false });
    }

    fn item_range(&self, r: usize) -> std::ops::Range<usize> {
        let start = self.rows[r].items as usize;
        let end = self.rows.get(r + 1).map_or(self.items.len(), |n| n.items as usize);
        start..end
    }

    fn scan_range(&self, r: usize) -> std::ops::Range<usize> {
        let start = self.rows[r].scans as usize;
        let end = self.rows.get(r + 1).map_or(self.scans.len(), |n| n.scans as usize);
        start..end
    }

    fn add(&mut self, it: Item) {
        if it.dotted as usize >= self.head.len() {
            self.head.resize(it.dotted as usize + 1, (0, 0));
        }
        let (g, last) = self.head[it.dotted as usize];
        let mut k = if g == self.generation { last } else { NONE };
        while k != NONE {
            if self.items[k as usize].origin == it.origin {
                return;
            }
            k = self.chain[k as usize];
        }
        let prev = if g == self.generation { last } else { NONE };
        self.head[it.dotted as usize] = (self.generation, self.items.len() as u32);
        self.items.push(it);
        self.chain.push(prev);
    }

    /// The symbol after the dot of a dotted rule, made ones included.
    #[inline]
    fn next(&self, dotted: u32) -> Option<Sym> {
        match self.t.next.get(dotted as usize) {
            Some(&s) => s,
            None => self.ext.next[dotted as usize - self.t.next.len()],
        }
    }

    /// The left side of a dotted rule.
    fn lhs(&self, dotted: u32) -> u32 {
        match self.t.prod.get(dotted as usize) {
            Some(&p) => self.t.cfg.productions[p as usize].lhs,
            None => self.ext.lhs[dotted as usize - self.t.next.len()],
        }
    }

    /// The permutation state of nonterminal `nt` (an entry or a made one).
    fn perm_state(&self, nt: u32) -> usize {
        match (nt as usize).checked_sub(self.t.cfg.names.len()) {
            None => self.t.cfg.perm_of[nt as usize] as usize,
            Some(i) => i + self.t.cfg.perms.len(),
        }
    }

    /// The nonterminal of a permutation state past its first item, made if new.
    fn perm_nt(&mut self, perm: u32, set: Box<[u64]>) -> u32 {
        let key = (perm, set);
        if let Some(&nt) = self.ext.ids.get(&key) {
            return nt;
        }
        // A separator comes first, and it is never empty: nullable exactly
        // when the members written may end it.
        let nullable = self.t.cfg.perms[perm as usize].may_end(&key.1);
        let nt = (self.t.cfg.names.len() + self.ext.nts.len() - self.t.cfg.perms.len()) as u32;
        self.ext.nts.push(PermState { perm, first: false, set: key.1.clone(), nullable, nt, bases: None });
        self.ext.ids.insert(key, nt);
        nt
    }

    /// The number of productions of permutation state `state`, made on
    /// first use: past the first item `ε` (once the members written may end
    /// it, see `Perm::may_end`), `sep extra S` and `sep member_j S∪{j}` for each member not
    /// written; before it the same without `sep`, and `ε` if the entry is
    /// nullable.
    fn expand(&mut self, state: usize) -> usize {
        if let Some(b) = &self.ext.nts[state].bases {
            return b.len();
        }
        let PermState { perm, first, ref set, nullable, nt, .. } = self.ext.nts[state];
        let set = set.clone();
        let t = self.t.clone();
        let p = &t.cfg.perms[perm as usize];
        let mut prods: Vec<Vec<Sym>> = Vec::new();
        if nullable {
            prods.push(vec![]);
        }
        let lead: &[Sym] = if first { &[] } else { std::slice::from_ref(&p.sep) };
        if let Some(x) = p.extra {
            let same = self.perm_nt(perm, set.clone());
            prods.push([lead, &[x, Sym::Nt(same)]].concat());
        }
        for (j, m) in p.members.iter().enumerate() {
            let Some(m) = *m else { continue };
            if has_member(&set, j) {
                continue;
            }
            let mut more = set.clone();
            add_member(&mut more, j);
            let to = self.perm_nt(perm, more);
            prods.push([lead, &[m, Sym::Nt(to)]].concat());
        }
        let mut bases = Vec::with_capacity(prods.len());
        for rhs in prods {
            if self.ext.next.len() + rhs.len() + 1 > MAX_EXPANDED {
                self.ext.overflow = true;
                break;
            }
            bases.push((self.t.next.len() + self.ext.next.len()) as u32);
            for s in rhs {
                self.ext.next.push(Some(s));
                self.ext.lhs.push(nt);
            }
            self.ext.next.push(None);
            self.ext.lhs.push(nt);
        }
        let n = bases.len();
        self.ext.nts[state].bases = Some(bases);
        n
    }

    /// Completes and predicts until the current row is closed.
    fn closure(&mut self) {
        let here = self.rows.len() - 1;
        let mut k = self.rows[here].items as usize;
        let cfg_start = self.t.cfg.start;
        while k < self.items.len() {
            let it = self.items[k];
            k += 1;
            match self.next(it.dotted) {
                None => {
                    let lhs = self.lhs(it.dotted);
                    if lhs == cfg_start && it.origin == 0 {
                        self.rows[here].accepting = true;
                    }
                    for j in self.item_range(it.origin as usize) {
                        let parent = self.items[j];
                        if self.next(parent.dotted) == Some(Sym::Nt(lhs)) {
                            self.add(Item { dotted: parent.dotted + 1, origin: parent.origin });
                        }
                    }
                }
                Some(Sym::Nt(b)) => {
                    let plain = self.t.cfg.perm_of.get(b as usize) == Some(&u32::MAX);
                    if b as usize >= self.predicted.len() {
                        self.predicted.resize(b as usize + 1, 0);
                    }
                    if self.predicted[b as usize] != self.generation {
                        self.predicted[b as usize] = self.generation;
                        if plain {
                            for i in 0..self.t.cfg.by_lhs[b as usize].len() {
                                let prod = self.t.cfg.by_lhs[b as usize][i];
                                self.add(Item { dotted: self.t.base[prod as usize], origin: here as u32 });
                            }
                        } else {
                            let state = self.perm_state(b);
                            for i in 0..self.expand(state) {
                                let dotted = self.ext.nts[state].bases.as_ref().map_or(0, |v| v[i]);
                                self.add(Item { dotted, origin: here as u32 });
                            }
                        }
                    }
                    let nullable = if plain { self.t.cfg.nullable[b as usize] } else { self.ext.nts[self.perm_state(b)].nullable };
                    if nullable {
                        self.add(Item { dotted: it.dotted + 1, origin: it.origin });
                    }
                }
                Some(Sym::Lex(l)) => {
                    if self.started[l as usize] != self.generation {
                        self.started[l as usize] = self.generation;
                        let dfa = &self.t.cfg.lexemes[l as usize];
                        if dfa.is_live(dfa.start()) {
                            self.scans.push(Scan { lexeme: l, origin: here as u32, state: dfa.start() });
                        }
                    }
                    if self.t.cfg.lexeme_nullable[l as usize] {
                        self.add(Item { dotted: it.dotted + 1, origin: it.origin });
                    }
                }
            }
        }
    }
}

fn too_many_states() -> EngineError {
    EngineError::TooComplex(format!("an object's any-order states grew past {MAX_EXPANDED} rules"))
}
