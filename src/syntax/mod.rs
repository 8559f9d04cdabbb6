//! The front end's first stage: template text to an [`ast::Template`] with
//! byte spans, reporting every syntax error (not only the first).
//!
//! pest is used only inside this module (`parser`, `gbnf`); nothing outside
//! sees a `Pair<Rule>`.

pub mod ast;
mod blocks;
pub mod defs;
pub mod dump;
pub mod gbnf;
pub mod literal;
mod parser;

pub use parser::STATEMENTS;

/// Deepest nesting of blocks, of expressions and of grammar groups. Deeper
/// input is reported (E0109) and cut, so no later stage can overflow its
/// stack on hostile input.
pub const MAX_NESTING: usize = 128;

use crate::diagnostic::Diagnostic;
use crate::span::FileId;

/// A parsed template and the syntax diagnostics found on the way.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The tree; parts that failed to parse are left out or marked as errors.
    pub template: ast::Template,
    /// Syntax errors, in the order found.
    pub diagnostics: Vec<Diagnostic>,
}

/// Parses template `text` belonging to `file`. Never panics; always returns a
/// tree, however broken the input.
pub fn parse(text: &str, file: FileId) -> Parsed {
    let mut diagnostics = Vec::new();
    let items = parser::parse_items(text, file, &mut diagnostics);
    let template = blocks::build(items, file, text.len(), &mut diagnostics);
    Parsed { template, diagnostics }
}
