//! Constraints written as GBNF for an engine that enforces grammars itself
//! (llama.cpp's `llama-server`): a regex through its parsed form, an lmt
//! grammar with its `/regex/` terminals lowered into plain GBNF, and a list
//! of literal choices. What comes back is re-checked by lmt's own engine,
//! so a writer that lost precision would fail loudly, never silently.

use std::fmt::Write as _;

use regex_syntax::hir::{Class, Hir, HirKind, Look};

use super::EngineError;
use crate::syntax::gbnf::{GExpr, GKind, Grammar};

/// Deepest nesting of a regex written out (the writer recurses).
const MAX_DEPTH: usize = 200;

/// `pattern` (Rust regex syntax, matched whole) as a GBNF grammar whose
/// `root` matches the same strings.
pub fn regex_gbnf(pattern: &str) -> Result<String, EngineError> {
    let hir = regex_syntax::ParserBuilder::new()
        .nest_limit(MAX_DEPTH as u32)
        .build()
        .parse(pattern)
        .map_err(|e| EngineError::Regex(e.to_string()))?;
    let mut out = String::from("root ::= ");
    write_hir(&hir, &mut out, 0)?;
    out.push('\n');
    Ok(out)
}

/// Literal options as a GBNF grammar (one alternative each, matched as text).
pub fn choices_gbnf(options: &[String]) -> String {
    let alts: Vec<String> = options.iter().map(|o| literal(o)).collect();
    format!("root ::= {}\n", alts.join(" | "))
}

/// `g` starting at rule `start` as plain GBNF: rules renamed `r0`, `r1`, …
/// (llama.cpp's names allow fewer characters than lmt's), `root` the start,
/// `/regex/` terminals written out.
pub fn grammar_gbnf(g: &Grammar, start: &str) -> Result<String, EngineError> {
    let index = |name: &str| g.rules.iter().position(|r| r.name == name);
    let Some(s) = index(start) else { return Err(EngineError::Unsupported(format!("the grammar has no rule `{start}`"))) };
    let mut out = format!("root ::= r{s}\n");
    for (i, r) in g.rules.iter().enumerate() {
        let _ = write!(out, "r{i} ::= ");
        write_gexpr(&r.body, &index, &mut out)?;
        out.push('\n');
    }
    Ok(out)
}

/// A grammar lmt wrote (its `root` defined on its first line) preceded by
/// the text `prefix`: its root renamed, and a new root of the two.
pub fn gbnf_after(prefix: &str, gbnf: &str) -> String {
    let body = gbnf.strip_prefix("root ::=").map_or_else(|| gbnf.to_string(), |rest| format!("lmt-value ::={rest}"));
    format!("root ::= {} lmt-value\n{body}", literal(prefix))
}

fn write_gexpr(e: &GExpr, index: &dyn Fn(&str) -> Option<usize>, out: &mut String) -> Result<(), EngineError> {
    match &e.kind {
        GKind::Alt(v) => group(out, v, " | ", |x, out| write_gexpr(x, index, out))?,
        GKind::Seq(v) if v.is_empty() => out.push_str("\"\""),
        GKind::Seq(v) => group(out, v, " ", |x, out| write_gexpr(x, index, out))?,
        GKind::Literal(s) => out.push_str(&literal(s)),
        GKind::Class { negated, ranges } => {
            out.push('[');
            if *negated {
                out.push('^');
            }
            ranges.iter().for_each(|&(a, b)| push_range(out, a, b));
            out.push(']');
        }
        GKind::Ref(name) => {
            let i = index(name).ok_or_else(|| EngineError::Unsupported(format!("the grammar has no rule `{name}`")))?;
            let _ = write!(out, "r{i}");
        }
        GKind::Regex(p) => {
            let hir = regex_syntax::ParserBuilder::new()
                .nest_limit(MAX_DEPTH as u32)
                .build()
                .parse(p)
                .map_err(|e| EngineError::Regex(e.to_string()))?;
            out.push('(');
            write_hir(&hir, out, 0)?;
            out.push(')');
        }
        GKind::Any => out.push('.'),
        GKind::Repeat { inner, min, max } => {
            out.push('(');
            write_gexpr(inner, index, out)?;
            out.push(')');
            push_repeat(out, *min, *max);
        }
    }
    Ok(())
}

fn write_hir(h: &Hir, out: &mut String, depth: usize) -> Result<(), EngineError> {
    if depth > MAX_DEPTH {
        return Err(EngineError::TooComplex(format!("a regex nested deeper than {MAX_DEPTH}")));
    }
    match h.kind() {
        HirKind::Empty => out.push_str("\"\""),
        HirKind::Literal(l) => {
            let s = std::str::from_utf8(&l.0).map_err(|_| EngineError::Unsupported("a regex literal that is not UTF-8 text".into()))?;
            out.push_str(&literal(s));
        }
        HirKind::Class(Class::Unicode(c)) => {
            // `[^"]` stays short: a class holding both ends of Unicode is
            // written as the negation of what it lacks.
            let full = c.ranges().first().is_some_and(|r| r.start() == '\0') && c.ranges().last().is_some_and(|r| r.end() == char::MAX);
            let mut shown = c.clone();
            out.push('[');
            if full && c.ranges().len() > 1 {
                shown.negate();
                out.push('^');
            }
            shown.ranges().iter().for_each(|r| push_range(out, r.start(), r.end()));
            out.push(']');
        }
        HirKind::Class(Class::Bytes(c)) => {
            out.push('[');
            for r in c.ranges() {
                if r.end() > 0x7F {
                    return Err(EngineError::Unsupported("a byte class beyond ASCII (`(?-u)`) has no GBNF form".into()));
                }
                push_range(out, char::from(r.start()), char::from(r.end()));
            }
            out.push(']');
        }
        // Constraints match whole values: the ends are where `^` and `$` sit.
        HirKind::Look(Look::Start | Look::End | Look::StartLF | Look::EndLF | Look::StartCRLF | Look::EndCRLF) => out.push_str("\"\""),
        HirKind::Look(l) => return Err(EngineError::Unsupported(format!("the regex assertion {l:?} has no GBNF form"))),
        HirKind::Repetition(r) => {
            out.push('(');
            write_hir(&r.sub, out, depth + 1)?;
            out.push(')');
            push_repeat(out, r.min, r.max);
        }
        HirKind::Capture(c) => {
            out.push('(');
            write_hir(&c.sub, out, depth + 1)?;
            out.push(')');
        }
        HirKind::Concat(v) => group(out, v, " ", |x, out| write_hir(x, out, depth + 1))?,
        HirKind::Alternation(v) => group(out, v, " | ", |x, out| write_hir(x, out, depth + 1))?,
    }
    Ok(())
}

/// `(a b c)` or `(a | b | c)`: `items` written by `each`, parenthesized.
fn group<T>(out: &mut String, items: &[T], sep: &str, mut each: impl FnMut(&T, &mut String) -> Result<(), EngineError>) -> Result<(), EngineError> {
    out.push('(');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        each(x, out)?;
    }
    out.push(')');
    Ok(())
}

/// One range of a character class: `a` or `a-b`.
fn push_range(out: &mut String, a: char, b: char) {
    push_class_char(out, a);
    if a != b {
        out.push('-');
        push_class_char(out, b);
    }
}

fn push_repeat(out: &mut String, min: u32, max: Option<u32>) {
    let _ = match (min, max) {
        (0, None) => write!(out, "*"),
        (1, None) => write!(out, "+"),
        (0, Some(1)) => write!(out, "?"),
        (m, None) => write!(out, "{{{m},}}"),
        (m, Some(n)) if m == n => write!(out, "{{{m}}}"),
        (m, Some(n)) => write!(out, "{{{m},{n}}}"),
    };
}

/// A GBNF string literal of `s`.
fn literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => push_plain_or_escaped(&mut out, c),
        }
    }
    out.push('"');
    out
}

/// One end of a character class range.
fn push_class_char(out: &mut String, c: char) {
    match c {
        // llama.cpp reads `^` as negation only first, but knows no `\^`.
        '^' => out.push_str("\\x5E"),
        ']' | '[' | '\\' | '-' => {
            out.push('\\');
            out.push(c);
        }
        c => push_plain_or_escaped(out, c),
    }
}

/// Printable characters as themselves; controls, spaces other than ' '
/// and anything unusual as `\xHH`, `\uHHHH` or `\UHHHHHHHH`.
fn push_plain_or_escaped(out: &mut String, c: char) {
    let code = c as u32;
    let _ = match c {
        '\n' => write!(out, "\\n"),
        '\r' => write!(out, "\\r"),
        '\t' => write!(out, "\\t"),
        ' ' => write!(out, " "),
        c if c.is_alphanumeric() || c.is_ascii_punctuation() => write!(out, "{c}"),
        _ if code <= 0xFF => write!(out, "\\x{code:02X}"),
        _ if code <= 0xFFFF => write!(out, "\\u{code:04X}"),
        _ => write!(out, "\\U{code:08X}"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regexes_become_gbnf() {
        assert_eq!(regex_gbnf("[0-9]{1,3}").unwrap(), "root ::= ([0-9]){1,3}\n");
        assert_eq!(regex_gbnf("a|bc").unwrap(), "root ::= (\"a\" | \"bc\")\n");
        assert_eq!(regex_gbnf("x*\"").unwrap(), "root ::= ((\"x\")* \"\\\"\")\n");
        assert_eq!(regex_gbnf("[\\]\\-^]").unwrap(), "root ::= [\\-\\]-\\x5E]\n");
        assert_eq!(regex_gbnf("[^\"]").unwrap(), "root ::= [^\"]\n");
        assert!(regex_gbnf("\\bx").is_err());
    }

    #[test]
    fn a_grammar_after_text() {
        assert_eq!(gbnf_after("a\"", "root ::= r0\nr0 ::= \"x\"\n"), "root ::= \"a\\\"\" lmt-value\nlmt-value ::= r0\nr0 ::= \"x\"\n");
    }

    #[test]
    fn choices_are_escaped_literals() {
        assert_eq!(choices_gbnf(&["a\"b".into(), "c\n".into()]), "root ::= \"a\\\"b\" | \"c\\n\"\n");
    }
}
