//! The second parsing pass: matches block openers with their `end`s and
//! builds the tree. Every mismatch is reported and repaired (an unclosed
//! block is closed at the end of the file, a stray `end` is dropped), so the
//! checker always gets a whole tree.

use super::ast::*;
use super::parser::{Item, Opener};
use crate::diagnostic::{Code, Diagnostic};
use crate::span::{FileId, Span};

/// Builds the template tree from flat items.
pub(crate) fn build(items: Vec<Item>, file: FileId, text_len: usize, diags: &mut Vec<Diagnostic>) -> Template {
    let mut m = Matcher { file, root: Vec::new(), stack: Vec::new(), diags, ignored: 0 };
    for item in items {
        m.item(item);
    }
    while let Some(frame) = m.stack.pop() {
        let kw = frame.opener.keyword();
        m.diags.push(
            Diagnostic::new(Code::UnclosedBlock, file, frame.open, format!("this `{kw}` block is never closed"))
                .with_label(format!("`{kw}` opened here"))
                .with_help(format!("close it with `{{% end %}}` (or `{{% end {kw} %}}`)")),
        );
        m.close(frame, Span::at(text_len));
    }
    Template { body: m.root }
}

struct Frame {
    opener: Opener,
    open: Span,
    /// The nodes of the part being read (current branch, `if` arm, body).
    body: Vec<Node>,
    /// Finished select branches or `if`/`elif` arms.
    arms: Vec<(Option<Expr>, Vec<Node>, Span)>,
    /// Where the current part started.
    part_start: Span,
    /// The condition of the current `elif` arm (the `if` arm's is in the opener).
    part_cond: Option<Expr>,
    /// Set once `else` was seen: the body before it.
    before_else: Option<Vec<Node>>,
    else_span: Option<Span>,
}

struct Matcher<'d> {
    file: FileId,
    root: Vec<Node>,
    stack: Vec<Frame>,
    diags: &'d mut Vec<Diagnostic>,
    /// Openers past the nesting limit, dropped with their separators and `end`s.
    ignored: usize,
}

impl Matcher<'_> {
    fn push_node(&mut self, node: Node) {
        match self.stack.last_mut() {
            Some(f) => f.body.push(node),
            None => self.root.push(node),
        }
    }

    fn err(&mut self, code: Code, span: Span, msg: impl Into<String>) -> &mut Diagnostic {
        self.diags.push(Diagnostic::new(code, self.file, span, msg));
        self.diags.last_mut().expect("just pushed")
    }

    fn item(&mut self, item: Item) {
        if self.ignored > 0 {
            match item {
                Item::Open(..) => self.ignored += 1,
                Item::End(..) => self.ignored -= 1,
                _ => {}
            }
            return;
        }
        if let Item::Open(_, open) = &item {
            if self.stack.len() >= crate::syntax::MAX_NESTING {
                let limit = crate::syntax::MAX_NESTING;
                self.err(Code::TooDeep, *open, format!("blocks nest deeper than {limit} here"))
                    .help = Some("flatten the template: move inner parts into a `{% def %}`".into());
                self.ignored = 1;
                return;
            }
        }
        match item {
            Item::Node(n) => self.push_node(n),
            Item::Open(opener, open) => {
                // A role opened directly inside a role almost always means a
                // forgotten `{% end %}`: close the outer one here instead of
                // reporting every later role as nested too.
                if matches!(opener, Opener::Role(_)) {
                    if let Some(top) = self.stack.last().filter(|f| matches!(f.opener, Opener::Role(_))) {
                        let (kw, outer) = (top.opener.keyword(), top.open);
                        let inner = opener.keyword();
                        self.err(Code::NestedRole, open, format!("`{inner}` is opened inside the `{kw}` block"))
                            .with_secondary_mut(outer, format!("`{kw}` opened here"))
                            .help = Some(format!("close `{kw}` with `{{% end %}}` before opening `{inner}`; roles cannot nest"));
                        let frame = self.stack.pop().expect("role frame");
                        self.close(frame, Span::at(open.start as usize));
                    }
                }
                self.open(opener, open)
            }
            Item::Or(span) => self.or(span),
            Item::Elif(cond, span) => self.elif(cond, span),
            Item::Else(span) => self.else_(span),
            Item::End(name, span) => self.end(name, span),
        }
    }

    fn open(&mut self, opener: Opener, open: Span) {
        self.stack.push(Frame {
                opener,
                open,
                body: Vec::new(),
                arms: Vec::new(),
                part_start: open,
                part_cond: None,
                before_else: None,
                else_span: None,
            });
    }

    fn or(&mut self, span: Span) {
        match self.stack.last_mut() {
            Some(f) if matches!(f.opener, Opener::Select { .. }) => {
                let body = std::mem::take(&mut f.body);
                let part = f.part_start.to(span);
                f.arms.push((None, body, part));
                f.part_start = span;
            }
            top => {
                let inner = top.map(|f| (f.opener.keyword(), f.open));
                let select = self.stack.iter().rev().find(|f| matches!(f.opener, Opener::Select { .. })).map(|f| f.open);
                let d = self.err(Code::OrOutsideSelect, span, "`or` is not directly inside a `select`");
                match (select, inner) {
                    (Some(sel), Some((kw, open))) => {
                        d.label = format!("the `{kw}` block is still open here");
                        d.secondary.push(crate::diagnostic::Label {
                            file: d.file,
                            span: open,
                            message: format!("`{kw}` opened here"),
                        });
                        d.secondary.push(crate::diagnostic::Label {
                            file: d.file,
                            span: sel,
                            message: "the select".into(),
                        });
                        d.help = Some(format!("close the `{kw}` block with `{{% end %}}` before `{{% or %}}`"));
                    }
                    _ => {
                        d.help = Some(
                            "`{% or %}` separates the options of `{% select name %}a{% or %}b{% end %}`".into(),
                        );
                    }
                }
            }
        }
    }

    fn elif(&mut self, cond: Expr, span: Span) {
        match self.stack.last_mut() {
            Some(f) if matches!(f.opener, Opener::If(_)) && f.before_else.is_none() => {
                let body = std::mem::take(&mut f.body);
                let prev = f.part_cond.take();
                let part = f.part_start.to(span);
                f.arms.push((prev, body, part));
                f.part_cond = Some(cond);
                f.part_start = span;
            }
            Some(f) if matches!(f.opener, Opener::If(_)) => {
                let else_span = f.else_span.unwrap_or(f.open);
                self.err(Code::MisplacedElse, span, "`elif` after `else`")
                    .with_secondary_mut(else_span, "the `else` is here")
                    .help = Some("move this `elif` before the `else`".into());
            }
            _ => {
                self.err(Code::MisplacedElse, span, "`elif` outside an `if` block").help =
                    Some("`elif` belongs between `{% if … %}` and its `{% end %}`".into());
            }
        }
    }

    fn else_(&mut self, span: Span) {
        match self.stack.last_mut() {
            Some(f) if matches!(f.opener, Opener::If(_) | Opener::For { .. }) && f.before_else.is_none() => {
                f.before_else = Some(std::mem::take(&mut f.body));
                f.else_span = Some(span);
            }
            Some(f) if matches!(f.opener, Opener::If(_) | Opener::For { .. }) => {
                let first = f.else_span.unwrap_or(f.open);
                self.err(Code::MisplacedElse, span, "a second `else` in the same block")
                    .with_secondary_mut(first, "the first `else` is here")
                    .help = Some("a block has at most one `else`".into());
            }
            _ => {
                self.err(Code::MisplacedElse, span, "`else` outside an `if` or `for` block").help =
                    Some("`else` belongs between `{% if … %}` (or `{% for … %}`) and its `{% end %}`".into());
            }
        }
    }

    fn end(&mut self, name: Option<String>, span: Span) {
        let Some(top_kw) = self.stack.last().map(|f| f.opener.keyword()) else {
            let after_select_in = matches!(
                self.root.last(),
                Some(Node::Select(Select { choices: Choices::List(_), .. }))
            );
            let d = self.err(Code::StrayEnd, span, "this `end` has no open block to close");
            d.label = "nothing to close".into();
            d.help = Some(if after_select_in {
                "`{% select name in [...] %}` is a single tag with no `{% end %}`: remove this one".into()
            } else {
                "remove it, or open the block it was meant to close".into()
            });
            return;
        };
        let matches = |f: &Frame, n: &str| {
            let kw = f.opener.keyword();
            kw == n || (n == "role" && matches!(f.opener, Opener::Role(_)))
        };
        if let Some(n) = name.as_deref() {
            if n == "grammar" || n == "raw" {
                let d = self.err(Code::MismatchedEnd, span, format!("`end {n}` but no `{n}` block is open"));
                d.help = Some(format!("the innermost open block is `{top_kw}`"));
                return;
            }
            let top = self.stack.last().expect("checked above");
            if !matches(top, n) {
                if let Some(depth) = self.stack.iter().rposition(|f| matches(f, n)) {
                    // Blocks opened inside the named one were left open.
                    while self.stack.len() > depth + 1 {
                        let inner = self.stack.pop().expect("frame");
                        let kw = inner.opener.keyword();
                        self.err(Code::UnclosedBlock, inner.open, format!("this `{kw}` block is not closed before `end {n}`"))
                            .with_secondary_mut(span, format!("`end {n}` is here"))
                            .help = Some(format!("close the `{kw}` with `{{% end %}}` first"));
                        self.close(inner, span);
                    }
                } else {
                    let kw = top.opener.keyword();
                    let open = top.open;
                    self.err(Code::MismatchedEnd, span, format!("`end {n}` closes {} `{kw}` block", article(kw)))
                        .with_secondary_mut(open, format!("`{kw}` opened here"))
                        .help = Some(format!("write `{{% end %}}` or `{{% end {kw} %}}`"));
                }
            }
        }
        let frame = self.stack.pop().expect("frame");
        self.close(frame, span);
    }

    fn close(&mut self, mut f: Frame, end: Span) {
        let span = f.open.to(end);
        let open = f.open;
        let node = match f.opener {
            Opener::Select { target, options } => {
                let last = f.part_start.to(end);
                f.arms.push((None, f.body, last));
                let branches = f.arms.into_iter().map(|(_, body, span)| Branch { body, span }).collect();
                Node::Select(Select { target, options, choices: Choices::Branches(branches), open, span })
            }
            Opener::If(cond) => {
                let (body, else_body) = match f.before_else {
                    Some(before) => (before, Some(f.body)),
                    None => (f.body, None),
                };
                f.arms.push((f.part_cond.take(), body, f.part_start.to(end)));
                let mut arms = f.arms.into_iter();
                let (_, first_body, _) = arms.next().expect("if arm");
                let mut branches = vec![(cond, first_body)];
                branches.extend(arms.map(|(c, b, s)| (c.unwrap_or(Expr { kind: ExprKind::Error, span: s }), b)));
                Node::If(If { branches, else_body, open, span })
            }
            Opener::For { vars, iter } => {
                let (body, else_body) = match f.before_else {
                    Some(before) => (before, Some(f.body)),
                    None => (f.body, None),
                };
                Node::For(For { vars, iter, body, else_body, open, span })
            }
            Opener::Def { name, params } => Node::Def(Def { name, params, body: f.body, open, span }),
            Opener::Role(head) => Node::Role(Block { head, body: f.body, open, span }),
            Opener::Capture(head) => Node::Capture(Block { head, body: f.body, open, span }),
            Opener::Hidden => Node::Hidden(Block { head: (), body: f.body, open, span }),
        };
        self.push_node(node);
    }
}

trait SecondaryMut {
    fn with_secondary_mut(&mut self, span: Span, msg: impl Into<String>) -> &mut Self;
}

impl SecondaryMut for Diagnostic {
    fn with_secondary_mut(&mut self, span: Span, msg: impl Into<String>) -> &mut Self {
        self.secondary.push(crate::diagnostic::Label { file: self.file, span, message: msg.into() });
        self
    }
}

/// "a" or "an" before a block keyword.
fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}
