//! The layers point one way: a module may use the modules below it, never
//! one above. This reads every `crate::` path in `src/` (comments left out,
//! `use crate::{a, b::c}` groups opened) and fails on an edge that points up.
//! The order is the one ARCHITECTURE.md gives.

use std::collections::BTreeSet;
use std::path::Path;

/// Lowest first.
const LAYERS: &[&str] = &[
    "span", "diagnostic", "files", "syntax", "engine", "builtins", "options", "check", "stdlib", "workspace", "ir", "model", "chat",
    "state", "interp", "search", "render", "dataset", "lsp", "cli",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|m| *m == module)
}

/// Source text without `//` comments (string literals containing `//` are
/// rare in this code base and only ever over-report, never hide, an edge).
fn code(text: &str) -> String {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a piece of code names through `crate::`.
fn targets(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let after = rest.trim_start();
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 1;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => start = true,
                    c if start && depth == 1 && !c.is_whitespace() => {
                        out.insert(ident(&group[j..]).to_string());
                        start = false;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            out.insert(ident(after).to_string());
        }
    }
    out.retain(|t| !t.is_empty() && t != "self");
    out
}

/// Edges `(from, to, file)` that point up or to a module with no layer.
fn violations(module: &str, file: &str, text: &str) -> Vec<String> {
    let Some(from) = rank(module) else { return vec![format!("{file}: module `{module}` has no layer in LAYERS")] };
    targets(&code(text))
        .into_iter()
        .filter(|t| t != module)
        .filter_map(|t| match rank(&t) {
            Some(to) if to < from => None,
            Some(_) => Some(format!("{file}: `{module}` uses `{t}`, which is above it")),
            None => Some(format!("{file}: `{module}` uses `{t}`, which has no layer")),
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn layers_point_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_str().unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first);
        if module == "lib" || module == "main" {
            continue;
        }
        seen.insert(module.to_string());
        bad.extend(violations(module, &rel.display().to_string(), &std::fs::read_to_string(path).unwrap()));
    }
    assert!(seen.len() >= 15, "found only {seen:?} under src/");
    for m in LAYERS {
        assert!(seen.contains(*m), "LAYERS names `{m}`, which is not a module of src/");
    }
    assert!(bad.is_empty(), "edges that point up:\n{}", bad.join("\n"));
}

/// The reader finds each form of path a back-edge could take.
#[test]
fn back_edges_are_found() {
    let cases = [
        ("state", "use crate::interp::value::Captured;"),
        ("syntax", "let x = crate::check::suggest(a, b);"),
        ("model", "use crate::{engine::Vocab, chat::Message};"),
        ("engine", "use crate::{\n    span::Span,\n    check::{self, Ctx},\n};"),
        ("span", "fn f() -> crate::nowhere::X { x }"),
    ];
    for (module, text) in cases {
        assert_eq!(violations(module, "x.rs", text).len(), 1, "{module}: {text}");
    }
    let fine = [
        ("interp", "use crate::state::{Captured, FinishReason};"),
        ("cli", "use crate::{interp, render::json, lsp};"),
        ("syntax", "// use crate::check::suggest;\nuse crate::span::Span;"),
        ("model", "use crate::model::tokenizer::TextEncoder;"),
    ];
    for (module, text) in fine {
        assert!(violations(module, "x.rs", text).is_empty(), "{module}: {text}");
    }
}
