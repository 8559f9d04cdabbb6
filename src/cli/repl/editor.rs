//! The REPL's line editor helper: when an entry is complete, what to
//! complete at the cursor, and how tags are coloured. Pure functions of the
//! text, so they are tested without a terminal; rustyline calls them
//! through [`ReplHelper`].

use std::borrow::Cow;

use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::highlight::{CmdKind, Highlighter};
use rustyline::hint::Hinter;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::Context;

use crate::builtins;
use crate::lsp::analysis::{context_at, Context as At, KEYWORDS};
use crate::span::FileId;

/// The REPL's commands with one line of help each.
pub const COMMANDS: &[(&str, &str)] = &[
    (":help", "this list"),
    (":vars", "the session's variables; captures with their metadata (log-probability, tokens, finish reason, choices)"),
    (":state", "the structured state: chat turns, nodes, token counts"),
    (":tokens", "the model's token sequence: position, id, kind, origin, text"),
    (":undo", "take the last entry back (text, variables and KV cache)"),
    (":reset", "start over: no entries, an empty KV cache"),
    (":save FILE.lmt", "write the session as a template that re-runs it"),
    (":load FILE.lmt", "run a template file as the next entry"),
    (":json", "the state as the JSON document of `lmt run --json`"),
    (":usage", "tokens fed, reused and re-fed; forward passes; timings"),
    (":quit", "leave (Ctrl-D too)"),
];

/// The commands' names, without their arguments (`:save`).
pub fn command_names() -> impl Iterator<Item = &'static str> {
    COMMANDS.iter().map(|(c, _)| c.split(' ').next().unwrap_or(c))
}

/// True when `input` is an entry that goes on: it ends inside an open
/// block, tag, comment or string, or its last line ends with `\`.
pub fn is_incomplete(input: &str) -> bool {
    if input.trim_start().starts_with(':') {
        return false;
    }
    if input.ends_with('\\') {
        return true;
    }
    let parsed = crate::syntax::parse(input, FileId(0));
    parsed.diagnostics.iter().any(|d| d.is_incomplete_input(input.len()))
}

/// Completions at byte `pos` of `line`: where the replaced word starts and the candidates.
pub fn complete(line: &str, pos: usize, vars: &[String]) -> (usize, Vec<String>) {
    let pos = crate::span::floor_char_boundary(line, pos);
    let before = &line[..pos];
    let command = before.trim_start();
    if command.starts_with(':') && !command.contains(' ') {
        return (before.len() - command.len(), starting_with(command, command_names()));
    }
    let start = crate::lsp::analysis::ident_start(before);
    let word = &before[start..];
    let names = || vars.iter().map(String::as_str).chain(builtins::FUNCTIONS.iter().map(|b| b.name));
    let found = match context_at(line, pos) {
        At::Text | At::ImportPath => Vec::new(),
        At::Keyword => starting_with(word, KEYWORDS.iter().map(|(k, _)| *k)),
        At::Options { select } => {
            let opts = crate::options::table(select);
            starting_with(word, opts.iter().map(|o| o.name).chain(names()))
        }
        At::Filter => starting_with(word, builtins::FILTERS.iter().map(|b| b.name)),
        At::Expr => starting_with(word, names()),
    };
    (start, found)
}

/// The items that start with `word`, sorted, once each.
fn starting_with<'a>(word: &str, items: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<String> = items.filter(|c| c.starts_with(word)).map(str::to_string).collect();
    v.sort();
    v.dedup();
    v
}

/// `line` with its tags, expressions and comments coloured (ANSI).
pub fn highlight(line: &str) -> String {
    const TAG: &str = "\x1b[35m";
    const EXPR: &str = "\x1b[36m";
    const COMMENT: &str = "\x1b[2m";
    const COMMAND: &str = "\x1b[1m";
    const RESET: &str = "\x1b[0m";
    if line.trim_start().starts_with(':') {
        return format!("{COMMAND}{line}{RESET}");
    }
    let mut out = String::with_capacity(line.len() + 16);
    let mut rest = line;
    while let Some(i) = rest.find('{') {
        let (open, close, style) = match rest[i..].get(..2) {
            Some("{%") => ("{%", "%}", TAG),
            Some("{{") => ("{{", "}}", EXPR),
            Some("{#") => ("{#", "#}", COMMENT),
            _ => {
                out.push_str(&rest[..=i]);
                rest = &rest[i + 1..];
                continue;
            }
        };
        out.push_str(&rest[..i]);
        let body = &rest[i + open.len()..];
        let end = body.find(close).map_or(rest.len(), |j| i + open.len() + j + close.len());
        out.push_str(style);
        out.push_str(&rest[i..end]);
        out.push_str(RESET);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// What rustyline calls: completion, highlighting, multi-line validation.
pub struct ReplHelper {
    /// The session's variable names, refreshed before each line.
    pub vars: Vec<String>,
    /// Whether to colour the input.
    pub color: bool,
    files: FilenameCompleter,
}

impl ReplHelper {
    /// A helper with no variables yet.
    pub fn new(color: bool) -> Self {
        ReplHelper { vars: Vec::new(), color, files: FilenameCompleter::new() }
    }
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(&self, line: &str, pos: usize, ctx: &Context<'_>) -> rustyline::Result<(usize, Vec<Pair>)> {
        let t = line.trim_start();
        if t.starts_with(":load ") || t.starts_with(":save ") {
            return self.files.complete(line, pos, ctx);
        }
        let (start, found) = complete(line, pos, &self.vars);
        Ok((start, found.into_iter().map(|c| Pair { display: c.clone(), replacement: c }).collect()))
    }
}

impl Hinter for ReplHelper {
    type Hint = String;
}

impl Highlighter for ReplHelper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        if self.color {
            Cow::Owned(highlight(line))
        } else {
            Cow::Borrowed(line)
        }
    }

    fn highlight_char(&self, _line: &str, _pos: usize, _kind: CmdKind) -> bool {
        self.color
    }
}

impl Validator for ReplHelper {
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        Ok(if is_incomplete(ctx.input()) { ValidationResult::Incomplete } else { ValidationResult::Valid(None) })
    }
}

impl rustyline::Helper for ReplHelper {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_continue_inside_open_blocks_and_after_a_backslash() {
        assert!(is_incomplete("{% user %}Hi"));
        assert!(is_incomplete("{% user %}Hi\n{% if x %}"));
        assert!(is_incomplete("Say {% gen x stop=\"\\n"));
        assert!(is_incomplete("{# a comment"));
        assert!(is_incomplete("First line\\"));
        assert!(!is_incomplete("{% user %}Hi{% end %}"));
        assert!(!is_incomplete("Q: {% gen x %}"));
        assert!(!is_incomplete(":save {% user"));
        // A real error is not a reason to wait for more.
        assert!(!is_incomplete("{% end %}"));
    }

    #[test]
    fn completes_commands_keywords_options_and_names() {
        let vars = vec!["answer".to_string(), "animal".to_string()];
        assert_eq!(complete(":u", 2, &vars), (0, vec![":undo".to_string(), ":usage".to_string()]));
        assert_eq!(complete("Hi {% ge", 8, &vars), (6, vec!["gen".to_string()]));
        assert_eq!(complete("{% gen x max_t", 14, &vars), (9, vec!["max_tokens".to_string()]));
        assert_eq!(complete("{% select x sc", 14, &vars).1, vec!["score".to_string()]);
        assert_eq!(complete("{{ an", 5, &vars), (3, vec!["animal".to_string(), "answer".to_string()]));
        assert_eq!(complete("{{ answer | up", 14, &vars).1, vec!["upper".to_string()]);
        assert!(complete("plain text an", 13, &vars).1.is_empty());
    }

    #[test]
    fn highlights_tags_and_leaves_text() {
        let h = highlight("Hi {% gen x %} {{ y }} {# c #} {x}");
        assert!(h.starts_with("Hi \x1b[35m{% gen x %}\x1b[0m \x1b[36m{{ y }}\x1b[0m \x1b[2m{# c #}\x1b[0m {x}"), "{h:?}");
        assert_eq!(highlight("{% gen"), "\x1b[35m{% gen\x1b[0m");
    }
}
