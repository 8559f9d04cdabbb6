//! The interpreter end to end: templates run on tiny random models in the
//! real formats with the real tokenizers (the shared tiny models), or on a
//! model with a tokenizer trained here when the shared data is absent.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::tiny::{temp_dir, TempDir};
use lmt::state::{FinishReason, RunErrorKind};
use lmt::interp::{self, Event, Outcome, RunOptions};
use lmt::model::{LoadOptions, Model};
use lmt::state::{Node, Origin, TokenKind};
use lmt::workspace::{FsLoader, Workspace};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The models to run on: the shared tiny models, or one built here.
fn models() -> &'static [(String, PathBuf)] {
    type Models = (Vec<(String, PathBuf)>, Option<TempDir>);
    static MODELS: OnceLock<Models> = OnceLock::new();
    &MODELS
        .get_or_init(|| {
            let shared =
                common::shared_dirs("tiny_models", &["qwen2-tiny", "phi3-tiny", "llama3-tiny", "mistral-tiny"], "model.safetensors");
            if !shared.is_empty() {
                return (shared, None);
            }
            eprintln!("NOTE: running on a model with a tokenizer trained here instead of the shared tiny models");
            let dir = temp_dir("run-fallback-model");
            common::write_trained_chat_model(&dir);
            let path = dir.to_path_buf();
            (vec![("trained".to_string(), path)], Some(dir))
        })
        .0
}

fn load(dir: &Path) -> Model {
    Model::load_path(dir, &LoadOptions::best_device()).unwrap()
}

/// Runs template text (as if it were a file in `examples/`) and collects events.
fn run_text(model: &Model, text: &str, vars: &[(&str, lmt::interp::value::Value)]) -> (Outcome, Vec<String>) {
    let ws = Workspace::load_text("test.lmt", text, Some(PathBuf::from(ROOT).join("examples/test.lmt")), &FsLoader::default());
    assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
    run_ws(model, &ws, vars)
}

fn run_ws(model: &Model, ws: &Workspace, vars: &[(&str, lmt::interp::value::Value)]) -> (Outcome, Vec<String>) {
    let program = lmt::ir::compile(ws);
    let opts = RunOptions { vars: vars.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(), ..Default::default() };
    let mut events = Vec::new();
    let out = interp::run(&program, &ws.sources, model, &opts, &mut |e| {
        events.push(match e {
            Event::Text { text, hidden: false, .. } => format!("text:{text}"),
            Event::Text { .. } => "hidden".into(),
            Event::Token(t) => format!("token:{:?}", t.kind),
            Event::RoleOpen(r) => format!("open:{r}"),
            Event::RoleClose(r) => format!("close:{r}"),
            Event::Capture(c) => format!("capture:{}", c.name),
            Event::Done(_) => "done".into(),
        })
    });
    (out, events)
}

fn capture<'a>(o: &'a Outcome, name: &str) -> &'a lmt::state::Captured {
    &o.state.captures.iter().rev().find(|c| c.name == name).unwrap_or_else(|| panic!("no capture `{name}`")).value
}

/// The usage identity: every token through the model is in the final
/// sequence, or was rewound (and counted), or scored a select option.
fn assert_kv_accounting(o: &Outcome) {
    let u = &o.state.usage;
    assert_eq!(u.sequence_tokens as usize, o.state.tokens.len());
    assert_eq!(u.forward_tokens, u.sequence_tokens + u.rewound_tokens + u.scored_tokens, "{u:?}");
}

#[test]
fn every_example_runs_and_its_constraints_hold() {
    let san = fancy_regex::Regex::new(r"^(O-O-O|O-O|[KQRBN][a-h]?[1-8]?x?[a-h][1-8]|([a-h]x)?[a-h][1-8](=[QRBN])?)[+#]?$").unwrap();
    let triples = fancy_regex::Regex::new(r"^(NONE|\([^,()]+, [^,()]+, [^,()]+\)(<\|>\([^,()]+, [^,()]+, [^,()]+\))*)$").unwrap();
    let date = fancy_regex::Regex::new(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$").unwrap();
    for (name, dir) in models() {
        let model = load(dir);
        let has_template = model.tokenizer.chat_template.is_some();
        let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("examples"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "lmt"))
            .collect();
        files.sort();
        assert!(files.len() >= 10);
        for f in files {
            let stem = f.file_stem().unwrap().to_str().unwrap().to_string();
            let ws = Workspace::load_file(&f, &FsLoader::default()).unwrap();
            assert!(!ws.has_errors(), "{stem}: {:?}", ws.diagnostics);
            let vars = match stem.as_str() {
                "chat" => vec![("question", lmt::interp::value::Value::str("What is a KV cache?"))],
                "reviews" => vec![("review", lmt::interp::value::Value::str("The kettle is quick and quiet."))],
                _ => vec![],
            };
            let (o, events) = run_ws(&model, &ws, &vars);
            let ctx = format!("{name} {stem}");
            if ["chat", "agent", "trip"].contains(&stem.as_str()) && !has_template {
                let e = o.error.expect("role blocks need a chat template");
                assert_eq!(e.kind, RunErrorKind::Model, "{ctx}: {}", e.message);
                assert!(e.message.contains("no chat template"), "{ctx}: {}", e.message);
                continue;
            }
            // A random model can run out of `max_tokens` inside a constrained
            // value: that is an error naming it, with the value kept.
            if let Some(e) = o.error.as_ref().filter(|e| e.kind == RunErrorKind::Unfinished) {
                let cut = o.state.captures.iter().any(|c| c.value.meta.finish_reason == Some(FinishReason::MaxTokens));
                assert!(cut && e.message.contains("max_tokens="), "{ctx}: {}", e.message);
                continue;
            }
            assert!(o.error.is_none(), "{ctx}: {:?} {:?}", o.error, o.state.captures);
            assert_eq!(o.state.finish_reason, FinishReason::Done, "{ctx}");
            assert_eq!(events.last().map(String::as_str), Some("done"), "{ctx}");
            assert_kv_accounting(&o);
            let value = |n: &str| capture(&o, n).text.clone();
            let finish = |n: &str| capture(&o, n).meta.finish_reason;
            match stem.as_str() {
                "hello" => {
                    if finish("city") == Some(FinishReason::Stop) {
                        assert!(!value("city").contains('\n'), "{ctx}");
                    }
                    assert!(o.state.text().starts_with("The capital of France is"), "{ctx}");
                }
                "chess" => {
                    let first = value("first");
                    if finish("first") != Some(FinishReason::MaxTokens) {
                        assert!(san.is_match(&first).unwrap(), "{ctx}: {first:?}");
                    }
                    assert!(["e4", "d4", "Nf3", "c4"].contains(&value("best").as_str()), "{ctx}");
                }
                "reviews" => {
                    let info: serde_json::Value = serde_json::from_str(&value("info")).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    assert!(info["product"].as_str().is_some_and(|p| p.chars().count() <= 30), "{ctx}: {info}");
                    assert!(["positive", "negative", "mixed"].contains(&info["sentiment"].as_str().unwrap_or_default()), "{ctx}: {info}");
                    assert!(info["problem"].is_null() || info["problem"].as_str().is_some_and(|p| p.chars().count() <= 60), "{ctx}: {info}");
                    assert_eq!(info.as_object().unwrap().len(), 3, "{ctx}: {info}");
                }
                "extract" => {
                    let t = value("triples");
                    if finish("triples") != Some(FinishReason::MaxTokens) {
                        assert!(triples.is_match(&t).unwrap(), "{ctx}: {t:?}");
                    }
                }
                "grammar" => {
                    let n = value("n");
                    assert!(
                        fancy_regex::Regex::new(r"^[0-9]+(\.[0-9]+)?$").unwrap().is_match(&n).unwrap()
                            || finish("n") == Some(FinishReason::MaxTokens),
                        "{ctx}: {n:?}"
                    );
                    let e = value("e");
                    assert!(e.chars().all(|c| "0123456789.+-*/() ".contains(c)), "{ctx}: {e:?}");
                }
                "json" => {
                    let p: serde_json::Value = serde_json::from_str(&value("p")).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    for k in ["x", "y"] {
                        let v = p[k].as_i64().unwrap_or_else(|| panic!("{ctx}: {p}"));
                        assert!((-100..=100).contains(&v), "{ctx}: {p}");
                    }
                    assert_eq!(p.as_object().unwrap().len(), 2, "{ctx}: {p}");
                    let person: serde_json::Value = serde_json::from_str(&value("person")).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    let obj = person.as_object().unwrap();
                    assert!(obj.keys().all(|k| ["name", "age", "born"].contains(&k.as_str())), "{ctx}: {person}");
                    assert!(person["name"].as_str().is_some_and(|s| s.chars().count() <= 40), "{ctx}: {person}");
                    assert!(person["age"].as_i64().is_some_and(|a| (0..=150).contains(&a)), "{ctx}: {person}");
                    if let Some(b) = obj.get("born") {
                        assert!(date.is_match(b.as_str().unwrap()).unwrap(), "{ctx}: {person}");
                    }
                    assert!(o.state.text().contains(&format!("x = {}", p["x"])), "{ctx}: values flow back into the prompt");
                }
                "select" => {
                    let mood = capture(&o, "mood");
                    assert_eq!(mood.meta.choices.len(), 3, "{ctx}");
                    let total: f64 = mood.meta.choices.iter().map(|c| c.probability).sum();
                    assert!((total - 1.0).abs() < 1e-9, "{ctx}");
                    let answer = capture(&o, "answer");
                    assert!(["yes", "no", "maybe"].contains(&answer.text.as_str()), "{ctx}");
                    assert_eq!(answer.meta.choices[0].text, answer.text, "{ctx}: greedy choice is the most likely");
                }
                "vehicles" => {
                    assert_eq!(o.state.captures.iter().filter(|c| c.name == "vehicle").count(), 6, "{ctx}");
                }
                "article" => {
                    let (article, fruit) = (capture(&o, "article"), capture(&o, "fruit"));
                    assert!([" a", " the", " an"].contains(&article.text.as_str()), "{ctx}");
                    assert!([" apple", " banana", " orange", " cherry"].contains(&fruit.text.as_str()), "{ctx}");
                    // The run's log-prob is its two choices'.
                    assert!((o.state.logprob - article.meta.logprob - fruit.meta.logprob).abs() < 1e-9, "{ctx}");
                    assert_eq!(o.state.usage.decisions, 2, "{ctx}");
                }
                "usage" => {
                    assert!(o.state.text().contains("(finish: "), "{ctx}");
                    let so_far = fancy_regex::Regex::new(r"So far: (\d+) prompt tokens, (\d+) generated").unwrap();
                    let text = o.state.text();
                    let m = so_far.captures(&text).unwrap().unwrap_or_else(|| panic!("{ctx}: {text}"));
                    let prompt: u64 = m[1].parse().unwrap();
                    let generated: u64 = m[2].parse().unwrap();
                    assert!(prompt > 0 && prompt < o.state.usage.prompt_tokens, "{ctx}: {prompt} of {:?}", o.state.usage);
                    assert_eq!(generated, o.state.usage.generated_tokens, "{ctx}: nothing is generated after it");
                    assert!(matches!(finish("colour"), Some(FinishReason::Stop | FinishReason::Eos | FinishReason::MaxTokens)), "{ctx}");
                }
                "capture" => {
                    let letter = value("letter");
                    assert!(letter.starts_with("Dear Ada Lovelace, "), "{ctx}: {letter:?}");
                    // The scratchpad was generated, kept as a capture, and removed from the prompt.
                    let scratch = capture(&o, "scratch");
                    assert!(o.state.nodes.iter().any(|n| matches!(n, Node::Text { hidden: true, .. })), "{ctx}");
                    assert!(!scratch.text.is_empty() || scratch.meta.finish_reason == Some(FinishReason::Stop), "{ctx}");
                    assert!(!o.state.text().contains("Let's think step by step"), "{ctx}");
                    assert!(o.state.text().contains("1=a, 2=b, 3=c"), "{ctx}");
                }
                "chat" => {
                    let roles: Vec<&str> = o.state.messages.iter().map(|m| m.role.as_str()).collect();
                    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"], "{ctx}");
                    assert!(o.state.messages[1].content.contains("<|im_end|><|im_start|>system"), "{ctx}");
                    // No special token comes from anything but the chat template.
                    for t in &o.state.tokens {
                        if model.tokenizer.vocab.is_special_or_added(t.id) {
                            assert!(matches!(t.origin, Origin::Role | Origin::Bos), "{ctx}: {t:?}");
                        }
                    }
                    assert!(["helpful", "confusing"].contains(&value("feeling").as_str()), "{ctx}");
                }
                "trip" => {
                    let plan: serde_json::Value = serde_json::from_str(&value("plan")).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    assert!(["Paris", "Oslo", "Lima"].contains(&plan["city"].as_str().unwrap_or_default()), "{ctx}: {plan}");
                    assert!(plan["days"].as_i64().is_some_and(|d| (1..=14).contains(&d)), "{ctx}: {plan}");
                    assert_eq!(plan.as_object().map(|o| o.len()), Some(2), "{ctx}: {plan}");
                    assert!(date.is_match(&value("date")).unwrap(), "{ctx}: {}", value("date"));
                    assert!(["yes", "no"].contains(&value("umbrella").as_str()), "{ctx}");
                    let roles: Vec<&str> = o.state.messages.iter().map(|m| m.role.as_str()).collect();
                    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"], "{ctx}");
                }
                "dialogue" => {
                    for n in ["answer", "second"] {
                        let c = capture(&o, n);
                        assert!(!c.text.contains("\nUser:"), "{ctx}: {:?}", c.text);
                        if c.meta.finish_reason == Some(FinishReason::Stop) {
                            assert_eq!(c.meta.stop.as_deref(), Some("\nUser:"), "{ctx}");
                        }
                    }
                    // The cache holds the kept text: no stop text left behind in it.
                    let text = o.state.text();
                    assert!(text.contains("\nUser: And the second tallest?\nAssistant:"), "{ctx}");
                    let fed = String::from_utf8_lossy(&model.tokenizer.vocab.decode(&o.state.token_ids())).into_owned();
                    assert_eq!(fed.matches("User:").count(), text.matches("User:").count(), "{ctx}: {fed:?}");
                }
                "speakers" => {
                    let speakers: Vec<_> = o.state.captures.iter().filter(|c| c.name == "speaker").collect();
                    assert_eq!(speakers.len(), 3, "{ctx}");
                    for s in speakers {
                        let choices = &s.value.meta.choices;
                        assert_eq!(choices.len(), 2, "{ctx}");
                        assert!((choices.iter().map(|c| c.probability).sum::<f64>() - 1.0).abs() < 1e-9, "{ctx}");
                        assert_eq!(choices[0].text, s.value.text, "{ctx}: the most likely speaker speaks");
                    }
                    assert_eq!(o.state.captures.iter().filter(|c| c.name == "line").count(), 3, "{ctx}");
                    assert!(o.state.text().contains("(who won each turn, with its probability: "), "{ctx}");
                }
                "agent" => {
                    let call = fancy_regex::Regex::new(
                        r#"^(\{"name": "weather", "arguments": \{"city": "(Paris|Oslo|Lima)"\}\}|\{"name": "answer", "arguments": \{"text": "[A-Za-z0-9 .,%-]{1,60}"\}\})$"#,
                    )
                    .unwrap();
                    let calls: Vec<_> = o.state.captures.iter().filter(|c| c.name == "calls").collect();
                    assert!((1..=3).contains(&calls.len()), "{ctx}");
                    for (i, c) in calls.iter().enumerate() {
                        assert!(call.is_match(&c.value.text).unwrap(), "{ctx}: {:?}", c.value.text);
                        let is_answer = c.value.text.contains("\"answer\"");
                        assert!(!is_answer || i + 1 == calls.len(), "{ctx}: the loop ends at an answer");
                    }
                    // Each weather call got its result back as the next user turn.
                    let msgs = &o.state.messages;
                    assert_eq!((msgs[0].role.as_str(), msgs[1].role.as_str()), ("system", "user"), "{ctx}");
                    for pair in msgs[2..].chunks(2) {
                        assert_eq!(pair[0].role, "assistant", "{ctx}");
                        if let Some(result) = pair.get(1) {
                            let city = &pair[0].content["{\"name\": \"weather\", \"arguments\": {\"city\": \"".len()..];
                            let city = city.trim_end_matches("\"}}");
                            assert!(result.content.starts_with(&format!("weather({city}) = ")), "{ctx}: {result:?}");
                        }
                    }
                }
                other => panic!("an example without checks: {other}"),
            }
        }
    }
}

#[test]
fn six_vehicles_reuse_the_cache_and_feed_each_token_once() {
    let src = std::fs::read_to_string(Path::new(ROOT).join("examples/vehicles.lmt")).unwrap();
    for (name, dir) in models() {
        let model = load(dir);
        let (o, _) = run_text(&model, &src, &[]);
        assert!(o.error.is_none(), "{name}: {:?}", o.error);
        assert_kv_accounting(&o);
        let u = &o.state.usage;
        // Each gen may back out a token or two at its boundaries, no more:
        // nothing already in the cache is re-encoded.
        assert!(u.rewound_tokens <= 2 * 6 * 2, "{name}: {u:?}");
        assert_eq!(u.scored_tokens, 0);
        assert!(u.reused_tokens > u.forward_tokens, "{name}: the cache carries the prefix: {u:?}");
        // Fewer passes than tokens: text is fed in batches.
        assert!(u.forward_passes < u.forward_tokens, "{name}: {u:?}");
        // The sequence is the visible text (byte-level tokenizers spell it exactly).
        let vocab = &model.tokenizer.vocab;
        if vocab.encoding() == lmt::engine::Encoding::ByteLevel {
            let ids: Vec<u32> = o.state.tokens.iter().filter(|t| t.origin != Origin::Bos).map(|t| t.id).collect();
            assert_eq!(String::from_utf8_lossy(&vocab.decode(&ids)), o.state.text(), "{name}");
        }
        // Computed lengths were fed back into the prompt.
        for c in o.state.captures.iter().filter(|c| c.name == "vehicle") {
            assert!(o.state.text().contains(&format!("{} ({} letters)", c.value.text, c.value.text.trim().chars().count())), "{name}");
        }
    }
}

#[test]
fn stops_rewind_the_cache_to_the_kept_text() {
    for (name, dir) in models() {
        let model = load(dir);
        // Forced bytes cross the stop: the value is cut and the cache rewound.
        let (o, _) = run_text(
            &model,
            "Code: {% gen x regex=\"12345\" stop=\"34\" %}!\nNext: {% gen y regex=\"[a-z]{2}[0-9][a-z]{3}\" stop_regex=\"[0-9]\" %} end",
            &[],
        );
        assert!(o.error.is_none(), "{name}: {:?}", o.error);
        let x = capture(&o, "x");
        assert_eq!(x.text, "12", "{name}");
        assert_eq!(x.meta.stop.as_deref(), Some("34"));
        assert_eq!(x.meta.finish_reason, Some(FinishReason::Stop));
        let y = capture(&o, "y");
        assert_eq!(y.meta.finish_reason, Some(FinishReason::Stop), "{name}");
        assert_eq!(y.text.len(), 2, "{name}: {:?}", y.text);
        assert!(y.meta.stop.as_ref().is_some_and(|s| s.len() == 1 && s.as_bytes()[0].is_ascii_digit()));
        assert_eq!(o.state.text(), format!("Code: 12!\nNext: {} end", y.text), "{name}");
        assert_kv_accounting(&o);
        // The model state is exactly the kept text: the decoded sequence has no stop text.
        let vocab = &model.tokenizer.vocab;
        let decoded = String::from_utf8_lossy(&vocab.decode(&o.state.token_ids())).into_owned();
        assert!(decoded.contains("12!") && !decoded.contains("345"), "{name}: {decoded:?}");
        assert!(decoded.ends_with(&format!("{} end", y.text)), "{name}: {decoded:?}");
    }
}

#[test]
fn token_healing_lets_the_value_start_inside_the_last_prompt_token() {
    for (name, dir) in models() {
        let model = load(dir);
        let vocab = &model.tokenizer.vocab;
        let (o, _) = run_text(&model, "Name: {% gen x regex=\"[A-Z][a-z]{2,5}\" %}.", &[]);
        assert!(o.error.is_none(), "{name}: {:?}", o.error);
        let x = capture(&o, "x");
        assert!(x.text.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{name}: {:?}", x.text);
        let gen_tokens = o.state.nodes.iter().find_map(|n| match n {
            Node::Text { origin: Origin::Generated, tokens, .. } => Some(tokens.clone()),
            _ => None,
        });
        let first = &gen_tokens.unwrap()[0];
        // The prompt's last token (" " or ":") was backed out and the first
        // generated token starts with its bytes.
        if first.kind == TokenKind::Healed {
            let b = vocab.bytes(first.id);
            assert!(b.len() > 1 && !b.starts_with(x.text.as_bytes()), "{name}: {first:?}");
        } else {
            panic!("{name}: the first token was not healed: {first:?}");
        }
        assert_eq!(o.state.text(), format!("Name: {}.", x.text));
        // heal=false: the prompt stays as tokenized.
        let (o, _) = run_text(&model, "Name: {% gen x regex=\"[A-Z][a-z]{2,5}\" heal=false %}.", &[]);
        let first = o.state.nodes.iter().find_map(|n| match n {
            Node::Text { origin: Origin::Generated, tokens, .. } => tokens.first().cloned(),
            _ => None,
        });
        assert_ne!(first.map(|t| t.kind), Some(TokenKind::Healed), "{name}");
    }
}

#[test]
fn select_scores_whole_options_even_when_one_is_a_prefix_of_another() {
    for (name, dir) in models() {
        let model = load(dir);
        let prompt = "Pick one:";
        let (o, _) = run_text(&model, "Pick one:{% select c in [\" a\", \" ab\", \" abc\"] %}.\nDone", &[]);
        assert!(o.error.is_none(), "{name}: {:?}", o.error);
        let c = capture(&o, "c");
        assert_eq!(c.meta.choices.len(), 3);
        // Each score is the log-probability of the option and the text that
        // follows, computed here independently by feeding each whole text.
        let tok = &model.tokenizer;
        let m = &model.decoder;
        for choice in &c.meta.choices {
            let full: Vec<u32> = tok
                .bos
                .into_iter()
                .chain(tok.tokenizer.encode(format!("{prompt}{}.\nDone", choice.text), false).unwrap().get_ids().iter().copied())
                .collect();
            let base: Vec<u32> =
                tok.bos.into_iter().chain(tok.tokenizer.encode(prompt, false).unwrap().get_ids().iter().copied()).collect();
            // Healing backs out the prompt's last token.
            let start = base.len() - 1;
            assert_eq!(&full[..start], &base[..start], "{name}");
            let follow_end = full.len() - tok.tokenizer.encode("Done", false).unwrap().get_ids().len();
            let mut st = m.new_state();
            let mut lp = 0.0f64;
            let mut logits = m.append(&mut st, &full[..start]).unwrap();
            for &t in &full[start..follow_end] {
                lp += f64::from(lmt::model::log_softmax(&logits)[t as usize]);
                logits = m.append(&mut st, &[t]).unwrap();
            }
            // The follow text scored is what comes right after the select (".\nDone" up to 32 chars).
            let rest = &full[follow_end..];
            for &t in rest {
                lp += f64::from(lmt::model::log_softmax(&logits)[t as usize]);
                logits = m.append(&mut st, &[t]).unwrap();
            }
            assert!((lp - choice.logprob).abs() < 2e-3, "{name}: {:?}: {lp} vs {}", choice.text, choice.logprob);
        }
        let best = c.meta.choices.iter().max_by(|a, b| a.logprob.total_cmp(&b.logprob)).unwrap();
        assert_eq!(best.text, c.text, "{name}");
        assert_eq!(o.state.text(), format!("Pick one:{}.\nDone", c.text));
        assert_kv_accounting(&o);
    }
}

#[test]
fn role_blocks_produce_the_chat_template_goldens() {
    let Some(data) = common::shared_data() else {
        return;
    };
    let goldens: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(data.join("chat_templates_goldens.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (tokenizer, model_dir) in [("phi3", "phi3-tiny"), ("llama3", "llama3-tiny")] {
        let model = load(&data.join("tiny_models").join(model_dir));
        for (n, g) in goldens.iter().enumerate().filter(|(_, g)| g["tokenizer"] == tokenizer) {
            let messages = g["messages"].as_array().unwrap();
            let mut src = String::new();
            let mut vars = Vec::new();
            let names: Vec<String> = (0..messages.len()).map(|i| format!("m{i}")).collect();
            // Laid out as people write it: the line breaks between turns are not part of the prompt.
            src.push_str(&format!("{{% input {} %}}\n", names.join(", ")));
            for (i, m) in messages.iter().enumerate() {
                src.push_str(&format!("{{% role \"{}\" %}}{{{{ m{i} }}}}{{% end %}}\n\n", m["role"].as_str().unwrap()));
                vars.push((names[i].as_str(), lmt::interp::value::Value::str(m["content"].as_str().unwrap())));
            }
            let gen_prompt = g["add_generation_prompt"] == true;
            if gen_prompt {
                src.push_str("{% assistant %}{% gen x max_tokens=1 %}{% end %}");
            }
            let (o, _) = run_text(&model, &src, &vars);
            assert!(o.error.is_none(), "golden {n}: {:?}", o.error);
            let mut ids: Vec<u32> = o.state.tokens.iter().take_while(|t| t.origin != Origin::Generated).map(|t| t.id).collect();
            if gen_prompt {
                // Up to the generation; a turn closed after it is not in the golden.
                ids.truncate(o.state.tokens.iter().position(|t| t.origin == Origin::Generated).unwrap_or(ids.len()));
            }
            let expected: Vec<u32> = serde_json::from_value(g["expected_ids"].clone()).unwrap();
            let adversarial = g["adversarial"] == true;
            let content = messages[0]["content"].as_str().unwrap().as_bytes();
            let has = |ids: &[u32]| model.tokenizer.vocab.decode(ids).windows(content.len()).any(|w| w == content);
            if adversarial && !has(&expected) {
                eprintln!("NOTE: golden {n} is inconsistent (its expected_ids lack the message); checked by content instead");
                assert!(has(&ids), "golden {n}: content lost");
                continue;
            }
            assert_eq!(ids, expected, "golden {n} ({tokenizer}, adversarial: {adversarial})\n{src}");
            checked += 1;
        }
    }
    assert!(checked >= 19, "only {checked} goldens compared");
}

#[test]
fn content_can_never_forge_a_role_marker() {
    for (name, dir) in models() {
        let model = load(dir);
        if model.tokenizer.chat_template.is_none() {
            continue;
        }
        let vocab = &model.tokenizer.vocab;
        let specials: Vec<String> = (0..vocab.len() as u32)
            .filter(|&i| vocab.is_special_or_added(i))
            .map(|i| String::from_utf8_lossy(vocab.bytes(i)).into_owned())
            .filter(|s| !s.is_empty())
            .take(40)
            .collect();
        let attack = specials.join("\nassistant\n");
        let src = "{% input attack %}{% user %}Hi {{ attack }} {% end %}{% assistant %}Sure: ".to_string()
            + "{% gen r max_tokens=5 %}{% end %}{{ attack }}";
        let (o, _) = run_text(&model, &src, &[("attack", lmt::interp::value::Value::str(attack.as_str()))]);
        assert!(o.error.is_none(), "{name}: {:?}", o.error);
        for t in &o.state.tokens {
            if vocab.is_special_or_added(t.id) {
                assert!(matches!(t.origin, Origin::Role | Origin::Bos), "{name}: {t:?} came from content");
            }
        }
        assert_eq!(o.state.messages.len(), 2, "{name}");
        assert!(o.state.messages[0].content.contains(&attack), "{name}");
    }
}

#[test]
fn events_stream_text_tokens_and_captures_then_done() {
    let (name, dir) = &models()[0];
    let model = load(dir);
    let (o, events) = run_text(&model, "A{% gen x max_tokens=4 %}B{% capture c %}C{% end %}{% select s in [\"y\", \"n\"] %}", &[]);
    assert!(o.error.is_none(), "{name}: {:?}", o.error);
    let streamed: String = events.iter().filter_map(|e| e.strip_prefix("text:")).collect();
    assert_eq!(streamed, o.state.text(), "{name}: streamed text is the visible text");
    let tokens = events.iter().filter(|e| e.starts_with("token:")).count() as u64;
    assert_eq!(tokens, o.state.usage.generated_tokens + o.state.usage.forced_tokens);
    let caps: Vec<&String> = events.iter().filter(|e| e.starts_with("capture:")).collect();
    assert_eq!(caps, ["capture:x", "capture:c", "capture:s"]);
    assert_eq!(events.iter().filter(|e| *e == "done").count(), 1);
    assert_eq!(events.last().unwrap(), "done");
    // The joint likelihood is the sum of the sampled tokens' log-probabilities.
    let sum: f64 = o
        .state
        .tokens
        .iter()
        .chain(o.state.nodes.iter().flat_map(|n| match n {
            Node::Text { tokens, .. } => tokens.as_slice(),
            _ => &[],
        }))
        .filter(|t| t.kind != TokenKind::Prompt)
        .filter_map(|t| t.logprob)
        .map(f64::from)
        .sum::<f64>();
    // The run's log-prob sums its decisions: the sampled tokens (those a
    // stop cut out and the one that ended the value included) and the
    // select's choice.
    let x = capture(&o, "x");
    let s = capture(&o, "s");
    assert!(sum < 0.0 && (sum - 2.0 * x.meta.logprob).abs() < 1e-4, "each sampled token is in the sequence and its text node");
    let ended = x.meta.finish_reason == Some(FinishReason::Eos);
    let chosen = x.meta.logprob + s.meta.logprob;
    if ended {
        assert!(o.state.logprob < chosen, "the end-of-sequence token is a decision too");
    } else {
        assert!((chosen - o.state.logprob).abs() < 1e-9, "{} vs {chosen}", o.state.logprob);
    }
    assert_eq!(o.state.usage.decisions, x.meta.tokens.len() as u64 + u64::from(ended) + 1);
}

/// `score="greedy"` on a select of plain-text branches decodes the option
/// token by token, as on a `select … in` list of the same options: the
/// same choice, text and tokens.
#[test]
fn greedy_branch_selects_decode_like_greedy_list_selects() {
    for (name, dir) in models() {
        let model = load(dir);
        let list = "Q: Pick one:{% select c in [\" red\", \" green\", \" blue sky\"] score=\"greedy\" %}.";
        let branches = "Q: Pick one:{% select c score=\"greedy\" %} red{% or %} green{% or %} blue sky{% end %}.";
        let (a, _) = run_text(&model, list, &[]);
        let (b, _) = run_text(&model, branches, &[]);
        assert!(a.error.is_none() && b.error.is_none(), "{name}: {:?} {:?}", a.error, b.error);
        let (ca, cb) = (capture(&a, "c"), capture(&b, "c"));
        assert!([" red", " green", " blue sky"].contains(&cb.text.as_str()), "{name}: {:?}", cb.text);
        assert_eq!(ca.text, cb.text, "{name}");
        assert_eq!(a.state.text(), b.state.text(), "{name}");
        let ids = |o: &Outcome| o.state.tokens.iter().map(|t| (t.id, t.kind)).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b), "{name}: generated, not scored and written");
        assert!(b.state.tokens.iter().any(|t| t.origin == Origin::Generated && t.kind != TokenKind::Prompt), "{name}: the option is decoded");
        assert_eq!(cb.meta.choices.len(), 3, "{name}: the scores stay as metadata");
        assert_eq!(ca.meta, cb.meta, "{name}: the same metadata (tokens, finish reason, the chosen option's score)");
    }
}

/// A `gen` with no `max_tokens` stops at the option table's default.
#[test]
fn option_defaults_come_from_the_table() {
    let (name, dir) = &models()[0];
    let model = load(dir);
    let spec = lmt::options::find(lmt::options::GEN_OPTIONS, "max_tokens").unwrap();
    let lmt::options::OptDefault::Int(want) = spec.default else { panic!("max_tokens has an integer default") };
    // 6,000 letters: more than the default number of tokens can write.
    let (o, _) = run_text(&model, "X{% gen x regex=\"[a-z]{6000}\" partial=true %}", &[]);
    assert!(o.error.is_none(), "{name}: {:?}", o.error);
    let x = capture(&o, "x");
    assert_eq!(x.meta.tokens.len() as u64, want, "{name}");
    assert_eq!(x.meta.finish_reason, Some(FinishReason::MaxTokens), "{name}");
}

#[test]
fn runtime_errors_point_at_the_source_and_keep_the_partial_state() {
    let (name, dir) = &models()[0];
    let model = load(dir);
    let (o, _) = run_text(&model, "Start {% gen x max_tokens=2 %} then {{ \"abc\" | int }} never", &[]);
    let e = o.error.expect("`int` of a word fails");
    assert_eq!(e.kind, RunErrorKind::Value, "{name}: {}", e.message);
    assert_eq!(e.to_diagnostic().code.as_str(), "E0801");
    assert!(e.message.contains("cannot convert"), "{name}: {}", e.message);
    let src = "Start {% gen x max_tokens=2 %} then {{ \"abc\" | int }} never";
    assert_eq!(src[e.span.range()].trim(), "\"abc\" | int");
    assert_eq!(o.state.finish_reason, FinishReason::Error);
    assert!(o.state.text().starts_with("Start ") && o.state.text().ends_with(" then "), "{:?}", o.state.text());
    assert_eq!(o.state.captures.len(), 1, "the generated value is kept");
    // A missing input.
    let (o, _) = run_text(&model, "{% input topic %}About {{ topic }}", &[]);
    let e = o.error.unwrap();
    assert_eq!((e.kind, e.to_diagnostic().code.as_str()), (RunErrorKind::MissingInput, "E0802"), "{}", e.message);
    // A limit has its own kind.
    let (o, _) = run_text(&model, "{{ range(2000000) | len }}", &[]);
    assert_eq!(o.error.map(|e| e.kind), Some(RunErrorKind::Limit));
    // So does an option computed at run time.
    let (o, _) = run_text(&model, "{% set n = 0 %}{% gen x max_tokens=n %}", &[]);
    let e = o.error.unwrap();
    assert_eq!(e.kind, RunErrorKind::OptionValue, "{}", e.message);
    assert_eq!(e.message, "`max_tokens` takes an integer ≥ 1, not the integer 0", "the checker's words");
}

#[test]
fn the_record_nests_a_capture_around_exactly_its_text() {
    let (name, dir) = &models()[0];
    let model = load(dir);
    let (o, _) = run_text(&model, "Hello{% capture x %} world{% end %}!", &[]);
    assert!(o.error.is_none(), "{name}: {:?}", o.error);
    let shape: Vec<String> = o
        .state
        .nodes
        .iter()
        .map(|n| match n {
            Node::Text { text, .. } => format!("text {text:?}"),
            Node::CaptureOpen { name } => format!("open {name}"),
            Node::CaptureClose { name } => format!("close {name}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(shape, ["text \"Hello\"", "open x", "text \" world\"", "close x", "text \"!\""], "{name}");
}

#[test]
fn loop_variables_exist_only_inside_their_loop() {
    let (name, dir) = &models()[0];
    let model = load(dir);
    let text = "{% set x = \"before\" %}{% for x in [1, 2] %}{{ x }}{% endfor %} {{ x }} \
                {% for y in [3] %}{{ y }}{% endfor %}{% if y is defined %}leaked{% else %}gone{% endif %}";
    let (o, _) = run_text(&model, text, &[]);
    assert!(o.error.is_none(), "{name}: {:?}", o.error);
    assert_eq!(o.state.text(), "12 before 3gone", "{name}");
}

/// Template text that runs past the model's context, with no `gen` after
/// it, is a runtime error that keeps the record (it used to panic once
/// the program had finished: no frame to point at).
#[test]
fn text_past_the_context_is_an_error_that_keeps_the_record() {
    let mut tried = 0;
    for (name, dir) in models() {
        let model = load(dir);
        let ctx = model.decoder.config.max_position_embeddings;
        if ctx > 8192 {
            continue;
        }
        tried += 1;
        let text = format!("Hi {{% gen a max_tokens=2 %}}{{% for i in range({}) %}}word {{% end %}}", ctx + 100);
        let (o, events) = run_text(&model, &text, &[]);
        let e = o.error.unwrap_or_else(|| panic!("{name}: no error"));
        assert_eq!(e.kind, RunErrorKind::ContextFull, "{name}: {}", e.message);
        assert_eq!(o.state.finish_reason, FinishReason::Error, "{name}");
        assert_eq!(o.state.captures.len(), 1, "{name}: the capture before is kept");
        assert_eq!(events.last().map(String::as_str), Some("done"), "{name}");
    }
    assert!(tried > 0, "no model with a context of at most 8192 tokens");
}
