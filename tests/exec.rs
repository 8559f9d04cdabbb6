//! Execution corpus: each line of `tests/exec/*.txt` is a template run on
//! its own (on a tiny model built here; the lines never call it); the
//! snapshot holds what each wrote, or the codes and messages that stopped
//! it at check time or run time. Every filter, test and function of the
//! builtin tables appears in the corpus.

mod common;

use std::path::Path;

use lmt::interp::{self, RunOptions};
use lmt::model::{LoadOptions, Model};
use lmt::workspace::{FsLoader, Workspace};

fn run_line(model: &Model, line: &str) -> String {
    let ws = Workspace::load_text("line.lmt", line, None, &FsLoader::default());
    let errors: Vec<String> =
        ws.diagnostics.iter().filter(|d| d.is_error()).map(|d| format!("check {}: {}", d.code.as_str(), d.message)).collect();
    if !errors.is_empty() {
        return errors.join("\n   ");
    }
    let program = lmt::ir::compile(&ws);
    let out = interp::run(&program, &ws.sources, model, &RunOptions::default(), &mut |_| {});
    match out.error {
        Some(e) => format!("{}{} {}: {}", out.state.text(), if out.state.text().is_empty() { "" } else { " ⟂" }, e.to_diagnostic().code.as_str(), e.message),
        None => out.state.text(),
    }
}

#[test]
fn expressions_filters_and_tests() {
    let dir = common::tiny::temp_dir("exec-model");
    common::write_trained_chat_model(&dir);
    let model = Model::load_path(&dir, &LoadOptions::default()).unwrap();
    insta::glob!("exec/*.txt", |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        let mut out = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if line.starts_with('#') {
                out.push_str(line);
            } else {
                out.push_str(&format!("{line}\n=> {}", run_line(&model, line)));
            }
            out.push('\n');
        }
        insta::assert_snapshot!(out);
    });
}

/// The corpus calls every filter, test and function at least once.
#[test]
fn the_corpus_covers_the_builtin_tables() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/exec");
    let corpus: String = std::fs::read_dir(&dir).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect();
    for f in lmt::builtins::FILTERS {
        assert!(corpus.contains(&format!("| {}", f.name)), "filter `{}` is not in tests/exec", f.name);
    }
    for t in lmt::builtins::TESTS {
        assert!(corpus.contains(&format!("is {}", t.name)), "test `{}` is not in tests/exec", t.name);
    }
    for f in lmt::builtins::FUNCTIONS {
        assert!(corpus.contains(&format!("{}(", f.name)), "function `{}` is not in tests/exec", f.name);
    }
}
