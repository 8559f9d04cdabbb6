//! Fixture corpus: `tests/corpus/**/ok/*.lmt` must check clean and are
//! snapshotted as AST + IR; `tests/corpus/**/err/*.lmt` name the errors they
//! expect inside themselves (`{# expect: E0201@3 W0502@7 #}`: code@line, or
//! code@file:line for a diagnostic in an imported file, by base name) and
//! their rendered diagnostics are snapshotted.

use std::path::Path;

use lmt::cli::report;
use lmt::workspace::{FsLoader, Workspace};

fn load(path: &Path) -> Workspace {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = path.strip_prefix(root).unwrap_or(path).display().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    // Fixtures import from sibling folders (`../lib`): the corpus is their root.
    let loader = FsLoader { root: Some(root.join("tests/corpus")), ..FsLoader::default() };
    Workspace::load_text(&name, &text, Some(path.to_path_buf()), &loader)
}

fn rendered(ws: &Workspace) -> String {
    ws.diagnostics.iter().map(|d| report::render(d, &ws.sources, false, 100)).collect()
}

/// `(code, place)` pairs named by `expect:` lines in the fixture.
fn expectations(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = text
        .split("expect:")
        .skip(1)
        .flat_map(|rest| {
            let end = rest.find("#}").unwrap_or(rest.len());
            rest[..end]
                .split_whitespace()
                .map(|item| {
                    let (code, place) = item.split_once('@').unwrap_or_else(|| panic!("bad expectation `{item}`"));
                    (code.to_string(), place.to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

#[test]
fn ok_fixtures_check_clean() {
    insta::glob!("corpus/**/ok/*.lmt", |path| {
        let ws = load(path);
        let errors: Vec<_> = ws.diagnostics.iter().filter(|d| d.is_error()).collect();
        assert!(errors.is_empty(), "{}:\n{}", path.display(), rendered(&ws));
        let ast = lmt::syntax::dump::dump(&ws.module(ws.root).template);
        let program = lmt::ir::compile(&ws);
        let ir = lmt::ir::disasm::disassemble(&program, &ws.sources);
        let warnings = rendered(&ws);
        insta::assert_snapshot!(format!("--- ast\n{ast}--- ir\n{ir}--- warnings\n{warnings}"));
    });
}

#[test]
fn err_fixtures_report_what_they_expect() {
    insta::glob!("corpus/**/err/*.lmt", |path| {
        let ws = load(path);
        let text = std::fs::read_to_string(path).unwrap();
        let expected = expectations(&text);
        assert!(!expected.is_empty(), "{} names no `expect:` codes", path.display());
        let mut got: Vec<(String, String)> = ws
            .diagnostics
            .iter()
            .map(|d| {
                let f = ws.sources.get(d.file);
                let line = f.lines.line_col(&f.text, d.span.start as usize).line;
                let place = if d.file == ws.root {
                    line.to_string()
                } else {
                    let base = Path::new(&f.name).file_name().unwrap().to_string_lossy().into_owned();
                    format!("{base}:{line}")
                };
                (d.code.as_str().to_string(), place)
            })
            .collect();
        got.sort();
        assert_eq!(got, expected, "{}:\n{}", path.display(), rendered(&ws));
        insta::assert_snapshot!(rendered(&ws));
    });
}
