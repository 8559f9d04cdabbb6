//! Runtime errors placed in the template: a [`Failure`] (a kind with its own
//! diagnostic code, and a message) and the span of the instruction that
//! failed. Tools and tests match the kind, never the text.

use crate::diagnostic::Diagnostic;
use crate::engine::EngineError;
use crate::model::ModelError;
use crate::span::{FileId, Span};
use crate::state::{Failure, RunErrorKind};

/// A runtime error with the place in the template it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct RunError {
    /// What kind of failure.
    pub kind: RunErrorKind,
    /// What went wrong.
    pub message: String,
    /// The file.
    pub file: FileId,
    /// Where.
    pub span: Span,
}

impl RunError {
    /// As a diagnostic (its kind's code), for rendering with the template's
    /// source.
    pub fn to_diagnostic(&self) -> Diagnostic {
        Diagnostic::new(self.kind.code(), self.file, self.span, self.message.clone()).with_label("while running this")
    }
}

impl From<ModelError> for Failure {
    fn from(e: ModelError) -> Failure {
        let kind = match e {
            ModelError::ContextFull { .. } => RunErrorKind::ContextFull,
            _ => RunErrorKind::Model,
        };
        Failure::new(kind, e.to_string())
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Failure {
        Failure::constraint(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
