//! Searches over whole programs (`lmt::search`, `lmt run --samples/--beam`):
//! beam search against an exhaustive enumeration computed without it, on
//! the shared tiny models and SmolLM2; samples reproducible and sharing
//! their prefix; constraints checked by an independent validator; Ctrl-C.

mod common;

use std::path::{Path, PathBuf};

use lmt::interp::{self, Outcome, RunOptions};
use lmt::model::{log_softmax, Decoder, KvState, LoadOptions, Model};
use lmt::search::{self, Found, Mode, SearchOptions};
use lmt::state::TokenKind;
use lmt::workspace::{FsLoader, Workspace};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The shared tiny models and the SmolLM2 GGUF, as many as are here.
fn models() -> Vec<(String, PathBuf)> {
    let mut m = common::shared_dirs("tiny_models", &["qwen2-tiny", "phi3-tiny", "llama3-tiny", "mistral-tiny"], "model.safetensors");
    if m.is_empty() {
        common::skip("beam search on the shared tiny models (../shared/data/tiny_models)");
    }
    match common::smollm2_gguf() {
        Some(p) => m.push(("smollm2".into(), p)),
        None => common::skip("beam search on SmolLM2 (scripts/fetch-smollm2.sh)"),
    }
    m
}

fn program(text: &str) -> (lmt::ir::Program, Workspace) {
    let ws = Workspace::load_text("test.lmt", text, Some(PathBuf::from(ROOT).join("examples/test.lmt")), &FsLoader::default());
    assert!(!ws.has_errors(), "{:?}", ws.diagnostics);
    (lmt::ir::compile(&ws), ws)
}

fn run(model: &Model, text: &str) -> Outcome {
    let (p, ws) = program(text);
    interp::run(&p, &ws.sources, model, &RunOptions::default(), &mut |_| {})
}

fn find(model: &Model, text: &str, mode: Mode, opts: &RunOptions) -> Found {
    let (p, ws) = program(text);
    let search = SearchOptions { mode, length_penalty: 0.0, prefix_cache_bytes: 256 << 20 };
    search::run(&p, &ws.sources, model, opts, &search)
}

/// Every way the model can write a value of `[ab]{3}` token by token, with
/// its log-prob: a walk over the decoder alone (no engine, no
/// interpreter), allowed tokens judged by hand.
fn enumerate_ab(model: &Model, n: usize, st: &KvState, logits: &[f32], value: &str, lp: f64, out: &mut Vec<(String, f64)>) {
    let (decoder, vocab): (&Decoder, _) = (&model.decoder, &model.tokenizer.vocab);
    if value.len() == n {
        out.push((value.to_string(), lp));
        return;
    }
    let lps = log_softmax(logits);
    for id in 0..vocab.len() as u32 {
        let b = vocab.bytes(id);
        if b.is_empty() || value.len() + b.len() > n || !b.iter().all(|&c| c == b'a' || c == b'b') {
            continue;
        }
        let mut next = st.fork_prefix(st.len()).unwrap();
        let l = decoder.append(&mut next, &[id]).unwrap();
        let v = format!("{value}{}", String::from_utf8_lossy(b));
        enumerate_ab(model, n, &next, &l, &v, lp + f64::from(lps[id as usize]), out);
    }
}

/// Beam search as wide as the number of complete runs finds the most
/// likely one, and ranks every run as the enumeration scores it.
#[test]
fn beam_is_exact_on_a_small_regex_space() {
    for (name, path) in models() {
        let model = Model::load_path(&path, &LoadOptions::default()).unwrap();
        // `[ab]{3}`, or `[ab]{2}` where the vocabulary writes a/b strings
        // in more than 64 ways (byte tokens beside letters).
        let (text, all) = [3, 2]
            .into_iter()
            .map(|n| {
                let text = format!("Word: {{% gen w regex=\"[ab]{{{n}}}\" heal=false %}}");
                // The prompt as the interpreter tokenizes it, from a plain run.
                let plain = run(&model, &text);
                let prompt: Vec<u32> = plain.state.tokens.iter().take_while(|t| t.kind == TokenKind::Prompt).map(|t| t.id).collect();
                let mut st = model.decoder.new_state();
                let logits = model.decoder.append(&mut st, &prompt).unwrap();
                let mut all = Vec::new();
                enumerate_ab(&model, n, &st, &logits, "", 0.0, &mut all);
                all.sort_by(|a, b| b.1.total_cmp(&a.1));
                (text, all)
            })
            .find(|(_, all)| all.len() <= 64)
            .unwrap();
        assert!(!all.is_empty(), "{name}");
        let found = find(&model, &text, Mode::Beam { width: all.len() }, &RunOptions::default());
        assert_eq!(found.runs.len(), all.len(), "{name}: every complete run comes back");
        for (r, (value, lp)) in found.runs.iter().zip(&all) {
            let s = &r.outcome.state;
            assert!(r.outcome.error.is_none(), "{name}: {:?}", r.outcome.error);
            assert!((s.logprob - lp).abs() < 1e-4, "{name}: {} vs {lp} ({value})", s.logprob);
            assert!((r.score - s.logprob).abs() < 1e-9, "{name}: the score is the record's log-prob");
            let w = &s.captures[0].value.text;
            assert!(w.len() == value.len() && w.bytes().all(|c| c == b'a' || c == b'b'), "{name}: {w:?}");
            assert_eq!(s.usage.decisions as usize, r.decisions);
        }
        assert_eq!(&found.runs[0].outcome.state.captures[0].value.text, &all[0].0, "{name}: the argmax");
        // Nothing beats the best, greedy included.
        assert!(found.usage.greedy_logprob.unwrap() <= all[0].1 + 1e-4);
    }
}

/// Three selects of three options: 27 runs. Each run's joint log-prob is
/// enumerated by running the template with each select narrowed to the one
/// option that run took (no search involved); the beam of width 27 returns
/// all 27 in that order.
#[test]
fn beam_is_exact_on_three_selects() {
    let opts = [" red", " green", " blue"];
    let template = |a: &[&str], b: &[&str], c: &[&str]| {
        let list = |o: &[&str]| o.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ");
        format!(
            "Colors:{{% select a in [{}] %}},{{% select b in [{}] %}} and{{% select c in [{}] %}}.",
            list(a),
            list(b),
            list(c)
        )
    };
    for (name, path) in models() {
        let model = Model::load_path(&path, &LoadOptions::default()).unwrap();
        let mut all = Vec::new();
        for a in opts {
            for b in opts {
                for c in opts {
                    let o = run(&model, &template(&[a], &[b], &[c]));
                    assert!(o.error.is_none());
                    all.push((o.state.text(), o.state.logprob));
                }
            }
        }
        all.sort_by(|x, y| y.1.total_cmp(&x.1));
        let found = find(&model, &template(&opts, &opts, &opts), Mode::Beam { width: 27 }, &RunOptions::default());
        assert_eq!(found.runs.len(), 27, "{name}");
        for (r, (text, lp)) in found.runs.iter().zip(&all) {
            assert!((r.outcome.state.logprob - lp).abs() < 1e-4, "{name}: {} vs {lp} ({text})", r.outcome.state.logprob);
        }
        assert_eq!(found.runs[0].outcome.state.text(), all[0].0, "{name}: the argmax");
        // Narrower beams keep the best run when it stays in the beam; any
        // beam's best is at least greedy's.
        let narrow = find(&model, &template(&opts, &opts, &opts), Mode::Beam { width: 2 }, &RunOptions::default());
        assert!(narrow.runs[0].outcome.state.logprob >= narrow.usage.greedy_logprob.unwrap() - 1e-9, "{name}");
    }
}

/// The article must agree with the noun that follows it: greedy takes the
/// likelier article and is stuck with its nouns; a beam of 4 finds the
/// more likely whole sentence (SmolLM2), and the CLI says so.
#[test]
fn beam_beats_greedy_where_the_first_choice_misleads() {
    let Some(gguf) = common::smollm2_gguf() else {
        common::skip("beam against greedy on SmolLM2 (scripts/fetch-smollm2.sh)");
        return;
    };
    let example = Path::new(ROOT).join("examples/article.lmt");
    let model = Model::load_path(&gguf, &LoadOptions::default()).unwrap();
    let text = std::fs::read_to_string(&example).unwrap();
    let found = find(&model, &text, Mode::Beam { width: 4 }, &RunOptions::default());
    let greedy = run(&model, &text);
    let best = &found.runs[0].outcome.state;
    assert!(best.logprob > greedy.state.logprob + 0.1, "{} vs greedy {}", best.logprob, greedy.state.logprob);
    assert_ne!(best.text(), greedy.state.text());
    assert_eq!(found.usage.greedy_logprob, Some(greedy.state.logprob));
    let (code, _, err) = common::lmt(&["run", example.to_str().unwrap(), "--model", gguf.to_str().unwrap(), "--beam", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("more likely"), "{err}");
}

/// `--samples 8`: the same seed gives the same runs; their shared prompt
/// is computed once (forward tokens ≤ the prefix once plus each run's
/// own); every value matches its constraint (checked with `regex`).
#[test]
fn samples_are_reproducible_shared_and_constrained() {
    let dir = common::tiny::temp_dir("search-samples");
    let model = common::cli_model(&dir);
    let template = dir.join("t.lmt");
    let prompt = "You are a careful assistant. Answer each question with yes or no and a two-digit number, nothing else.";
    std::fs::write(&template, format!("{prompt}\nQ: Is it raining?\nA: {{% gen a regex=\"(yes|no), [0-9]{{2}}\" %}}\n")).unwrap();
    let args = ["run", template.to_str().unwrap(), "--model", model.to_str().unwrap(), "--samples", "8", "--seed", "7", "--json"];
    let (code, first, err) = common::lmt(&args);
    assert_eq!(code, 0, "{err}");
    let (_, again, _) = common::lmt(&args);
    let doc: serde_json::Value = serde_json::from_str(&first).unwrap();
    let other: serde_json::Value = serde_json::from_str(&again).unwrap();
    let values = |d: &serde_json::Value| d["runs"].as_array().unwrap().iter().map(|r| r["captures"]["a"]["value"].clone()).collect::<Vec<_>>();
    assert_eq!(values(&doc), values(&other), "same seed, same runs");
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    let re = regex_automata::meta::Regex::new(r"^(yes|no), [0-9]{2}$").unwrap();
    for r in runs {
        let v = r["captures"]["a"]["value"].as_str().unwrap();
        assert!(re.is_match(v), "{v:?}");
    }
    // Ranked, and the top level is the best run.
    let lps: Vec<f64> = runs.iter().map(|r| r["logprob"].as_f64().unwrap()).collect();
    assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
    assert_eq!(doc["text"], runs[0]["text"]);
    // Sharing: the prompt once, then each run's own tokens (and the one
    // token each run feeds again to get its logits).
    let prefix = runs.iter().map(|r| r["usage"]["sequence_tokens"].as_u64().unwrap()).min().unwrap()
        - runs.iter().map(|r| r["usage"]["generated_tokens"].as_u64().unwrap() + r["usage"]["forced_tokens"].as_u64().unwrap()).max().unwrap();
    let own: u64 = runs.iter().map(|r| r["usage"]["sequence_tokens"].as_u64().unwrap() - prefix + 1).sum();
    let forward = doc["search"]["forward_tokens"].as_u64().unwrap();
    assert!(forward <= prefix + own, "forward {forward} > prefix {prefix} + own {own}");
    assert!(doc["search"]["shared_tokens"].as_u64().unwrap() >= 7 * (prefix - 16), "{}", doc["search"]);
    // Sample i is the plain run with the seed `--seed` + i·φ64.
    let seed3 = lmt::search::sample_seed(7, 3).to_string();
    let (_, plain, _) = common::lmt(&["run", template.to_str().unwrap(), "--model", model.to_str().unwrap(), "--temperature", "1", "--seed", &seed3, "--json"]);
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    assert!(runs.iter().any(|r| r["text"] == plain["text"] && r["logprob"] == plain["logprob"]), "sample 3 is the run of its seed");
    // A different seed, different runs (8 samples at temperature 1).
    let mut other_seed = args.to_vec();
    other_seed[7] = "8";
    let (_, third, _) = common::lmt(&other_seed);
    assert_ne!(values(&serde_json::from_str(&third).unwrap()), values(&doc));
}

/// `score_all` (`--score all`): `logprob_all` is every token's log-prob
/// after the first, template text included — as a token-by-token walk of
/// the decoder computes it — and each sampled token's own log-prob is its
/// term there.
#[test]
fn logprob_all_scores_every_token() {
    let text = "Q: Name two colours.\nA: {% gen a max_tokens=6 stop=\"\\n\" %} and{% select b in [\" red\", \" blue\"] %}.";
    for (name, path) in models() {
        let model = Model::load_path(&path, &LoadOptions::default()).unwrap();
        let (p, ws) = program(text);
        let opts = RunOptions { score_all: true, ..RunOptions::default() };
        let o = interp::run(&p, &ws.sources, &model, &opts, &mut |_| {});
        assert!(o.error.is_none(), "{name}: {:?}", o.error);
        let ids: Vec<u32> = o.state.tokens.iter().map(|t| t.id).collect();
        let mut st = model.decoder.new_state();
        let mut logits = model.decoder.append(&mut st, &ids[..1]).unwrap();
        let mut walk = 0.0;
        for (i, t) in o.state.tokens.iter().enumerate().skip(1) {
            let lp = log_softmax(&logits)[t.id as usize];
            if let Some(own) = t.logprob {
                assert!((own - lp).abs() < 1e-4, "{name}: token {i}: {own} vs {lp}");
            }
            walk += f64::from(lp);
            logits = model.decoder.append(&mut st, &ids[i..=i]).unwrap();
        }
        let all = o.state.logprob_all.unwrap();
        assert!((all - walk).abs() < 1e-3, "{name}: {all} vs {walk}");
        assert!(all < o.state.logprob, "{name}: template text costs too");
        // The scoring pass is counted as the run's work, as scoring.
        let u = &o.state.usage;
        assert_eq!(u.forward_tokens, u.sequence_tokens + u.rewound_tokens + u.scored_tokens, "{name}: {u:?}");
        assert!(u.scored_tokens >= ids.len() as u64 - 1, "{name}: {u:?}");
        // Without it, no `logprob_all`.
        assert!(run(&model, text).state.logprob_all.is_none());
    }
}

/// `--samples --score all` ranks the runs by `logprob_all`.
#[test]
fn samples_rank_by_every_token_when_asked() {
    let dir = common::tiny::temp_dir("search-score-all");
    let model = common::cli_model(&dir);
    let template = dir.join("t.lmt");
    std::fs::write(&template, "Once{% gen a max_tokens=4 %}, then{% gen b max_tokens=3 %}.").unwrap();
    let (code, out, err) =
        common::lmt(&["run", template.to_str().unwrap(), "--model", model.to_str().unwrap(), "--samples", "5", "--score", "all", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let all: Vec<f64> = doc["runs"].as_array().unwrap().iter().map(|r| r["logprob_all"].as_f64().unwrap()).collect();
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0] >= w[1]), "{all:?}");
    for r in doc["runs"].as_array().unwrap() {
        assert_eq!(r["score"], r["logprob_all"]);
    }
}

/// A plain `--json` run has the same shape: a `runs` list of one.
#[test]
fn a_plain_run_is_a_list_of_one() {
    let dir = common::tiny::temp_dir("search-plain");
    let model = common::cli_model(&dir);
    let example = Path::new(ROOT).join("examples/article.lmt");
    let (code, out, err) = common::lmt(&["run", example.to_str().unwrap(), "--model", model.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["text"], doc["text"]);
    assert_eq!(runs[0]["score"], doc["logprob"]);
}

/// A search's HTML report holds every run, one shown at a time: in a real
/// browser, `#run-2` shows the second run and hides the first.
#[test]
fn the_report_switches_between_runs() {
    let dir = common::tiny::temp_dir("search-html");
    let model = common::cli_model(&dir);
    let report = dir.join("report.html");
    let example = Path::new(ROOT).join("examples/article.lmt");
    let args = ["run", example.to_str().unwrap(), "--model", model.to_str().unwrap(), "--beam", "3", "--html", report.to_str().unwrap(), "--json", "-q"];
    let (code, out, err) = common::lmt(&args);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    let html = std::fs::read_to_string(&report).unwrap();
    for (i, r) in runs.iter().enumerate() {
        assert!(html.contains(&format!("id=\"run-{}\"", i + 1)));
        assert!(html.contains(&format!("joint log-probability {:.3}", r["logprob"].as_f64().unwrap())));
    }
    let Some(dom) = common::browser_dom(&format!("file://{}#run-2", report.display()), &dir.join("profile")) else {
        common::skip("no Chromium found (apt install chromium): the search report was checked as text only");
        return;
    };
    assert!(dom.contains("<section class=\"run\" id=\"run-1\" hidden=\"\">"), "run 1 hidden");
    assert!(dom.contains("<section class=\"run\" id=\"run-2\">"), "run 2 shown");
    assert!(dom.contains("<button data-run=\"run-2\" class=\"on\">"), "its button marked");
}

/// `--beam` with `--inputs`: each row is searched, its record is its best
/// run's (what `lmt run --beam` gives for its inputs alone) with `runs` and
/// `search`, at any `--parallel`.
#[test]
fn rows_of_a_dataset_are_searched_too() {
    let dir = common::tiny::temp_dir("search-rows");
    let model = common::cli_model(&dir);
    let m = model.to_str().unwrap();
    let template = dir.join("t.lmt");
    std::fs::write(&template, "{% input thing %}My favourite {{ thing }} is{% select a in [\" a\", \" the\", \" an\"] %}{% gen w regex=\"[a-z]{2,5}\" %}.").unwrap();
    let t = template.to_str().unwrap();
    let things = ["fruit", "colour", "animal"];
    let rows = dir.join("rows.jsonl");
    std::fs::write(&rows, things.iter().map(|x| format!("{{\"id\": \"{x}\", \"thing\": \"{x}\"}}\n")).collect::<String>()).unwrap();
    for parallel in ["1", "3"] {
        let (code, out, err) = common::lmt(&["run", t, "--model", m, "--beam", "2", "--inputs", rows.to_str().unwrap(), "--parallel", parallel, "-q"]);
        assert_eq!(code, 0, "{err}");
        let records: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len(), 3);
        for r in &records {
            let thing = r["id"].as_str().unwrap();
            let (code, alone, err) = common::lmt(&["run", t, "--model", m, "--beam", "2", "--var", &format!("thing={thing}"), "--json", "-q"]);
            assert_eq!(code, 0, "{err}");
            let alone: serde_json::Value = serde_json::from_str(&alone).unwrap();
            assert_eq!(r["text"], alone["text"], "{thing}");
            assert!((r["logprob"].as_f64().unwrap() - alone["logprob"].as_f64().unwrap()).abs() < 1e-9, "{thing}");
            let runs = r["runs"].as_array().unwrap();
            assert!(!runs.is_empty() && runs.len() <= 2 && runs[0]["text"] == r["text"] && runs[0].get("tokens").is_none());
            assert_eq!(r["search"]["kind"], "beam");
        }
    }
}

/// Bad or unsupported combinations are refused before the model loads.
#[test]
fn search_flags_are_checked() {
    let example = Path::new(ROOT).join("examples/article.lmt");
    let e = example.to_str().unwrap();
    for (args, says) in [
        (vec!["--beam", "0"], "0"),
        (vec!["--beam", "65"], "65"),
        (vec!["--beam", "2", "--samples", "3"], "cannot be used with"),
        (vec!["--samples", "2", "--events"], "--events"),
        (vec!["--length-penalty", "1"], "search"),
        (vec!["--beam", "2", "--length-penalty=-1"], "length penalty"),
        (vec!["--beam", "2", "--score", "all"], "--score all"),
        (vec!["--score", "most"], "most"),
    ] {
        let mut a = vec!["run", e, "--model", "/nonexistent"];
        a.extend(args.iter());
        let (code, _, err) = common::lmt(&a);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("loaded"), "{args:?}: {err}");
    }
}

/// Ctrl-C during a beam search: exit 130 with the best runs so far.
#[test]
fn ctrl_c_keeps_the_best_runs_so_far() {
    let dir = common::tiny::temp_dir("search-ctrl-c");
    let model = common::cli_model(&dir);
    let template = dir.join("long.lmt");
    std::fs::write(&template, "Story:{% gen s max_tokens=3000 stop=\"@@@@@@@@\" %}").unwrap();
    let (code, out) =
        common::interrupted_run(&["run", template.to_str().unwrap(), "--model", model.to_str().unwrap(), "--beam", "3", "--json"], 1);
    assert_eq!(code, Some(130), "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert!(!runs.is_empty() && runs.len() <= 3);
    assert!(runs.iter().all(|r| r["finish_reason"] == "cancelled"));
    // Each is a partial run with its own decisions (a fork stopped while
    // it replayed its parent is not one), ranked.
    assert!(runs.iter().all(|r| r["usage"]["decisions"].as_u64().unwrap() > 0 && r["usage"]["generated_tokens"].as_u64().unwrap() > 0));
    let scores: Vec<f64> = runs.iter().map(|r| r["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
}
