//! Definitions a file makes (inputs, defs, grammars, imports, captures), collected before the walk so uses before them are told apart from unknown names.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct Binding {
    pub(super) span: Span,
    pub(super) kind: BindKind,
}

#[derive(Debug, Clone)]
pub(super) enum BindKind {
    Value,
    Def(Vec<ParamSig>),
    Grammar { rules: Vec<String> },
    Module(Option<ModuleInfo>),
}

impl<'a> Checker<'a> {
    /// Every name defined in `body` (not inside `def` bodies), with
    /// duplicate and placement checks.
    pub(super) fn collect(&mut self, body: &'a [Node], top: bool) -> HashMap<String, Binding> {
        let mut defs: HashMap<String, Binding> = HashMap::new();
        self.collect_into(body, top, &mut defs);
        defs
    }

    pub(super) fn collect_into(&mut self, body: &'a [Node], top: bool, defs: &mut HashMap<String, Binding>) {
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

    pub(super) fn binding(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }
}
