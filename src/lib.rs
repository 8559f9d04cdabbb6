//! lmt: a template language and runtime for programs that interleave fixed
//! text with language-model generation.
//!
//! The front end is a pipeline of stages, one module each:
//! [`syntax`] (text → AST), [`check`] (static checks → diagnostics),
//! [`ir`] (AST → instructions). [`workspace`] ties them together across
//! imported files. See `ARCHITECTURE.md` for the map and the invariants.
//!
//! Layers, lowest first; a module never uses one after it (tested by
//! `tests/layers.rs`): span → diagnostic → files → syntax → engine →
//! builtins → options → check → stdlib → workspace → ir → model → chat → state →
//! interp → search → render → dataset → lsp → cli.

#![warn(missing_docs)]

pub mod builtins;
pub mod chat;
pub mod check;
pub mod cli;
pub mod dataset;
pub mod diagnostic;
pub mod engine;
pub mod files;
pub mod interp;
pub mod ir;
pub mod lsp;
pub mod options;
pub mod model;
pub mod render;
pub mod search;
pub mod span;
pub mod state;
pub mod stdlib;
pub mod syntax;
pub mod workspace;
