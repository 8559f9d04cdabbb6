//! `lmt repl`: the session API (undo restores the token sequence and the KV
//! cache exactly; entries cost only their own tokens), scripted sessions on
//! piped standard input (snapshots), and a real session in a pseudo-terminal.
//!
//! Runs on a tiny model with a tokenizer trained here and a ChatML template,
//! built in the test, so the transcripts are the same on every machine.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::tiny::{temp_dir, TempDir};
use lmt::interp::session::Session;
use lmt::interp::RunOptions;
use lmt::model::{LoadOptions, Model};
use lmt::state::{Origin, TokenKind};
use lmt::workspace::FsLoader;

fn model_dir() -> &'static Path {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("repl-model");
        common::write_trained_chat_model(&dir);
        dir
    })
}

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load_path(model_dir(), &LoadOptions::best_device()).unwrap())
}

/// Runs one entry; panics on template errors, returns the runtime error.
fn enter(s: &mut Session<'_>, text: &str) -> Result<(), String> {
    let ws = s.load("<entry>", text, None, &FsLoader::default());
    assert!(!ws.has_errors(), "{text}: {:?}", ws.diagnostics);
    s.run(&ws, &mut |_| {}).map_err(|e| e.message)
}

fn ids(s: &Session<'_>) -> Vec<u32> {
    s.state().token_ids()
}

#[test]
fn undo_restores_the_tokens_the_cache_and_the_variables() {
    let m = model();
    let mut s = Session::new(m, RunOptions::default()).unwrap();
    // The second entry re-tokenizes the first one's last token (" la" + "zy").
    enter(&mut s, "The quick brown fox jumps over the la").unwrap();
    let after_first = (ids(&s), s.state().text(), s.state().nodes.clone());
    enter(&mut s, "zy dog. Name: {% gen name max_tokens=4 stop=\"\\n\" %}").unwrap();
    assert!(s.vars().iter().any(|(k, _)| *k == "name"));
    assert_ne!(ids(&s)[..after_first.0.len()], after_first.0[..], "the boundary token was re-tokenized");
    let undone = s.undo().unwrap().expect("an entry to undo");
    assert!(undone.text.starts_with("zy dog. Name:"));
    assert_eq!((ids(&s), s.state().text(), s.state().nodes.clone()), after_first);
    assert!(s.vars().iter().all(|(k, _)| *k != "name"), "variables are restored: {:?}", s.vars());
    assert_eq!(s.state().usage.sequence_tokens as usize, after_first.0.len());
    // The cache holds exactly the restored sequence: what follows is what a
    // fresh session with the same text produces, token for token.
    enter(&mut s, "zy dog. Age: {% gen age max_tokens=5 %}").unwrap();
    let mut fresh = Session::new(m, RunOptions::default()).unwrap();
    enter(&mut fresh, "The quick brown fox jumps over the la").unwrap();
    enter(&mut fresh, "zy dog. Age: {% gen age max_tokens=5 %}").unwrap();
    assert_eq!(ids(&s), ids(&fresh));
    let lp = |s: &Session<'_>| s.state().tokens.iter().filter_map(|t| t.logprob).collect::<Vec<_>>();
    assert_eq!(lp(&s), lp(&fresh), "same logits after the undo as without it");
    // Undo down to nothing, then once more.
    assert!(s.undo().unwrap().is_some());
    assert!(s.undo().unwrap().is_some());
    assert!(s.undo().unwrap().is_none());
    assert!(ids(&s).is_empty() && s.state().nodes.is_empty());
}

#[test]
fn entries_cost_their_own_tokens_not_the_sum_of_prefixes() {
    let m = model();
    let mut s = Session::new(m, RunOptions::default()).unwrap();
    let mut prefixes = 0;
    for entry in
        ["Knowledge triples: (Marie Curie, discovered, ", "{% gen obj max_tokens=6 stop=\")\" %})", " and {% gen more max_tokens=6 %}"]
    {
        enter(&mut s, entry).unwrap();
        prefixes += s.state().tokens.len() as u64;
    }
    let u = &s.state().usage;
    assert_eq!(u.sequence_tokens, s.state().tokens.len() as u64);
    assert_eq!(u.forward_tokens, u.sequence_tokens + u.rewound_tokens + u.scored_tokens, "fed = the session's length + re-fed: {u:?}");
    assert!(u.rewound_tokens <= 8, "a few tokens re-fed at boundaries and stops, not whole prefixes: {u:?}");
    assert!(u.forward_tokens < prefixes, "{} fed vs {prefixes} for re-sending each prefix", u.forward_tokens);
}

#[test]
fn names_of_earlier_entries_are_known_and_errors_leave_the_session_usable() {
    let m = model();
    let mut s = Session::new(m, RunOptions::default()).unwrap();
    enter(&mut s, "{% set who = \"Ada\" %}{% def greet(x, punct=\"!\") %}Hello {{ x }}{{ punct }}{% end %}").unwrap();
    enter(&mut s, "{% grammar yn %}root ::= \"yes\" | \"no\"{% end %}{% import \"std/regex\" as re %}").unwrap();
    // Used in a later entry: no unknown-name errors, calls checked against the def.
    let ws = s.load("<e>", "{{ greet(who) }} {% gen ok grammar=yn %} {% gen n regex=re.integer %}", None, &FsLoader::default());
    assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
    s.run(&ws, &mut |_| {}).unwrap();
    assert!(s.state().text().starts_with("Hello Ada! "), "{}", s.state().text());
    let ok = s.vars().into_iter().find(|(k, _)| *k == "ok").unwrap().1.to_string();
    assert!(ok == "yes" || ok == "no", "{ok}");
    let ws = s.load("<e>", "{{ greet() }}{{ whom }}", None, &FsLoader::default());
    let codes: Vec<&str> = ws.diagnostics.iter().map(|d| d.code.as_str()).collect();
    assert!(codes.contains(&"E0501"), "unknown `whom`: {codes:?}");
    assert!(ws.diagnostics.iter().any(|d| d.message.contains("greet")), "arity checked: {:?}", ws.diagnostics);
    // A runtime error keeps the partial output, closes the open turn, and the session goes on.
    let before = s.state().messages.len();
    let err = enter(&mut s, "{% user %}Partial {{ [1][3] }} never{% end %}").unwrap_err();
    assert!(err.contains("out of range"), "{err}");
    assert_eq!(s.state().messages.len(), before + 1);
    assert_eq!(s.state().messages.last().unwrap().content, "Partial ");
    enter(&mut s, "{% assistant %}{% gen reply max_tokens=3 %}{% end %}").unwrap();
    assert_eq!(s.state().messages.last().unwrap().role, "assistant");
    assert!(s.state().tokens.iter().any(|t| t.origin == Origin::Generated && t.kind == TokenKind::Sampled));
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `lmt repl` on `script` as piped standard input, in `cwd`; returns
/// the exit code and standard output and error interleaved.
fn repl(cwd: &Path, script: &str, extra: &[&str]) -> (i32, String) {
    let model = model_dir().to_str().unwrap().to_string();
    let mut args = vec!["repl".to_string(), "--model".into(), model, "--quiet".into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" \"$@\" 2>&1")
        .arg(env!("CARGO_BIN_EXE_lmt"))
        .args(&args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        .env("XDG_DATA_HOME", cwd.join("data"))
        .env_remove("LMT_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Timings differ run to run.
fn redact(s: &str) -> String {
    let timing =
        fancy_regex::Regex::new(r"(?m)^time: .*$|(\x22(total_ms|mask_ms|tokens_per_second|time_to_first_token_ms)\x22: )[^,\n]+").unwrap();
    timing
        .replace_all(s, |c: &fancy_regex::Captures| match c.get(1) {
            Some(key) => format!("{}[time]", key.as_str()),
            None => "time: [redacted]".to_string(),
        })
        .into_owned()
}

fn transcript(script: &str, code: i32, out: &str) -> String {
    format!("--- input\n{script}--- output (exit {code})\n{}", redact(out))
}

#[test]
fn a_scripted_session_uses_every_command() {
    let dir = temp_dir("repl-script");
    std::fs::write(dir.join("intro.lmt"), "{% set topic = \"chess\" %}Notes on {{ topic }}:\n").unwrap();
    let script = "\
:help
:load intro.lmt
1. {% gen first max_tokens=4 stop=\"\\n\" %}
{% user %}Which is better,
e4 or d4?{% end %}
{% assistant %}{% select pick %}e4{% or %}d4{% end %}{% end %}
:vars
:state
:usage
{{ topic | upper }} {{ nope }}
{% user %}Half {{ [1][2] }} lost{% end %}
:undo
:state
:tokens
:save session.lmt
:reset
:vars
Score: {% gen score regex=\"[0-9]{2}\" %}
:json
:frobnicate
:quit
this is never read
";
    let (code, out) = repl(&dir, script, &[]);
    assert_eq!(code, 1, "entries failed, and stdin is not a terminal: {out}");
    insta::assert_snapshot!("scripted_session", transcript(script, code, &out));
    // The saved template re-runs the session's entries.
    let saved = std::fs::read_to_string(dir.join("session.lmt")).unwrap();
    assert!(saved.starts_with("{% set topic = \"chess\" %}Notes on"), "{saved}");
    assert!(!saved.contains("Half"), "the undone entry is not saved: {saved}");
    let run = Command::new(env!("CARGO_BIN_EXE_lmt"))
        .args(["run", dir.join("session.lmt").to_str().unwrap(), "--model", model_dir().to_str().unwrap(), "--json", "--quiet"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(doc["captures"]["pick"]["value"], doc["captures"]["pick"]["choices"][0]["text"]);
    // No history file without a terminal.
    assert!(!dir.join("data").exists());
}

#[test]
fn multi_line_entries_and_a_session_started_from_a_file() {
    let dir = temp_dir("repl-multiline");
    let file = PathBuf::from(ROOT).join("examples/hello.lmt");
    let script = "\
{% if true %}
A line\\

{% for w in [\"x\", \"y\"] %}{{ w }}{% end %}
{% end %}
{# an open comment
   goes on #}Done, {{ name }}.
:state
";
    let (code, out) = repl(&dir, script, &[file.to_str().unwrap(), "--var", "name=Ada"]);
    assert_eq!(code, 0, "{out}");
    insta::assert_snapshot!("multi_line", transcript(script, code, &out));
    // Input that ends inside an entry is reported, not dropped.
    let (code, out) = repl(&dir, "Kept.\n{% user %}never closed\n", &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("Kept.\nerror: the input ended inside an unfinished entry"), "{out}");
    assert!(out.contains("{% user %}never closed"), "{out}");
}

#[test]
fn a_real_terminal_session_streams_completes_cancels_and_quits() {
    use expectrl::{ControlCode, Expect, Regex, Session as Pty};
    let dir = temp_dir("repl-pty");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lmt"));
    cmd.args(["repl", "--model", model_dir().to_str().unwrap()])
        .current_dir(&*dir)
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("NO_COLOR", "1")
        .env("TERM", "xterm")
        .env_remove("LMT_MODEL");
    let mut p = Pty::spawn(cmd).expect("a pseudo-terminal");
    p.set_expect_timeout(Some(std::time::Duration::from_secs(60)));
    p.expect("lmt> ").unwrap();
    // An entry with a gen: the prompt text and the generated text stream back.
    p.send_line("Score: {% gen score regex=\"[0-9]{3}\" %}").unwrap();
    p.expect(Regex("Score: [0-9]{3}")).unwrap();
    p.expect("lmt> ").unwrap();
    // Completion: `sco` + Tab becomes the variable `score`, `up` + Tab the filter `upper`.
    p.send("{{ sco").unwrap();
    p.send("\t").unwrap();
    p.send(" | up").unwrap();
    p.send("\t").unwrap();
    p.send(" }}\r").unwrap();
    p.expect("{{ score | upper").unwrap();
    p.expect(Regex("\n[0-9]{3}")).unwrap();
    p.expect("lmt> ").unwrap();
    // Ctrl-C stops a long generation and returns to the prompt with the output kept.
    p.send_line("{% for i in range(100000) %}{% hidden %}{% gen x max_tokens=40 %}{% end %}{% end %}").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send(ControlCode::EndOfText).unwrap();
    p.expect("cancelled: partial output kept").unwrap();
    p.expect("lmt> ").unwrap();
    p.send_line(":vars").unwrap();
    p.expect(Regex("score = \"[0-9]{3}\"")).unwrap();
    p.expect("lmt> ").unwrap();
    // Ctrl-D leaves; the history is kept in the data directory.
    p.send(ControlCode::EndOfTransmission).unwrap();
    p.expect(expectrl::Eof).unwrap();
    let history = std::fs::read_to_string(dir.join("data/lmt/repl_history")).expect("a history file");
    assert!(history.contains("{% gen score regex="), "{history}");
}
