//! Every definition a template makes, in one walk, in source order: the
//! one definitions pass that the checker (names and their placement), the
//! module exports (`check::module_info`) and the language server (hover,
//! completion, go to definition, outline) read.

use super::ast::{Choices, Node, RoleName};
use crate::span::Span;

/// What a definition is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefKind {
    /// `{% set %}`.
    Variable,
    /// A `gen`, `select` or `capture` target.
    Capture,
    /// `{% input %}`.
    Input,
    /// A `for` variable.
    LoopVar,
    /// `{% def %}`.
    Def,
    /// A `def` parameter.
    Param,
    /// `{% grammar %}`.
    Grammar,
    /// A GBNF rule inside a grammar.
    Rule,
    /// `{% import … as name %}`.
    Import,
    /// A role block (outline only).
    Role,
}

impl DefKind {
    /// How hovers and completions describe it.
    pub fn describe(self) -> &'static str {
        match self {
            DefKind::Variable => "variable",
            DefKind::Capture => "captured value",
            DefKind::Input => "input",
            DefKind::LoopVar => "loop variable",
            DefKind::Def => "def",
            DefKind::Param => "parameter",
            DefKind::Grammar => "grammar",
            DefKind::Rule => "grammar rule",
            DefKind::Import => "imported module",
            DefKind::Role => "role",
        }
    }
}

/// One definition.
#[derive(Debug, Clone, Copy)]
pub struct Def<'t> {
    /// The name.
    pub name: &'t str,
    /// What it is.
    pub kind: DefKind,
    /// Where the name is written.
    pub name_span: Span,
    /// The whole construct (for the outline).
    pub span: Span,
    /// Where it is visible: the walk's whole span, or a `for`/`def` body.
    pub scope: Span,
    /// The statement that makes it (for a parameter or a rule, its `def` or
    /// `grammar`).
    pub node: &'t Node,
    /// Written directly in the walked body, not inside a block.
    pub top: bool,
    /// Inside a `def` body (or a parameter of one) of the walked body.
    pub in_def: bool,
}

/// Every definition in `body`, whose names are visible across `scope`.
pub fn definitions(body: &[Node], scope: Span) -> Vec<Def<'_>> {
    let mut out = Vec::new();
    walk(body, scope, true, false, &mut out);
    out
}

fn walk<'t>(nodes: &'t [Node], scope: Span, top: bool, in_def: bool, out: &mut Vec<Def<'t>>) {
    for node in nodes {
        let mut push = |name: &'t str, kind: DefKind, name_span: Span, span: Span, scope: Span, in_def: bool| {
            out.push(Def { name, kind, name_span, span, scope, node, top, in_def });
        };
        match node {
            Node::Gen(g) => {
                if let Some(t) = &g.target {
                    push(&t.name.name, DefKind::Capture, t.name.span, g.span, scope, in_def);
                }
            }
            Node::Select(s) => {
                if let Some(t) = &s.target {
                    push(&t.name.name, DefKind::Capture, t.name.span, s.span, scope, in_def);
                }
                if let Choices::Branches(bs) = &s.choices {
                    for b in bs {
                        walk(&b.body, scope, false, in_def, out);
                    }
                }
            }
            Node::Capture(b) => {
                push(&b.head.name.name, DefKind::Capture, b.head.name.span, b.span, scope, in_def);
                walk(&b.body, scope, false, in_def, out);
            }
            Node::Set { target, span, .. } => push(&target.name.name, DefKind::Variable, target.name.span, *span, scope, in_def),
            Node::Input { params, span } => {
                for p in params {
                    push(&p.name.name, DefKind::Input, p.name.span, *span, scope, in_def);
                }
            }
            Node::For(f) => {
                for v in &f.vars {
                    push(&v.name, DefKind::LoopVar, v.span, f.open, f.span, in_def);
                }
                walk(&f.body, scope, false, in_def, out);
                if let Some(e) = &f.else_body {
                    walk(e, scope, false, in_def, out);
                }
            }
            Node::Def(d) => {
                push(&d.name.name, DefKind::Def, d.name.span, d.span, scope, in_def);
                for p in &d.params {
                    push(&p.name.name, DefKind::Param, p.name.span, d.open, d.span, true);
                }
                walk(&d.body, d.span, false, true, out);
            }
            Node::Import(i) => push(&i.alias.name, DefKind::Import, i.alias.span, i.span, scope, in_def),
            Node::Grammar(g) => {
                push(&g.name.name, DefKind::Grammar, g.name.span, g.span, scope, in_def);
                for r in &g.grammar.rules {
                    push(&r.name, DefKind::Rule, r.name_span, r.span, g.span, in_def);
                }
            }
            Node::Role(b) => {
                let name = match &b.head {
                    RoleName::System => "system",
                    RoleName::User => "user",
                    RoleName::Assistant => "assistant",
                    RoleName::Expr(_) => "role",
                };
                push(name, DefKind::Role, b.open, b.span, scope, in_def);
                walk(&b.body, scope, false, in_def, out);
            }
            Node::Hidden(b) => walk(&b.body, scope, false, in_def, out),
            Node::If(i) => {
                for (_, body) in &i.branches {
                    walk(body, scope, false, in_def, out);
                }
                if let Some(e) = &i.else_body {
                    walk(e, scope, false, in_def, out);
                }
            }
            Node::Text { .. } | Node::Emit { .. } => {}
        }
    }
}
