//! Templates through a real llama.cpp `llama-server` (built by
//! `../shared/scripts/llama-cpp/build-server.sh`, serving the SmolLM2 GGUF
//! on 127.0.0.1): constraints hold, captures equal what the server
//! generates for the same prompt, selects run with their warning, datasets
//! hit the server's prefix cache; and failures (server down, HTTP 500, no
//! answer, a wrong key) end with exit 3, a clear message and the partial
//! record kept. Failures the real server cannot be made to show on demand
//! come from a scripted stand-in that answers as llama-server does.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A llama-server under a watchdog shell that kills it once its standard
/// input closes: when the `Server` is dropped, and also when this test
/// process ends without dropping it (the shared server lives in a static,
/// which Rust never drops) or is killed.
struct Server {
    watchdog: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// The llama-server binary: `$LMT_LLAMA_SERVER`, else where build-server.sh puts it.
fn server_binary() -> Option<PathBuf> {
    let path = std::env::var_os("LMT_LLAMA_SERVER")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/lmt-llama-server/build/bin/llama-server")))
        .filter(|p| p.is_file());
    if path.is_none() {
        common::skip("llama-server is not built (run ../shared/scripts/llama-cpp/build-server.sh)");
    }
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts llama-server on the SmolLM2 GGUF with `extra` arguments and waits
/// until it answers `/health` (a hang guard of 120 s, not a timing).
fn start_server(extra: &[&str]) -> Option<Server> {
    let (bin, model) = (server_binary()?, common::smollm2_gguf()?);
    let port = free_port();
    let watchdog = Command::new("sh")
        .args(["-c", r#""$0" "$@" & s=$!; read -r _; kill "$s"; wait "$s""#])
        .arg(bin)
        .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1", "--port", &port.to_string(), "-t", "2", "-c", "8192", "--parallel", "4"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server { watchdog, url: format!("http://127.0.0.1:{port}") };
    let started = Instant::now();
    while ureq::get(&format!("{}/health", server.url)).call().is_err() {
        assert!(started.elapsed() < Duration::from_secs(120), "llama-server did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    Some(server)
}

/// One server for the tests that need no special flags.
fn shared_server() -> Option<&'static str> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER.get_or_init(|| start_server(&[])).as_ref().map(|s| s.url.as_str())
}

fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn write_template(dir: &Path, text: &str) -> String {
    let p = dir.join("t.lmt");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn run_json(args: &[&str]) -> (i32, Value, String) {
    let (code, out, err) = common::lmt(args);
    let doc = serde_json::from_str(&out).unwrap_or(Value::Null);
    (code, doc, err)
}

#[test]
fn examples_run_with_their_constraints() {
    let Some(url) = shared_server() else { return };
    for name in ["hello", "capture", "grammar", "json", "dialogue", "trip", "usage", "vehicles", "agent", "chess", "article"] {
        let (code, doc, err) = run_json(&["run", &example(&format!("{name}.lmt")), "--model", url, "--json", "-q"]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(doc["finish_reason"], "done", "{name}");
        assert!(doc["usage"]["generated_tokens"].as_u64().unwrap() > 0, "{name}");
    }
    // Values checked here, independently of lmt's own re-check.
    let (_, doc, _) = run_json(&["run", &example("json.lmt"), "--model", url, "--json", "-q"]);
    let p: Value = serde_json::from_str(doc["captures"]["p"]["value"].as_str().unwrap()).unwrap();
    for k in ["x", "y"] {
        let v = p[k].as_i64().unwrap();
        assert!((-100..=100).contains(&v), "{p}");
    }
    assert_eq!(p.as_object().unwrap().len(), 2);
    let person: Value = serde_json::from_str(doc["captures"]["person"]["value"].as_str().unwrap()).unwrap();
    assert!(person["name"].is_string(), "{person}");
    let (_, doc, _) = run_json(&["run", &example("grammar.lmt"), "--model", url, "--json", "-q"]);
    let arith = regex_automata::meta::Regex::new(r"^[0-9]+(\.[0-9]+)?( ?[-+*/] ?([0-9]+(\.[0-9]+)?|\(.*\)))*$").unwrap();
    for k in ["e", "n"] {
        let v = doc["captures"][k]["value"].as_str().unwrap();
        assert!(arith.is_match(v) || v.contains('('), "{k} = {v:?}");
    }
    assert!(doc["captures"]["n"]["value"].as_str().unwrap().bytes().all(|b| b.is_ascii_digit() || b == b'.'));
}

#[test]
fn regexes_choices_and_captures_equal_the_servers_text() {
    let Some(url) = shared_server() else { return };
    let dir = std::env::temp_dir().join(format!("lmt-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = write_template(
        &dir,
        "Q: What is the capital of France?\nA:{% gen answer max_tokens=12 stop=\"\\n\" %}\n\
         A year: {% gen year regex=\"1[0-9]{3}|20[0-9]{2}\" %}\n\
         A colour: {% select colour in [\"red\", \"green\", \"blue\"] %}\n",
    );
    let (code, doc, err) = run_json(&["run", &t, "--model", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("W0902"), "the select's warning: {err}");
    let year = doc["captures"]["year"]["value"].as_str().unwrap();
    assert!(regex_automata::meta::Regex::new(r"^(1[0-9]{3}|20[0-9]{2})$").unwrap().is_match(year), "{year:?}");
    assert!(["red", "green", "blue"].contains(&doc["captures"]["colour"]["value"].as_str().unwrap()));
    // Healed as locally: "A:" was backed out, the first token the engine
    // chose spells ":" and more.
    let tokens = doc["tokens"].as_array().unwrap();
    let first = tokens.iter().find(|t| t["origin"] == "generated").unwrap();
    assert_eq!(first["kind"], "healed", "{first}");
    assert!(first["text"].as_str().unwrap().starts_with(':'), "{first}");
    // The same request sent by hand: lmt's token ids before the value, and
    // a grammar for ":" then anything.
    let prompt: Vec<u64> = tokens.iter().take_while(|t| t["origin"] != "generated").map(|t| t["id"].as_u64().unwrap()).collect();
    let body = json!({"prompt": prompt, "n_predict": 12, "temperature": 0.0, "stop": ["\n"], "repeat_penalty": 1.0,
                      "grammar": "root ::= \":\" [\\x00-\\U0010FFFF]*"});
    let resp: Value = ureq::post(&format!("{url}/completion")).send_json(body).unwrap().into_json().unwrap();
    let content = resp["content"].as_str().unwrap();
    assert_eq!(doc["captures"]["answer"]["value"].as_str(), content.strip_prefix(':'), "{content:?}");
    assert!(content.len() > 1);
    // Every generated token has the model's log-prob.
    assert!(tokens.iter().filter(|t| t["kind"] == "sampled").all(|t| t["logprob"].as_f64().is_some_and(|l| l <= 0.0)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_the_engine_lacks_is_refused_before_any_request() {
    let Some(url) = shared_server() else { return };
    // A bias needs per-token logits; a select with a generating branch too.
    for (name, construct) in [("extract.lmt", "`bias`"), ("select.lmt", "branches generate")] {
        let (code, out, err) = common::lmt(&["run", &example(name), "--model", url]);
        assert_eq!(code, 1, "{name}: {err}");
        assert!(err.contains("E0901") && err.contains(construct) && err.contains("llama-server"), "{name}: {err}");
        assert!(out.is_empty());
    }
    let (code, _, err) = common::lmt(&["run", &example("hello.lmt"), "--model", url, "--beam", "2"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = common::lmt(&["run", &example("hello.lmt"), "--model", url, "--score", "all"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--score all"), "{err}");
}

#[test]
fn a_dataset_shares_the_servers_prefix_cache() {
    let Some(url) = shared_server() else { return };
    let dir = std::env::temp_dir().join(format!("lmt-remote-rows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let reviews: Vec<String> = std::fs::read_to_string(format!("{}/benches/data/reviews64.jsonl", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["review"].as_str().unwrap().to_string())
        .collect();
    let rows: String = (0..200).map(|i| format!("{}\n", json!({"id": format!("row{i}"), "review": reviews[i % reviews.len()]}))).collect();
    let (inp, out) = (dir.join("rows.jsonl"), dir.join("out.jsonl"));
    std::fs::write(&inp, rows).unwrap();
    let (code, _, err) = common::lmt(&[
        "run", &example("reviews.lmt"), "--model", url, "--inputs", inp.to_str().unwrap(), "--out", out.to_str().unwrap(), "--parallel", "4", "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let records: Vec<Value> = std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ids: std::collections::BTreeSet<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!((records.len(), ids.len()), (200, 200));
    let schema_fields = ["product", "sentiment", "problem"];
    for r in &records {
        assert!(r.get("error").is_none_or(Value::is_null), "{r}");
        let v: Value = serde_json::from_str(r["captures"]["info"]["value"].as_str().unwrap()).unwrap();
        assert!(schema_fields.iter().all(|k| v.get(k).is_some()), "{v}");
        assert!(["positive", "negative", "mixed"].contains(&v["sentiment"].as_str().unwrap()), "{v}");
    }
    // The instructions and examples (about 150 tokens) come from the
    // server's cache for every row but those that started together.
    let cached: u64 = records.iter().map(|r| r["usage"]["prefix_cached_tokens"].as_u64().unwrap()).sum();
    assert!(cached >= 190 * 100, "prompt tokens the server took from its cache: {cached}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_key_is_exit_3_and_the_right_one_runs() {
    let Some(server) = start_server(&["--api-key", "sesame"]) else { return };
    let run = |key: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_lmt"))
            .args(["run", &example("hello.lmt"), "--model", &server.url, "--tokenizer"])
            .arg(common::smollm2_gguf().unwrap())
            .env("LMT_API_KEY", key)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run("wrong");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("API key"), "{err}");
    let (code, err) = run("sesame");
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_server_that_is_down_is_exit_3() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    let url = format!("http://127.0.0.1:{}", free_port());
    let (code, _, err) = common::lmt(&["run", &example("hello.lmt"), "--model", &url, "--tokenizer", gguf.to_str().unwrap()]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot connect") && err.contains(&url), "{err}");
}

/// What the stand-in answers to `/completion` requests, in turn.
#[derive(Clone, Copy)]
enum Answer {
    /// A llama-server completion of " Paris" and EOS.
    Paris,
    /// HTTP 500 with llama-server's error shape.
    Status500,
    /// Nothing, ever.
    Silence,
    /// A completion whose body comes a byte at a time.
    Drip,
}

/// A stand-in llama-server: `/props` as llama-server answers it (serving
/// the SmolLM2 GGUF at `model`), each `/completion` with the next answer
/// (the last repeats).
fn stand_in(model: &Path, answers: Vec<Answer>) -> String {
    let props = json!({"default_generation_settings": {"n_ctx": 2048}, "model_path": model, "total_slots": 1});
    let turn = std::sync::atomic::AtomicUsize::new(0);
    serve(move |path, _| {
        if path == "/props" {
            return Some((200, props.clone()));
        }
        let t = turn.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match answers[t.min(answers.len() - 1)] {
            Answer::Paris => Some((
                200,
                json!({"content": " Paris", "tokens": [7042], "stop_type": "eos", "stopping_word": "",
                       "completion_probabilities": [{"id": 7042, "logprob": -0.25, "top_logprobs": []}],
                       "timings": {"prompt_n": 5, "cache_n": 0}}),
            )),
            Answer::Status500 => Some((500, json!({"error": {"code": 500, "message": "the slot crashed"}}))),
            Answer::Silence => None,
            Answer::Drip => Some((DRIP, json!({"content": " Paris and a great deal more text than anyone will wait for"}))),
        }
    })
}

/// The status with which [`serve`] sends a 200 whose body comes a byte every 300 ms.
const DRIP: u16 = 0;

/// An HTTP server on a free port answering each request with `answer(path,
/// body)`: a status and JSON (status [`DRIP`]: dripped), or (`None`) never.
/// Returns its URL.
fn serve(answer: impl Fn(&str, &Value) -> Option<(u16, Value)> + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some((path, body)) = read_request(&mut stream) else { continue };
            let Some((status, reply)) = answer(&path, &body) else {
                // Held open, unanswered, past any timeout a test gives.
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(30));
                    drop(stream);
                });
                continue;
            };
            let reply = reply.to_string();
            let head = |status: u16| format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", reply.len());
            if status == DRIP {
                let ok = head(200);
                std::thread::spawn(move || {
                    let _ = stream.write_all(ok.as_bytes());
                    for b in reply.bytes() {
                        std::thread::sleep(Duration::from_millis(300));
                        if stream.write_all(&[b]).and_then(|()| stream.flush()).is_err() {
                            return;
                        }
                    }
                });
                continue;
            }
            let _ = write!(stream, "{}{reply}", head(status));
        }
    });
    url
}

/// Reads one request: its path and JSON body (`null` when none).
fn read_request(stream: &mut TcpStream) -> Option<(String, Value)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut length = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((path, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

#[test]
fn a_failing_server_is_exit_3_and_the_record_keeps_what_came_before() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    let dir = std::env::temp_dir().join(format!("lmt-remote-fail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (No healing: the stand-in's canned answers do not begin with the healed text.)
    let t = write_template(&dir, "The capital of France is{% gen city max_tokens=4 heal=false %}. And of Italy:{% gen other max_tokens=4 heal=false %}");
    // The first value comes back; the second request gets 500 (retried, then given up).
    let url = stand_in(&gguf, vec![Answer::Paris, Answer::Status500]);
    let (code, doc, err) = run_json(&["run", &t, "--model", &url, "--json", "-q"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("HTTP 500") && err.contains("the slot crashed") && err.contains("after 3 attempts"), "{err}");
    assert_eq!(doc["captures"]["city"]["value"], " Paris");
    assert_eq!(doc["finish_reason"], "error");
    assert_eq!(doc["error"]["kind"], "model-failed");
    // No answer within the timeout.
    let url = stand_in(&gguf, vec![Answer::Silence]);
    let (code, _, err) = run_json(&["run", &t, "--model", &url, "--json", "-q", "--timeout", "1"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no response within"), "{err}");
    // A body that comes a byte at a time is bounded by the same timeout.
    let url = stand_in(&gguf, vec![Answer::Drip]);
    // (It would complete after about 20 s: each byte comes well within the timeout.)
    let (code, _, err) = run_json(&["run", &t, "--model", &url, "--json", "-q", "--timeout", "1"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no response within") || err.contains("timed out"), "{err}");
    // A value that breaks its constraint is the engine's error, never a capture.
    let t = write_template(&dir, "The capital of France is{% gen city regex=\"[0-9]+\" heal=false %}");
    let url = stand_in(&gguf, vec![Answer::Paris]);
    let (code, doc, err) = run_json(&["run", &t, "--model", &url, "--json", "-q"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("does not match") && err.contains("llama-server"), "{err}");
    assert!(doc["captures"].get("city").is_none(), "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn fixture(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{}/tests/data/remote/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()).unwrap()
}

/// The requests a stand-in received, in order.
type Log = std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>;

/// Runs a generation and a scored select through a stand-in of `engine`
/// whose answers come from `answer`; returns the record and the requests.
fn through_stand_in(engine: Option<&str>, answer: impl Fn(&str, &Value) -> Option<(u16, Value)> + Send + 'static) -> Option<(Value, String, Vec<(String, Value)>)> {
    let gguf = common::smollm2_gguf()?;
    let log: Log = Default::default();
    let seen = log.clone();
    let url = serve(move |path, body| {
        seen.lock().unwrap().push((path.to_string(), body.clone()));
        answer(path, body)
    });
    let dir = std::env::temp_dir().join(format!("lmt-remote-{}-{}", engine.unwrap_or("detected"), std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = write_template(&dir, "The capital of France is{% gen city max_tokens=4 heal=false %}. Colour: {% select c in [\"red\", \"blue\"] %}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lmt"));
    cmd.args(["run", &t, "--model", &url, "--json"]).env("NO_COLOR", "1");
    match engine {
        Some(e) => cmd.args(["--engine", e, "--tokenizer", gguf.to_str().unwrap()]),
        // Detected, with the tokenizer of the hub model the engine names,
        // from a Hugging Face cache (offline: up to the network boundary).
        None => cmd.env("HF_HUB_OFFLINE", "1").env("HF_HUB_CACHE", hub_cache(&dir)?),
    };
    let out = cmd.output().unwrap();
    let (code, err) = (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(code, 0, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    let requests = log.lock().unwrap().clone();
    Some((doc, err, requests))
}

/// A Hugging Face cache under `dir` holding SmolLM2-135M-Instruct's
/// tokenizer files (from the shared data) and its config, as the hub lays
/// them out: no weights.
fn hub_cache(dir: &Path) -> Option<PathBuf> {
    let data = common::shared_data()?.join("smollm2");
    let cache = dir.join("hub");
    let repo = cache.join("models--HuggingFaceTB--SmolLM2-135M-Instruct");
    let commit = "12fd25f77366fa6b3b4b768ec3050bf629380bac";
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        std::fs::copy(data.join(f), snap.join(f)).unwrap();
    }
    let config = json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": 2});
    std::fs::write(snap.join("config.json"), config.to_string()).unwrap();
    Some(cache)
}

/// The log-prob the stand-ins give each option token: option 1 ("blue") is likelier.
fn option_logprob(option: usize) -> f64 {
    if option == 1 { -1.0 } else { -5.0 }
}

/// Checks a run through a stand-in: the value, the select scored by the
/// engine's log-probs (no W0902), and the prompts as lmt's token ids.
fn check_scored_run(doc: &Value, err: &str, generation: &Value, scoring: &Value, key: &str) {
    // The prompts of a request: one list of ids, or a list of them.
    let ids = |p: &Value| -> Vec<u64> { p.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect() };
    let prompts = |b: &Value| -> Vec<Vec<u64>> {
        match b[key][0].is_array() {
            true => b[key].as_array().unwrap().iter().map(ids).collect(),
            false => vec![ids(&b[key])],
        }
    };
    assert_eq!(doc["captures"]["city"]["value"], " Paris");
    assert_eq!(doc["captures"]["c"]["value"], "blue", "{doc}");
    assert!(!err.contains("W0902"), "{err}");
    let choices = doc["captures"]["c"]["choices"].as_array().unwrap();
    assert_eq!(choices[0]["text"], "blue");
    assert!(choices[0]["logprob"].as_f64().unwrap() < 0.0 && choices[1]["logprob"].as_f64().unwrap() < choices[0]["logprob"].as_f64().unwrap());
    assert!(doc["usage"]["scored_tokens"].as_u64().unwrap() >= 2);
    let gen_prompt = &prompts(generation)[0];
    let ids: Vec<u64> = doc["tokens"].as_array().unwrap().iter().map(|t| t["id"].as_u64().unwrap()).collect();
    assert_eq!(gen_prompt[..], ids[..gen_prompt.len()], "the generation's prompt is the record's tokens");
    let scored = prompts(scoring);
    assert_eq!(scored.len(), 2);
    // Both options after one prefix: the record's tokens before the choice.
    let shared = scored[0].iter().zip(&scored[1]).take_while(|(a, b)| a == b).count();
    assert!(shared >= gen_prompt.len(), "the options share the prompt: {scored:?}");
    assert_eq!(scored[0][..shared], ids[..shared]);
}

#[test]
fn vllm_adapter_runs_a_template_against_a_stand_in() {
    let Some((doc, err, requests)) = through_stand_in(None, |path, body| match path {
        "/v1/models" => Some((200, fixture("vllm_models.json"))),
        "/v1/completions" if body["prompt"][0].is_array() => {
            let choices: Vec<Value> = body["prompt"].as_array().unwrap().iter().enumerate().map(|(i, p)| {
                let mut lps = vec![Value::Null];
                lps.extend(p.as_array().unwrap()[1..].iter().map(|id| json!({id.to_string(): {"logprob": option_logprob(i), "rank": 1, "decoded_token": ""}})));
                json!({"index": i, "text": ",", "token_ids": [28], "logprobs": null, "finish_reason": "length", "stop_reason": null, "prompt_logprobs": lps})
            }).collect();
            Some((200, json!({"id": "cmpl-1", "object": "text_completion", "choices": choices, "usage": {"prompt_tokens": 9, "completion_tokens": 2}})))
        }
        "/v1/completions" => Some((200, fixture("vllm_completion_response.json"))),
        _ => Some((404, json!({"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}}))),
    }) else { return };
    assert!(err.contains("tokenizer from the hub model HuggingFaceTB/SmolLM2-135M-Instruct"), "{err}");
    let posts: Vec<&Value> = requests.iter().filter(|(p, _)| p == "/v1/completions").map(|(_, b)| b).collect();
    assert_eq!(posts.len(), 2, "one generation, one request scoring both options");
    assert_eq!(posts[0]["model"], "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_eq!(posts[0]["return_token_ids"], true);
    check_scored_run(&doc, &err, posts[0], posts[1], "prompt");
}

#[test]
fn sglang_adapter_runs_a_template_against_a_stand_in() {
    let Some((doc, err, requests)) = through_stand_in(Some("sglang"), |path, body| match path {
        "/get_model_info" => Some((200, fixture("sglang_model_info.json"))),
        "/generate" if body["input_ids"][0].is_array() => {
            let from = body["logprob_start_len"].as_u64().unwrap() as usize;
            let items: Vec<Value> = body["input_ids"].as_array().unwrap().iter().enumerate().map(|(i, p)| {
                let lps: Vec<Value> = p.as_array().unwrap()[from..].iter().map(|id| json!([option_logprob(i), id, null])).collect();
                json!({"text": "", "meta_info": {"finish_reason": {"type": "length", "length": 0}, "prompt_tokens": p.as_array().unwrap().len(), "cached_tokens": from, "input_token_logprobs": lps, "output_token_logprobs": []}})
            }).collect();
            Some((200, Value::Array(items)))
        }
        "/generate" => Some((200, fixture("sglang_generate_response.json"))),
        _ => Some((404, json!({"detail": "Not Found"}))),
    }) else { return };
    let posts: Vec<&Value> = requests.iter().filter(|(p, _)| p == "/generate").map(|(_, b)| b).collect();
    assert_eq!(posts.len(), 2, "one generation, one request scoring both options");
    assert_eq!(posts[0]["return_logprob"], true);
    check_scored_run(&doc, &err, posts[0], posts[1], "input_ids");
}

#[test]
fn samples_run_through_the_engine() {
    let Some(url) = shared_server() else { return };
    let dir = std::env::temp_dir().join(format!("lmt-remote-samples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = write_template(&dir, "A number between 10 and 99: {% gen n regex=\"[1-9][0-9]\" %}");
    let (code, doc, err) = run_json(&["run", &t, "--model", url, "--samples", "4", "--seed", "7", "--json"]);
    assert_eq!(code, 0, "{err}");
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let two_digits = regex_automata::meta::Regex::new(r"^[1-9][0-9]$").unwrap();
    let scores: Vec<f64> = runs.iter().map(|r| r["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "ranked best first: {scores:?}");
    for r in runs {
        let v = r["captures"]["n"]["value"].as_str().unwrap();
        assert!(two_digits.is_match(v), "{v:?}");
        // The run's score is its decisions' log-probs, from the engine.
        assert!(r["logprob"].as_f64().unwrap() < 0.0);
    }
    // Dataset rows searched through the engine.
    let rows = dir.join("rows.jsonl");
    std::fs::write(&rows, "{\"id\": \"a\"}\n{\"id\": \"b\"}\n").unwrap();
    let (code, out, err) = common::lmt(&["run", &t, "--model", url, "--inputs", rows.to_str().unwrap(), "--best-of", "3", "-q"]);
    assert_eq!(code, 0, "{err}");
    let records: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!((r["runs"].as_array().unwrap().len(), r["search"]["runs_started"].as_u64()), (1, Some(3)), "{r}");
        assert!(two_digits.is_match(r["captures"]["n"]["value"].as_str().unwrap()), "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_says_what_an_engine_lacks_without_running() {
    // Named engines need no connection.
    let (code, _, err) = common::lmt(&["check", &example("select.lmt"), "--engine", "llama-server"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("E0901"), "{err}");
    let (code, _, err) = common::lmt(&["check", &example("article.lmt"), "--engine", "llama-server"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("W0902"), "{err}");
    let (code, _, err) = common::lmt(&["check", &example("article.lmt"), "--engine", "vllm"]);
    assert_eq!((code, err.contains("W0902")), (0, false), "{err}");
    let (code, _, err) = common::lmt(&["check", &example("hello.lmt"), "--engine", "openai"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("E0901") && err.contains("openai"), "{err}");
    let (code, _, err) = common::lmt(&["check", &example("hello.lmt")]);
    assert_eq!((code, err.contains("W09")), (0, false), "{err}");
    // Detected at a URL.
    let Some(url) = shared_server() else { return };
    let (code, out, err) = common::lmt(&["check", &example("extract.lmt"), "--model", url, "--format", "json"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.contains("\"E0901\""), "{out}");
}

#[test]
fn ctrl_c_during_a_request_ends_the_run_at_once_with_its_record() {
    let Some(gguf) = common::smollm2_gguf() else { return };
    let dir = std::env::temp_dir().join(format!("lmt-remote-ctrl-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = write_template(&dir, "The capital of France is{% gen city max_tokens=4 heal=false %}. And of Italy:{% gen other max_tokens=4 heal=false %}");
    // The first value comes at once; the second request is never answered
    // (and the timeout is far away): Ctrl-C must not wait for it.
    let url = stand_in(&gguf, vec![Answer::Paris, Answer::Silence]);
    let (code, out) = common::interrupted_run_after(&["run", &t, "--model", &url, "--json"], "connected", 1);
    assert_eq!(code, Some(130));
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["finish_reason"], "cancelled");
    assert_eq!(doc["captures"]["city"]["value"], " Paris");
    let _ = std::fs::remove_dir_all(&dir);
}
