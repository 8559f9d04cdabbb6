//! Property tests: arbitrary input and mutated real templates never panic the
//! parser, checker or compiler, and every reported span lies inside its file
//! on character boundaries.

use std::path::{Path, PathBuf};

mod common;

use common::mutate::{apply, Mutation};
use lmt::workspace::{FsLoader, Workspace};
use proptest::prelude::*;

fn assert_sound(name: &str, text: &str, path: Option<PathBuf>) {
    let ws = Workspace::load_text(name, text, path, &FsLoader::default());
    for d in &ws.diagnostics {
        let f = ws.sources.get(d.file);
        let spans = std::iter::once(d.span).chain(d.secondary.iter().filter(|l| l.file == d.file).map(|l| l.span));
        for s in spans {
            assert!(s.start <= s.end, "{d:?}");
            assert!((s.end as usize) <= f.text.len(), "span {s:?} past the end of {}: {d:?}", f.name);
            assert!(f.text.is_char_boundary(s.start as usize), "start not on a char boundary: {d:?}");
            assert!(f.text.is_char_boundary(s.end as usize), "end not on a char boundary: {d:?}");
        }
        for l in &d.secondary {
            let lf = ws.sources.get(l.file);
            assert!((l.span.end as usize) <= lf.text.len());
        }
        // Rendering must not panic either.
        let _ = lmt::cli::report::render(d, &ws.sources, false, 80);
        let _ = lmt::cli::report::render_json(d, &ws.sources);
    }
    // The compiler is only run on clean workspaces by the CLI, but must not
    // panic on anything the parser produces.
    let program = lmt::ir::compile(&ws);
    let _ = lmt::ir::disasm::disassemble(&program, &ws.sources);
    let _ = lmt::syntax::dump::dump(&ws.module(ws.root).template);
}

/// Pieces that make random text look like templates.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(common::mutate::PIECES).prop_map(str::to_string),
        1 => any::<char>().prop_map(|c| c.to_string()),
    ]
}

fn corpus_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["examples", "examples/lib", "stdlib", "tests/corpus/syntax/ok", "tests/corpus/check/ok"] {
        if let Ok(rd) = std::fs::read_dir(root.join(dir)) {
            files.extend(rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "lmt")));
        }
    }
    files.sort();
    files
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..20).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), piece()).prop_map(|(a, s)| Mutation::Insert(a, s)),
        (any::<usize>(), 0usize..40).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_template_like_text(pieces in prop::collection::vec(piece(), 0..80)) {
        assert_sound("fuzz.lmt", &pieces.concat(), None);
    }

    #[test]
    fn arbitrary_strings(text in ".{0,200}") {
        assert_sound("fuzz.lmt", &text, None);
    }

    #[test]
    fn mutated_real_templates(index in any::<prop::sample::Index>(), muts in prop::collection::vec(mutation(), 1..8)) {
        let files = corpus_files();
        prop_assume!(!files.is_empty());
        let path = index.get(&files);
        let mut text = std::fs::read_to_string(path).unwrap();
        for m in &muts {
            apply(&mut text, m);
        }
        assert_sound("mutated.lmt", &text, Some(path.clone()));
    }
}

/// Hostile nesting is reported (E0109), never a stack overflow: run in a test
/// thread (small stack) on a debug build, the worst case.
#[test]
fn deep_nesting_is_reported_not_a_crash() {
    let n = 20_000;
    let cases = [
        format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n)),
        format!("{{{{ {}{} }}}}", "[".repeat(n), "]".repeat(n)),
        format!("{}x{}", "{% if true %}".repeat(n), "{% end %}".repeat(n)),
        format!("{{{{ {}1 }}}}", "-".repeat(n)),
        format!("{{{{ 1{} }}}}", " + 1".repeat(n)),
        format!("{{{{ x{} }}}}", ".a".repeat(n)),
        format!("{{% grammar g %}}\nroot ::= {}\"a\"{}\n{{% end %}}", "(".repeat(n), ")".repeat(n)),
    ];
    for text in &cases {
        let ws = Workspace::load_text("deep.lmt", text, None, &FsLoader::default());
        assert!(
            ws.diagnostics.iter().any(|d| d.code == lmt::diagnostic::Code::TooDeep),
            "no E0109 for {}…: {:?}",
            &text[..40],
            ws.diagnostics.iter().map(|d| d.code).collect::<Vec<_>>()
        );
        assert_sound("deep.lmt", text, None);
    }
    // Just under the limit is fine.
    let ok = format!("{}x{}", "{% if true %}".repeat(100), "{% end %}".repeat(100));
    let ws = Workspace::load_text("ok.lmt", &ok, None, &FsLoader::default());
    assert!(ws.diagnostics.is_empty(), "{:?}", ws.diagnostics);
}

/// A regex error at a position (an empty span) next to a multi-byte
/// character is widened to that whole character, in a `gen` option and in
/// a grammar's `/regex/` terminal (found by the mutation test above).
#[test]
fn regex_errors_before_multibyte_characters_stay_on_char_boundaries() {
    for text in [
        "{% gen x regex=\"a{é}\" %}",
        "{% gen x regex=\"a{😀}\" %}",
        "{% grammar g %}\nroot ::= /a{é}/\n{% end %}{% gen x grammar=g %}",
    ] {
        let ws = Workspace::load_text("t.lmt", text, None, &FsLoader::default());
        assert!(ws.diagnostics.iter().any(|d| d.code == lmt::diagnostic::Code::InvalidRegex), "{text}: {:?}", ws.diagnostics);
        assert_sound("t.lmt", text, None);
    }
}
