//! Checks of `gen` and `select` options: names against the one table
//! ([`crate::options`]), literal values read as the run reads them, and what
//! only the checker does before a run: regexes compiled, schemas checked and
//! compiled, one hard constraint per `gen`.

use crate::diagnostic::{Code, Diagnostic};
use crate::engine::Semantics;
use crate::span::{FileId, Span};
use crate::options::{self, OptKind, OptValue, OptionSpec, SchemaArg, ALIASES};
use crate::syntax::ast::{Const, Expr, ExprKind, GenOption};
use crate::syntax::literal;

/// Checks the options of a `gen` (`is_select` false) or `select`, and returns
/// diagnostics. Grammar references are checked by the caller, which knows
/// the names in scope.
pub fn check(options: &[GenOption], is_select: bool, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let specs = options::table(is_select);
    let what = if is_select { "select" } else { "gen" };
    let file = ctx.file;
    let mut seen: Vec<&GenOption> = Vec::new();
    // A schema is checked as the run will compile it.
    let open = options.iter().any(|o| o.name.name == "json_open" && matches!(o.value.to_const(), Some(Const::Bool(true))));
    let semantics = if open { Semantics::Validation } else { Semantics::Generation };
    for opt in options {
        let name = opt.name.name.as_str();
        if let Some(prev) = seen.iter().find(|p| p.name.name == name) {
            out.push(
                Diagnostic::new(Code::DuplicateOption, file, opt.name.span, format!("option `{name}` is given twice"))
                    .with_secondary(prev.name.span, "first given here")
                    .with_help("remove one of them"),
            );
            continue;
        }
        seen.push(opt);
        let Some(spec) = options::find(specs, name) else {
            out.push(unknown_option(file, what, name, opt.name.span, specs, is_select));
            continue;
        };
        check_value(spec, &opt.value, semantics, ctx, out);
    }
    let constraints: Vec<&&GenOption> =
        seen.iter().filter(|o| options::find(specs, &o.name.name).is_some_and(|s| options::CONSTRAINTS.contains(&s.opt))).collect();
    if constraints.len() > 1 {
        let first = constraints[0];
        for other in &constraints[1..] {
            out.push(
                Diagnostic::new(
                    Code::ConflictingOptions,
                    file,
                    other.name.span,
                    format!("`{}` cannot be combined with `{}`", other.name.name, first.name.name),
                )
                .with_secondary(first.name.span, "already constrained here")
                .with_help("a gen takes one hard constraint: `regex`, `grammar` or `json`"),
            );
        }
    }
}

fn unknown_option(file: FileId, what: &str, name: &str, span: Span, specs: &[OptionSpec], is_select: bool) -> Diagnostic {
    let d = Diagnostic::new(Code::UnknownOption, file, span, format!("`{what}` has no option `{name}`"))
        .with_label("unknown option");
    let alias = ALIASES.iter().find(|(a, _)| *a == name).map(|(_, to)| *to).filter(|to| specs.iter().any(|s| s.name == *to));
    let suggestion = alias.or_else(|| crate::diagnostic::suggest(name, specs.iter().map(|s| s.name)));
    let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    let help = match suggestion {
        Some(s) => format!("did you mean `{s}`?"),
        None if is_select && matches!(name, "options" | "choices" | "in") => {
            "list the options with `{% select name in [\"a\", \"b\"] %}`".to_string()
        }
        None => format!("`{what}` options are: {}", names.join(", ")),
    };
    d.with_help(help)
}

fn check_value(spec: &OptionSpec, value: &Expr, semantics: Semantics, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let file = ctx.file;
    if matches!(value.kind, ExprKind::Error) || spec.kind == OptKind::Grammar {
        return; // grammar names are checked with the names in scope
    }
    // Only literal values can be checked before the run.
    let Some(c) = value.to_const() else { return };
    let read = match options::parse_value(spec, &c) {
        Ok(v) => v,
        Err(e) => {
            // An entry at fault is pointed at itself.
            let span = match (&value.kind, e.entry) {
                (ExprKind::Map(entries), Some(i)) => entries.get(i).map_or(value.span, |(_, v)| v.span),
                (ExprKind::List(items), Some(i)) => items.get(i).map_or(value.span, |v| v.span),
                _ => value.span,
            };
            let d = Diagnostic::new(Code::OptionType, file, span, e.message);
            out.push(match e.help {
                Some(h) => d.with_help(h),
                None => d.with_label(format!("expected {}", spec.ty)),
            });
            return;
        }
    };
    match (spec.kind, &value.kind) {
        (OptKind::Regex, _) => {
            check_regex(value, ctx, out);
        }
        (OptKind::Regexes, ExprKind::List(exprs)) => exprs.iter().for_each(|e| check_stop_regex(e, ctx, out)),
        (OptKind::Regexes, _) => check_stop_regex(value, ctx, out),
        (OptKind::Bias, ExprKind::Map(exprs)) => {
            for (k, _) in exprs {
                check_regex(k, ctx, out);
            }
        }
        (OptKind::Schema, _) => match read {
            OptValue::Schema(SchemaArg::Inline(schema)) if matches!(c, Const::Map(_)) => {
                let before = out.len();
                super::schema::check_literal(value, file, out);
                if !out[before..].iter().any(Diagnostic::is_error) {
                    check_engine_schema(&schema, value.span, semantics, ctx, out);
                }
            }
            OptValue::Schema(SchemaArg::File(path)) => super::schema::check_file(&path, value.span, semantics, ctx, out),
            _ => {}
        },
        _ => {}
    }
}

/// A stop regex: a regex that must not match the empty string (it would
/// stop before anything is generated).
fn check_stop_regex(e: &Expr, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    if check_regex(e, ctx, out).is_some_and(|d| d.is_accepting(d.start())) {
        out.push(
            Diagnostic::new(Code::OptionType, ctx.file, e.span, "this stop regex matches the empty string, so it would stop at once")
                .with_help("make it need at least one character, e.g. `\\n+` instead of `\\n*`"),
        );
    }
}

/// A regex literal: its syntax, then the grammar engine's compile, whose
/// automaton it returns when both pass.
fn check_regex(e: &Expr, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) -> Option<crate::engine::Dfa> {
    if !check_regex_expr(e, ctx, out) {
        return None;
    }
    match crate::engine::Dfa::regex(e.as_str()?, &crate::engine::Limits::default()) {
        Ok(d) if d.is_empty() => {
            out.push(
                Diagnostic::new(Code::InvalidRegex, ctx.file, e.span, "this regex matches nothing".to_string())
                    .with_help("no string can satisfy it (an empty class such as `[^\\s\\S]`?): a value could never be generated"),
            );
            None
        }
        Ok(d) => Some(d),
        Err(err) => {
            out.push(engine_error(err, e.span, ctx));
            None
        }
    }
}

/// A JSON Schema compiled by the grammar engine, as `json=` will be, and
/// a warning for each object it leaves open to any other key with no bound
/// on their number (generation may then never end).
pub(super) fn check_engine_schema(schema: &serde_json::Value, span: Span, semantics: Semantics, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let limits = crate::engine::Limits::default();
    if let Err(err) = crate::engine::Constraint::json_schema(schema, crate::engine::Whitespace::Any, semantics, &limits) {
        out.push(engine_error(err, span, ctx));
        return;
    }
    let mut open = Vec::new();
    super::schema::open_objects(schema, "", &mut open);
    for pointer in open {
        let at = if pointer.is_empty() { "/".to_string() } else { pointer };
        out.push(
            Diagnostic::new(
                Code::OpenObject,
                ctx.file,
                span,
                format!("the object at `{at}` takes any other key (`additionalProperties: true`) and sets no `maxProperties`, so generation may not end"),
            )
            .with_help("list the keys it may have and drop `additionalProperties`, or bound them with `maxProperties`; `max_tokens` still stops the run"),
        );
    }
}

/// An engine refusal as a diagnostic at `span`.
pub(super) fn engine_error(err: crate::engine::EngineError, span: Span, ctx: &super::Ctx<'_>) -> Diagnostic {
    let help = match &err {
        crate::engine::EngineError::Unsupported(m) if m.contains("`oneOf`") => {
            "make the branches provably disjoint (different types, `const`/`enum` values, or a required property with disjoint values), make every branch a string, number or literal, or use `anyOf`"
        }
        crate::engine::EngineError::Unsupported(m) if m.contains("JSON Schema") => "rewrite the schema without it",
        crate::engine::EngineError::Unsupported(_) => "use a form the engine supports, as the message says",
        crate::engine::EngineError::TooComplex(_) => "split the constraint into smaller parts, or loosen bounds such as large repetition counts",
        _ => "the constraint must be enforceable token by token while generating",
    };
    Diagnostic::new(Code::UnsupportedConstraint, ctx.file, span, err.to_string()).with_help(help)
}

/// The end of a span starting at `start`: `end`, or at least one whole
/// character when the error is empty (a regex error at a position), never
/// past `limit`, always on a character boundary of `text`.
pub(super) fn widen_to_char(text: &str, start: usize, end: usize, limit: usize) -> usize {
    let mut b = end.max(start + 1).min(limit);
    while b < text.len() && !text.is_char_boundary(b) {
        b += 1;
    }
    b
}

/// Checks that a string-literal expression is a valid regex, pointing into
/// the literal at the error. Non-literals are left to the run. Returns
/// whether it parsed.
pub fn check_regex_expr(e: &Expr, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) -> bool {
    let Some(pattern) = e.as_str() else { return true };
    if let Err((start, end, msg)) = compile_regex(pattern) {
        let raw = &ctx.text[e.span.range()];
        let a = e.span.start as usize + literal::source_offset(raw, start);
        let b = widen_to_char(ctx.text, a, e.span.start as usize + literal::source_offset(raw, end), e.span.end as usize);
        out.push(
            Diagnostic::new(Code::InvalidRegex, ctx.file, Span::new(a, b), format!("invalid regex: {msg}"))
                .with_label(msg)
                .with_help("lmt regexes use Rust `regex` syntax; escape a literal character with `\\`"),
        );
        return false;
    }
    true
}

/// Parses `pattern` with the syntax the grammar engine uses. On error,
/// returns the byte range in the pattern and the reason.
pub fn compile_regex(pattern: &str) -> Result<(), (usize, usize, String)> {
    let mut parser = regex_syntax::ParserBuilder::new().nest_limit(200).build();
    match parser.parse(pattern) {
        Ok(_) => Ok(()),
        Err(e) => {
            let (span, msg) = match &e {
                regex_syntax::Error::Parse(p) => (*p.span(), p.kind().to_string()),
                regex_syntax::Error::Translate(t) => (*t.span(), t.kind().to_string()),
                _ => (regex_syntax::ast::Span::splat(regex_syntax::ast::Position::new(0, 1, 1)), e.to_string()),
            };
            Err((span.start.offset, span.end.offset, msg))
        }
    }
}
