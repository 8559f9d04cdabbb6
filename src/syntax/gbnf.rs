//! GBNF grammars (llama.cpp's notation plus `/regex/` terminals): the AST
//! (what GBNF can write, with spans; the engine lowers it into its own
//! grammar IR) and its parser. The parser reads one rule at a time and, after a broken
//! rule, resumes at the next line that starts a rule, so every broken rule
//! is reported.

use pest::iterators::Pair;
use pest::Parser as _;

use crate::diagnostic::{Code, Diagnostic};
use crate::span::{FileId, Span};

mod pest_gbnf {
    /// The pest parser generated from `grammar/gbnf.pest`.
    #[derive(pest_derive::Parser)]
    #[grammar = "grammar/gbnf.pest"]
    pub struct GbnfParser;
}
use pest_gbnf::{GbnfParser, Rule as R};

/// Largest repetition count accepted in `{m,n}`: bounds the work the grammar
/// engine may be asked to do.
pub const MAX_REPEAT: u32 = 10_000;

/// A parsed grammar: its rules in the order written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grammar {
    /// The rules.
    pub rules: Vec<GrammarRule>,
}

/// `name ::= body`.
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarRule {
    /// The rule's name.
    pub name: String,
    /// Where the name is written.
    pub name_span: Span,
    /// The right-hand side.
    pub body: GExpr,
    /// The whole rule.
    pub span: Span,
}

/// A grammar expression with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct GExpr {
    /// What it is.
    pub kind: GKind,
    /// Where it is written.
    pub span: Span,
}

/// The kinds of grammar expression.
#[derive(Debug, Clone, PartialEq)]
pub enum GKind {
    /// `a | b`.
    Alt(Vec<GExpr>),
    /// `a b` (empty: matches the empty string).
    Seq(Vec<GExpr>),
    /// `"text"`, escapes resolved.
    Literal(String),
    /// `[a-z_]` or `[^"]`: inclusive character ranges.
    Class {
        /// True for `[^…]`.
        negated: bool,
        /// Inclusive ranges.
        ranges: Vec<(char, char)>,
    },
    /// A rule name.
    Ref(String),
    /// `/regex/`, escapes other than `\/` left for the regex parser.
    Regex(String),
    /// `.`: any one character.
    Any,
    /// `x*`, `x+`, `x?`, `x{m,n}`.
    Repeat {
        /// What is repeated.
        inner: Box<GExpr>,
        /// Fewest repetitions.
        min: u32,
        /// Most repetitions; `None` for unbounded.
        max: Option<u32>,
    },
}

impl GExpr {
    /// Calls `f` on each expression directly inside this one.
    pub fn for_each_child<'a>(&'a self, mut f: impl FnMut(&'a GExpr)) {
        match &self.kind {
            GKind::Alt(v) | GKind::Seq(v) => v.iter().for_each(f),
            GKind::Repeat { inner, .. } => f(inner),
            GKind::Literal(_) | GKind::Class { .. } | GKind::Ref(_) | GKind::Regex(_) | GKind::Any => {}
        }
    }
}

impl Grammar {
    /// The rule with this name.
    pub fn rule(&self, name: &str) -> Option<&GrammarRule> {
        self.rules.iter().find(|r| r.name == name)
    }
}

/// Parses GBNF `src`, which starts at byte `base` of its file.
pub fn parse(src: &str, base: usize, file: FileId, diags: &mut Vec<Diagnostic>) -> Grammar {
    let mut rules = Vec::new();
    let mut pos = skip_blank(src, 0);
    while pos < src.len() {
        if paren_depth(&src[pos..]) > crate::syntax::MAX_NESTING {
            let end = next_rule_start(src, pos);
            let message = format!("this rule nests groups deeper than {}", crate::syntax::MAX_NESTING);
            diags.push(
                Diagnostic::new(Code::TooDeep, file, Span::new(base + pos, base + end), message)
                    .with_help("split the rule into smaller named rules"),
            );
            pos = skip_blank(src, end);
            continue;
        }
        match GbnfParser::parse(R::gbnf_rule, &src[pos..]) {
            Ok(mut pairs) => {
                let p = pairs.next().expect("rule");
                let len = p.as_str().len();
                let mut errors = Vec::new();
                let rule = build_rule(p, base + pos, &mut errors);
                if errors.is_empty() {
                    rules.push(rule);
                } else {
                    diags.extend(errors.into_iter().map(|(span, msg)| {
                        Diagnostic::new(Code::GrammarSyntax, file, span, msg)
                            .with_help("GBNF escapes: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH")
                    }));
                }
                pos = skip_blank(src, pos + len.max(1));
            }
            Err(e) => {
                let at = match e.location {
                    pest::error::InputLocation::Pos(p) => p,
                    pest::error::InputLocation::Span((a, _)) => a,
                };
                let at = crate::span::floor_char_boundary(src, pos + at);
                let found: String = src[at..].chars().next().map(|c| c.to_string()).unwrap_or_default();
                let line_start = src[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0);
                let looks_like_rule = src[line_start.max(pos)..].trim_start().split("::=").count() > 1
                    && src[pos..].lines().next().is_some_and(|l| l.contains("::="));
                let (message, help) = if !looks_like_rule {
                    (
                        "expected a rule such as `name ::= \"text\"`".to_string(),
                        "each rule is `name ::= alternatives`; a rule ends at the end of its line unless inside `( )`",
                    )
                } else if found.is_empty() || found == "\n" {
                    ("this rule ends too early".to_string(), "finish the rule, or close the open `(`")
                } else {
                    (
                        format!("unexpected `{}` in this grammar rule", found.escape_default()),
                        "rules are made of \"literals\", [classes], /regexes/, rule names, ( groups ), |, ?, *, + and {m,n}",
                    )
                };
                if let Some(open) = unclosed_paren(&src[pos..at]) {
                    let open = pos + open;
                    diags.push(
                        Diagnostic::new(Code::GrammarSyntax, file, Span::new(base + open, base + open + 1), "this `(` is never closed")
                            .with_help("close the group with `)`; inside parentheses a rule may span lines"),
                    );
                    pos = skip_blank(src, next_rule_start(src, pos));
                    continue;
                }
                let end = at + found.len();
                diags.push(
                    Diagnostic::new(Code::GrammarSyntax, file, Span::new(base + at, base + end), message)
                        .with_help(help),
                );
                pos = skip_blank(src, next_rule_start(src, pos));
            }
        }
    }
    Grammar { rules }
}

/// The offset of the innermost `(` in `text` that is not closed, skipping
/// literals, classes, regexes and comments.
fn unclosed_paren(text: &str) -> Option<usize> {
    let mut open = Vec::new();
    let mut it = text.char_indices();
    while let Some((i, c)) = it.next() {
        match c {
            '"' | '[' | '/' => {
                let close = if c == '[' { ']' } else { c };
                while let Some((_, d)) = it.next() {
                    if d == '\\' {
                        it.next();
                    } else if d == close || d == '\n' {
                        break;
                    }
                }
            }
            '#' => {
                for (_, d) in it.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '(' => open.push(i),
            ')' => {
                open.pop();
            }
            _ => {}
        }
    }
    open.pop()
}

/// The deepest `(` nesting in the rule starting `text` (to its end), a
/// cheap upper bound that ignores parentheses inside literals.
fn paren_depth(text: &str) -> usize {
    let end = next_rule_start(text, 0);
    let (mut depth, mut max) = (0usize, 0usize);
    for c in text[..end].chars() {
        match c {
            '(' => {
                depth += 1;
                max = max.max(depth);
            }
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Skips white space, newlines and `#` comments.
fn skip_blank(src: &str, mut pos: usize) -> usize {
    loop {
        let rest = &src[pos..];
        let trimmed = rest.trim_start();
        pos += rest.len() - trimmed.len();
        if trimmed.starts_with('#') {
            pos += trimmed.find('\n').unwrap_or(trimmed.len());
        } else {
            return pos;
        }
    }
}

/// The start of the next line after `pos` that contains `::=` outside
/// quotes, or the end of the text.
fn next_rule_start(src: &str, pos: usize) -> usize {
    let mut at = src[pos..].find('\n').map(|i| pos + i + 1).unwrap_or(src.len());
    while at < src.len() {
        let line = src[at..].lines().next().unwrap_or("");
        let head = line.trim_start();
        let name_len = head.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).unwrap_or(head.len());
        if name_len > 0 && head[name_len..].trim_start().starts_with("::=") {
            return at;
        }
        at = src[at..].find('\n').map(|i| at + i + 1).unwrap_or(src.len());
    }
    src.len()
}

type Errors = Vec<(Span, String)>;

fn span_of(p: &Pair<'_, R>, base: usize) -> Span {
    Span::new(base + p.as_span().start(), base + p.as_span().end())
}

fn build_rule(p: Pair<'_, R>, base: usize, errs: &mut Errors) -> GrammarRule {
    let span = span_of(&p, base);
    let mut inner = p.into_inner();
    let name = inner.next().expect("rule name");
    let alts = inner.next().expect("alternatives");
    let span = Span::new(span.start as usize, span.end as usize);
    GrammarRule { name: name.as_str().to_string(), name_span: span_of(&name, base), body: build(alts, base, errs), span }
}

fn build(p: Pair<'_, R>, base: usize, errs: &mut Errors) -> GExpr {
    let span = span_of(&p, base);
    let kind = match p.as_rule() {
        R::alts | R::nested_alts => {
            let mut alts: Vec<GExpr> = p.into_inner().map(|a| build(a, base, errs)).collect();
            if alts.len() == 1 {
                return alts.pop().expect("one");
            }
            GKind::Alt(alts)
        }
        R::seq | R::nested_seq => {
            let mut items: Vec<GExpr> = p.into_inner().map(|a| build(a, base, errs)).collect();
            if items.len() == 1 {
                return items.pop().expect("one");
            }
            GKind::Seq(items)
        }
        R::group => return build(p.into_inner().next().expect("group"), base, errs),
        R::item => {
            let mut inner = p.into_inner();
            let atom = build(inner.next().expect("atom"), base, errs);
            let Some(q) = inner.next() else { return atom };
            let (min, max) = quantifier(q, base, errs);
            GKind::Repeat { inner: Box::new(atom), min, max }
        }
        R::literal => {
            let s = p.as_str();
            GKind::Literal(unescape(&s[1..s.len() - 1], span.start as usize + 1, errs))
        }
        R::class => class(p.as_str(), span.start as usize, errs),
        R::regex => {
            let s = p.as_str();
            GKind::Regex(s[1..s.len() - 1].replace("\\/", "/"))
        }
        R::any => GKind::Any,
        R::rule_ref => GKind::Ref(p.as_str().to_string()),
        other => unreachable!("gbnf rule {other:?}"),
    };
    GExpr { kind, span }
}

fn quantifier(q: Pair<'_, R>, base: usize, errs: &mut Errors) -> (u32, Option<u32>) {
    let span = span_of(&q, base);
    let text = q.as_str();
    match text {
        "*" => return (0, None),
        "+" => return (1, None),
        "?" => return (0, Some(1)),
        _ => {}
    }
    let braces = q.into_inner().next().expect("braces");
    let mut min: Option<u32> = None;
    let mut max: Option<u32> = None;
    let mut comma = false;
    for part in braces.into_inner() {
        match part.as_rule() {
            R::comma => comma = true,
            _ => {
                let n = part.as_str().parse::<u32>().unwrap_or(u32::MAX);
                if comma {
                    max = Some(n);
                } else {
                    min = Some(n);
                }
            }
        }
    }
    let min_v = min.unwrap_or(0);
    let max_v = if comma { max } else { Some(min_v) };
    if min.is_none() && !comma {
        errs.push((span, "`{}` needs a count, such as `{3}` or `{1,5}`".into()));
    }
    for n in [Some(min_v), max_v].into_iter().flatten() {
        if n > MAX_REPEAT {
            errs.push((span, format!("repetition count {n} is above the limit of {MAX_REPEAT}")));
            return (0, Some(0));
        }
    }
    if let Some(m) = max_v {
        if m < min_v {
            errs.push((span, format!("`{text}`: the maximum {m} is below the minimum {min_v}")));
        }
    }
    (min_v, max_v)
}

/// Resolves GBNF escapes in `s`, which starts at byte `at` of the file.
fn unescape(s: &str, at: usize, errs: &mut Errors) -> String {
    let mut out = String::new();
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some((_, e)) = it.next() else {
            errs.push((Span::new(at + i, at + i + 1), "a lone `\\` at the end".into()));
            break;
        };
        let digits = match e {
            'n' => {
                out.push('\n');
                continue;
            }
            'r' => {
                out.push('\r');
                continue;
            }
            't' => {
                out.push('\t');
                continue;
            }
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => {
                out.push(e);
                continue;
            }
            other => match super::literal::hex_digits(other) {
                Some(n) => n,
                None => {
                    errs.push((Span::new(at + i, at + i + 1 + other.len_utf8()), format!("unknown escape `\\{other}`")));
                    continue;
                }
            },
        };
        let hex = super::literal::take_hex(&mut it, digits);
        match u32::from_str_radix(&hex, 16).ok().filter(|_| hex.len() == digits).and_then(char::from_u32) {
            Some(ch) => out.push(ch),
            None => errs.push((
                Span::new(at + i, at + i + 2 + hex.len()),
                format!("`\\{e}` needs {digits} hex digits naming a Unicode character"),
            )),
        }
    }
    out
}

fn class(text: &str, at: usize, errs: &mut Errors) -> GKind {
    let body = &text[1..text.len() - 1];
    let (negated, body, offset) = match body.strip_prefix('^') {
        Some(rest) => (true, rest, at + 2),
        None => (false, body, at + 1),
    };
    // Resolve escapes char by char, remembering which were escaped so that an
    // escaped `-` is a literal dash.
    let mut chars: Vec<(char, bool, usize)> = Vec::new();
    let mut it = body.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if c == '\\' {
            let start = i;
            let mut esc = String::from('\\');
            if let Some((_, e)) = it.next() {
                esc.push(e);
                esc.push_str(&super::literal::take_hex(&mut it, super::literal::hex_digits(e).unwrap_or(0)));
            }
            let value = unescape(&esc, offset + start, errs);
            if let Some(ch) = value.chars().next() {
                chars.push((ch, true, offset + start));
            }
        } else {
            chars.push((c, false, offset + i));
        }
    }
    let mut ranges = Vec::new();
    let mut k = 0;
    while k < chars.len() {
        let (lo, _, lo_at) = chars[k];
        if k + 2 < chars.len() && chars[k + 1].0 == '-' && !chars[k + 1].1 {
            let (hi, _, hi_at) = chars[k + 2];
            if hi < lo {
                errs.push((Span::new(lo_at, hi_at + hi.len_utf8()), format!("range `{lo}-{hi}` is reversed")));
            }
            ranges.push((lo, hi));
            k += 3;
        } else {
            ranges.push((lo, lo));
            k += 1;
        }
    }
    if ranges.is_empty() && !negated {
        errs.push((Span::new(at, at + text.len()), "`[]` matches nothing".into()));
    }
    GKind::Class { negated, ranges }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(src: &str) -> Grammar {
        let mut d = Vec::new();
        let g = parse(src, 0, FileId(0), &mut d);
        assert!(d.is_empty(), "{d:#?}");
        g
    }

    #[test]
    fn parses_llama_cpp_json_grammar_shapes() {
        let g = parse_ok(
            r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
ws ::= | " " | "\n" [ \t]{0,20}
"#,
        );
        let names: Vec<_> = g.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["root", "value", "object", "string", "number", "array", "ws"]);
        let ws = g.rule("ws").unwrap();
        match &ws.body.kind {
            GKind::Alt(alts) => {
                assert_eq!(alts.len(), 3);
                assert_eq!(alts[0].kind, GKind::Seq(vec![]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn classes_literals_regex_and_repeats() {
        let g = parse_ok("root ::= [^a-c\\-] \"x\\u00e9\" /[0-9]+/ . x{2,} x{,3}\nx ::= \"a\"");
        let GKind::Seq(items) = &g.rules[0].body.kind else { panic!() };
        assert_eq!(items[0].kind, GKind::Class { negated: true, ranges: vec![('a', 'c'), ('-', '-')] });
        assert_eq!(items[1].kind, GKind::Literal("xé".into()));
        assert_eq!(items[2].kind, GKind::Regex("[0-9]+".into()));
        assert_eq!(items[3].kind, GKind::Any);
        assert!(matches!(items[4].kind, GKind::Repeat { min: 2, max: None, .. }));
        assert!(matches!(items[5].kind, GKind::Repeat { min: 0, max: Some(3), .. }));
    }

    #[test]
    fn reports_each_broken_rule_and_keeps_the_rest() {
        let mut d = Vec::new();
        let src = "root ::= a (\nb ::= \"x\"\nc ::= [z-a]\nd ::= \"q\\k\"\n";
        let g = parse(src, 0, FileId(0), &mut d);
        assert_eq!(d.len(), 3, "{d:#?}");
        assert!(d.iter().all(|x| x.code == Code::GrammarSyntax));
        assert_eq!(g.rules.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["b"]);
    }
}
