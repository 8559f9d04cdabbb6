//! Checks of `{% grammar %}` blocks: duplicate and undefined rules, a start
//! rule, `/regex/` terminals that compile, and rules nothing reaches.

use std::collections::{BTreeSet, HashMap};

use crate::diagnostic::{Code, Diagnostic};
use crate::span::{FileId, Span};
use crate::syntax::ast::GrammarBlock;
use crate::syntax::gbnf::{GExpr, GKind};

/// Checks one grammar block (everything but unused rules, which need the
/// whole file's `grammar=name.rule` uses).
pub(super) fn check_block(g: &GrammarBlock, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let file = ctx.file;
    let mut first: HashMap<&str, Span> = HashMap::new();
    for r in &g.grammar.rules {
        if let Some(prev) = first.get(r.name.as_str()) {
            out.push(
                Diagnostic::new(Code::DuplicateRule, file, r.name_span, format!("rule `{}` is defined twice", r.name))
                    .with_secondary(*prev, "first defined here")
                    .with_help("join the definitions with `|` in one rule"),
            );
        } else {
            first.insert(&r.name, r.name_span);
        }
    }
    let names: Vec<&str> = g.grammar.rules.iter().map(|r| r.name.as_str()).collect();
    for r in &g.grammar.rules {
        visit(&r.body, &mut |e| match &e.kind {
            GKind::Ref(name) if !first.contains_key(name.as_str()) => {
                let help = match crate::diagnostic::suggest(name, names.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("define it with `{name} ::= …`"),
                };
                out.push(
                    Diagnostic::new(Code::UndefinedRule, file, e.span, format!("rule `{name}` is not defined in grammar `{}`", g.name.name))
                        .with_help(help),
                );
            }
            GKind::Regex(pattern) => {
                if let Err((a, b, msg)) = super::options::compile_regex(pattern) {
                    // Point into the regex when no `\/` shifted the offsets.
                    let raw = &ctx.text[e.span.range()];
                    let span = if raw.contains("\\/") {
                        e.span
                    } else {
                        let s = e.span.start as usize + 1;
                        Span::new(s + a, super::options::widen_to_char(ctx.text, s + a, s + b, e.span.end as usize))
                    };
                    out.push(Diagnostic::new(Code::InvalidRegex, file, span, format!("invalid regex: {msg}")).with_label(msg));
                }
            }
            _ => {}
        });
    }
    // A grammar that checks clean is compiled as a run will compile it.
    let clean = !out.iter().any(|d| d.is_error() && g.span.start <= d.span.start && d.span.end <= g.span.end);
    if let (true, Some(start)) = (clean, super::start_rule(&g.name.name, &g.grammar)) {
        if let Err(err) = crate::engine::Cfg::new(&crate::engine::Grammar::from(&g.grammar), &start, &crate::engine::Limits::default()) {
            out.push(super::options::engine_error(err, g.name.span, ctx));
        }
    }
    if !g.name.name.is_empty() && super::start_rule(&g.name.name, &g.grammar).is_none() {
        let d = Diagnostic::new(Code::NoStartRule, file, g.name.span, format!("grammar `{}` has no start rule", g.name.name));
        let help = if g.grammar.rules.is_empty() {
            "write rules inside the block, starting with `root ::= …`".to_string()
        } else {
            format!("add a rule `root ::= …` (or `{} ::= …`); generation starts there", g.name.name)
        };
        out.push(d.with_help(help));
    }
}

/// Warns about rules that cannot be reached from the start rule nor from a
/// `grammar=name.rule` entry used in the file.
pub(super) fn unused_rules(g: &GrammarBlock, entries: &[(String, String)], file: FileId, out: &mut Vec<Diagnostic>) {
    let Some(start) = super::start_rule(&g.name.name, &g.grammar) else { return };
    // By name, once: a lookup per reference kept long chains quadratic.
    let mut rules = std::collections::HashMap::new();
    for r in &g.grammar.rules {
        rules.entry(r.name.as_str()).or_insert(r);
    }
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    let mut todo: Vec<&str> = vec![start.as_str()];
    todo.extend(entries.iter().filter(|(n, _)| *n == g.name.name).map(|(_, r)| r.as_str()));
    while let Some(name) = todo.pop() {
        if !reached.insert(name) {
            continue;
        }
        if let Some(rule) = rules.get(name) {
            visit(&rule.body, &mut |e| {
                if let GKind::Ref(r) = &e.kind {
                    todo.push(r.as_str());
                }
            });
        }
    }
    let mut warned = BTreeSet::new();
    for r in &g.grammar.rules {
        if !reached.contains(r.name.as_str()) && warned.insert(r.name.as_str()) {
            out.push(
                Diagnostic::new(Code::UnusedRule, file, r.name_span, format!("rule `{}` is never used", r.name))
                    .with_help(format!("nothing reachable from `{start}` refers to it; remove it or refer to it")),
            );
        }
    }
}

fn visit<'g>(e: &'g GExpr, f: &mut impl FnMut(&'g GExpr)) {
    f(e);
    e.for_each_child(|x| visit(x, f));
}
