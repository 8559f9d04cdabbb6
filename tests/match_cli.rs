//! `lmt match` as a user runs it, on a real tokenizer when the shared data is
//! there and on a trained one always.

mod common;

use std::process::Command;

fn lmt(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lmt")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn tokenizer_paths() -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("lmt-match-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trained = dir.join("tokenizer.json");
    common::trained_byte_level().save(&trained, false).unwrap();
    let mut paths: Vec<String> = common::real_tokenizers().into_iter().map(|(_, p)| p.display().to_string()).collect();
    paths.push(trained.display().to_string());
    paths
}

#[test]
fn accepts_matching_text_and_rejects_with_the_place() {
    for tok in tokenizer_paths() {
        let (code, out, err) = lmt(&["match", "--tokenizer", &tok, "--regex", "[12][0-9]{3}-[0-9]{2}", "--text", "2024-07"]);
        assert_eq!(code, 0, "{tok}: {out}{err}");
        assert!(out.starts_with("accepted: 7 bytes"), "{out}");

        let (code, out, _) = lmt(&["match", "--tokenizer", &tok, "--regex", "[12][0-9]{3}-[0-9]{2}", "--text", "2024-7x", "--json"]);
        assert_eq!(code, 1);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["accepted"], false);
        assert_eq!(v["reject"]["byte_offset"], 6, "{tok}: {out}");
        assert_eq!(v["reject"]["expected"], "[0-9]");

        let (code, out, _) = lmt(&["match", "--tokenizer", &tok, "--choices", "yes,no,maybe", "--text", "may"]);
        assert_eq!(code, 1);
        assert!(out.contains("ends before the constraint is satisfied") && out.contains("\"b\""), "{out}");

        // Special-token text is matched as text, never as a special token.
        let (code, out, _) = lmt(&["match", "--tokenizer", &tok, "--regex", "<\\|[a-z_]+\\|>", "--text", "<|endoftext|>"]);
        assert_eq!(code, 0, "{tok}: {out}");
    }
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    let tok = tokenizer_paths().pop().unwrap();
    let (code, _, err) = lmt(&["match", "--tokenizer", &tok, "--regex", "(", "--text", "a"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid regex"), "{err}");
    let (code, _, err) = lmt(&["match", "--tokenizer", "/no/such/dir", "--regex", "a", "--text", "a"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot load"), "{err}");
    let (code, _, err) = lmt(&["match", "--tokenizer", &tok, "--text", "a"]);
    assert_eq!(code, 2);
    assert!(err.contains("exactly one constraint"), "{err}");
}

#[test]
fn grammar_schema_and_bench_modes() {
    let tok = tokenizer_paths().pop().unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let grammar = format!("{root}/examples/grammar.lmt#arith");
    let (code, out, err) = lmt(&["match", "--tokenizer", &tok, "--grammar", &grammar, "--text", "(1 + 2) * 3"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = lmt(&["match", "--tokenizer", &tok, "--grammar", &grammar, "--text", "(1 + 2 * 3"]);
    assert_eq!(code, 1);
    assert!(out.contains("ends before the constraint is satisfied"), "{out}");
    let number = format!("{root}/examples/grammar.lmt#arith.number");
    let (code, _, _) = lmt(&["match", "--tokenizer", &tok, "--grammar", &number, "--text", "(1)"]);
    assert_eq!(code, 1, "`.number` starts at that rule");

    let schema = format!("{root}/examples/person.schema.json");
    // As `gen` writes it: the schema's order; validation takes any order.
    let (code, out, err) = lmt(&["match", "--tokenizer", &tok, "--json-schema", &schema, "--text", r#"{"name": "Ada", "age": 36}"#]);
    assert_eq!(code, 0, "{out}{err}");
    let swapped = r#"{"age": 36, "name": "Ada"}"#;
    let (code, out, _) = lmt(&["match", "--tokenizer", &tok, "--json-schema", &schema, "--text", swapped]);
    assert_eq!(code, 1, "generation keeps the schema's order: {out}");
    let (code, out, err) = lmt(&["match", "--tokenizer", &tok, "--json-schema", &schema, "--json-open", "--text", swapped]);
    assert_eq!(code, 0, "any order for small objects when validating: {out}{err}");
    let (code, _, _) = lmt(&["match", "--tokenizer", &tok, "--json-schema", &schema, "--text", r#"{"name": "Ada", "age": 151}"#]);
    assert_eq!(code, 1);
}
