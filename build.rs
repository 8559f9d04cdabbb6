//! Embeds every `stdlib/*.lmt` file in the binary, so an installed `lmt`
//! finds `std/...` imports from any directory.

use std::fmt::Write;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=stdlib");
    // Read when the script runs, not when it was compiled: a build script
    // compiled for one checkout is reused for another with the same target
    // directory, and must not embed the first one's files.
    let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("stdlib");
    let mut entries: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("stdlib/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "lmt"))
        .map(|p| {
            println!("cargo:rerun-if-changed={}", p.display());
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (format!("std/{stem}"), p.display().to_string())
        })
        .collect();
    entries.sort();
    let mut out = String::from("/// Every stdlib module: (`std/name`, source).\npub static MODULES: &[(&str, &str)] = &[\n");
    for (name, path) in entries {
        writeln!(out, "    ({name:?}, include_str!({path:?})),").unwrap();
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("stdlib.rs");
    std::fs::write(dest, out).unwrap();
}
