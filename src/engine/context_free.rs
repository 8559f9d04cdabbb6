//! Compiles a grammar (the engine's IR: lowered GBNF, or JSON Schema) into the
//! lexer/parser split the Earley recognizer
//! runs: every regular part (a rule that is not recursive, a run of adjacent
//! regular items) becomes one lexeme, an anchored DFA; what remains is a
//! context-free grammar over lexemes. Lexeme boundaries stay ambiguous (a
//! lexeme may end at any accepting byte), so the language is exactly the
//! grammar's — no maximal munch.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use regex_syntax::hir::{Capture, Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Repetition};

use super::dfa::{Dfa, COUNTED_MIN};
use super::memo::Memo;
use super::{EngineError, Limits};
use super::grammar::{Expr, Grammar};

/// A grammar symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sym {
    /// A nonterminal.
    Nt(u32),
    /// A lexeme (an index into [`Cfg::lexemes`]).
    Lex(u32),
}

/// `lhs ::= rhs`.
#[derive(Debug, Clone)]
pub struct Production {
    /// The nonterminal it defines.
    pub lhs: u32,
    /// The symbols.
    pub rhs: Vec<Sym>,
}

/// Members in any order, each at most once (see
/// [`Expr::Permutation`]). Its nonterminals are made as parses reach them
/// (one per set of members written): the parser expands them, the grammar
/// holds only the entry.
#[derive(Debug, Clone)]
pub struct Perm {
    /// The nonterminal that stands for the whole permutation.
    pub entry: u32,
    /// Each member's symbol (`None`: it derives nothing and never appears).
    pub members: Vec<Option<Sym>>,
    /// Bits of the members that must appear.
    pub required: Vec<u64>,
    /// What may appear between members any number of times.
    pub extra: Option<Sym>,
    /// Between two items; never matches the empty string.
    pub sep: Sym,
    /// At least one item must appear (matters only when no member is required).
    pub nonempty: bool,
    /// Member `i` with the bits of the members that must appear with it.
    pub deps: Vec<(usize, Vec<u64>)>,
}

impl Perm {
    /// True when member `j` must appear.
    pub fn is_required(&self, j: usize) -> bool {
        has_member(&self.required, j)
    }

    /// True when the members in `set` may end the permutation: the
    /// required ones are there, and what each one there requires.
    pub fn may_end(&self, set: &[u64]) -> bool {
        let within = |need: &[u64]| need.iter().zip(set).all(|(n, s)| n & !s == 0);
        within(&self.required) && self.deps.iter().all(|(i, need)| !has_member(set, *i) || within(need))
    }

    /// The members the shortest way to write it has: the required ones and
    /// what they require, and so on.
    pub fn least(&self) -> Vec<u64> {
        let mut set = self.required.clone();
        loop {
            let before = set.clone();
            for (i, need) in &self.deps {
                if has_member(&set, *i) {
                    set.iter_mut().zip(need).for_each(|(s, n)| *s |= n);
                }
            }
            if set == before {
                return set;
            }
        }
    }
}

/// True when member `j` is in the set `words` (one bit per member).
pub fn has_member(words: &[u64], j: usize) -> bool {
    words[j / 64] >> (j % 64) & 1 == 1
}

/// Adds member `j` to the set `words`.
pub fn add_member(words: &mut [u64], j: usize) {
    words[j / 64] |= 1 << (j % 64);
}

/// A compiled context-free grammar over regular lexemes.
#[derive(Debug)]
pub struct Cfg {
    /// Lexeme automata (interned process-wide, so equal lexemes share masks).
    pub lexemes: Vec<Arc<Dfa>>,
    /// Lexemes that match the empty string.
    pub lexeme_nullable: Vec<bool>,
    /// Productions.
    pub productions: Vec<Production>,
    /// Productions of each nonterminal.
    pub by_lhs: Vec<Vec<u32>>,
    /// Names of nonterminals (helpers are named after their rule).
    pub names: Vec<String>,
    /// Nonterminals that derive the empty string.
    pub nullable: Vec<bool>,
    /// The start nonterminal.
    pub start: u32,
    /// Permutations, expanded while parsing.
    pub perms: Vec<Perm>,
    /// Per nonterminal: the permutation it is the entry of, or `u32::MAX`.
    pub perm_of: Vec<u32>,
}

/// Largest inlined size of a regular rule before it is kept as a nonterminal.
const MAX_INLINE: usize = 4_000;

/// Largest inlined size of a `%` rule (a lexeme of its own where it
/// stands alone) inside a bigger lexeme.
const MAX_ATOMIC_INLINE: usize = 256;

/// Largest number of copies `{m,n}` may make of a recursive part.
const MAX_EXPANSION: u32 = 1_000;

impl Cfg {
    /// Compiles `g` starting at rule `start`.
    pub fn new(g: &Grammar, start: &str, limits: &Limits) -> Result<Cfg, EngineError> {
        let mut b = Builder::new(g, limits)?;
        let root = b.rule_nt(start)?.ok_or_else(|| EngineError::Unsatisfiable(format!("the grammar has no rule `{start}`")))?;
        b.finish(root)
    }

    /// The single-nonterminal grammar of one regex (mostly for tests).
    pub fn from_regex(pattern: &str, limits: &Limits) -> Result<Cfg, EngineError> {
        Cfg::new(&Grammar::regex(pattern), "root", limits)
    }
}

struct Builder<'g> {
    g: &'g Grammar,
    limits: &'g Limits,
    rules: HashMap<&'g str, &'g Expr>,
    /// Rules that take part in a cycle of references, or reference one.
    non_regular: HashMap<&'g str, bool>,
    /// Regular `%` rules too large to copy into other lexemes.
    atomic: std::collections::HashSet<&'g str>,
    /// Rules kept as nonterminals for their size alone (their language may
    /// still be regular: a difference takes it through them).
    costly: std::collections::HashSet<&'g str>,
    hir_cache: HashMap<&'g str, Hir>,
    lexeme_ids: HashMap<String, u32>,
    lexemes: Vec<Arc<Dfa>>,
    productions: Vec<Production>,
    perms: Vec<Perm>,
    names: Vec<String>,
    rule_nts: HashMap<&'g str, u32>,
    /// Inlining depth (a guard: classification should make it shallow).
    depth: usize,
}

impl<'g> Builder<'g> {
    fn new(g: &'g Grammar, limits: &'g Limits) -> Result<Builder<'g>, EngineError> {
        let mut rules = HashMap::new();
        for r in &g.rules {
            rules.entry(r.name.as_str()).or_insert(&r.body);
        }
        let mut b = Builder {
            g,
            limits,
            rules,
            non_regular: HashMap::new(),
            atomic: Default::default(),
            costly: Default::default(),
            hir_cache: HashMap::new(),
            lexeme_ids: HashMap::new(),
            lexemes: Vec::new(),
            productions: Vec::new(),
            perms: Vec::new(),
            names: Vec::new(),
            rule_nts: HashMap::new(),
            depth: 0,
        };
        b.classify()?;
        Ok(b)
    }

    /// Marks rules that are recursive or reach a recursive rule.
    fn classify(&mut self) -> Result<(), EngineError> {
        // From the same definitions `rules` keeps (the first of each name):
        // classifying one body and inlining another could recurse forever.
        let refs: HashMap<&str, Vec<&str>> = self
            .rules
            .iter()
            .map(|(name, body)| {
                let mut out = Vec::new();
                collect_refs(body, &mut out);
                (*name, out)
            })
            .collect();
        for r in refs.values().flatten() {
            if !self.rules.contains_key(r) {
                return Err(EngineError::Unsatisfiable(format!("rule `{r}` is not defined")));
            }
        }
        // A rule is non-regular if it can reach itself, or reaches one that
        // can, or one with a permutation or a difference (which have no
        // regex). In time linear in the references: the reachable set of
        // every rule was two thirds of a Kubernetes schema's compile.
        let mut names: Vec<&str> = self.rules.keys().copied().collect();
        names.sort_unstable();
        let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let adj: Vec<Vec<usize>> = names.iter().map(|n| refs[n].iter().map(|r| index[r]).collect()).collect();
        let mut bad = on_cycles(&adj);
        for (i, n) in names.iter().enumerate() {
            bad[i] |= is_structural(self.rules[n]);
        }
        let mut back: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        for (i, out) in adj.iter().enumerate() {
            out.iter().for_each(|&j| back[j].push(i));
        }
        let mut todo: Vec<usize> = (0..names.len()).filter(|&i| bad[i]).collect();
        while let Some(j) = todo.pop() {
            for &i in &back[j] {
                if !bad[i] {
                    bad[i] = true;
                    todo.push(i);
                }
            }
        }
        for (i, n) in names.iter().enumerate() {
            self.non_regular.insert(n, bad[i]);
        }
        // A regular rule too big to inline everywhere it is used stays a
        // nonterminal: lexeme automata stay small however large the grammar.
        let mut cost: HashMap<&str, usize> = HashMap::new();
        for n in names {
            self.inline_cost(n, &mut cost);
        }
        Ok(())
    }

    /// The size of rule `name` with its regular references inlined; marks
    /// the rule non-regular when that passes [`MAX_INLINE`].
    fn inline_cost(&mut self, name: &'g str, cost: &mut HashMap<&'g str, usize>) -> usize {
        stacker::maybe_grow(64 * 1024, 1024 * 1024, || self.inline_cost_inner(name, cost))
    }

    fn inline_cost_inner(&mut self, name: &'g str, cost: &mut HashMap<&'g str, usize>) -> usize {
        if let Some(&c) = cost.get(name) {
            return c;
        }
        if self.non_regular[name] {
            cost.insert(name, 1);
            return 1;
        }
        cost.insert(name, 1); // no cycles here, but be safe against re-entry
        let body = self.rules[name];
        // Deep chains of references stay nonterminals (and the stack shallow).
        self.depth += 1;
        let c = if self.depth > 64 { usize::MAX } else { self.expr_cost(body, cost) };
        self.depth -= 1;
        let c = if c > MAX_INLINE {
            self.non_regular.insert(name, true);
            self.costly.insert(name);
            1
        } else {
            c
        };
        cost.insert(name, c);
        c
    }

    fn expr_cost(&mut self, e: &'g Expr, cost: &mut HashMap<&'g str, usize>) -> usize {
        match e {
            Expr::Ref(r) => {
                let key = self.rules.get_key_value(r.as_str()).map(|(k, _)| *k).expect("checked");
                let c = self.inline_cost(key, cost);
                // What uses a rule that cannot be inlined cannot be either;
                // nor is a large `%` rule copied into bigger lexemes (a list
                // of 200 countries went twice into each array of them, and
                // was determinized anew for every such array).
                if key.starts_with('%') && c > MAX_ATOMIC_INLINE {
                    self.atomic.insert(key);
                }
                if self.non_regular[key] || self.atomic.contains(key) {
                    usize::MAX
                } else {
                    c
                }
            }
            Expr::Alt(v) | Expr::Seq(v) => v.iter().map(|x| self.expr_cost(x, cost)).fold(1usize, usize::saturating_add),
            // Long counts stay lexemes of their own, which count without
            // a copy of their body per count (see `Dfa`'s counted form).
            Expr::Repeat { min, max, .. } if max.unwrap_or(*min).max(*min) >= COUNTED_MIN => usize::MAX,
            Expr::Regex(r) if parse_regex(r, self.limits).is_ok_and(|h| long_count(&h)) => usize::MAX,
            Expr::Repeat { inner, min, max } => {
                // Counted repeats copy their body in the automaton.
                let copies = max.unwrap_or(*min).max(1) as usize;
                self.expr_cost(inner, cost).saturating_mul(copies.min(64)).saturating_add(1)
            }
            Expr::Literal(s) => s.len().max(1),
            Expr::Regex(r) => r.len().max(1),
            _ => 1,
        }
    }

    fn is_regular(&self, e: &Expr) -> bool {
        self.regular_as(e, false)
    }

    /// Whether `e` is regular; with `atomic`, also through rules too large
    /// to copy into a bigger lexeme (a difference needs their text).
    fn regular_as(&self, e: &Expr, atomic: bool) -> bool {
        self.regular_in(e, atomic, 0)
    }

    fn regular_in(&self, e: &Expr, atomic: bool, depth: usize) -> bool {
        match e {
            // Through chains of rules as deep as inlining goes (see `inline_cost`).
            Expr::Ref(r) if atomic && self.costly.contains(r.as_str()) => depth < 64 && self.regular_in(self.rules[r.as_str()], true, depth + 1),
            Expr::Ref(r) => !self.non_regular.get(r.as_str()).copied().unwrap_or(true) && (atomic || !self.atomic.contains(r.as_str())),
            Expr::Alt(v) | Expr::Seq(v) => v.iter().all(|x| self.regular_in(x, atomic, depth)),
            Expr::Repeat { inner, .. } => self.regular_in(inner, atomic, depth),
            Expr::Permutation { .. } | Expr::Except { .. } => false,
            _ => true,
        }
    }

    /// The regex of a regular expression (rule references inlined).
    fn hir(&mut self, e: &'g Expr) -> Result<Hir, EngineError> {
        self.depth += 1;
        if self.depth > self.limits.max_nesting * 2 {
            self.depth -= 1;
            return Err(EngineError::TooComplex("rules nest too deeply to inline".into()));
        }
        let h = stacker::maybe_grow(64 * 1024, 1024 * 1024, || self.hir_inner(e));
        self.depth -= 1;
        h
    }

    fn hir_inner(&mut self, e: &'g Expr) -> Result<Hir, EngineError> {
        Ok(match e {
            Expr::Literal(s) => Hir::literal(s.as_bytes().to_vec().into_boxed_slice()),
            Expr::Class { negated, ranges } => {
                let mut class = ClassUnicode::new(ranges.iter().map(|(a, b)| ClassUnicodeRange::new(*a, *b)));
                if *negated {
                    class.negate();
                }
                Hir::class(Class::Unicode(class))
            }
            Expr::Any => Hir::class(Class::Unicode(ClassUnicode::new([ClassUnicodeRange::new('\0', char::MAX)]))),
            Expr::Regex(r) => parse_regex(r, self.limits)?,
            Expr::Ref(name) => {
                if let Some(h) = self.hir_cache.get(name.as_str()) {
                    return Ok(h.clone());
                }
                let body = self.rules[name.as_str()];
                let h = self.hir(body)?;
                let key: &'g str = self.g.rules.iter().find(|r| r.name == *name).map(|r| r.name.as_str()).expect("rule");
                self.hir_cache.insert(key, h.clone());
                h
            }
            // Plain loops: iterator adapters cost stack frames per level.
            Expr::Seq(v) => {
                let mut parts = Vec::with_capacity(v.len());
                for x in v {
                    parts.push(self.hir(x)?);
                }
                Hir::concat(parts)
            }
            Expr::Alt(v) => {
                let mut parts = Vec::with_capacity(v.len());
                for x in v {
                    parts.push(self.hir(x)?);
                }
                Hir::alternation(parts)
            }
            Expr::Repeat { inner, min, max } => {
                let sub = self.hir(inner)?;
                Hir::repetition(Repetition { min: *min, max: *max, greedy: true, sub: Box::new(sub) })
            }
            // Never reached: `is_regular` is false for these.
            Expr::Permutation { .. } | Expr::Except { .. } => {
                return Err(EngineError::TooComplex("a permutation or a difference has no regex".into()))
            }
        })
    }

    fn lexeme(&mut self, h: Hir) -> Result<Sym, EngineError> {
        let limits = self.limits;
        self.lexeme_by(regex_text(&h), || Dfa::from_hir(&h, limits))
    }

    /// The lexeme of the strings of `base` that are not strings of `except`.
    fn difference(&mut self, base: &'g Expr, except: &'g Expr, name: &str) -> Result<Sym, EngineError> {
        let r = Regular::Except(Box::new(self.regular(base, name)?), Box::new(self.regular(except, name)?));
        let limits = self.limits;
        self.lexeme_by(r.key(), || r.build(limits))
    }

    /// The regular language of `e`: a regex, or a difference of them (also
    /// through rules whose body is one).
    fn regular(&mut self, e: &'g Expr, name: &str) -> Result<Regular<'g>, EngineError> {
        let mut literals = Vec::new();
        if literal_set(e, &mut literals) {
            return Ok(Regular::Literals(literals));
        }
        if self.regular_as(e, true) {
            return Ok(Regular::Regex(self.hir(e)?));
        }
        self.depth += 1;
        let r = match e {
            _ if self.depth > self.limits.max_nesting => Err(EngineError::TooComplex("differences nest too deeply".into())),
            Expr::Except { base, except } => {
                self.regular(base, name).and_then(|b| Ok(Regular::Except(Box::new(b), Box::new(self.regular(except, name)?))))
            }
            Expr::Ref(r) if self.rules.contains_key(r.as_str()) => self.regular(self.rules[r.as_str()], name),
            _ => Err(EngineError::Unsupported(format!("a difference of recursive parts in `{name}`"))),
        };
        self.depth -= 1;
        r
    }

    /// The lexeme named `key`, from this grammar's, the process's, or `make`.
    fn lexeme_by(&mut self, key: String, make: impl FnOnce() -> Result<Dfa, EngineError>) -> Result<Sym, EngineError> {
        if let Some(&id) = self.lexeme_ids.get(&key) {
            return Ok(Sym::Lex(id));
        }
        let dfa = intern_lexeme(&key, make)?;
        let id = self.lexemes.len() as u32;
        self.lexemes.push(dfa);
        self.lexeme_ids.insert(key, id);
        Ok(Sym::Lex(id))
    }

    fn new_nt(&mut self, name: String) -> u32 {
        self.names.push(name);
        self.names.len() as u32 - 1
    }

    fn add(&mut self, lhs: u32, rhs: Vec<Sym>) -> Result<(), EngineError> {
        if self.productions.len() > self.limits.max_states {
            return Err(EngineError::TooComplex("the grammar expands to too many productions".into()));
        }
        self.productions.push(Production { lhs, rhs });
        Ok(())
    }

    /// The nonterminal of a rule (`None` if there is no such rule),
    /// compiling it on first use.
    fn rule_nt(&mut self, name: &str) -> Result<Option<u32>, EngineError> {
        let Some((key, body)) = self.rules.get_key_value(name).map(|(k, v)| (*k, *v)) else { return Ok(None) };
        if let Some(&nt) = self.rule_nts.get(key) {
            return Ok(Some(nt));
        }
        let nt = self.new_nt(key.to_string());
        self.rule_nts.insert(key, nt);
        self.define(nt, body, key)?;
        Ok(Some(nt))
    }

    fn define(&mut self, nt: u32, body: &'g Expr, name: &str) -> Result<(), EngineError> {
        stacker::maybe_grow(64 * 1024, 1024 * 1024, || self.define_inner(nt, body, name))
    }

    fn define_inner(&mut self, nt: u32, body: &'g Expr, name: &str) -> Result<(), EngineError> {
        let alts = match body {
            Expr::Alt(v) if !self.is_regular(body) => v.iter().collect::<Vec<_>>(),
            _ => vec![body],
        };
        for alt in alts {
            let rhs = self.sequence(alt, name)?;
            self.add(nt, rhs)?;
        }
        Ok(())
    }

    /// The symbols of one alternative; adjacent regular items merge into one lexeme.
    fn sequence(&mut self, e: &'g Expr, name: &str) -> Result<Vec<Sym>, EngineError> {
        // A list of literals (an `enum`): its trie, keyed without printing a regex.
        let mut literals = Vec::new();
        if matches!(e, Expr::Alt(_)) && literal_set(e, &mut literals) {
            let r = Regular::Literals(literals);
            let limits = self.limits;
            return Ok(vec![self.lexeme_by(r.key(), || r.build(limits))?]);
        }
        let items: Vec<&'g Expr> = match e {
            Expr::Seq(v) => v.iter().collect(),
            _ => vec![e],
        };
        let mut out = Vec::new();
        let mut run: Vec<Hir> = Vec::new();
        for item in items {
            // `%`-named rules (only the JSON Schema compiler makes them; GBNF
            // names cannot start with `%`) are lexemes of their own, so equal
            // values share one automaton and its cached masks.
            if let Expr::Ref(r) = item {
                if r.starts_with('%') && self.is_regular(item) {
                    if !run.is_empty() {
                        out.push(self.lexeme(Hir::concat(std::mem::take(&mut run)))?);
                    }
                    let h = self.hir(item)?;
                    out.push(self.lexeme(h)?);
                    continue;
                }
            }
            if self.is_regular(item) {
                run.push(self.hir(item)?);
                continue;
            }
            if !run.is_empty() {
                out.push(self.lexeme(Hir::concat(std::mem::take(&mut run)))?);
            }
            out.push(self.symbol(item, name)?);
        }
        if !run.is_empty() {
            out.push(self.lexeme(Hir::concat(run))?);
        }
        Ok(out)
    }

    /// One symbol for an item: a nonterminal, or for a difference a lexeme.
    fn symbol(&mut self, e: &'g Expr, name: &str) -> Result<Sym, EngineError> {
        match e {
            Expr::Ref(r) => self
                .rule_nt(r)?
                .map(Sym::Nt)
                .ok_or_else(|| EngineError::Unsatisfiable(format!("rule `{r}` is not defined"))),
            Expr::Repeat { inner, min, max } => {
                let item = self.symbol_any(inner, name)?;
                let (min, max) = (*min, *max);
                if min > MAX_EXPANSION || max.is_some_and(|m| m > MAX_EXPANSION) {
                    return Err(EngineError::TooComplex(format!("`{{{min},…}}` on a recursive part of `{name}` expands too far")));
                }
                let nt = self.new_nt(format!("{name}~rep"));
                // `item{min}` then either `item*` or up to `max - min` optional items.
                let mut rhs = vec![item; min as usize];
                match max {
                    None => {
                        let star = self.new_nt(format!("{name}~star"));
                        self.add(star, vec![])?;
                        self.add(star, vec![Sym::Nt(star), item])?;
                        rhs.push(Sym::Nt(star));
                    }
                    Some(m) => {
                        // opt_k ::= ε | item opt_{k-1}
                        let mut tail: Option<u32> = None;
                        for _ in min..m {
                            let opt = self.new_nt(format!("{name}~opt"));
                            self.add(opt, vec![])?;
                            let mut r = vec![item];
                            if let Some(t) = tail {
                                r.push(Sym::Nt(t));
                            }
                            self.add(opt, r)?;
                            tail = Some(opt);
                        }
                        if let Some(t) = tail {
                            rhs.push(Sym::Nt(t));
                        }
                    }
                }
                self.add(nt, rhs)?;
                Ok(Sym::Nt(nt))
            }
            Expr::Except { base, except } => self.difference(base, except, name),
            Expr::Permutation { members, extra, sep, nonempty, requires } => {
                let sep = self.symbol_any(sep, name)?;
                if let Sym::Lex(l) = sep {
                    if self.lexemes[l as usize].is_accepting(self.lexemes[l as usize].start()) {
                        return Err(EngineError::Unsatisfiable(format!("the separator of a permutation in `{name}` matches the empty string")));
                    }
                } else {
                    return Err(EngineError::TooComplex(format!("the separator of a permutation in `{name}` is not regular")));
                }
                let extra = extra.as_deref().map(|x| self.symbol_any(x, name)).transpose()?;
                let mut syms = Vec::with_capacity(members.len());
                let mut required = vec![0u64; members.len().div_ceil(64)];
                for (j, (m, req)) in members.iter().enumerate() {
                    // A nonterminal, not one lexeme: its value's `%` rule
                    // stays a lexeme of its own, shared by every property
                    // of that type, and the key's lexeme is a literal (a
                    // lexeme of key and value per property was most of the
                    // compile time of large schemas).
                    syms.push(Some(self.symbol(m, name)?));
                    if *req {
                        add_member(&mut required, j);
                    }
                }
                let entry = self.new_nt(format!("{name}~perm"));
                let deps = requires
                    .iter()
                    .map(|(i, js)| {
                        let mut bits = vec![0u64; members.len().div_ceil(64)];
                        js.iter().for_each(|&j| add_member(&mut bits, j));
                        (*i, bits)
                    })
                    .collect();
                self.perms.push(Perm { entry, members: syms, required, extra, sep, nonempty: *nonempty, deps });
                Ok(Sym::Nt(entry))
            }
            _ => {
                let nt = self.new_nt(format!("{name}~group"));
                self.define(nt, e, name)?;
                Ok(Sym::Nt(nt))
            }
        }
    }

    /// A symbol for any expression (regular ones become a lexeme).
    fn symbol_any(&mut self, e: &'g Expr, name: &str) -> Result<Sym, EngineError> {
        if self.is_regular(e) {
            let h = self.hir(e)?;
            self.lexeme(h)
        } else {
            self.symbol(e, name)
        }
    }

    fn finish(mut self, root: u32) -> Result<Cfg, EngineError> {
        // An augmented start `S' ::= root` so acceptance is one item.
        let start = self.new_nt("<start>".into());
        self.add(start, vec![Sym::Nt(root)])?;
        let n = self.names.len();
        let lexeme_nullable: Vec<bool> = self.lexemes.iter().map(|d| d.is_accepting(d.start())).collect();
        let lexeme_empty: Vec<bool> = self.lexemes.iter().map(|d| !d.is_live(d.start())).collect();
        // For the fixpoints, a permutation is as if its entry were its
        // required members with separators between them (the shortest way
        // to write it); one that must not be empty and requires nothing, as
        // if it were any one of its items.
        let mut with_perms = self.productions.clone();
        for p in &self.perms {
            let least = p.least();
            let mut rhs: Vec<Sym> = p.members.iter().enumerate().filter(|(j, _)| has_member(&least, *j)).filter_map(|(_, m)| *m).collect();
            if rhs.len() > 1 {
                rhs.push(p.sep);
            }
            if rhs.is_empty() && p.nonempty {
                let items = p.members.iter().flatten().chain(&p.extra);
                with_perms.extend(items.map(|&item| Production { lhs: p.entry, rhs: vec![item] }));
            } else {
                with_perms.push(Production { lhs: p.entry, rhs });
            }
        }
        // Productive nonterminals (derive some string), then drop productions that cannot.
        let productive = fixpoint(&with_perms, n, |l| !lexeme_empty[l as usize]);
        if !productive[start as usize] {
            return Err(EngineError::Unsatisfiable("the grammar matches no string at all".into()));
        }
        self.productions.retain(|p| {
            productive[p.lhs as usize]
                && p.rhs.iter().all(|s| match s {
                    Sym::Nt(x) => productive[*x as usize],
                    Sym::Lex(l) => !lexeme_empty[*l as usize],
                })
        });
        // Lexemes that match only the empty string consume nothing: drop them.
        let only_empty: Vec<bool> = self.lexemes.iter().map(|d| d.is_complete(d.start())).collect();
        for p in &mut self.productions {
            p.rhs.retain(|s| !matches!(s, Sym::Lex(l) if only_empty[*l as usize]));
        }
        let live = |s: &Sym| match s {
            Sym::Nt(x) => productive[*x as usize],
            Sym::Lex(l) => !lexeme_empty[*l as usize],
        };
        let mut perm_of = vec![u32::MAX; n];
        for (k, p) in self.perms.iter_mut().enumerate() {
            perm_of[p.entry as usize] = k as u32;
            // A member that derives nothing never appears (an unproductive
            // required one made the entry unproductive above).
            for m in &mut p.members {
                *m = m.filter(live);
            }
            // Nor does one whose companions never appear.
            while let Some(i) = p.deps.iter().find(|(i, need)| p.members[*i].is_some() && (0..p.members.len()).any(|j| has_member(need, j) && p.members[j].is_none())).map(|d| d.0) {
                p.members[i] = None;
            }
            p.extra = p.extra.filter(live);
        }
        let nullable = fixpoint(&with_perms, n, |l| lexeme_nullable[l as usize]);
        let mut by_lhs = vec![Vec::new(); n];
        for (i, p) in self.productions.iter().enumerate() {
            by_lhs[p.lhs as usize].push(i as u32);
        }
        Ok(Cfg {
            lexemes: self.lexemes,
            lexeme_nullable,
            productions: self.productions,
            by_lhs,
            names: self.names,
            nullable,
            start,
            perms: self.perms,
            perm_of,
        })
    }
}

/// The nonterminals with a production whose symbols all hold: nonterminals
/// already found, and lexemes for which `lexeme` is true (least fixpoint).
fn fixpoint(productions: &[Production], n: usize, lexeme: impl Fn(u32) -> bool) -> Vec<bool> {
    let mut found = vec![false; n];
    loop {
        let mut changed = false;
        for p in productions {
            if !found[p.lhs as usize]
                && p.rhs.iter().all(|s| match s {
                    Sym::Nt(x) => found[*x as usize],
                    Sym::Lex(l) => lexeme(*l),
                })
            {
                found[p.lhs as usize] = true;
                changed = true;
            }
        }
        if !changed {
            return found;
        }
    }
}

/// The regex text of `h`, to parse again or to key a cache. regex-syntax's
/// printer drops the group around a repeated repetition: `(?:a{2})?`
/// prints as `a{2}?`, which parses as a lazy `a{2}` (and `(?:a+)+` as
/// `a++`, which does not parse). Such inner repetitions are put in a
/// group first; the group captures nothing that anything reads.
pub(super) fn regex_text(h: &Hir) -> String {
    fn nested(h: &Hir) -> bool {
        match h.kind() {
            HirKind::Repetition(r) => matches!(r.sub.kind(), HirKind::Repetition(_)) || nested(&r.sub),
            HirKind::Capture(c) => nested(&c.sub),
            HirKind::Concat(v) | HirKind::Alternation(v) => v.iter().any(nested),
            _ => false,
        }
    }
    fn group(h: &Hir) -> Hir {
        match h.kind() {
            HirKind::Repetition(r) => {
                let mut sub = group(&r.sub);
                if matches!(sub.kind(), HirKind::Repetition(_)) {
                    sub = Hir::capture(Capture { index: 1, name: None, sub: Box::new(sub) });
                }
                Hir::repetition(Repetition { sub: Box::new(sub), ..r.clone() })
            }
            HirKind::Capture(c) => Hir::capture(Capture { sub: Box::new(group(&c.sub)), ..c.clone() }),
            HirKind::Concat(v) => Hir::concat(v.iter().map(group).collect()),
            HirKind::Alternation(v) => Hir::alternation(v.iter().map(group).collect()),
            _ => h.clone(),
        }
    }
    if nested(h) {
        group(h).to_string()
    } else {
        h.to_string()
    }
}

/// True when `h` repeats something [`COUNTED_MIN`] times or more.
fn long_count(h: &Hir) -> bool {
    match h.kind() {
        HirKind::Repetition(r) => r.max.unwrap_or(r.min).max(r.min) >= COUNTED_MIN || long_count(&r.sub),
        HirKind::Capture(c) => long_count(&c.sub),
        HirKind::Concat(v) | HirKind::Alternation(v) => v.iter().any(long_count),
        _ => false,
    }
}

/// Into `out`, the strings of `e` when it is a literal or an alternation
/// of them.
fn literal_set<'g>(e: &'g Expr, out: &mut Vec<&'g str>) -> bool {
    match e {
        Expr::Literal(s) => {
            out.push(s);
            true
        }
        Expr::Alt(v) => v.iter().all(|x| literal_set(x, out)),
        _ => false,
    }
}

/// A regular language: a regex, a finite set of literals, or what one
/// takes and another does not.
enum Regular<'g> {
    Regex(Hir),
    Literals(Vec<&'g str>),
    Except(Box<Regular<'g>>, Box<Regular<'g>>),
}

impl Regular<'_> {
    /// The key of its lexeme. No regex prints with a NUL in it, so these
    /// keys cannot meet a regex's.
    fn key(&self) -> String {
        match self {
            Regular::Regex(h) => regex_text(h),
            Regular::Literals(v) => {
                let mut k = String::from("(\0");
                for l in v {
                    k.push_str(&l.len().to_string());
                    k.push(':');
                    k.push_str(l);
                    k.push('\0');
                }
                k + ")"
            }
            Regular::Except(a, b) => format!("(\0{}\0-\0{}\0)", a.key(), b.key()),
        }
    }

    fn build(&self, limits: &Limits) -> Result<Dfa, EngineError> {
        match self {
            Regular::Regex(h) => Dfa::from_hir(h, limits),
            Regular::Literals(v) => Dfa::choices(v, limits),
            // Names out of a key or value set: the literals' trie, not their automaton.
            Regular::Except(a, b) => match &**b {
                Regular::Literals(v) => a.interned(limits)?.minus_literals(&v.iter().map(|l| l.as_bytes()).collect::<Vec<_>>(), limits),
                _ => a.interned(limits)?.difference(&*b.interned(limits)?, limits),
            },
        }
    }

    /// [`Regular::build`] through the process's lexemes: the parts of
    /// differences (a JSON string, a format) recur in every schema.
    fn interned(&self, limits: &Limits) -> Result<Arc<Dfa>, EngineError> {
        intern_lexeme(&self.key(), || self.build(limits))
    }
}

/// A `/regex/` terminal's syntax tree. Parsed ones are kept process-wide:
/// JSON Schema grammars repeat the same few (a string, a number, a format)
/// in every property of every schema, and parsing was a quarter of a
/// typical schema's compile.
fn parse_regex(r: &str, limits: &Limits) -> Result<Hir, EngineError> {
    static PARSED: LazyLock<Memo<(String, usize), Hir>> = LazyLock::new(|| Memo::new(2048));
    let key = (r.to_string(), limits.max_nesting);
    if let Some(h) = PARSED.get(&key) {
        return Ok(h);
    }
    let h = regex_syntax::ParserBuilder::new()
        .nest_limit(limits.max_nesting as u32)
        .build()
        .parse(r)
        .map_err(|err| EngineError::Regex(format!("/{r}/: {err}")))?;
    PARSED.insert(key, h.clone());
    Ok(h)
}

/// Lexeme automata by regex, shared by every grammar in the process: the
/// JSON string body of one schema is the same automaton, with the same
/// cached masks, as every other schema's.
fn intern_lexeme(key: &str, make: impl FnOnce() -> Result<Dfa, EngineError>) -> Result<Arc<Dfa>, EngineError> {
    // Bounded (grammars keep their own Arcs); 512 a generation.
    static LEXEMES: LazyLock<Memo<String, Arc<Dfa>>> = LazyLock::new(|| Memo::new(512));
    // One that outgrew its state limit is not handed out again.
    if let Some(d) = LEXEMES.get(&key.to_string()).filter(|d| d.check().is_ok()) {
        return Ok(d);
    }
    let d = Arc::new(make()?);
    LEXEMES.insert(key.to_string(), d.clone());
    Ok(d)
}

/// The nodes of `adj` that lie on a cycle: Tarjan's strongly connected
/// components, with an explicit stack (grammars chain thousands of rules).
fn on_cycles(adj: &[Vec<usize>]) -> Vec<bool> {
    const NONE: usize = usize::MAX;
    let n = adj.len();
    let (mut index, mut low) = (vec![NONE; n], vec![0; n]);
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut cyclic = vec![false; n];
    let mut next = 0;
    // (node, position in its references)
    let mut calls: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if index[root] != NONE {
            continue;
        }
        calls.push((root, 0));
        while let Some(&(v, i)) = calls.last() {
            if index[v] == NONE {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = adj[v].get(i) {
                calls.last_mut().expect("a call").1 += 1;
                if index[w] == NONE {
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 || adj[v].contains(&v) {
                    component.into_iter().for_each(|w| cyclic[w] = true);
                }
            }
        }
    }
    cyclic
}

fn collect_refs<'a>(e: &'a Expr, out: &mut Vec<&'a str>) {
    match e {
        Expr::Ref(r) => out.push(r),
        _ => e.for_each_child(|x| collect_refs(x, out)),
    }
}

/// True for expressions with a node no regex can say (a permutation, a
/// difference): the rules that hold them are always nonterminals.
fn is_structural(e: &Expr) -> bool {
    match e {
        Expr::Permutation { .. } | Expr::Except { .. } => true,
        Expr::Alt(v) | Expr::Seq(v) => v.iter().any(is_structural),
        Expr::Repeat { inner, .. } => is_structural(inner),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_on_cycles_and_only_those() {
        // 0 → 1 → 2 → 0 is a cycle, 3 loops on itself, 4 → 0 and 5 → 6 only lead to or sit beside them.
        let adj = vec![vec![1], vec![2], vec![0, 3], vec![3], vec![0], vec![6], vec![]];
        assert_eq!(on_cycles(&adj), vec![true, true, true, true, false, false, false]);
        // A chain far deeper than any call stack would take.
        let n = 200_000;
        let mut chain: Vec<Vec<usize>> = (0..n).map(|i| vec![i + 1]).collect();
        chain[n - 1] = vec![n / 2];
        let c = on_cycles(&chain);
        assert!(!c[n / 2 - 1] && c[n / 2] && c[n - 1]);
    }
}
