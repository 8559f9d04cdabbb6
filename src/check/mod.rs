//! Static checks of a parsed template, before any model is loaded: options
//! and their types, regexes, grammars, JSON Schemas, names (defined, maybe
//! undefined, used before definition), calls and their arity, imports'
//! exports, block placement. Each finding is a [`Diagnostic`].
//!
//! Scoping rule (documented in docs/reference.md): a file has one flat
//! namespace; `if`/`for`/`select` bodies do not open scopes, except that
//! loop variables and `loop` live only inside their loop. A `def` body has
//! its own namespace of parameters and locals and reads the file's names.

mod definitions;
mod expr;
mod flow;
mod grammar;
pub mod options;
pub mod schema;
mod select;

use definitions::{BindKind, Binding};
use flow::Flow;

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
    use crate::syntax::defs::{self, DefKind};
    let mut exports = BTreeMap::new();
    for d in defs::definitions(&t.body, Span::default()).iter().filter(|d| d.top) {
        let export = match (d.kind, d.node) {
            (DefKind::Def, Node::Def(def)) => Export::Def(sigs(&def.params)),
            (DefKind::Grammar, Node::Grammar(g)) => Export::Grammar {
                rules: g.grammar.rules.iter().map(|r| r.name.clone()).collect(),
                start: start_rule(&g.name.name, &g.grammar),
            },
            (DefKind::Variable | DefKind::Input, _) => Export::Value,
            (DefKind::Import, _) => Export::Module,
            _ => continue,
        };
        exports.entry(d.name.to_string()).or_insert(export);
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

    // ---------------------------------------------------- expressions

}
