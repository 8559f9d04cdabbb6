//! Definitions a file makes (inputs, defs, grammars, imports, captures),
//! read from the one definitions pass (`syntax::defs`) before the walk, so
//! uses before them are told apart from unknown names.

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
    /// Every name defined in `body` (not inside `def` bodies, loops'
    /// variables and parameters apart), with duplicate and placement
    /// checks, from the one definitions pass (`syntax::defs`).
    pub(super) fn collect(&mut self, body: &'a [Node], top: bool) -> HashMap<String, Binding> {
        use crate::syntax::defs::{self, DefKind};
        let file = self.file();
        let mut defs: HashMap<String, Binding> = HashMap::new();
        let mut last_input: Option<&Node> = None;
        for d in defs::definitions(body, Span::default()) {
            if d.in_def || d.name.is_empty() {
                continue;
            }
            let at_top = top && d.top;
            let not_top = |this: &mut Self, what: &str, span: Span| {
                if !at_top {
                    this.push(
                        Diagnostic::new(Code::NotTopLevel, file, span, format!("`{what}` must be at the top level of the file"))
                            .with_help(format!("move this `{what}` out of the block it is in")),
                    );
                }
            };
            let unique = |this: &mut Self, defs: &mut HashMap<String, Binding>, kind: BindKind, what: &str| {
                if let Some(prev) = defs.get(d.name) {
                    if !matches!(prev.kind, BindKind::Value) || !matches!(kind, BindKind::Value) {
                        this.push(
                            Diagnostic::new(Code::DuplicateDefinition, file, d.name_span, format!("`{}` is defined twice", d.name))
                                .with_secondary(prev.span, "first defined here")
                                .with_help(format!("rename this {what} or remove one definition")),
                        );
                    }
                    return;
                }
                defs.insert(d.name.to_string(), Binding { span: d.name_span, kind });
            };
            // Reserved names are reported where they are assigned, and never bound.
            let value = |defs: &mut HashMap<String, Binding>| {
                if !builtins::is_reserved(d.name) {
                    defs.entry(d.name.to_string()).or_insert(Binding { span: d.name_span, kind: BindKind::Value });
                }
            };
            match (d.kind, d.node) {
                (DefKind::Capture | DefKind::Variable, _) => value(&mut defs),
                (DefKind::Def, Node::Def(def)) => {
                    not_top(self, "def", def.open);
                    unique(self, &mut defs, BindKind::Def(sigs(&def.params)), "def");
                }
                (DefKind::Grammar, Node::Grammar(g)) => {
                    not_top(self, "grammar", g.open);
                    let rules = g.grammar.rules.iter().map(|r| r.name.clone()).collect();
                    unique(self, &mut defs, BindKind::Grammar { rules }, "grammar");
                }
                (DefKind::Import, Node::Import(i)) => {
                    not_top(self, "import", i.span);
                    let info = self.ctx.imports.get(&i.path).cloned();
                    unique(self, &mut defs, BindKind::Module(info), "import");
                }
                (DefKind::Input, node @ Node::Input { span, .. }) => {
                    // Placement is said once per `input` statement.
                    if !last_input.is_some_and(|n| std::ptr::eq(n, node)) {
                        last_input = Some(node);
                        not_top(self, "input", *span);
                    }
                    if self.scopes.is_empty() && defs.get(d.name).is_some_and(|b| b.span != d.name_span) {
                        let prev = defs[d.name].span;
                        self.push(
                            Diagnostic::new(Code::DuplicateDefinition, file, d.name_span, format!("`{}` is defined twice", d.name))
                                .with_secondary(prev, "first defined here")
                                .with_help("an input is declared once, before anything else defines the name"),
                        );
                    }
                    value(&mut defs);
                }
                _ => {} // loop variables, parameters, rules, roles: scoped or not names
            }
        }
        defs
    }

    pub(super) fn binding(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }
}
