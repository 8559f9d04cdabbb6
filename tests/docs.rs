//! The reference in `docs/reference.md` and the implementation agree: every
//! diagnostic code, option, filter and test is documented, and everything
//! documented exists.

use std::collections::BTreeSet;

use lmt::options::{GEN_OPTIONS, SELECT_OPTIONS};
use lmt::diagnostic::Code;

fn reference() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md")).unwrap()
}

/// The text of the section headed `## {title}`, up to the next `## `.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let start = doc.find(&format!("## {title}\n")).unwrap_or_else(|| panic!("no section `{title}`"));
    let rest = &doc[start + 3..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// The first-column names of the table rows in `text`: "| `name` | …".
fn first_column(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_string()))
        .collect()
}

#[test]
fn every_code_is_documented_and_every_documented_code_exists() {
    let doc = reference();
    let documented = first_column(section(&doc, "Diagnostic codes"));
    let implemented: BTreeSet<String> = Code::ALL.iter().map(|c| c.as_str().to_string()).collect();
    assert_eq!(documented, implemented);
    // Codes mentioned anywhere in the prose exist too.
    for word in doc.split(|c: char| !c.is_ascii_alphanumeric()) {
        let looks_like_code = word.len() == 5 && (word.starts_with('E') || word.starts_with('W')) && word[1..].chars().all(|c| c.is_ascii_digit());
        if looks_like_code {
            assert!(Code::parse(word).is_some(), "the reference mentions `{word}`, which does not exist");
        }
    }
    for c in Code::ALL {
        let row = doc.lines().find(|l| l.starts_with(&format!("| `{}` |", c.as_str()))).unwrap();
        assert!(row.contains(c.name()), "row for {} lacks its name `{}`", c.as_str(), c.name());
    }
}

#[test]
fn options_filters_and_tests_match_the_tables() {
    let doc = reference();
    let names = |xs: &mut dyn Iterator<Item = &'static str>| xs.map(str::to_string).collect::<BTreeSet<_>>();
    assert_eq!(first_column(section(&doc, "`gen` options")), names(&mut GEN_OPTIONS.iter().map(|o| o.name)));
    assert_eq!(first_column(section(&doc, "`select` options")), names(&mut SELECT_OPTIONS.iter().map(|o| o.name)));
    assert_eq!(first_column(section(&doc, "Filters")), names(&mut lmt::builtins::FILTERS.iter().map(|f| f.name)));
    assert_eq!(first_column(section(&doc, "Tests")), names(&mut lmt::builtins::TESTS.iter().map(|f| f.name)));
    assert_eq!(first_column(section(&doc, "Functions")), names(&mut lmt::builtins::FUNCTIONS.iter().map(|f| f.name)));
}

/// The option tables are the option table: every row's type, default and
/// meaning as `lmt::options` gives them.
#[test]
fn option_rows_are_the_option_table() {
    let doc = reference();
    for (title, table) in [("`gen` options", GEN_OPTIONS), ("`select` options", SELECT_OPTIONS)] {
        let text = section(&doc, title);
        let want: Vec<String> =
            table.iter().map(|o| format!("| `{}` | {} | {} | {} |", o.name, o.ty, o.default.display(), o.doc)).collect();
        let have: Vec<&str> = text.lines().filter(|l| l.starts_with("| `")).collect();
        assert_eq!(have, want, "the rows of `{title}` should be:\n{}", want.join("\n"));
    }
}

#[test]
fn every_statement_keyword_is_documented() {
    let doc = reference();
    let statements = section(&doc, "Statements");
    for kw in lmt::syntax::STATEMENTS {
        if matches!(*kw, "or" | "elif" | "else" | "end" | "raw") {
            continue; // parts of other statements, shown with them
        }
        assert!(statements.contains(&format!("{{% {kw}")), "statement `{kw}` is not in the reference");
    }
}

#[test]
fn ci_runs_the_readme_test_command() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
    assert!(readme.contains("```sh\nbash test.sh\n```"), "README shows the test command");
    assert!(ci.lines().any(|l| l.trim() == "bash test.sh"), ".ci/run runs it");
}

#[test]
fn every_template_in_the_guide_and_the_readme_checks_clean() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut checked = 0;
    for doc in ["docs/guide.md", "README.md"] {
        let text = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
        for (i, block) in text.split("```lmt\n").skip(1).enumerate() {
            let template = &block[..block.find("```").unwrap()];
            // As if in `examples/`, where the schema files and libraries are.
            let path = std::path::PathBuf::from(format!("{root}/examples/{doc}-{i}.lmt"));
            let ws = lmt::workspace::Workspace::load_text("t.lmt", template, Some(path), &lmt::workspace::FsLoader::default());
            assert!(ws.diagnostics.is_empty(), "{doc}, template {i}:\n{template}\n{:?}", ws.diagnostics);
            checked += 1;
        }
    }
    assert!(checked >= 11, "only {checked} templates found");
    // The README's example is the example file it names.
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let shown = readme.split("```lmt\n").nth(1).and_then(|b| b.split("```").next()).unwrap();
    let trip = std::fs::read_to_string(format!("{root}/examples/trip.lmt")).unwrap();
    assert!(trip.ends_with(shown), "README's template is examples/trip.lmt");
}

/// The reference's JSON Schema paragraphs agree with the compiler's tables:
/// every keyword the engine refuses is named as refused (in all or some
/// forms), every validation keyword it compiles as enforced, and nothing
/// named as enforced exactly is one it refuses.
#[test]
fn json_schema_support_is_the_compilers() {
    let doc = reference();
    let start = doc.find("### `json=`: what JSON Schema support means").unwrap();
    let text = &doc[start..];
    let para = |head: &str| -> String {
        let i = text.find(head).unwrap_or_else(|| panic!("no paragraph `{head}`"));
        text[i..i + text[i..].find("\n\n").unwrap()].replace('\n', " ")
    };
    let (exact, some, refused) = (para("Enforced exactly:"), para("Enforced in some forms"), para("Refused with an error"));
    let named = |p: &str, k: &str| p.contains(&format!("`{k}`")) || p.contains(&format!("`{k}:"));
    let unsupported: Vec<&str> = lmt::engine::UNSUPPORTED_KEYWORDS.iter().map(|(k, _)| *k).collect();
    for k in &unsupported {
        assert!(named(&refused, k) || named(&some, k), "`{k}` is refused by the engine but the reference does not say so");
        assert!(!named(&exact, k), "`{k}` is refused by the engine but the reference says it is enforced exactly");
    }
    for k in lmt::engine::VALIDATION_KEYWORDS.iter().filter(|k| !unsupported.contains(k)) {
        if ["uniqueItems", "minProperties", "maxProperties", "dependencies"].contains(k) {
            assert!(named(&some, k) || named(&refused, k), "`{k}` has conditions: say which");
            continue;
        }
        assert!(named(&exact, k) || named(&some, k), "`{k}` is compiled but the reference does not say so");
    }
}
