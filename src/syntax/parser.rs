//! Reads template text into a flat list of [`Item`]s: text, complete nodes,
//! block openers, separators (`or`, `elif`, `else`) and `end`s. Block
//! matching happens afterwards in [`super::blocks`].
//!
//! Recovery: the text is cut into segments one at a time, and each tag's
//! inside is parsed on its own, so one bad tag is one diagnostic and the
//! tags after it are still read. A tag that does not parse but starts with a
//! block keyword still opens its block, so its `{% end %}` is not reported as
//! stray. This is the only module (with `gbnf`) that sees pest types.

use std::cell::RefCell;
use std::sync::{LazyLock, Mutex};

use pest::iterators::Pair;
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest::Parser as _;

use super::ast::*;
use super::{gbnf, literal};
use crate::diagnostic::{Code, Diagnostic};
use crate::span::{FileId, Span};

#[derive(pest_derive::Parser)]
#[grammar = "grammar/lmt.pest"]
struct LmtParser;

/// A piece of the template before blocks are matched.
#[derive(Debug)]
pub(crate) enum Item {
    /// A node that needs no closing tag.
    Node(Node),
    /// A tag that opens a block.
    Open(Opener, Span),
    /// `{% or %}`.
    Or(Span),
    /// `{% elif cond %}`.
    Elif(Expr, Span),
    /// `{% else %}`.
    Else(Span),
    /// `{% end [name] %}`.
    End(Option<String>, Span),
}

/// What a block-opening tag says.
#[derive(Debug)]
pub(crate) enum Opener {
    Select { target: Option<Target>, options: Vec<GenOption> },
    Role(RoleName),
    Capture(Target),
    Hidden,
    If(Expr),
    For { vars: Vec<Ident>, iter: Expr },
    Def { name: Ident, params: Vec<Param> },
}

impl Opener {
    /// The keyword a named `end` uses for this block.
    pub(crate) fn keyword(&self) -> &'static str {
        match self {
            Opener::Select { .. } => "select",
            Opener::Role(RoleName::System) => "system",
            Opener::Role(RoleName::User) => "user",
            Opener::Role(RoleName::Assistant) => "assistant",
            Opener::Role(RoleName::Expr(_)) => "role",
            Opener::Capture(_) => "capture",
            Opener::Hidden => "hidden",
            Opener::If(_) => "if",
            Opener::For { .. } => "for",
            Opener::Def { .. } => "def",
        }
    }
}

/// Every statement keyword, for "unknown statement" suggestions.
pub const STATEMENTS: &[&str] = &[
    "gen", "select", "or", "role", "system", "user", "assistant", "capture", "hidden", "set", "if", "elif", "else",
    "for", "def", "import", "grammar", "input", "raw", "end",
];

const BLOCK_NAMES: &[&str] =
    &["select", "role", "system", "user", "assistant", "capture", "hidden", "if", "for", "def", "grammar"];

/// Parses `text` into items, reporting problems to `diags`.
pub(crate) fn parse_items(text: &str, file: FileId, diags: &mut Vec<Diagnostic>) -> Vec<Item> {
    let b = Builder { text, file, diags: RefCell::new(Vec::new()), depth: std::cell::Cell::new(0) };
    let segs = b.scan();
    let items = b.items(&segs);
    diags.extend(b.diags.into_inner());
    items
}

/// One scanned piece of the text.
#[derive(Debug, Clone)]
struct Seg {
    kind: SegKind,
    span: Span,
    trim_l: bool,
    trim_r: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum SegKind {
    /// Plain text, or the body of a raw block.
    Text,
    Comment,
    /// `{{ … }}`, with the span of its inside; `closed` is false for an
    /// unterminated tag (already reported).
    Expr { inner: Span, closed: bool },
    /// `{% … %}`.
    Stmt { inner: Span, closed: bool },
    /// `{% grammar name %}` with its GBNF body and the whole block's span.
    Grammar { inner: Span, body: Span, block: Span },
}

struct Builder<'t> {
    text: &'t str,
    file: FileId,
    diags: RefCell<Vec<Diagnostic>>,
    /// Expression nesting depth while building (see [`super::MAX_NESTING`]).
    depth: std::cell::Cell<usize>,
}

impl<'t> Builder<'t> {
    fn error(&self, d: Diagnostic) {
        self.diags.borrow_mut().push(d);
    }

    fn diag(&self, code: Code, span: Span, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::new(code, self.file, span, msg)
    }

    // ------------------------------------------------------------ scanning

    fn scan(&self) -> Vec<Seg> {
        let text = self.text;
        let mut segs = Vec::new();
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            if rest.starts_with("{#") {
                match LmtParser::parse(Rule::comment, rest) {
                    Ok(mut pairs) => {
                        let p = pairs.next().expect("comment pair");
                        let (trim_l, trim_r) = trims(&p);
                        let end = pos + p.as_str().len();
                        segs.push(Seg { kind: SegKind::Comment, span: Span::new(pos, end), trim_l, trim_r });
                        pos = end;
                    }
                    Err(_) => {
                        self.error(
                            self.diag(Code::UnterminatedComment, Span::new(pos, pos + 2), "this comment is never closed")
                                .with_label("comment opened here")
                                .with_help("close the comment with `#}`"),
                        );
                        let trim_l = rest.starts_with("{#-");
                        segs.push(Seg { kind: SegKind::Comment, span: Span::new(pos, text.len()), trim_l, trim_r: false });
                        pos = text.len();
                    }
                }
            } else if rest.starts_with("{{") || rest.starts_with("{%") {
                pos = self.scan_tag(pos, &mut segs);
            } else {
                let len = LmtParser::parse(Rule::text, rest)
                    .ok()
                    .and_then(|mut p| p.next())
                    .map(|p| p.as_str().len())
                    .unwrap_or(rest.len())
                    .max(1);
                let mut end = pos + len;
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                segs.push(Seg { kind: SegKind::Text, span: Span::new(pos, end), trim_l: false, trim_r: false });
                pos = end;
            }
        }
        segs
    }

    /// Scans the tag at `pos` (and a raw or grammar body after it); returns
    /// where scanning continues.
    fn scan_tag(&self, pos: usize, segs: &mut Vec<Seg>) -> usize {
        let text = self.text;
        let rest = &text[pos..];
        let is_stmt = rest.starts_with("{%");
        let rule = if is_stmt { Rule::stmt_tag } else { Rule::expr_tag };
        let (inner, end, trim_l, trim_r, closed) = match LmtParser::parse(rule, rest) {
            Ok(mut pairs) => {
                let p = pairs.next().expect("tag pair");
                let end = pos + p.as_str().len();
                let (trim_l, trim_r) = trims(&p);
                let raw = p.into_inner().find(|c| matches!(c.as_rule(), Rule::stmt_raw | Rule::expr_raw));
                let inner = raw.map(|r| Span::new(pos + r.as_span().start(), pos + r.as_span().end()));
                (inner.unwrap_or(Span::at(pos + 2)), end, trim_l, trim_r, true)
            }
            Err(_) => {
                // Unterminated: the tag runs to the next tag or the end of its
                // first line, whichever comes first.
                let trim_l = rest.get(2..).is_some_and(|r| r.starts_with('-'));
                let start = pos + 2 + trim_l as usize;
                let raw_rule = if is_stmt { Rule::stmt_raw } else { Rule::expr_raw };
                let scanned = LmtParser::parse(raw_rule, &text[start..])
                    .ok()
                    .and_then(|mut p| p.next())
                    .map(|p| p.as_str().len())
                    .unwrap_or(0);
                let line = text[start..start + scanned].find('\n').unwrap_or(scanned);
                let end = start + line;
                let close = if is_stmt { "%}" } else { "}}" };
                let open = if is_stmt { "{%" } else { "{{" };
                self.error(
                    self.diag(Code::UnterminatedTag, Span::new(pos, end), format!("this `{open}` tag is never closed"))
                        .with_label(format!("expected `{close}` here"))
                        .with_help(format!("end the tag with `{close}`")),
                );
                (Span::new(start, end), end, trim_l, false, false)
            }
        };
        if !is_stmt {
            segs.push(Seg { kind: SegKind::Expr { inner, closed }, span: Span::new(pos, end), trim_l, trim_r });
            return end;
        }
        let content = &text[inner.range()];
        let head = head_word(content);
        if closed && content.trim() == "raw" {
            segs.push(Seg { kind: SegKind::Comment, span: Span::new(pos, end), trim_l, trim_r });
            let (body_end, close) = self.find_close(end, Rule::raw_close);
            match close {
                Some((close_end, tl, tr)) => {
                    segs.push(Seg { kind: SegKind::Text, span: Span::new(end, body_end), trim_l: false, trim_r: false });
                    segs.push(Seg { kind: SegKind::Comment, span: Span::new(body_end, close_end), trim_l: tl, trim_r: tr });
                    return close_end;
                }
                None => {
                    self.error(
                        self.diag(Code::UnclosedRaw, Span::new(pos, end), "this raw block is never closed")
                            .with_label("raw block opened here")
                            .with_help("close it with `{% endraw %}`"),
                    );
                    segs.push(Seg { kind: SegKind::Text, span: Span::new(end, text.len()), trim_l: false, trim_r: false });
                    return text.len();
                }
            }
        }
        if closed && head == "grammar" {
            let (body_end, close) = self.find_close(end, Rule::grammar_close);
            let (block_end, close_tr) = match close {
                Some((close_end, _, tr)) => (close_end, tr),
                None => {
                    self.error(
                        self.diag(Code::UnclosedBlock, Span::new(pos, end), "this `grammar` block is never closed")
                            .with_label("grammar opened here")
                            .with_help("close the grammar with `{% end %}`"),
                    );
                    (text.len(), false)
                }
            };
            segs.push(Seg {
                kind: SegKind::Grammar { inner, body: Span::new(end, body_end), block: Span::new(pos, block_end) },
                span: Span::new(pos, block_end),
                trim_l,
                trim_r: close_tr,
            });
            return block_end;
        }
        segs.push(Seg { kind: SegKind::Stmt { inner, closed }, span: Span::new(pos, end), trim_l, trim_r });
        end
    }

    /// Finds the first closing tag matching `rule` at or after `from`.
    /// Returns where the body ends and, if found, the closing tag's end and
    /// trim markers.
    fn find_close(&self, from: usize, rule: Rule) -> (usize, Option<(usize, bool, bool)>) {
        let text = self.text;
        let mut at = from;
        while let Some(i) = text[at..].find("{%") {
            let start = at + i;
            if let Ok(mut pairs) = LmtParser::parse(rule, &text[start..]) {
                let p = pairs.next().expect("close pair");
                let (tl, tr) = trims(&p);
                return (start, Some((start + p.as_str().len(), tl, tr)));
            }
            at = start + 2;
        }
        (text.len(), None)
    }

    // ------------------------------------------------------------- items

    fn items(&self, segs: &[Seg]) -> Vec<Item> {
        let mut items = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            match &seg.kind {
                SegKind::Text => {
                    let (mut start, mut end) = (seg.span.start as usize, seg.span.end as usize);
                    if segs.get(i + 1).is_some_and(|n| n.trim_l) {
                        end = start + self.text[start..end].trim_end().len();
                    }
                    if i > 0 && segs[i - 1].trim_r {
                        start = end - self.text[start..end].trim_start().len();
                    }
                    if start < end {
                        items.push(Item::Node(Node::Text {
                            value: self.text[start..end].to_string(),
                            span: Span::new(start, end),
                        }));
                    }
                }
                SegKind::Comment => {}
                SegKind::Expr { inner, closed } => {
                    let expr = if self.text[inner.range()].trim().is_empty() {
                        if *closed {
                            self.error(
                                self.diag(Code::EmptyTag, seg.span, "this `{{ }}` tag is empty")
                                    .with_help("put an expression inside, such as `{{ name }}`"),
                            );
                        }
                        Expr { kind: ExprKind::Error, span: *inner }
                    } else {
                        self.parse_expr_body(*inner, !closed)
                    };
                    items.push(Item::Node(Node::Emit { expr, span: seg.span }));
                }
                SegKind::Stmt { inner, closed } => {
                    if let Some(item) = self.stmt_item(*inner, seg.span, !closed) {
                        items.push(item);
                    }
                }
                SegKind::Grammar { inner, body, block } => {
                    items.push(Item::Node(self.grammar_node(*inner, *body, *block, seg.span)));
                }
            }
        }
        items
    }

    fn grammar_node(&self, inner: Span, body: Span, block: Span, tag: Span) -> Node {
        let open = Span::new(tag.start as usize, inner.end as usize + 2);
        let name = match self.parse_rule(Rule::stmt_body, inner) {
            Ok(p) => {
                let g = p.into_inner().next().expect("grammar_stmt");
                let ident = g.into_inner().find(|c| c.as_rule() == Rule::ident).expect("grammar name");
                self.ident(ident, inner.start as usize)
            }
            Err(e) => {
                self.error(self.pest_error(e, inner, "grammar"));
                Ident { name: String::new(), span: inner }
            }
        };
        let mut diags = Vec::new();
        let grammar = gbnf::parse(&self.text[body.range()], body.start as usize, self.file, &mut diags);
        self.diags.borrow_mut().extend(diags);
        Node::Grammar(GrammarBlock { name, grammar, body, open, span: block })
    }

    fn parse_rule(&self, rule: Rule, inner: Span) -> Result<Pair<'t, Rule>, pest::error::Error<Rule>> {
        let s = &self.text[inner.range()];
        match LmtParser::parse(rule, s) {
            Ok(mut p) => Ok(p.next().expect("body pair")),
            Err(_) => Err(parse_with_detail(rule, s)),
        }
    }

    fn parse_expr_body(&self, inner: Span, quiet: bool) -> Expr {
        match self.parse_rule(Rule::expr_body, inner) {
            Ok(p) => {
                let e = p.into_inner().next().expect("expr");
                self.expr(e, inner.start as usize)
            }
            Err(e) => {
                if !quiet {
                    self.error(self.pest_error(e, inner, "{{ }}"));
                }
                Expr { kind: ExprKind::Error, span: inner }
            }
        }
    }

    /// Parses a statement tag's inside. `quiet` suppresses parse errors (the
    /// tag was unterminated, which is already reported).
    fn stmt_item(&self, inner: Span, tag: Span, quiet: bool) -> Option<Item> {
        let content = &self.text[inner.range()];
        let head = head_word(content);
        if content.trim().is_empty() {
            if !quiet {
                self.error(
                    self.diag(Code::EmptyTag, tag, "this `{% %}` tag is empty")
                        .with_help("write a statement inside, such as `{% gen answer %}`"),
                );
            }
            return None;
        }
        let known = STATEMENTS.contains(&head) || head.strip_prefix("end").is_some_and(|b| BLOCK_NAMES.contains(&b));
        if !known {
            let lead = content.len() - content.trim_start().len();
            // No word: point at the first character, whatever its width.
            let first = content.trim_start().chars().next().map_or(0, char::len_utf8);
            let len = if head.is_empty() { first } else { head.len() };
            let word_span = Span::new(inner.start as usize + lead, inner.start as usize + lead + len);
            if head == "endraw" {
                self.error(
                    self.diag(Code::StrayEnd, tag, "`endraw` without a `{% raw %}` before it")
                        .with_help("remove it, or open the raw block with `{% raw %}`"),
                );
                return None;
            }
            if !quiet {
                self.error(unknown_statement(self.file, head, word_span));
            }
            return None;
        }
        let pair = match self.parse_rule(Rule::stmt_body, inner) {
            Ok(p) => p.into_inner().next().expect("stmt"),
            Err(e) => {
                if !quiet {
                    self.error(self.pest_error(e, inner, head));
                }
                return broken_item(head, inner, tag);
            }
        };
        let base = inner.start as usize;
        let rule = pair.as_rule();
        let mut parts = pair.into_inner().filter(|p| !is_keyword(p.as_rule())).peekable();
        let item = match rule {
            Rule::gen_stmt => {
                let target = parts.next_if(|p| p.as_rule() == Rule::gen_target).map(|p| self.target(p, base));
                let options = parts.map(|p| self.option(p, base)).collect();
                Item::Node(Node::Gen(Gen { target, options, span: tag }))
            }
            Rule::select_stmt => {
                let target = parts.next_if(|p| p.as_rule() == Rule::gen_target).map(|p| self.target(p, base));
                let list = parts.next_if(|p| p.as_rule() == Rule::expr).map(|p| self.expr(p, base));
                let options = parts.map(|p| self.option(p, base)).collect();
                match list {
                    Some(list) => Item::Node(Node::Select(Select {
                        target,
                        options,
                        choices: Choices::List(list),
                        open: tag,
                        span: tag,
                    })),
                    None => Item::Open(Opener::Select { target, options }, tag),
                }
            }
            Rule::or_stmt => Item::Or(tag),
            Rule::role_stmt => Item::Open(Opener::Role(RoleName::Expr(self.expr(parts.next()?, base))), tag),
            Rule::role_short => {
                let role = match head {
                    "system" => RoleName::System,
                    "user" => RoleName::User,
                    _ => RoleName::Assistant,
                };
                Item::Open(Opener::Role(role), tag)
            }
            Rule::capture_stmt => Item::Open(Opener::Capture(self.target(parts.next()?, base)), tag),
            Rule::hidden_stmt => Item::Open(Opener::Hidden, tag),
            Rule::set_stmt => {
                let target = self.target(parts.next()?, base);
                let value = self.expr(parts.next()?, base);
                Item::Node(Node::Set { target, value, span: tag })
            }
            Rule::if_stmt => Item::Open(Opener::If(self.expr(parts.next()?, base)), tag),
            Rule::elif_stmt => Item::Elif(self.expr(parts.next()?, base), tag),
            Rule::else_stmt => Item::Else(tag),
            Rule::for_stmt => {
                let mut vars = Vec::new();
                let mut iter = None;
                for p in parts {
                    match p.as_rule() {
                        Rule::ident => vars.push(self.ident(p, base)),
                        _ => iter = Some(self.expr(p, base)),
                    }
                }
                Item::Open(Opener::For { vars, iter: iter? }, tag)
            }
            Rule::def_stmt => {
                let name = self.ident(parts.next()?, base);
                let params = parts.map(|p| self.param(p, base)).collect();
                Item::Open(Opener::Def { name, params }, tag)
            }
            Rule::import_stmt => {
                let path = parts.next()?;
                let path_span = span_of(&path, base);
                let path_value = self.string(path, base).unwrap_or_default();
                let alias = self.ident(parts.next()?, base);
                Item::Node(Node::Import(Import { path: path_value, path_span, alias, span: tag }))
            }
            Rule::input_stmt => {
                let params = parts.map(|p| self.param(p, base)).collect();
                Item::Node(Node::Input { params, span: tag })
            }
            Rule::raw_stmt => {
                // `{% raw %}` is handled while scanning; reaching here means
                // it carried trim markers in an odd place: treat as empty.
                return None;
            }
            Rule::end_stmt => {
                let name = parts.next().map(|p| {
                    let s = p.as_str();
                    s.strip_prefix("end").unwrap_or(s).trim().to_string()
                });
                Item::End(name, tag)
            }
            // A grammar tag whose `%}` is missing (reported): its body was
            // not read as GBNF, and the block is skipped.
            Rule::grammar_stmt => return None,
            other => unreachable!("statement rule {other:?}"),
        };
        Some(item)
    }

    // ------------------------------------------------------------ pieces

    fn ident(&self, p: Pair<'_, Rule>, base: usize) -> Ident {
        Ident { name: p.as_str().to_string(), span: span_of(&p, base) }
    }

    fn target(&self, p: Pair<'_, Rule>, base: usize) -> Target {
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().expect("target name"), base);
        Target { name, append: inner.next().is_some() }
    }

    fn option(&self, p: Pair<'_, Rule>, base: usize) -> GenOption {
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().expect("option name"), base);
        let value = self.expr(inner.next().expect("option value"), base);
        GenOption { name, value }
    }

    fn param(&self, p: Pair<'_, Rule>, base: usize) -> Param {
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().expect("param name"), base);
        let default = inner.next().map(|e| self.expr(e, base));
        Param { name, default }
    }

    fn string(&self, p: Pair<'_, Rule>, base: usize) -> Option<String> {
        match literal::decode(p.as_str()) {
            Ok(s) => Some(s),
            Err(e) => {
                let start = p.as_span().start() + base;
                self.error(
                    self.diag(Code::InvalidEscape, Span::new(start + e.start, start + e.end), e.message)
                        .with_help("write a literal backslash as `\\\\`, or use a raw string `r\"…\"`"),
                );
                None
            }
        }
    }

    /// Builds an expression, cutting it (with one error) past the nesting limit.
    fn expr(&self, p: Pair<'_, Rule>, base: usize) -> Expr {
        let depth = self.depth.get();
        // Operator and postfix chains build one tree level per operator.
        let width = match p.as_rule() {
            Rule::binary | Rule::postfix => p.clone().into_inner().count(),
            _ => 0,
        };
        if depth >= super::MAX_NESTING || width > 2 * super::MAX_NESTING {
            let span = span_of(&p, base);
            self.error(
                self.diag(Code::TooDeep, span, format!("this expression nests deeper than {}", super::MAX_NESTING))
                    .with_help("split it into several `{% set %}` steps"),
            );
            return Expr { kind: ExprKind::Error, span };
        }
        self.depth.set(depth + 1);
        let e = self.expr_inner(p, base);
        self.depth.set(depth);
        e
    }

    fn expr_inner(&self, p: Pair<'_, Rule>, base: usize) -> Expr {
        match p.as_rule() {
            Rule::expr => {
                let span = span_of(&p, base);
                let mut inner = p.into_inner().filter(|c| !is_keyword(c.as_rule()));
                let first = self.expr(inner.next().expect("binary"), base);
                match (inner.next(), inner.next()) {
                    (Some(cond), Some(otherwise)) => Expr {
                        kind: ExprKind::Cond {
                            cond: Box::new(self.expr(cond, base)),
                            then: Box::new(first),
                            otherwise: Box::new(self.expr(otherwise, base)),
                        },
                        span,
                    },
                    _ => first,
                }
            }
            Rule::binary => self.binary(p, base),
            Rule::postfix => self.postfix(p, base),
            _ => self.primary(p, base),
        }
    }

    fn binary(&self, p: Pair<'_, Rule>, base: usize) -> Expr {
        PRATT
            .map_primary(|p| self.expr(p, base))
            .map_prefix(|op, rhs| {
                let kind = match op.as_rule() {
                    Rule::op_not => UnaryOp::Not,
                    Rule::op_neg => UnaryOp::Neg,
                    _ => UnaryOp::Pos,
                };
                let span = span_of(&op, base).to(rhs.span);
                Expr { kind: ExprKind::Unary(kind, Box::new(rhs)), span }
            })
            .map_infix(|lhs, op, rhs| {
                let kind = match op.as_rule() {
                    Rule::op_or => BinaryOp::Or,
                    Rule::op_and => BinaryOp::And,
                    Rule::op_not_in => BinaryOp::NotIn,
                    Rule::op_in => BinaryOp::In,
                    Rule::op_eq => BinaryOp::Eq,
                    Rule::op_ne => BinaryOp::Ne,
                    Rule::op_le => BinaryOp::Le,
                    Rule::op_ge => BinaryOp::Ge,
                    Rule::op_lt => BinaryOp::Lt,
                    Rule::op_gt => BinaryOp::Gt,
                    Rule::op_concat => BinaryOp::Concat,
                    Rule::op_add => BinaryOp::Add,
                    Rule::op_sub => BinaryOp::Sub,
                    Rule::op_pow => BinaryOp::Pow,
                    Rule::op_floordiv => BinaryOp::FloorDiv,
                    Rule::op_mul => BinaryOp::Mul,
                    Rule::op_div => BinaryOp::Div,
                    _ => BinaryOp::Mod,
                };
                let span = lhs.span.to(rhs.span);
                Expr { kind: ExprKind::Binary(kind, Box::new(lhs), Box::new(rhs)), span }
            })
            .parse(p.into_inner())
    }

    fn postfix(&self, p: Pair<'_, Rule>, base: usize) -> Expr {
        let mut inner = p.into_inner();
        let mut e = self.expr(inner.next().expect("primary"), base);
        for op in inner {
            let span = e.span.to(span_of(&op, base));
            let rule = op.as_rule();
            let mut parts = op.into_inner();
            let kind = match rule {
                Rule::attr => ExprKind::Attr(Box::new(e), self.ident(parts.next().expect("attr"), base)),
                Rule::index => {
                    let i = parts.next().expect("index");
                    if i.as_rule() == Rule::slice {
                        let mut bounds = i
                            .into_inner()
                            .map(|part| part.into_inner().next().map(|x| Box::new(self.expr(x, base))));
                        ExprKind::Slice {
                            value: Box::new(e),
                            start: bounds.next().flatten(),
                            stop: bounds.next().flatten(),
                            step: bounds.next().flatten(),
                        }
                    } else {
                        ExprKind::Index(Box::new(e), Box::new(self.expr(i, base)))
                    }
                }
                Rule::call_args => ExprKind::Call(Box::new(e), self.args(parts, base)),
                Rule::filter => {
                    let name = self.ident(parts.next().expect("filter name"), base);
                    let args = parts.next().map(|a| self.args(a.into_inner(), base)).unwrap_or_default();
                    ExprKind::Filter(Box::new(e), name, args)
                }
                Rule::test => {
                    let mut parts = parts.filter(|c| c.as_rule() != Rule::kw_is).peekable();
                    let negated = parts.next_if(|c| c.as_rule() == Rule::negation).is_some();
                    let name = self.ident(parts.next().expect("test name"), base);
                    let args = parts.next().map(|a| self.args(a.into_inner(), base)).unwrap_or_default();
                    ExprKind::Test { value: Box::new(e), name, args, negated }
                }
                other => unreachable!("postfix rule {other:?}"),
            };
            e = Expr { kind, span };
        }
        e
    }

    fn args(&self, pairs: pest::iterators::Pairs<'_, Rule>, base: usize) -> Vec<Arg> {
        pairs
            .map(|arg| {
                let a = arg.into_inner().next().expect("arg");
                if a.as_rule() == Rule::kwarg {
                    let mut kv = a.into_inner();
                    let name = self.ident(kv.next().expect("kwarg name"), base);
                    Arg { name: Some(name), value: self.expr(kv.next().expect("kwarg value"), base) }
                } else {
                    Arg { name: None, value: self.expr(a, base) }
                }
            })
            .collect()
    }

    fn primary(&self, p: Pair<'_, Rule>, base: usize) -> Expr {
        let span = span_of(&p, base);
        let kind = match p.as_rule() {
            Rule::int => match p.as_str().parse::<i64>() {
                Ok(n) => ExprKind::Int(n),
                Err(_) => {
                    self.error(
                        self.diag(Code::InvalidNumber, span, "this integer does not fit in 64 bits")
                            .with_help("integers range from -9223372036854775808 to 9223372036854775807"),
                    );
                    ExprKind::Error
                }
            },
            Rule::float => match p.as_str().parse::<f64>() {
                Ok(f) if f.is_finite() => ExprKind::Float(f),
                _ => {
                    self.error(self.diag(Code::InvalidNumber, span, "this number is too large"));
                    ExprKind::Error
                }
            },
            Rule::string => self.string(p, base).map(ExprKind::Str).unwrap_or(ExprKind::Error),
            Rule::bool_true => ExprKind::Bool(true),
            Rule::bool_false => ExprKind::Bool(false),
            Rule::none => ExprKind::None,
            Rule::ident => ExprKind::Name(p.as_str().to_string()),
            Rule::paren => return self.expr(p.into_inner().next().expect("paren"), base),
            Rule::list => ExprKind::List(p.into_inner().map(|e| self.expr(e, base)).collect()),
            Rule::map => ExprKind::Map(
                p.into_inner()
                    .map(|pair| {
                        let mut kv = pair.into_inner();
                        let k = self.expr(kv.next().expect("key"), base);
                        let v = self.expr(kv.next().expect("value"), base);
                        (k, v)
                    })
                    .collect(),
            ),
            Rule::bad_string => {
                let quote = Span::new(span.start as usize, span.start as usize + 1 + p.as_str().starts_with('r') as usize);
                self.error(
                    self.diag(Code::UnterminatedString, quote, "this string is never closed")
                        .with_label("string starts here")
                        .with_help("close the string with a matching quote on the same line; write a newline as `\\n`"),
                );
                ExprKind::Error
            }
            other => unreachable!("primary rule {other:?}"),
        };
        Expr { kind, span }
    }

    // ------------------------------------------------------------ errors

    /// Turns a pest error inside a tag into a diagnostic that says what was
    /// found and what could come there.
    fn pest_error(&self, e: pest::error::Error<Rule>, inner: Span, what: &str) -> Diagnostic {
        let content = &self.text[inner.range()];
        // pest gives up on very deep brackets with a generic error.
        if bracket_depth(content) > super::MAX_NESTING {
            return self
                .diag(Code::TooDeep, inner, format!("brackets nest deeper than {} in this tag", super::MAX_NESTING))
                .with_help("split the expression into several `{% set %}` steps");
        }
        let pos = match e.location {
            pest::error::InputLocation::Pos(p) => p,
            pest::error::InputLocation::Span((a, _)) => a,
        };
        let pos = crate::span::floor_char_boundary(content, pos);
        let (skip, found) = found_token(&content[pos..]);
        let pos = pos + skip;
        let mut expected: Vec<String> = Vec::new();
        let mut has_operator = false;
        if let pest::error::ErrorVariant::ParsingError { positives, .. } = &e.variant {
            for r in positives {
                if is_operator(*r) {
                    has_operator = true;
                } else if let Some(d) = describe(*r) {
                    expected.push(d.to_string());
                }
            }
        }
        if let Some(attempts) = e.parse_attempts() {
            // `ParsingToken` is not exported; its text is the token itself
            // (ranges print as `a..z`, built-in rules as `BUILTIN_RULE`).
            for token in attempts.expected_tokens().iter().map(|t| t.to_string()) {
                if OPERATOR_TOKENS.contains(&token.as_str()) {
                    has_operator = true;
                } else if !token.trim().is_empty()
                    && !token.contains("..")
                    && !token.chars().all(|c| c.is_ascii_alphabetic() || c == '_')
                {
                    expected.push(format!("`{token}`"));
                }
            }
        }
        if expected.iter().any(|e| e == "an expression" || e == "an argument") {
            // `"`, `[`, `(`… are how an expression starts: already said.
            expected.retain(|e| !EXPR_START_TOKENS.contains(&e.as_str()));
        }
        // Where an operand is missing, an operator cannot come either.
        if has_operator && !expected.iter().any(|e| e == "an expression") {
            expected.push("an operator".into());
        }
        let mut seen = std::collections::HashSet::new();
        expected.retain(|e| seen.insert(e.clone()));
        let start = inner.start as usize + pos;
        let at_end = found.is_empty();
        let span = Span::new(start, start + found.len());
        let message = if at_end {
            format!("the `{what}` tag ends too early")
        } else {
            format!("unexpected `{found}` in this `{what}` tag")
        };
        let label = if expected.is_empty() { "not expected here".to_string() } else { format!("expected {}", join_or(&expected)) };
        let mut d = self.diag(Code::Syntax, span, message).with_label(label);
        if let Some(help) = syntax_help(what, content, pos) {
            d = d.with_help(help);
        }
        d
    }
}

/// Parses `s` again with pest's error detail on, so the error lists the
/// literal tokens expected (`=`, `)`), not only rules. The flag is global
/// and tracking slows every parse by a third, so it is on only here, under a
/// lock: concurrent failing parses then always get the same detail.
fn parse_with_detail(rule: Rule, s: &str) -> pest::error::Error<Rule> {
    static DETAIL: Mutex<()> = Mutex::new(());
    let _guard = DETAIL.lock().unwrap_or_else(|e| e.into_inner());
    pest::set_error_detail(true);
    let result = LmtParser::parse(rule, s);
    pest::set_error_detail(false);
    match result {
        Err(e) => e,
        // Cannot happen (parsing is deterministic); degrade to a plain error.
        Ok(_) => pest::error::Error::new_from_pos(
            pest::error::ErrorVariant::CustomError { message: "syntax error".into() },
            pest::Position::from_start(s),
        ),
    }
}

/// The item a statement that failed to parse still stands for, so block
/// matching stays in step.
fn broken_item(head: &str, inner: Span, tag: Span) -> Option<Item> {
    let err = || Expr { kind: ExprKind::Error, span: inner };
    let placeholder = || Ident { name: String::new(), span: inner };
    let opener = match head {
        "select" => Opener::Select { target: None, options: Vec::new() },
        "role" => Opener::Role(RoleName::Expr(err())),
        "system" => Opener::Role(RoleName::System),
        "user" => Opener::Role(RoleName::User),
        "assistant" => Opener::Role(RoleName::Assistant),
        "capture" => Opener::Capture(Target { name: placeholder(), append: false }),
        "hidden" => Opener::Hidden,
        "if" => Opener::If(err()),
        "for" => Opener::For { vars: Vec::new(), iter: err() },
        "def" => Opener::Def { name: placeholder(), params: Vec::new() },
        "elif" => return Some(Item::Elif(err(), tag)),
        "else" => return Some(Item::Else(tag)),
        "or" => return Some(Item::Or(tag)),
        "end" => return Some(Item::End(None, tag)),
        h if h.starts_with("end") => return Some(Item::End(Some(h[3..].to_string()), tag)),
        _ => return None,
    };
    Some(Item::Open(opener, tag))
}

fn unknown_statement(file: FileId, head: &str, span: Span) -> Diagnostic {
    let message = if head.is_empty() {
        "a statement tag must start with a statement keyword".to_string()
    } else {
        format!("unknown statement `{head}`")
    };
    let d = Diagnostic::new(Code::UnknownStatement, file, span, message).with_label("not a statement");
    let help = match head {
        "elseif" | "elsif" => Some("write `{% elif condition %}`".to_string()),
        "macro" | "function" | "fn" => Some("define a function with `{% def name(params) %}…{% end %}`".to_string()),
        "let" | "var" => Some("assign with `{% set name = value %}`".to_string()),
        "include" | "from" => Some("use `{% import \"path\" as name %}`".to_string()),
        "generate" | "complete" => Some("generate text with `{% gen name %}`".to_string()),
        "choose" | "choice" | "choices" | "oneof" => Some("choose with `{% select name %}a{% or %}b{% end %}`".to_string()),
        "endblock" | "endmacro" | "endcall" => Some("close blocks with `{% end %}`".to_string()),
        _ => crate::diagnostic::suggest(head, STATEMENTS.iter().copied())
            .map(|s| format!("did you mean `{s}`?"))
            .or_else(|| {
                (!head.is_empty()).then(|| format!("to insert the value of `{head}`, write `{{{{ {head} }}}}`"))
            }),
    };
    match help {
        Some(h) => d.with_help(h),
        None => d.with_help(format!("statements are: {}", STATEMENTS.join(", "))),
    }
}

fn syntax_help(what: &str, content: &str, pos: usize) -> Option<String> {
    let before = content[..pos].trim_end();
    let rest = &content[pos..];
    if matches!(what, "if" | "elif" | "{{ }}") && rest.starts_with('=') && !rest.starts_with("==") {
        return Some("to compare, write `==`; `=` only assigns, in `{% set name = value %}`".into());
    }
    if let Some(at) = content[..pos].rfind("regex=") {
        let value = content[at + 6..].trim_start();
        if !value.starts_with(['"', '\'', 'r']) {
            return Some("write the regex as a string: `regex=\"[a-z]+\"`".into());
        }
    }
    if (what == "gen" || what == "select") && before.ends_with('=') {
        return Some("give the option a value, such as `max_tokens=50` or `stop=\"\\n\"`".into());
    }
    if what == "set" && !content.contains('=') {
        return Some("write `{% set name = value %}`".into());
    }
    if what == "for" && !content.split_whitespace().any(|w| w == "in") {
        return Some("write `{% for item in items %}`".into());
    }
    if what == "import" {
        return Some("write `{% import \"std/json\" as json %}` (a quoted path, then `as` and a name)".into());
    }
    if what == "def" {
        return Some("write `{% def name(param, other=\"default\") %}`".into());
    }
    None
}

static PRATT: LazyLock<PrattParser<Rule>> = LazyLock::new(|| {
    PrattParser::new()
        .op(Op::infix(Rule::op_or, Assoc::Left))
        .op(Op::infix(Rule::op_and, Assoc::Left))
        .op(Op::prefix(Rule::op_not))
        .op(Op::infix(Rule::op_eq, Assoc::Left)
            | Op::infix(Rule::op_ne, Assoc::Left)
            | Op::infix(Rule::op_lt, Assoc::Left)
            | Op::infix(Rule::op_le, Assoc::Left)
            | Op::infix(Rule::op_gt, Assoc::Left)
            | Op::infix(Rule::op_ge, Assoc::Left)
            | Op::infix(Rule::op_in, Assoc::Left)
            | Op::infix(Rule::op_not_in, Assoc::Left))
        .op(Op::infix(Rule::op_concat, Assoc::Left))
        .op(Op::infix(Rule::op_add, Assoc::Left) | Op::infix(Rule::op_sub, Assoc::Left))
        .op(Op::infix(Rule::op_mul, Assoc::Left)
            | Op::infix(Rule::op_div, Assoc::Left)
            | Op::infix(Rule::op_floordiv, Assoc::Left)
            | Op::infix(Rule::op_mod, Assoc::Left))
        .op(Op::prefix(Rule::op_neg) | Op::prefix(Rule::op_pos))
        .op(Op::infix(Rule::op_pow, Assoc::Right))
});

const EXPR_START_TOKENS: &[&str] = &["`\"`", "`'`", "`r\"`", "`r'`", "`{`", "`[`", "`(`", "`-`", "`+`"];

const OPERATOR_TOKENS: &[&str] =
    &["==", "!=", "<=", ">=", "<", ">", "~", "+", "-", "**", "//", "*", "/", "%", "|", ".", "[", "("];

fn is_operator(r: Rule) -> bool {
    use Rule::*;
    matches!(
        r,
        op_or | op_and | op_not_in | op_in | op_eq | op_ne | op_le | op_ge | op_lt | op_gt | op_concat | op_add
            | op_sub | op_pow | op_floordiv | op_mul | op_div | op_mod | attr | index | call_args | filter | test
            | kw_is
    )
}

fn is_keyword(r: Rule) -> bool {
    use Rule::*;
    matches!(
        r,
        kw_gen | kw_select | kw_or | kw_role | kw_system | kw_user | kw_assistant | kw_capture | kw_hidden | kw_set
            | kw_if | kw_elif | kw_else | kw_for | kw_in | kw_def | kw_import | kw_as | kw_grammar | kw_input
            | kw_raw | kw_end
    )
}

/// What a rule stands for in "expected …" messages.
fn describe(r: Rule) -> Option<&'static str> {
    use Rule::*;
    Some(match r {
        expr | binary | postfix | paren | list | map | float | int | string | raw_string | dq_string | sq_string
        | bool_true | bool_false | none | bad_string | op_not | op_neg | op_pos | slice | slice_part => "an expression",
        ident | target | gen_target => "a name",
        option => "an option such as `max_tokens=50`",
        param => "a parameter name",
        pair => "a `key: value` pair",
        arg | kwarg => "an argument",
        block_name => "a block name",
        EOI => "the end of the tag",
        kw_in => "`in`",
        kw_as => "`as`",
        kw_else => "`else`",
        _ => return None,
    })
}

fn join_or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}

/// The deepest nesting of `(`, `[` and `{` in `s`, outside string literals.
fn bracket_depth(s: &str) -> usize {
    let (mut depth, mut max, mut quote) = (0usize, 0usize, None);
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => {
                depth += 1;
                max = max.max(depth);
            }
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The token at the start of `s` after white space: a word or one
/// character. Returns how much white space came first, and the token.
fn found_token(s: &str) -> (usize, &str) {
    let skip = s.len() - s.trim_start().len();
    let s = &s[skip..];
    let Some(c) = s.chars().next() else { return (skip, "") };
    let len = if c.is_alphanumeric() || c == '_' {
        s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len())
    } else {
        c.len_utf8()
    };
    (skip, &s[..len])
}

/// The first word of a tag's inside (`gen`, `endfor`, …).
fn head_word(content: &str) -> &str {
    let s = content.trim_start();
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

fn trims(p: &Pair<'_, Rule>) -> (bool, bool) {
    let mut l = false;
    let mut r = false;
    for c in p.clone().into_inner() {
        match c.as_rule() {
            Rule::trim_l => l = true,
            Rule::trim_r => r = true,
            _ => {}
        }
    }
    (l, r)
}

fn span_of(p: &Pair<'_, Rule>, base: usize) -> Span {
    let s = p.as_span();
    Span::new(base + s.start(), base + s.end())
}
