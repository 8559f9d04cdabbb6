//! Shared test helpers: where the shared data lives, and tokenizers the tests
//! train themselves so nothing depends on `../shared` being there.
#![allow(dead_code)]

pub mod gguf_vocab;
pub mod mutate;
pub mod tiny;

use std::path::PathBuf;

/// `../shared/data` (or `$LMT_SHARED_DATA`), if it exists. Prints a loud
/// note when it does not: tests that need it must say they skipped.
pub fn shared_data() -> Option<PathBuf> {
    let dir = std::env::var_os("LMT_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data")));
    if dir.is_dir() {
        Some(dir)
    } else {
        skip(&format!("shared test data not found at {} (set LMT_SHARED_DATA)", dir.display()));
        None
    }
}

/// Says that a test skips part of its work because `what` is missing: on
/// standard error past the test harness's capture, in `$LMT_SKIP_LOG` for
/// `test.sh`'s summary, and as a failure when `LMT_REQUIRE_ALL=1` (as CI
/// sets it).
pub fn skip(what: &str) {
    use std::io::Write;
    if std::env::var("LMT_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("LMT_REQUIRE_ALL=1, but {what}");
    }
    let line = format!("SKIPPED: {what}\n");
    // `eprintln!` is captured by the harness; a write to the handle is not.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("LMT_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The real SmolLM2-135M-Instruct Q4_1 GGUF that
/// `../shared/scripts/fetch-smollm2.sh` fetches (into `$LMT_TEST_MODELS`,
/// else `~/.cache/lmt-test-models`), if it is there.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let dir = std::env::var_os("LMT_TEST_MODELS")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/lmt-test-models")));
    let path = dir.map(|d| d.join("SmolLM2-135M-Instruct.Q4_1.gguf")).filter(|p| p.is_file());
    if path.is_none() {
        skip("the SmolLM2 GGUF is not fetched (run ../shared/scripts/fetch-smollm2.sh)");
    }
    path
}

/// The real tokenizers in the shared data: (name, tokenizer directory).
pub fn real_tokenizers() -> Vec<(String, PathBuf)> {
    shared_dirs("tokenizers", &["gpt2", "llama2", "phi3", "llama3"], "tokenizer.json")
}

/// `data/<sub>/<name>` for each name whose `marker` file exists; says
/// loudly which are missing.
pub fn shared_dirs(sub: &str, names: &[&str], marker: &str) -> Vec<(String, PathBuf)> {
    let Some(data) = shared_data() else { return Vec::new() };
    names
        .iter()
        .map(|n| (n.to_string(), data.join(sub).join(n)))
        .filter(|(n, p)| {
            let ok = p.join(marker).is_file();
            if !ok {
                skip(&format!("{n} missing at {}", p.display()));
            }
            ok
        })
        .collect()
}

/// A small byte-level BPE tokenizer trained in process, with `</s>` as a
/// special token and a non-special added token.
pub fn trained_byte_level() -> tokenizers::Tokenizer {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};
    let mut tok = Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let mut trainer: tokenizers::models::TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(600)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from("</s>", true)])
        .build()
        .into();
    let corpus = [
        "The quick brown fox jumps over the lazy dog. {\"name\": \"Ada\", \"age\": 36}",
        "Knowledge triples: (Marie Curie, discovered, polonium)<|>(Curie, born in, Warsaw)",
        "1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 — chess, 日本語, emoji 😀, café, naïve.",
        "SELECT name FROM users WHERE age > 30; 2024-01-15 12:30:00 user@example.com",
    ];
    let lines: Vec<String> = (0..20).flat_map(|_| corpus.iter().map(|s| s.to_string())).collect();
    tok.train(&mut trainer, lines.into_iter()).expect("training works");
    tok.add_tokens([AddedToken::from("<tool>", false)]).expect("added token");
    tok
}

/// A ChatML template (as Qwen's) for models built with [`write_trained_chat_model`].
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Writes a tiny random Qwen2 model into `dir` in the Hugging Face layout,
/// with a tokenizer trained here (ChatML markers added as special tokens)
/// and a ChatML chat template: a chat model that needs no shared data.
pub fn write_trained_chat_model(dir: &std::path::Path) {
    let mut tok = trained_byte_level();
    tok.add_special_tokens([tokenizers::AddedToken::from("<|im_start|>", true), tokenizers::AddedToken::from("<|im_end|>", true)])
        .expect("special tokens");
    let spec = tiny::Spec::small("qwen2").with_tokenizer(&tok);
    spec.write_hf(dir);
    tok.save(dir.join("tokenizer.json"), false).expect("tokenizer written");
    let cfg = serde_json::json!({"eos_token": "</s>", "chat_template": CHATML});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("tokenizer_config written");
}

/// Runs `lmt args…` (which must print `loaded` on standard error once its
/// model is in), sends SIGINT `presses` times once the run is under way,
/// and returns the exit code and standard output. A process still running
/// 20 s later fails the test (a hang guard, not a timing).
pub fn interrupted_run(args: &[&str], presses: usize) -> (Option<i32>, String) {
    interrupted_run_after(args, "loaded", presses)
}

/// [`interrupted_run`], the run under way once standard error shows `marker`.
pub fn interrupted_run_after(args: &[&str], marker: &str, presses: usize) -> (Option<i32>, String) {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmt")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains(marker) {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "lmt exited early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = child.id().to_string();
    for _ in 0..presses {
        assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    }
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        out
    });
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed().as_secs() > 20 {
            let _ = child.kill();
            panic!("still running 20 s after Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap())
}

/// A model directory for CLI runs: the shared Llama-3 tiny model, or one
/// built in `dir` when the shared data is not there.
pub fn cli_model(dir: &std::path::Path) -> PathBuf {
    if let Some(m) = shared_dirs("tiny_models", &["llama3-tiny"], "model.safetensors").pop() {
        return m.1;
    }
    write_trained_chat_model(dir);
    dir.to_path_buf()
}

/// Runs the `lmt` binary (no colour, no `$LMT_MODEL`): exit code, stdout, stderr.
pub fn lmt(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lmt"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("LMT_MODEL")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The DOM of `url` after its scripts ran in headless Chromium (profile in
/// `profile`); `None` when no Chromium is installed.
pub fn browser_dom(url: &str, profile: &std::path::Path) -> Option<String> {
    let chromium =
        ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"].into_iter().map(PathBuf::from).find(|p| p.exists())?;
    let dom = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(url)
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    Some(String::from_utf8_lossy(&dom.stdout).into_owned())
}
