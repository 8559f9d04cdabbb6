//! Every example and every stdlib module passes `lmt check` and compiles.

use std::path::Path;

use lmt::workspace::{FsLoader, Workspace};

fn check_dir(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut n = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "lmt") {
            continue;
        }
        let ws = Workspace::load_file(&path, &FsLoader::default()).unwrap();
        let problems: Vec<String> = ws.diagnostics.iter().map(|d| format!("{:?}: {}", d.code, d.message)).collect();
        assert!(problems.is_empty(), "{}: {problems:#?}", path.display());
        let program = lmt::ir::compile(&ws);
        assert!(!program.modules[program.entry].code.is_empty());
        n += 1;
    }
    n
}

#[test]
fn examples_check_clean() {
    assert!(check_dir("examples") >= 8);
    assert!(check_dir("examples/lib") >= 1, "examples/lib holds the modules the examples import");
}

#[test]
fn stdlib_checks_clean_and_is_embedded() {
    let n = check_dir("stdlib");
    assert_eq!(n, lmt::stdlib::names().count(), "every stdlib/*.lmt is embedded");
    for name in lmt::stdlib::names() {
        let text = format!("{{% import \"{name}\" as m %}}");
        let ws = Workspace::load_text("t.lmt", &text, None, &FsLoader::default());
        assert!(ws.diagnostics.is_empty(), "{name}: {:?}", ws.diagnostics);
    }
}
