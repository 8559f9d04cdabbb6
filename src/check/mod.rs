//! Static checks of a parsed template, before any model is loaded: options
//! and their types, regexes, grammars, JSON Schemas, names (defined, maybe
//! undefined, used before definition), calls and their arity, imports'
//! exports, block placement. Each finding is a [`Diagnostic`].
//!
//! Scoping rule (documented in docs/reference.md): a file has one flat
//! namespace; `if`/`for`/`select` bodies do not open scopes, except that
//! loop variables and `loop` live only inside their loop. A `def` body has
//! its own namespace of parameters and locals and reads the file's names.

mod grammar;
pub mod options;
pub mod schema;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::builtins;
use crate::diagnostic::{suggest, Code, Diagnostic};
use crate::span::{FileId, Span};
use crate::syntax::ast::*;
use crate::files::Loader;

/// What the checker needs to know besides the tree.
pub struct Ctx<'a> {
    /// The file being checked.
    pub file: FileId,
    /// Its text (to map regex errors into literals).
    pub text: &'a str,
    /// Its directory, for relative schema paths.
    pub base_dir: Option<PathBuf>,
    /// The folder schema files must stay under ([`crate::files::resolve_named`]).
    pub root: Option<&'a std::path::Path>,
    /// Reads schema files.
    pub loader: &'a dyn Loader,
    /// What each import path (as written) resolved to. Missing: the import
    /// failed and was reported already.
    pub imports: &'a HashMap<String, ModuleInfo>,
    /// Names defined before this text (earlier REPL entries).
    pub prelude: Option<&'a Prelude>,
}

/// Names an earlier REPL entry defined, visible in the next one as if
/// defined above it.
#[derive(Debug, Clone, Default)]
pub struct Prelude {
    /// Each name and what it is.
    pub names: BTreeMap<String, Export>,
    /// What the modules among them export, by name.
    pub modules: HashMap<String, ModuleInfo>,
}

/// What a module defines at its top level, as seen by its importers.
#[derive(Debug, Clone, Default)]
pub struct ModuleInfo {
    /// Display name of the module's file.
    pub name: String,
    /// Top-level names.
    pub exports: BTreeMap<String, Export>,
}

/// A top-level definition of a module.
#[derive(Debug, Clone)]
pub enum Export {
    /// A `def` with its parameters.
    Def(Vec<ParamSig>),
    /// A grammar with its rule names and default start rule.
    Grammar {
        /// Rule names.
        rules: Vec<String>,
        /// The rule generation starts at, if the grammar has one.
        start: Option<String>,
    },
    /// Any other value (`set`, `input`, captures).
    Value,
    /// An imported module.
    Module,
}

/// A parameter of a `def`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSig {
    /// Its name.
    pub name: String,
    /// True when it has a default and may be left out.
    pub has_default: bool,
}

/// The start rule of grammar block `name`: the rule named like the block,
/// else `root`.
pub fn start_rule(name: &str, g: &crate::syntax::gbnf::Grammar) -> Option<String> {
    [name, "root"].into_iter().find(|n| g.rule(n).is_some()).map(str::to_string)
}

/// The exports of a parsed module.
pub fn module_info(name: &str, t: &Template) -> ModuleInfo {
    let mut exports = BTreeMap::new();
    let mut add = |n: &str, e: Export| {
        exports.entry(n.to_string()).or_insert(e);
    };
    for node in &t.body {
        match node {
            Node::Def(d) => add(&d.name.name, Export::Def(sigs(&d.params))),
            Node::Grammar(g) => add(
                &g.name.name,
                Export::Grammar {
                    rules: g.grammar.rules.iter().map(|r| r.name.clone()).collect(),
                    start: start_rule(&g.name.name, &g.grammar),
                },
            ),
            Node::Set { target, .. } => add(&target.name.name, Export::Value),
            Node::Input { params, .. } => params.iter().for_each(|p| add(&p.name.name, Export::Value)),
            Node::Import(i) => add(&i.alias.name, Export::Module),
            _ => {}
        }
    }
    ModuleInfo { name: name.to_string(), exports }
}

fn sigs(params: &[Param]) -> Vec<ParamSig> {
    params.iter().map(|p| ParamSig { name: p.name.name.clone(), has_default: p.default.is_some() }).collect()
}

/// Checks `t` and returns its diagnostics (syntax errors are not included:
/// they come from the parser).
pub fn check_template(t: &Template, ctx: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut c = Checker { ctx, out: Vec::new(), scopes: Vec::new(), role_depth: 0, loop_depth: 0, entry_rules: Vec::new(), grammars: Vec::new(), names: Vec::new(), ids: HashMap::new() };
    let mut module = c.collect(&t.body, true);
    let mut flow = Flow::default();
    for (name, export) in ctx.prelude.iter().flat_map(|p| &p.names) {
        let kind = match export {
            Export::Def(params) => BindKind::Def(params.clone()),
            Export::Grammar { rules, .. } => BindKind::Grammar { rules: rules.clone() },
            Export::Value => BindKind::Value,
            Export::Module => BindKind::Module(ctx.prelude.and_then(|p| p.modules.get(name)).cloned()),
        };
        // This text's own definition of a name wins; it is defined from the start otherwise.
        module.entry(name.clone()).or_insert(Binding { span: Span::default(), kind });
        let id = c.id(name);
        flow.define(id);
    }
    c.scopes.push(module);
    c.walk(&t.body, &mut flow);
    for g in std::mem::take(&mut c.grammars) {
        grammar::unused_rules(g, &c.entry_rules, ctx.file, &mut c.out);
    }
    c.out
}

#[derive(Debug, Clone)]
struct Binding {
    span: Span,
    kind: BindKind,
}

#[derive(Debug, Clone)]
enum BindKind {
    Value,
    Def(Vec<ParamSig>),
    Grammar { rules: Vec<String> },
    Module(Option<ModuleInfo>),
}

/// A set of interned names.
#[derive(Debug, Clone, Default)]
struct Names(Vec<u64>);

impl Names {
    fn has(&self, i: u32) -> bool {
        self.0.get(i as usize / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn set(&mut self, i: u32) {
        let w = i as usize / 64;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }

    fn unset(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut(i as usize / 64) {
            *w &= !(1 << (i % 64));
        }
    }

    /// `self |= other`.
    fn add(&mut self, other: &Names) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a |= b);
    }

    /// `self &= other`.
    fn keep(&mut self, other: &Names) {
        for (i, a) in self.0.iter_mut().enumerate() {
            *a &= other.0.get(i).copied().unwrap_or(0);
        }
    }

    /// `self &= !other`.
    fn remove(&mut self, other: &Names) {
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a &= !b);
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(w, bits)| (0..64).filter(move |b| bits & (1 << b) != 0).map(move |b| (w * 64 + b) as u32))
    }
}

/// Names definitely and possibly defined at a point of the program.
/// Bitsets over interned names: branches clone them, so they must be cheap.
#[derive(Debug, Clone, Default)]
struct Flow {
    definite: Names,
    maybe: Names,
}

impl Flow {
    fn define(&mut self, name: u32) {
        self.definite.set(name);
        self.maybe.unset(name);
    }

    fn forget(&mut self, name: u32) {
        self.definite.unset(name);
        self.maybe.unset(name);
    }

    /// The flow after exactly one of `branches` ran.
    fn join(branches: Vec<Flow>) -> Flow {
        let mut it = branches.into_iter();
        let Some(first) = it.next() else { return Flow::default() };
        let mut definite = first.definite.clone();
        let mut maybe = first.maybe;
        maybe.add(&first.definite);
        for f in it {
            definite.keep(&f.definite);
            maybe.add(&f.maybe);
            maybe.add(&f.definite);
        }
        maybe.remove(&definite);
        Flow { definite, maybe }
    }
}

struct Checker<'a> {
    ctx: &'a Ctx<'a>,
    out: Vec<Diagnostic>,
    /// The module scope, then a `def`'s scope while inside one: every name
    /// defined anywhere in that scope.
    scopes: Vec<HashMap<String, Binding>>,
    role_depth: usize,
    loop_depth: usize,
    /// `(grammar, rule)` pairs used as `grammar=g.rule`.
    entry_rules: Vec<(String, String)>,
    grammars: Vec<&'a GrammarBlock>,
    /// Interned names, for [`Flow`].
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl<'a> Checker<'a> {
    fn push(&mut self, d: Diagnostic) {
        self.out.push(d);
    }

    fn file(&self) -> FileId {
        self.ctx.file
    }

    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), self.names.len() as u32 - 1);
        self.names.len() as u32 - 1
    }

    // ----------------------------------------------------- definitions

    /// Every name defined in `body` (not inside `def` bodies), with
    /// duplicate and placement checks.
    fn collect(&mut self, body: &'a [Node], top: bool) -> HashMap<String, Binding> {
        let mut defs: HashMap<String, Binding> = HashMap::new();
        self.collect_into(body, top, &mut defs);
        defs
    }

    fn collect_into(&mut self, body: &'a [Node], top: bool, defs: &mut HashMap<String, Binding>) {
        let file = self.file();
        for node in body {
            let unique = |this: &mut Self, defs: &mut HashMap<String, Binding>, ident: &Ident, kind: BindKind, what: &str| {
                if ident.name.is_empty() {
                    return;
                }
                if let Some(prev) = defs.get(&ident.name) {
                    if !matches!(prev.kind, BindKind::Value) || !matches!(kind, BindKind::Value) {
                        this.push(
                            Diagnostic::new(Code::DuplicateDefinition, file, ident.span, format!("`{}` is defined twice", ident.name))
                                .with_secondary(prev.span, "first defined here")
                                .with_help(format!("rename this {what} or remove one definition")),
                        );
                        return;
                    }
                    return;
                }
                defs.insert(ident.name.clone(), Binding { span: ident.span, kind });
            };
            let value = |defs: &mut HashMap<String, Binding>, t: &Ident| {
                // Reserved names are reported where they are assigned, and never bound.
                if !t.name.is_empty() && !builtins::is_reserved(&t.name) {
                    defs.entry(t.name.clone()).or_insert(Binding { span: t.span, kind: BindKind::Value });
                }
            };
            let not_top = |this: &mut Self, what: &str, span: Span| {
                if !top {
                    this.push(
                        Diagnostic::new(Code::NotTopLevel, file, span, format!("`{what}` must be at the top level of the file"))
                            .with_help(format!("move this `{what}` out of the block it is in")),
                    );
                }
            };
            match node {
                Node::Gen(g) => {
                    if let Some(t) = &g.target {
                        value(defs, &t.name)
                    }
                }
                Node::Select(s) => {
                    if let Some(t) = &s.target {
                        value(defs, &t.name)
                    }
                    if let Choices::Branches(bs) = &s.choices {
                        for b in bs {
                            self.collect_into(&b.body, false, defs);
                        }
                    }
                }
                Node::Set { target, .. } => value(defs, &target.name),
                Node::Capture(b) => {
                    value(defs, &b.head.name);
                    self.collect_into(&b.body, false, defs);
                }
                Node::Role(b) => self.collect_into(&b.body, false, defs),
                Node::Hidden(b) => self.collect_into(&b.body, false, defs),
                Node::If(i) => {
                    for (_, body) in &i.branches {
                        self.collect_into(body, false, defs);
                    }
                    if let Some(e) = &i.else_body {
                        self.collect_into(e, false, defs);
                    }
                }
                Node::For(f) => {
                    self.collect_into(&f.body, false, defs);
                    if let Some(e) = &f.else_body {
                        self.collect_into(e, false, defs);
                    }
                }
                Node::Def(d) => {
                    not_top(self, "def", d.open);
                    unique(self, defs, &d.name, BindKind::Def(sigs(&d.params)), "def");
                }
                Node::Grammar(g) => {
                    not_top(self, "grammar", g.open);
                    let rules = g.grammar.rules.iter().map(|r| r.name.clone()).collect();
                    unique(self, defs, &g.name, BindKind::Grammar { rules }, "grammar");
                }
                Node::Import(i) => {
                    not_top(self, "import", i.span);
                    let info = self.ctx.imports.get(&i.path).cloned();
                    unique(self, defs, &i.alias, BindKind::Module(info), "import");
                }
                Node::Input { params, span } => {
                    not_top(self, "input", *span);
                    for p in params {
                        if self.scopes.is_empty() && defs.get(&p.name.name).is_some_and(|b| b.span != p.name.span) {
                            let prev = defs[&p.name.name].span;
                            self.push(
                                Diagnostic::new(Code::DuplicateDefinition, file, p.name.span, format!("`{}` is defined twice", p.name.name))
                                    .with_secondary(prev, "first defined here")
                                    .with_help("an input is declared once, before anything else defines the name"),
                            );
                        }
                        value(defs, &p.name);
                    }
                }
                Node::Text { .. } | Node::Emit { .. } => {}
            }
        }
    }

    fn binding(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    // ----------------------------------------------------------- walk

    fn walk(&mut self, body: &'a [Node], flow: &mut Flow) {
        for node in body {
            self.node(node, flow);
        }
    }

    fn define_target(&mut self, t: &Target, flow: &mut Flow) {
        if builtins::is_reserved(&t.name.name) {
            self.push(
                Diagnostic::new(Code::ReservedName, self.file(), t.name.span, format!("`{}` is reserved", t.name.name))
                    .with_help("choose another name"),
            );
        }
        let id = self.id(&t.name.name);
        flow.define(id);
    }

    fn node(&mut self, node: &'a Node, flow: &mut Flow) {
        match node {
            Node::Text { .. } => {}
            Node::Emit { expr, .. } => self.expr(expr, flow),
            Node::Gen(g) => {
                self.gen_options(&g.options, false, flow);
                if let Some(t) = &g.target {
                    self.define_target(t, flow);
                }
            }
            Node::Select(s) => {
                self.gen_options(&s.options, true, flow);
                match &s.choices {
                    Choices::List(list) => {
                        self.expr(list, flow);
                        self.select_list(list, s.open);
                    }
                    Choices::Branches(bs) => {
                        self.select_branches(bs, s.open, &s.options);
                        let mut outs = Vec::new();
                        for b in bs {
                            let mut f = flow.clone();
                            self.walk(&b.body, &mut f);
                            outs.push(f);
                        }
                        *flow = Flow::join(outs);
                    }
                }
                if let Some(t) = &s.target {
                    self.define_target(t, flow);
                }
            }
            Node::Role(b) => {
                if self.role_depth > 0 {
                    self.push(
                        Diagnostic::new(Code::NestedRole, self.file(), b.open, "a role block cannot be inside another role block")
                            .with_help("close the outer role with `{% end %}` before opening this one"),
                    );
                }
                if let RoleName::Expr(e) = &b.head {
                    self.expr(e, flow);
                    match e.to_const() {
                        Some(Const::Str(name)) if !is_role_name(&name) => self.push(
                            Diagnostic::new(Code::InvalidRoleName, self.file(), e.span, format!("{name:?} is not a role name"))
                                .with_help("a role name is a plain word such as `tool` or `developer` (a letter, then letters, digits, `_` or `-`)"),
                        ),
                        Some(Const::Str(_)) | None => {}
                        Some(c) => self.push(
                            Diagnostic::new(Code::OptionType, self.file(), e.span, format!("a role name must be a string, not {}", crate::diagnostic::with_article(c.type_name())))
                                .with_help("write `{% role \"tool\" %}`"),
                        ),
                    }
                }
                self.role_depth += 1;
                self.walk(&b.body, flow);
                self.role_depth -= 1;
            }
            Node::Capture(b) => {
                self.walk(&b.body, flow);
                self.define_target(&b.head, flow);
            }
            Node::Hidden(b) => self.walk(&b.body, flow),
            Node::Set { target, value, .. } => {
                self.expr(value, flow);
                self.define_target(target, flow);
            }
            Node::If(i) => {
                let mut outs = Vec::new();
                for (cond, body) in &i.branches {
                    self.expr(cond, flow);
                    let mut f = flow.clone();
                    if let ExprKind::Test { value, name, negated: false, .. } = &cond.kind {
                        if let (ExprKind::Name(n), "defined") = (&value.kind, name.name.as_str()) {
                            f.define(self.id(n));
                        }
                    }
                    self.walk(body, &mut f);
                    outs.push(f);
                }
                let mut f = flow.clone();
                if let Some(e) = &i.else_body {
                    self.walk(e, &mut f);
                }
                outs.push(f);
                *flow = Flow::join(outs);
            }
            Node::For(f) => {
                self.expr(&f.iter, flow);
                let mut body = flow.clone();
                for v in &f.vars {
                    if builtins::is_reserved(&v.name) {
                        self.push(Diagnostic::new(Code::ReservedName, self.file(), v.span, format!("`{}` is reserved", v.name)));
                    }
                    body.define(self.id(&v.name));
                }
                body.define(self.id("loop"));
                self.loop_depth += 1;
                self.walk(&f.body, &mut body);
                self.loop_depth -= 1;
                for v in &f.vars {
                    body.forget(self.id(&v.name));
                }
                body.forget(self.id("loop"));
                // The body may run zero times: what it defines is "maybe".
                let mut ran = flow.clone();
                let mut added = body.definite.clone();
                added.remove(&flow.definite);
                ran.maybe.add(&added);
                ran.maybe.add(&body.maybe);
                if let Some(e) = &f.else_body {
                    // Either the body ran or the else did: names both define are defined.
                    let mut other = flow.clone();
                    self.walk(e, &mut other);
                    let mut both = body.definite.clone();
                    both.keep(&other.definite);
                    let mut added = other.definite.clone();
                    added.remove(&flow.definite);
                    ran.maybe.add(&added);
                    ran.maybe.add(&other.maybe);
                    ran.definite.add(&both);
                }
                ran.maybe.remove(&ran.definite);
                *flow = ran;
            }
            Node::Def(d) => {
                let mut seen: Vec<&Ident> = Vec::new();
                for p in &d.params {
                    if let Some(prev) = seen.iter().find(|q| q.name == p.name.name) {
                        self.push(
                            Diagnostic::new(Code::DuplicateDefinition, self.file(), p.name.span, format!("parameter `{}` is listed twice", p.name.name))
                                .with_secondary(prev.span, "first listed here"),
                        );
                    }
                    seen.push(&p.name);
                    if let Some(def) = &p.default {
                        self.expr(def, flow);
                    }
                }
                flow.define(self.id(&d.name.name));
                let mut locals = self.collect(&d.body, false);
                let mut inner = Flow::default();
                for p in &d.params {
                    locals.insert(p.name.name.clone(), Binding { span: p.name.span, kind: BindKind::Value });
                    inner.define(self.id(&p.name.name));
                }
                self.scopes.push(locals);
                let (roles, loops) = (self.role_depth, self.loop_depth);
                self.role_depth = 0;
                self.loop_depth = 0;
                self.walk(&d.body, &mut inner);
                self.role_depth = roles;
                self.loop_depth = loops;
                self.scopes.pop();
            }
            Node::Import(i) => flow.define(self.id(&i.alias.name)),
            Node::Grammar(g) => {
                grammar::check_block(g, self.ctx, &mut self.out);
                self.grammars.push(g);
                flow.define(self.id(&g.name.name));
            }
            Node::Input { params, .. } => {
                for p in params {
                    if let Some(d) = &p.default {
                        self.expr(d, flow);
                    }
                    flow.define(self.id(&p.name.name));
                }
            }
        }
    }

    fn gen_options(&mut self, opts: &'a [GenOption], is_select: bool, flow: &mut Flow) {
        options::check(opts, is_select, self.ctx, &mut self.out);
        for o in opts {
            self.expr(&o.value, flow);
            if o.name.name == "grammar" && !is_select {
                self.grammar_ref(&o.value);
            }
        }
    }

    fn select_list(&mut self, list: &Expr, open: Span) {
        let file = self.file();
        let Some(c) = list.to_const() else { return };
        let Const::List(items) = c else {
            self.push(
                Diagnostic::new(Code::OptionType, file, list.span, format!("`select … in` takes a list of strings, not {}", crate::diagnostic::with_article(c.type_name())))
                    .with_help("write `{% select answer in [\"yes\", \"no\"] %}`"),
            );
            return;
        };
        if items.is_empty() {
            self.push(
                Diagnostic::new(Code::EmptyChoices, file, list.span, "this select has no options to choose from")
                    .with_help("list at least two options"),
            );
            return;
        }
        let ExprKind::List(exprs) = &list.kind else { return };
        let mut seen: Vec<(&str, Span)> = Vec::new();
        for (item, e) in items.iter().zip(exprs) {
            match item {
                Const::Str(s) => {
                    if let Some((_, first)) = seen.iter().find(|(t, _)| *t == s.as_str()) {
                        self.push(
                            Diagnostic::new(Code::DuplicateChoice, file, e.span, format!("option {s:?} is listed twice"))
                                .with_secondary(*first, "first listed here"),
                        );
                    }
                    if let Some(s) = e.as_str() {
                        seen.push((s, e.span));
                    }
                }
                other => self.push(
                    Diagnostic::new(Code::OptionType, file, e.span, format!("select options must be strings, not {}", crate::diagnostic::with_article(other.type_name())))
                        .with_help("quote the option, or convert it with `| string`"),
                ),
            }
        }
        if items.len() == 1 {
            self.push(
                Diagnostic::new(Code::SingleOption, file, open, "this select has one option, so it always picks it")
                    .with_help("add options, or write the text directly"),
            );
        }
    }

    fn select_branches(&mut self, bs: &[Branch], open: Span, options: &[GenOption]) {
        let file = self.file();
        let greedy = options.iter().find(|o| o.name.name == "score" && matches!(o.value.to_const(), Some(Const::Str(s)) if s == "greedy"));
        if let Some(g) = greedy.filter(|_| !bs.iter().all(|b| b.body.iter().all(|n| matches!(n, Node::Text { .. })))) {
            self.push(
                Diagnostic::new(Code::GreedyBranches, file, g.value.span, "`score=\"greedy\"` needs branches that are plain text; this select is scored `\"full\"`")
                    .with_label("greedy decoding needs literal options")
                    .with_help("make every branch plain text, or write `score=\"full\"` or `score=\"mean\"`"),
            );
        }
        if bs.len() == 1 {
            self.push(
                Diagnostic::new(Code::SingleOption, file, open, "this select has one branch, so it always picks it")
                    .with_help("separate options with `{% or %}`"),
            );
        }
        let literal = |b: &Branch| match b.body.as_slice() {
            [Node::Text { value, .. }] => Some(value.clone()),
            _ => None,
        };
        let mut seen: Vec<(String, Span)> = Vec::new();
        for b in bs {
            if let Some(t) = literal(b) {
                if let Some((_, first)) = seen.iter().find(|(s, _)| *s == t) {
                    self.push(
                        Diagnostic::new(Code::DuplicateChoice, file, b.body[0].span(), format!("option {t:?} is listed twice"))
                            .with_secondary(*first, "first listed here"),
                    );
                } else {
                    seen.push((t, b.body[0].span()));
                }
            }
        }
    }

    /// Checks the value of `grammar=`: a grammar, optionally `.rule`, or a
    /// module's grammar.
    fn grammar_ref(&mut self, e: &Expr) {
        let file = self.file();
        let not_grammar = |what: String, span: Span| {
            Diagnostic::new(Code::NotAGrammar, file, span, what)
                .with_help("define a grammar with `{% grammar name %}root ::= …{% end %}` and write `grammar=name`")
        };
        match &e.kind {
            ExprKind::Str(s) => {
                let is_grammar = matches!(self.binding(s).map(|b| &b.kind), Some(BindKind::Grammar { .. }));
                let help = if is_grammar {
                    format!("write the grammar's name without quotes: `grammar={s}`")
                } else {
                    "write `grammar=name` for `{% grammar name %}`; to match a regex, use `regex=\"…\"`".to_string()
                };
                let d = not_grammar("`grammar=` takes the name of a grammar, not a string".into(), e.span).with_help(help);
                self.push(d);
            }
            ExprKind::Name(n) => match self.binding(n).map(|b| b.kind.clone()) {
                Some(BindKind::Def(_)) => self.push(not_grammar(format!("`{n}` is a def, not a grammar"), e.span)),
                Some(BindKind::Module(_)) => self.push(not_grammar(format!("`{n}` is a module; name one of its grammars, as `{n}.NAME`"), e.span)),
                _ => {}
            },
            ExprKind::Attr(base, rule) => match &base.kind {
                ExprKind::Name(n) => match self.binding(n).map(|b| b.kind.clone()) {
                    Some(BindKind::Grammar { rules }) => {
                        if rules.contains(&rule.name) {
                            self.entry_rules.push((n.clone(), rule.name.clone()));
                        } else {
                            let help = match suggest(&rule.name, rules.iter().map(String::as_str)) {
                                Some(s) => format!("did you mean `{n}.{s}`?"),
                                None => format!("its rules are: {}", rules.join(", ")),
                            };
                            self.push(
                                Diagnostic::new(Code::NotAGrammar, file, rule.span, format!("grammar `{n}` has no rule `{}`", rule.name))
                                    .with_help(help),
                            );
                        }
                    }
                    Some(BindKind::Module(Some(info))) => match info.exports.get(&rule.name) {
                        Some(Export::Grammar { .. }) | None => {}
                        Some(_) => self.push(not_grammar(format!("`{n}.{}` is not a grammar", rule.name), rule.span)),
                    },
                    _ => {}
                },
                ExprKind::Attr(inner, gname) => {
                    if let ExprKind::Name(m) = &inner.kind {
                        if let Some(BindKind::Module(Some(info))) = self.binding(m).map(|b| b.kind.clone()) {
                            if let Some(Export::Grammar { rules, .. }) = info.exports.get(&gname.name) {
                                if !rules.contains(&rule.name) {
                                    self.push(
                                        Diagnostic::new(Code::NotAGrammar, file, rule.span, format!("grammar `{m}.{}` has no rule `{}`", gname.name, rule.name))
                                            .with_help(format!("its rules are: {}", rules.join(", "))),
                                    );
                                }
                            }
                        }
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }

    // ---------------------------------------------------- expressions

    fn expr(&mut self, e: &Expr, flow: &Flow) {
        match &e.kind {
            ExprKind::Str(_) | ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None | ExprKind::Error => {}
            ExprKind::List(items) => items.iter().for_each(|i| self.expr(i, flow)),
            ExprKind::Map(kv) => kv.iter().for_each(|(k, v)| {
                self.expr(k, flow);
                self.expr(v, flow);
            }),
            ExprKind::Name(n) => self.use_name(n, e.span, flow),
            ExprKind::Attr(base, attr) => {
                if let ExprKind::Name(m) = &base.kind {
                    if let Some(BindKind::Module(Some(info))) = self.binding(m).map(|b| b.kind.clone()) {
                        if !info.exports.contains_key(&attr.name) {
                            let help = match suggest(&attr.name, info.exports.keys().map(String::as_str)) {
                                Some(s) => format!("did you mean `{m}.{s}`?"),
                                None => format!("`{}` defines: {}", info.name, info.exports.keys().cloned().collect::<Vec<_>>().join(", ")),
                            };
                            self.push(
                                Diagnostic::new(Code::UnknownAttribute, self.file(), attr.span, format!("module `{m}` has no `{}`", attr.name))
                                    .with_help(help),
                            );
                        }
                    }
                }
                self.expr(base, flow);
            }
            ExprKind::Index(v, i) => {
                self.expr(v, flow);
                self.expr(i, flow);
            }
            ExprKind::Slice { value, start, stop, step } => {
                self.expr(value, flow);
                for x in [start, stop, step].into_iter().flatten() {
                    self.expr(x, flow);
                }
            }
            ExprKind::Call(f, args) => {
                self.call(f, args, e.span);
                self.expr(f, flow);
                args.iter().for_each(|a| self.expr(&a.value, flow));
            }
            ExprKind::Filter(v, name, args) => {
                match builtins::filter(&name.name) {
                    Some(b) => self.builtin_args(b, 0, args, name.span, "filter"),
                    None => self.unknown_builtin(Code::UnknownFilter, "filter", name, builtins::FILTERS),
                }
                // `x | default(…)` is how a possibly undefined name is read.
                let guarded = name.name == "default" && matches!(v.kind, ExprKind::Name(_));
                if !guarded {
                    self.expr(v, flow);
                }
                args.iter().for_each(|a| self.expr(&a.value, flow));
            }
            ExprKind::Test { value, name, args, .. } => {
                match builtins::test(&name.name) {
                    Some(b) => self.builtin_args(b, 0, args, name.span, "test"),
                    None => self.unknown_builtin(Code::UnknownTest, "test", name, builtins::TESTS),
                }
                let guarded = matches!(name.name.as_str(), "defined" | "undefined") && matches!(value.kind, ExprKind::Name(_));
                if !guarded {
                    self.expr(value, flow);
                }
                args.iter().for_each(|a| self.expr(&a.value, flow));
            }
            ExprKind::Unary(_, v) => self.expr(v, flow),
            ExprKind::Binary(_, a, b) => {
                self.expr(a, flow);
                self.expr(b, flow);
            }
            ExprKind::Cond { cond, then, otherwise } => {
                self.expr(cond, flow);
                self.expr(then, flow);
                self.expr(otherwise, flow);
            }
        }
    }

    fn unknown_builtin(&mut self, code: Code, what: &str, name: &Ident, table: &[builtins::Builtin]) {
        let help = match suggest(&name.name, table.iter().map(|f| f.name)) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!("{what}s are: {}", table.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")),
        };
        self.push(Diagnostic::new(code, self.file(), name.span, format!("unknown {what} `{}`", name.name)).with_help(help));
    }

    fn use_name(&mut self, n: &str, span: Span, flow: &Flow) {
        let id = self.id(n);
        if flow.definite.has(id) {
            return;
        }
        let file = self.file();
        let def_span = self.binding(n).map(|b| b.span);
        if flow.maybe.has(id) {
            let mut d = Diagnostic::new(Code::MaybeUndefined, file, span, format!("`{n}` may be undefined here"))
                .with_label("defined on some paths only")
                .with_help(format!("define `{n}` before the branch or loop (e.g. `{{% set {n} = none %}}`), or test `{n} is defined`"));
            if let Some(s) = def_span {
                d = d.with_secondary(s, "defined here");
            }
            self.push(d);
            return;
        }
        // Inside a def, the file's names are read when the def is called.
        if self.scopes.len() > 1 && self.scopes[0].contains_key(n) {
            return;
        }
        if builtins::function(n).is_some() {
            return;
        }
        let local_scope = self.scopes.last().and_then(|s| s.get(n)).map(|b| b.span);
        if let Some(later) = local_scope {
            self.push(
                Diagnostic::new(Code::UsedBeforeDefined, file, span, format!("`{n}` is used before it is defined"))
                    .with_label("used here")
                    .with_secondary(later, "defined later here")
                    .with_help(format!("move the definition of `{n}` above this use")),
            );
            return;
        }
        let mut candidates: Vec<&str> = flow.definite.iter().map(|i| self.names[i as usize].as_str()).collect();
        for s in &self.scopes {
            candidates.extend(s.keys().map(String::as_str));
        }
        let help = match suggest(n, candidates) {
            Some(s) => format!("did you mean `{s}`?"),
            None if n == "loop" => "`loop` exists only inside a `for` block".to_string(),
            None => format!("declare it as an input with `{{% input {n} %}}` (then pass `--var {n}=…`), or define it with `{{% set {n} = … %}}`"),
        };
        self.push(
            Diagnostic::new(Code::UnknownName, file, span, format!("unknown name `{n}`")).with_label("not defined").with_help(help),
        );
    }

    fn call(&mut self, f: &Expr, args: &[Arg], span: Span) {
        let sig = match &f.kind {
            ExprKind::Name(n) => match self.binding(n).map(|b| b.kind.clone()) {
                Some(BindKind::Def(p)) => Some((n.clone(), p)),
                Some(_) => None,
                None => {
                    if let Some((b, offset)) = builtins::function(n) {
                        self.builtin_args(b, offset, args, f.span, "function");
                    }
                    None
                }
            },
            ExprKind::Attr(base, name) => match &base.kind {
                ExprKind::Name(m) => match self.binding(m).map(|b| b.kind.clone()) {
                    Some(BindKind::Module(Some(info))) => match info.exports.get(&name.name) {
                        Some(Export::Def(p)) => Some((format!("{m}.{}", name.name), p.clone())),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        let Some((name, params)) = sig else { return };
        let file = self.file();
        let positional = args.iter().filter(|a| a.name.is_none()).count();
        let mut errs = Vec::new();
        if positional > params.len() {
            errs.push(format!("`{name}` takes {} argument{}, but {} were given", params.len(), if params.len() == 1 { "" } else { "s" }, positional));
        }
        let mut given: Vec<&str> = params.iter().take(positional).map(|p| p.name.as_str()).collect();
        for a in args {
            if let Some(k) = &a.name {
                if !params.iter().any(|p| p.name == k.name) {
                    errs.push(format!("`{name}` has no parameter `{}`", k.name));
                } else if given.contains(&k.name.as_str()) {
                    errs.push(format!("argument `{}` of `{name}` is given twice", k.name));
                } else {
                    given.push(&k.name);
                }
            }
        }
        for p in &params {
            if !p.has_default && !given.contains(&p.name.as_str()) {
                errs.push(format!("`{name}` is missing the argument `{}`", p.name));
            }
        }
        let sig_text = params.iter().map(|p| if p.has_default { format!("{}=…", p.name) } else { p.name.clone() }).collect::<Vec<_>>().join(", ");
        for msg in errs {
            self.push(Diagnostic::new(Code::WrongArguments, file, span, msg).with_help(format!("call it as `{name}({sig_text})`")));
        }
    }

    fn builtin_args(&mut self, b: &builtins::Builtin, offset: usize, args: &[Arg], span: Span, what: &str) {
        let positional = args.iter().filter(|a| a.name.is_none()).count();
        let (min, max) = (b.min_args + offset, b.max_args + offset);
        let file = self.file();
        let mut errs = Vec::new();
        if positional < min && args.iter().all(|a| a.name.is_none()) {
            errs.push(format!("{what} `{}` needs at least {min} argument{}", b.name, if min == 1 { "" } else { "s" }));
        }
        if positional > max {
            errs.push(format!("{what} `{}` takes at most {max} argument{}, but {positional} were given", b.name, if max == 1 { "" } else { "s" }));
        }
        for a in args {
            if let Some(k) = &a.name {
                if !b.params.contains(&k.name.as_str()) {
                    errs.push(format!("{what} `{}` has no parameter `{}`", b.name, k.name));
                }
            }
        }
        for msg in errs {
            self.push(Diagnostic::new(Code::WrongArguments, file, span, msg).with_help(b.doc.to_string()));
        }
    }
}
