//! A readable dump of the AST, for `lmt check --emit ast` and snapshots.

use std::fmt::Write;

use super::ast::*;
use super::gbnf::{GExpr, GKind};

/// Renders `t` as an indented tree, one node per line, spans as `@start..end`.
pub fn dump(t: &Template) -> String {
    let mut out = String::new();
    nodes(&mut out, &t.body, 0);
    out
}

fn line(out: &mut String, depth: usize, s: &str) {
    let _ = writeln!(out, "{}{}", "  ".repeat(depth), s);
}

fn nodes(out: &mut String, body: &[Node], depth: usize) {
    for n in body {
        node(out, n, depth);
    }
}

fn sp(s: crate::span::Span) -> String {
    format!("@{}..{}", s.start, s.end)
}

fn target(t: &Option<Target>) -> String {
    match t {
        Some(t) => format!(" {}{}", t.name.name, if t.append { "[]" } else { "" }),
        None => String::new(),
    }
}

fn options(opts: &[GenOption]) -> String {
    opts.iter().map(|o| format!(" {}={}", o.name.name, expr(&o.value))).collect()
}

fn params(ps: &[Param]) -> String {
    ps.iter()
        .map(|p| match &p.default {
            Some(d) => format!("{}={}", p.name.name, expr(d)),
            None => p.name.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn node(out: &mut String, n: &Node, d: usize) {
    match n {
        Node::Text { value, span } => line(out, d, &format!("Text {:?} {}", value, sp(*span))),
        Node::Emit { expr: e, span } => line(out, d, &format!("Emit {} {}", expr(e), sp(*span))),
        Node::Gen(g) => line(out, d, &format!("Gen{}{} {}", target(&g.target), options(&g.options), sp(g.span))),
        Node::Select(s) => match &s.choices {
            Choices::List(l) => line(
                out,
                d,
                &format!("Select{} in {}{} {}", target(&s.target), expr(l), options(&s.options), sp(s.span)),
            ),
            Choices::Branches(bs) => {
                line(out, d, &format!("Select{}{} {}", target(&s.target), options(&s.options), sp(s.span)));
                for b in bs {
                    line(out, d + 1, &format!("Branch {}", sp(b.span)));
                    nodes(out, &b.body, d + 2);
                }
            }
        },
        Node::Role(b) => {
            let head = match &b.head {
                RoleName::System => "system".to_string(),
                RoleName::User => "user".to_string(),
                RoleName::Assistant => "assistant".to_string(),
                RoleName::Expr(e) => expr(e),
            };
            line(out, d, &format!("Role {} {}", head, sp(b.span)));
            nodes(out, &b.body, d + 1);
        }
        Node::Capture(b) => {
            line(out, d, &format!("Capture{} {}", target(&Some(b.head.clone())), sp(b.span)));
            nodes(out, &b.body, d + 1);
        }
        Node::Hidden(b) => {
            line(out, d, &format!("Hidden {}", sp(b.span)));
            nodes(out, &b.body, d + 1);
        }
        Node::Set { target: t, value, span } => {
            line(out, d, &format!("Set{} = {} {}", target(&Some(t.clone())), expr(value), sp(*span)))
        }
        Node::If(i) => {
            line(out, d, &format!("If {}", sp(i.span)));
            for (k, (c, body)) in i.branches.iter().enumerate() {
                line(out, d + 1, &format!("{} {}", if k == 0 { "If" } else { "Elif" }, expr(c)));
                nodes(out, body, d + 2);
            }
            if let Some(e) = &i.else_body {
                line(out, d + 1, "Else");
                nodes(out, e, d + 2);
            }
        }
        Node::For(f) => {
            let vars: Vec<_> = f.vars.iter().map(|v| v.name.as_str()).collect();
            line(out, d, &format!("For {} in {} {}", vars.join(", "), expr(&f.iter), sp(f.span)));
            nodes(out, &f.body, d + 1);
            if let Some(e) = &f.else_body {
                line(out, d + 1, "Else");
                nodes(out, e, d + 2);
            }
        }
        Node::Def(f) => {
            line(out, d, &format!("Def {}({}) {}", f.name.name, params(&f.params), sp(f.span)));
            nodes(out, &f.body, d + 1);
        }
        Node::Import(i) => line(out, d, &format!("Import {:?} as {} {}", i.path, i.alias.name, sp(i.span))),
        Node::Grammar(g) => {
            line(out, d, &format!("Grammar {} {}", g.name.name, sp(g.span)));
            for r in &g.grammar.rules {
                line(out, d + 1, &format!("{} ::= {}", r.name, gexpr(&r.body)));
            }
        }
        Node::Input { params: ps, span } => line(out, d, &format!("Input {} {}", params(ps), sp(*span))),
    }
}

fn args(a: &[Arg]) -> String {
    a.iter()
        .map(|a| match &a.name {
            Some(n) => format!("{}={}", n.name, expr(&a.value)),
            None => expr(&a.value),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Renders an expression compactly, fully parenthesised.
pub fn expr(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Str(s) => format!("{s:?}"),
        ExprKind::Int(n) => n.to_string(),
        ExprKind::Float(f) => format!("{f:?}"),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::None => "none".into(),
        ExprKind::List(items) => format!("[{}]", items.iter().map(expr).collect::<Vec<_>>().join(", ")),
        ExprKind::Map(kv) => {
            format!("{{{}}}", kv.iter().map(|(k, v)| format!("{}: {}", expr(k), expr(v))).collect::<Vec<_>>().join(", "))
        }
        ExprKind::Name(n) => n.clone(),
        ExprKind::Attr(v, a) => format!("{}.{}", expr(v), a.name),
        ExprKind::Index(v, i) => format!("{}[{}]", expr(v), expr(i)),
        ExprKind::Slice { value, start, stop, step } => {
            let o = |x: &Option<Box<Expr>>| x.as_deref().map(expr).unwrap_or_default();
            match step {
                Some(_) => format!("{}[{}:{}:{}]", expr(value), o(start), o(stop), o(step)),
                None => format!("{}[{}:{}]", expr(value), o(start), o(stop)),
            }
        }
        ExprKind::Call(f, a) => format!("{}({})", expr(f), args(a)),
        ExprKind::Filter(v, n, a) if a.is_empty() => format!("({} | {})", expr(v), n.name),
        ExprKind::Filter(v, n, a) => format!("({} | {}({}))", expr(v), n.name, args(a)),
        ExprKind::Test { value, name, args: a, negated } => {
            let not = if *negated { "not " } else { "" };
            let a = if a.is_empty() { String::new() } else { format!("({})", args(a)) };
            format!("({} is {}{}{})", expr(value), not, name.name, a)
        }
        ExprKind::Unary(op, v) => {
            let o = match op {
                UnaryOp::Not => "not ",
                UnaryOp::Neg => "-",
                UnaryOp::Pos => "+",
            };
            format!("({}{})", o, expr(v))
        }
        ExprKind::Binary(op, a, b) => format!("({} {} {})", expr(a), op.symbol(), expr(b)),
        ExprKind::Cond { cond, then, otherwise } => {
            format!("({} if {} else {})", expr(then), expr(cond), expr(otherwise))
        }
        ExprKind::Error => "<error>".into(),
    }
}

/// Renders a grammar expression in GBNF-like notation.
pub fn gexpr(e: &GExpr) -> String {
    match &e.kind {
        GKind::Alt(a) => format!("({})", a.iter().map(gexpr).collect::<Vec<_>>().join(" | ")),
        GKind::Seq(s) if s.is_empty() => "\"\"".into(),
        GKind::Seq(s) => format!("({})", s.iter().map(gexpr).collect::<Vec<_>>().join(" ")),
        GKind::Literal(l) => format!("{l:?}"),
        GKind::Class { negated, ranges } => {
            let body: String = ranges
                .iter()
                .map(|(a, b)| {
                    if a == b {
                        a.escape_debug().to_string()
                    } else {
                        format!("{}-{}", a.escape_debug(), b.escape_debug())
                    }
                })
                .collect();
            format!("[{}{}]", if *negated { "^" } else { "" }, body)
        }
        GKind::Ref(r) => r.clone(),
        GKind::Regex(r) => format!("/{r}/"),
        GKind::Any => ".".into(),
        GKind::Repeat { inner, min, max } => match (min, max) {
            (0, None) => format!("{}*", gexpr(inner)),
            (1, None) => format!("{}+", gexpr(inner)),
            (0, Some(1)) => format!("{}?", gexpr(inner)),
            (m, None) => format!("{}{{{},}}", gexpr(inner), m),
            (m, Some(n)) if m == n => format!("{}{{{}}}", gexpr(inner), m),
            (m, Some(n)) => format!("{}{{{},{}}}", gexpr(inner), m, n),
        },
    }
}
