//! Editor features on a checked workspace, as plain data with byte offsets:
//! what is defined where, what the cursor is on (hover), what may be typed
//! next (completion), where a name comes from (definition), and the outline.
//! The protocol layer (`super`) converts offsets to LSP positions.

use crate::builtins;
use crate::options::OptionSpec;
use crate::span::{FileId, Span};
use crate::syntax::ast::Node;
use crate::workspace::Workspace;

/// Statement keywords with one line of documentation: the one list that
/// completion, hover and the TextMate grammar's keyword scope share.
pub const KEYWORDS: &[(&str, &str)] = &[
    ("gen", "`{% gen name options %}` — generate a value (constrained by regex, grammar, json, stop…) and capture it."),
    ("select", "`{% select name %}…{% or %}…{% end %}` or `{% select name in list %}` — choose one option by its likelihood."),
    ("or", "Separates the options of a `select` block."),
    ("system", "`{% system %}…{% end %}` — a system message, rendered by the model's chat template."),
    ("user", "`{% user %}…{% end %}` — a user message, rendered by the model's chat template."),
    ("assistant", "`{% assistant %}…{% end %}` — an assistant message; generation inside ends at the end of turn."),
    ("role", "`{% role expr %}…{% end %}` — a message of the role the expression names."),
    ("capture", "`{% capture name %}…{% end %}` — capture the text (prompt and generated) of the block."),
    ("hidden", "`{% hidden %}…{% end %}` — run the block but keep it out of the prompt afterwards (scratchpads)."),
    ("set", "`{% set name = expr %}` — assign a variable (`name[]` appends to a list)."),
    ("if", "`{% if cond %}…{% elif cond %}…{% else %}…{% end %}` — conditional text."),
    ("elif", "Another condition of an `if` block."),
    ("else", "The fallback branch of an `if` or `for` block."),
    ("for", "`{% for x in list %}…{% end %}` — repeat the block; `loop.index` and friends inside."),
    ("def", "`{% def name(params) %}…{% end %}` — a reusable template fragment, called as `{{ name(args) }}`."),
    ("import", "`{% import \"path\" as name %}` — definitions of another file (`std/…` for the standard library)."),
    ("grammar", "`{% grammar name %}GBNF rules{% end %}` — a grammar for `gen … grammar=name`."),
    ("input", "`{% input a, b=default %}` — the variables the template takes from `--var`."),
    ("raw", "`{% raw %}…{% endraw %}` — text taken literally, tags and all."),
    ("end", "Closes the innermost open block."),
];

pub use crate::syntax::defs::DefKind;

/// A definition in a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// The name.
    pub name: String,
    /// What it is.
    pub kind: DefKind,
    /// Where the name is written.
    pub name_span: Span,
    /// The whole construct (for the outline).
    pub span: Span,
    /// Where it is visible: the whole file, or a `for`/`def` body.
    pub scope: Span,
    /// The imported file, for imports.
    pub target: Option<FileId>,
}

/// Every definition in the root file, in source order (the one
/// definitions pass, `syntax::defs`, with imports resolved to their files).
pub fn definitions(ws: &Workspace) -> Vec<Definition> {
    let m = ws.module(ws.root);
    let file_len = ws.sources.get(ws.root).text.len();
    crate::syntax::defs::definitions(&m.template.body, Span::new(0, file_len))
        .into_iter()
        .map(|d| Definition {
            name: d.name.to_string(),
            kind: d.kind,
            name_span: d.name_span,
            span: d.span,
            scope: d.scope,
            target: match d.node {
                Node::Import(i) if d.kind == DefKind::Import => m.imports.iter().find(|(p, _)| *p == i.path).map(|(_, f)| *f),
                _ => None,
            },
        })
        .collect()
}

/// Where the cursor is, as far as editing goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Context {
    /// Prompt text, outside any tag.
    Text,
    /// Right after `{%`, where a statement keyword goes.
    Keyword,
    /// Inside a `gen` or `select` tag, where an option name may go.
    Options {
        /// True for `select`.
        select: bool,
    },
    /// Right after `|`: a filter name.
    Filter,
    /// Inside the string of an `import`.
    ImportPath,
    /// Anywhere else in a tag: an expression.
    Expr,
}

/// The context of `offset` in `text`.
pub fn context_at(text: &str, offset: usize) -> Context {
    let offset = crate::span::floor_char_boundary(text, offset);
    let before = &text[..offset];
    let open_stmt = before.rfind("{%");
    let open_expr = before.rfind("{{");
    let close = before.rfind("%}").into_iter().chain(before.rfind("}}")).max();
    let (start, stmt) = match (open_stmt, open_expr) {
        (Some(s), Some(e)) if e > s => (e, false),
        (Some(s), _) => (s, true),
        (None, Some(e)) => (e, false),
        (None, None) => return Context::Text,
    };
    if close.is_some_and(|c| c > start) {
        return Context::Text;
    }
    let inside = before[start + 2..].trim_start_matches('-');
    let word_start = ident_start(inside);
    let head = inside[..word_start].trim_end();
    if stmt && head.is_empty() {
        return Context::Keyword;
    }
    if inside.matches('"').count() % 2 == 1 {
        let first = inside.split_whitespace().next().unwrap_or("");
        return if stmt && first == "import" { Context::ImportPath } else { Context::Text };
    }
    if head.ends_with('|') {
        return Context::Filter;
    }
    let first = inside.split_whitespace().next().unwrap_or("");
    if stmt && (first == "gen" || first == "select") && !head.ends_with('=') && !in_brackets(inside) {
        return Context::Options { select: first == "select" };
    }
    Context::Expr
}

/// True when `s` has an unclosed `[`, `(` or `{`.
fn in_brackets(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth -= 1,
            _ => {}
        }
    }
    depth > 0
}

/// True for characters of names.
pub fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where the name that `s` ends with starts (a byte offset on a character
/// boundary, also after a multi-byte character such as an emoji).
pub fn ident_start(s: &str) -> usize {
    s.char_indices().rev().find(|&(_, c)| !is_ident_char(c)).map_or(0, |(i, c)| i + c.len_utf8())
}

/// The name under (or just before) `offset`, with its span.
pub fn word_at(text: &str, offset: usize) -> Option<(String, Span)> {
    let offset = crate::span::floor_char_boundary(text, offset);
    let start = ident_start(&text[..offset]);
    let end = text[offset..].find(|c: char| !is_ident_char(c)).map(|i| offset + i).unwrap_or(text.len());
    (start < end).then(|| (text[start..end].to_string(), Span::new(start, end)))
}

/// One completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// What is inserted.
    pub label: String,
    /// What it is (keyword, option, filter…).
    pub kind: &'static str,
    /// A line of detail (type, default).
    pub detail: String,
    /// Documentation.
    pub doc: String,
}

/// What may be typed at `offset` of the root file.
pub fn completions(ws: &Workspace, offset: usize) -> Vec<Completion> {
    let text = &ws.sources.get(ws.root).text;
    let c = |label: &str, kind, detail: String, doc: &str| Completion { label: label.into(), kind, detail, doc: doc.into() };
    match context_at(text, offset) {
        Context::Text => Vec::new(),
        Context::Keyword => KEYWORDS.iter().map(|(k, d)| c(k, "keyword", String::new(), d)).collect(),
        Context::Options { select } => {
            let opts = crate::options::table(select);
            opts.iter().map(|o| c(o.name, "option", format!("{} = {}", o.ty, o.default.display()), o.doc)).collect()
        }
        Context::Filter => builtins::FILTERS.iter().map(|b| c(b.name, "filter", signature(b), b.doc)).collect(),
        Context::ImportPath => crate::stdlib::names().map(|n| c(n, "module", "standard library".into(), "")).collect(),
        Context::Expr => {
            let mut out: Vec<Completion> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for d in definitions(ws) {
                let visible = d.scope.range().start <= offset && offset <= d.scope.range().end;
                if visible && !matches!(d.kind, DefKind::Role | DefKind::Rule) && seen.insert(d.name.clone()) {
                    out.push(c(&d.name, d.kind.describe(), String::new(), ""));
                }
            }
            out.extend(builtins::FUNCTIONS.iter().map(|b| c(b.name, "function", signature(b), b.doc)));
            out
        }
    }
}

/// A hover: markdown and the range it is about.
#[derive(Debug, Clone, PartialEq)]
pub struct Hover {
    /// Markdown.
    pub markdown: String,
    /// The word hovered.
    pub span: Span,
}

/// What to show for the cursor at `offset` of the root file.
pub fn hover(ws: &Workspace, offset: usize) -> Option<Hover> {
    let text = &ws.sources.get(ws.root).text;
    let (word, span) = word_at(text, offset)?;
    let ctx = context_at(text, span.range().start);
    if ctx == Context::Text {
        return None;
    }
    let after = text[span.range().end..].trim_start();
    let before = text[..span.range().start].trim_end();
    let md = |s: String| Some(Hover { markdown: s, span });
    if ctx == Context::Keyword {
        if let Some((k, d)) = KEYWORDS.iter().find(|(k, _)| *k == word) {
            return md(format!("**{k}**\n\n{d}"));
        }
    }
    if let Context::Options { select } = ctx {
        if after.starts_with('=') && !after.starts_with("==") {
            let opts = crate::options::table(select);
            if let Some(o) = opts.iter().find(|o| o.name == word) {
                return md(option_doc(o, select));
            }
        }
    }
    if before.ends_with('|') {
        if let Some(b) = builtins::filter(&word) {
            return md(format!("filter **{}**{}\n\n{}", b.name, signature(b), b.doc));
        }
    }
    if before.ends_with(" is") || before.ends_with(" is not") {
        if let Some(b) = builtins::test(&word) {
            return md(format!("test **{}**\n\n{}", b.name, b.doc));
        }
    }
    let defs = definitions(ws);
    if let Some((file, d)) = imported_definition(ws, &defs, text, span) {
        let src = ws.sources.get(file);
        let snippet = src.text[d.span.range()].lines().next().unwrap_or("").trim();
        return md(format!("{} **{}** from `{}`\n\n```lmt\n{snippet}\n```", d.kind.describe(), d.name, src.name));
    }
    if let Some(d) = visible_definition(&defs, &word, span.range().start) {
        let line = crate::span::LineIndex::new(text).line_of(d.name_span.range().start) + 1;
        let snippet = text[d.span.range()].lines().next().unwrap_or("").trim();
        return md(format!("{} **{}** — defined on line {line}\n\n```lmt\n{snippet}\n```", d.kind.describe(), d.name));
    }
    if after.starts_with('(') {
        if let Some((b, _)) = builtins::function(&word) {
            return md(format!("function **{}**{}\n\n{}", b.name, signature(b), b.doc));
        }
    }
    KEYWORDS.iter().find(|(k, _)| *k == word).and_then(|(k, d)| md(format!("**{k}**\n\n{d}")))
}

/// The definition of `name` visible at `offset`: the nearest enclosing
/// scope's last definition before it, else the first one anywhere (names
/// defined later in the file, which the checker reports when used early).
pub fn visible_definition<'a>(defs: &'a [Definition], name: &str, offset: usize) -> Option<&'a Definition> {
    let candidates = defs.iter().filter(|d| d.name == name && d.kind != DefKind::Role && d.scope.range().start <= offset && offset <= d.scope.range().end);
    let inner = candidates.clone().filter(|d| d.name_span.range().start <= offset).min_by_key(|d| (d.scope.len(), usize::MAX - d.name_span.range().start));
    inner.or_else(|| candidates.min_by_key(|d| d.name_span.range().start))
}

/// Where the thing at `offset` is defined: a file and a span in it.
pub fn definition(ws: &Workspace, offset: usize) -> Option<(FileId, Span)> {
    let text = &ws.sources.get(ws.root).text;
    let m = ws.module(ws.root);
    // An import's path: the imported file.
    for n in &m.template.body {
        if let Node::Import(i) = n {
            if i.path_span.range().start <= offset && offset <= i.path_span.range().end {
                let (_, f) = m.imports.iter().find(|(p, _)| *p == i.path)?;
                return Some((*f, Span::at(0)));
            }
        }
    }
    let (word, span) = word_at(text, offset)?;
    let defs = definitions(ws);
    if let Some((file, d)) = imported_definition(ws, &defs, text, span) {
        return Some((file, d.name_span));
    }
    let d = visible_definition(&defs, &word, span.range().start)?;
    Some((ws.root, d.name_span))
}

/// For `alias.name` at `span`: the file `alias` imports and `name`'s
/// definition in it.
fn imported_definition(ws: &Workspace, defs: &[Definition], text: &str, span: Span) -> Option<(FileId, Definition)> {
    let prefix = text[..span.range().start].strip_suffix('.')?;
    let (alias, _) = word_at(prefix, prefix.len())?;
    let imp = defs.iter().find(|d| d.kind == DefKind::Import && d.name == alias)?;
    let target = imp.target?;
    let sub = Workspace { root: target, ..ws.clone() };
    let name = &text[span.range()];
    let d = definitions(&sub).into_iter().find(|d| d.name == name && d.kind != DefKind::Rule)?;
    Some((target, d))
}

/// The outline: defs, grammars, captures, roles, inputs and imports.
pub fn symbols(ws: &Workspace) -> Vec<Definition> {
    definitions(ws).into_iter().filter(|d| !matches!(d.kind, DefKind::LoopVar | DefKind::Param | DefKind::Rule)).collect()
}

fn option_doc(o: &OptionSpec, select: bool) -> String {
    let tag = if select { "select" } else { "gen" };
    format!("`{tag}` option **{}**: {}\n\ndefault: {}\n\n{}", o.name, o.ty, o.default.display(), o.doc)
}

fn signature(b: &builtins::Builtin) -> String {
    if b.params.is_empty() {
        String::new()
    } else {
        format!("({})", b.params.join(", "))
    }
}
