//! The `gen` and `select` options: their names, types, defaults and docs
//! (one table for the checker, the interpreter and the language server), and
//! the checks of literal option values.

use crate::diagnostic::{Code, Diagnostic};
use crate::engine::Semantics;
use crate::span::{FileId, Span};
use crate::syntax::ast::{Const, Expr, ExprKind, GenOption};
use crate::syntax::literal;

/// What kind of value an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptKind {
    /// Integer ≥ 1.
    PositiveInt,
    /// Integer ≥ 0.
    NonNegativeInt,
    /// Number ≥ 0.
    NonNegativeNumber,
    /// Number in (0, 1].
    Probability,
    /// Number in [0, 1].
    UnitInterval,
    /// A boolean.
    Bool,
    /// A string or a list of strings.
    Strings,
    /// A regex.
    Regex,
    /// A regex or a list of regexes.
    Regexes,
    /// A grammar name (`{% grammar NAME %}`), optionally `.rule`.
    Grammar,
    /// A JSON Schema: a map, `true`, or a path to a schema file.
    Schema,
    /// A map from regex to logit offset.
    Bias,
    /// One of `full`, `mean`, `greedy`.
    Score,
}

/// One option of `gen` or `select`.
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    /// The option's name.
    pub name: &'static str,
    /// Its kind of value.
    pub kind: OptKind,
    /// The type as shown to users.
    pub ty: &'static str,
    /// The default, as shown to users.
    pub default: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
}

const fn o(name: &'static str, kind: OptKind, ty: &'static str, default: &'static str, doc: &'static str) -> OptionSpec {
    OptionSpec { name, kind, ty, default, doc }
}

/// The options of `{% gen %}`.
pub const GEN_OPTIONS: &[OptionSpec] = &[
    o("max_tokens", OptKind::PositiveInt, "integer ≥ 1", "256", "Most tokens to generate."),
    o("stop", OptKind::Strings, "string or list of strings", "none", "Stop at any of these strings; the stop text is cut from the value."),
    o("stop_regex", OptKind::Regexes, "regex or list of regexes", "none", "Stop where one of these regexes matches; the match is cut from the value."),
    o("regex", OptKind::Regex, "regex", "none", "The value must match this regex in full."),
    o("grammar", OptKind::Grammar, "grammar name", "none", "The value must match this grammar (`{% grammar NAME %}`, optionally `NAME.rule`)."),
    o("json", OptKind::Schema, "JSON Schema map, or path to a schema file", "none", "The value must be JSON valid against this schema; an object that lists its properties takes no other key unless the schema says so (see `json_open`)."),
    o("json_open", OptKind::Bool, "boolean", "false", "With `json`: JSON Schema's validation semantics, where an object takes keys it does not list unless `additionalProperties` is false."),
    o("bias", OptKind::Bias, "map of regex to number", "none", "Adds the number to the logits of tokens that keep the regex matching (a soft constraint)."),
    o("temperature", OptKind::NonNegativeNumber, "number ≥ 0", "0 (greedy), or --temperature", "Sampling temperature; 0 picks the most likely token."),
    o("top_p", OptKind::Probability, "number in (0, 1]", "1", "Nucleus sampling: sample from the smallest set of tokens with this much probability."),
    o("top_k", OptKind::NonNegativeInt, "integer ≥ 0", "0 (off)", "Sample from the k most likely tokens."),
    o("min_p", OptKind::UnitInterval, "number in [0, 1]", "0 (off)", "Drop tokens less likely than min_p times the most likely one."),
    o("seed", OptKind::NonNegativeInt, "integer ≥ 0", "--seed", "Seed for this generation's sampler."),
    o("heal", OptKind::Bool, "boolean", "true", "Token healing: re-generate the last prompt token so the value can start mid-token."),
    o("partial", OptKind::Bool, "boolean", "false", "With `regex`, `grammar` or `json`: keep a value that `max_tokens` cut short of matching (its `finish_reason` is `max_tokens`) instead of stopping the run with an error."),
];

/// The options of `{% select %}`.
pub const SELECT_OPTIONS: &[OptionSpec] = &[
    o("score", OptKind::Score, "\"full\", \"mean\" or \"greedy\"", "\"full\"", "How options are compared: total log-probability, per-token mean, or token-by-token constrained decoding."),
    o("temperature", OptKind::NonNegativeNumber, "number ≥ 0", "0", "Sample the choice from the scores at this temperature; 0 picks the best."),
    o("seed", OptKind::NonNegativeInt, "integer ≥ 0", "--seed", "Seed for sampling the choice."),
];

/// Names people write for options that are called something else here.
const ALIASES: &[(&str, &str)] = &[
    ("max_new_tokens", "max_tokens"),
    ("max_length", "max_tokens"),
    ("n_predict", "max_tokens"),
    ("stops", "stop"),
    ("until", "stop"),
    ("stop_sequences", "stop"),
    ("pattern", "regex"),
    ("schema", "json"),
    ("json_schema", "json"),
    ("temp", "temperature"),
    ("logit_bias", "bias"),
    ("token_healing", "heal"),
];

/// Checks the options of a `gen` (`is_select` false) or `select`, and returns
/// diagnostics. Grammar references are checked by the caller, which knows
/// the names in scope.
pub fn check(options: &[GenOption], is_select: bool, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let specs = if is_select { SELECT_OPTIONS } else { GEN_OPTIONS };
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
        let Some(spec) = specs.iter().find(|s| s.name == name) else {
            out.push(unknown_option(file, what, name, opt.name.span, specs, is_select));
            continue;
        };
        check_value(spec, &opt.value, semantics, ctx, out);
    }
    let constraints: Vec<&&GenOption> =
        seen.iter().filter(|o| matches!(o.name.name.as_str(), "regex" | "grammar" | "json")).collect();
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

fn type_error(file: FileId, spec: &OptionSpec, span: Span, found: &str) -> Diagnostic {
    Diagnostic::new(Code::OptionType, file, span, format!("`{}` takes {}, not {}", spec.name, crate::diagnostic::with_article(spec.ty), found))
        .with_label(format!("expected {}", spec.ty))
}

fn describe(c: &Const) -> String {
    match c {
        Const::Str(s) => format!("the string {s:?}"),
        Const::Int(n) => format!("the integer {n}"),
        Const::Float(f) => format!("the number {f}"),
        Const::Bool(b) => format!("`{b}`"),
        Const::None => "`none`".into(),
        Const::List(_) => "a list".into(),
        Const::Map(_) => "a map".into(),
    }
}

fn check_value(spec: &OptionSpec, value: &Expr, semantics: Semantics, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let file = ctx.file;
    if matches!(value.kind, ExprKind::Error) {
        return;
    }
    if spec.kind == OptKind::Grammar {
        return; // checked with the names in scope
    }
    // Only literal values can be checked before the run.
    let Some(c) = value.to_const() else { return };
    let bad = |out: &mut Vec<Diagnostic>| out.push(type_error(file, spec, value.span, &describe(&c)));
    let number = match c {
        Const::Int(n) => Some(n as f64),
        Const::Float(f) => Some(f),
        _ => None,
    };
    match spec.kind {
        OptKind::PositiveInt => match c {
            Const::Int(n) if n >= 1 => {}
            _ => bad(out),
        },
        OptKind::NonNegativeInt => match c {
            Const::Int(n) if n >= 0 => {}
            _ => bad(out),
        },
        OptKind::NonNegativeNumber => match number {
            Some(x) if x >= 0.0 => {}
            _ => bad(out),
        },
        OptKind::Probability => match number {
            Some(x) if x > 0.0 && x <= 1.0 => {}
            _ => bad(out),
        },
        OptKind::UnitInterval => match number {
            Some(x) if (0.0..=1.0).contains(&x) => {}
            _ => bad(out),
        },
        OptKind::Bool => {
            if !matches!(c, Const::Bool(_)) {
                bad(out)
            }
        }
        OptKind::Score => match &c {
            Const::Str(s) if matches!(s.as_str(), "full" | "mean" | "greedy") => {}
            _ => bad(out),
        },
        OptKind::Strings => match &c {
            Const::Str(s) if !s.is_empty() => {}
            Const::List(items) if !items.is_empty() && items.iter().all(|i| matches!(i, Const::Str(s) if !s.is_empty())) => {}
            Const::Str(_) => out.push(
                Diagnostic::new(Code::OptionType, file, value.span, format!("`{}` cannot be the empty string", spec.name))
                    .with_help("every string ends with the empty string: give the text to stop at"),
            ),
            Const::List(items) if items.iter().any(|i| matches!(i, Const::Str(s) if s.is_empty())) => out.push(
                Diagnostic::new(Code::OptionType, file, value.span, format!("`{}` cannot hold the empty string", spec.name))
                    .with_help("every string ends with the empty string: remove `\"\"` from the list"),
            ),
            Const::List(items) if items.is_empty() => out.push(
                Diagnostic::new(Code::OptionType, file, value.span, format!("`{}` is an empty list", spec.name))
                    .with_help("give the strings to stop at, or leave the option out"),
            ),
            _ => bad(out),
        },
        OptKind::Regex => match &c {
            Const::Str(_) => {
                check_regex(value, ctx, out);
            }
            _ => bad(out),
        },
        OptKind::Regexes => match (&c, &value.kind) {
            (Const::Str(_), _) => check_stop_regex(value, ctx, out),
            (Const::List(items), ExprKind::List(exprs)) if !items.is_empty() && items.iter().all(|i| matches!(i, Const::Str(_))) => {
                for e in exprs {
                    check_stop_regex(e, ctx, out);
                }
            }
            _ => bad(out),
        },
        OptKind::Bias => match (&c, &value.kind) {
            (Const::Map(entries), ExprKind::Map(exprs)) => {
                for ((_, v), (ke, ve)) in entries.iter().zip(exprs) {
                    check_regex(ke, ctx, out);
                    let ok = match v {
                        Const::Int(_) => true,
                        Const::Float(f) => f.is_finite(),
                        _ => false,
                    };
                    if !ok {
                        out.push(
                            Diagnostic::new(Code::OptionType, file, ve.span, format!("a bias must be a number, not {}", describe(v)))
                                .with_help("write `bias={\"regex\": -2.5}`: negative discourages, positive encourages"),
                        );
                    }
                }
            }
            _ => bad(out),
        },
        OptKind::Schema => match &c {
            Const::Bool(true) => {}
            Const::Map(_) => {
                let before = out.len();
                super::schema::check_literal(value, file, out);
                if !out[before..].iter().any(Diagnostic::is_error) {
                    check_engine_schema(&c.to_json(), value.span, semantics, ctx, out);
                }
            }
            Const::Str(path) => super::schema::check_file(path, value.span, semantics, ctx, out),
            _ => bad(out),
        },
        OptKind::Grammar => {}
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
