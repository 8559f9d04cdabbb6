//! `lmt run` as a user runs it: exit codes, the JSON document, the HTML
//! report in a real browser, and Ctrl-C.

mod common;


use common::tiny::temp_dir;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");



#[test]
fn run_prints_text_and_a_json_document() {
    let tmp = temp_dir("run-cli-json");
    let m = common::cli_model(&tmp);
    let m = m.to_str().unwrap();
    let vehicles = format!("{ROOT}/examples/vehicles.lmt");
    let (code, out, err) = common::lmt(&["run", &vehicles, "--model", m, "--var", "n=3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("\nHere are 3 vehicles") || out.starts_with("Here are 3 vehicles"), "{out}");
    assert!(err.contains("finish: done") && err.contains("forward passes"), "{err}");
    let (code, out, err) =
        common::lmt(&["run", &vehicles, "--model", m, "--var", "n=2", "--json", "--quiet", "--seed", "3", "--temperature", "0.8"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "--quiet: {err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in ["text", "messages", "captures", "tokens", "usage", "finish_reason"] {
        assert!(doc.get(k).is_some(), "missing `{k}`: {doc}");
    }
    assert_eq!(doc["finish_reason"], "done");
    assert_eq!(doc["captures"]["vehicle"].as_array().unwrap().len(), 2);
    for c in doc["captures"]["vehicle"].as_array().unwrap() {
        for k in ["value", "logprob", "tokens", "finish_reason", "stop", "choices"] {
            assert!(c.get(k).is_some(), "capture lacks `{k}`: {c}");
        }
    }
    assert!(doc["tokens"].as_array().unwrap().iter().any(|t| t["origin"] == "generated" && t["kind"] == "sampled"));
    assert!(doc["usage"]["forward_passes"].as_u64().unwrap() > 0);
    // Seeded sampling is reproducible.
    let again = common::lmt(&["run", &vehicles, "--model", m, "--var", "n=2", "--json", "--quiet", "--seed", "3", "--temperature", "0.8"]).1;
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!((&doc["text"], &doc["captures"], &doc["tokens"]), (&again["text"], &again["captures"], &again["tokens"]));
}

#[test]
fn bad_input_exits_non_zero_with_a_clear_message() {
    let tmp = temp_dir("run-cli-errors");
    let m = common::cli_model(&tmp);
    let m = m.to_str().unwrap();
    let chat = format!("{ROOT}/examples/chat.lmt");
    // A missing input: said before any model loads.
    let (code, _, err) = common::lmt(&["run", &chat, "--model", "/nonexistent/model"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("the input `question` was not given") && err.contains("--var question="), "{err}");
    // An input the template does not declare.
    let (code, _, err) = common::lmt(&["run", &chat, "--model", m, "--var", "questoin=x"]);
    assert_eq!(code, 2);
    assert!(err.contains("no input `questoin`") && err.contains("question"), "{err}");
    // A bad model.
    let hello = format!("{ROOT}/examples/hello.lmt");
    let (code, _, err) = common::lmt(&["run", &hello, "--model", "/nonexistent/model"]);
    assert_eq!(code, 3);
    assert!(err.contains("/nonexistent/model"), "{err}");
    // A template with errors.
    let bad = tmp.join("bad.lmt");
    std::fs::write(&bad, "{% gen x max_tokens=\"many\" %}{% if %}").unwrap();
    let (code, _, err) = common::lmt(&["run", bad.to_str().unwrap(), "--model", m]);
    assert_eq!(code, 1);
    assert!(err.contains("E0302") || err.contains("max_tokens"), "{err}");
    // A runtime error points at its source.
    let fails = tmp.join("fails.lmt");
    std::fs::write(&fails, "Value: {{ \"abc\" | int }}").unwrap();
    let (code, _, err) = common::lmt(&["run", fails.to_str().unwrap(), "--model", m]);
    assert_eq!(code, 3);
    assert!(err.contains("E0801") && err.contains("cannot convert") && err.contains("fails.lmt:1"), "{err}");
}

#[test]
fn html_report_renders_in_a_headless_browser() {
    let tmp = temp_dir("run-cli-html");
    let m = common::cli_model(&tmp);
    let report = tmp.join("report.html");
    let select = format!("{ROOT}/examples/usage.lmt");
    let (code, out, err) = common::lmt(&["run", &select, "--model", m.to_str().unwrap(), "--html", report.to_str().unwrap(), "--json", "-q"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let generated = doc["usage"]["generated_tokens"].as_u64().unwrap();
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("<h2>Captures</h2>") && html.contains("colour") && !html.contains("http"), "self-contained");
    let Some(dom) = common::browser_dom(&format!("file://{}", report.display()), &tmp.join("profile")) else {
        common::skip("no Chromium found (apt install chromium): the HTML report was checked as text only");
        return;
    };
    // The page's script ran in the browser: it coloured and counted the tokens.
    let want = format!("<span class=\"summary\">{generated} generated tokens");
    assert!(dom.contains(&want), "{want} not in the rendered page");
    assert!(dom.contains("style=\"background: "), "tokens coloured by probability");
}

#[test]
fn ctrl_c_stops_the_run_keeps_the_partial_result_and_exits_130() {
    let tmp = temp_dir("run-cli-sigint");
    let m = common::cli_model(&tmp);
    // Runs until stopped, with a bounded context (hidden rewinds each turn).
    let long = tmp.join("long.lmt");
    std::fs::write(
        &long,
        "Start: {% gen first max_tokens=3 %}\n{% for i in range(1000000) %}{% hidden %}{% gen x max_tokens=40 %}{% end %}{% end %}",
    )
    .unwrap();
    let (code, out) = common::interrupted_run(&["run", long.to_str().unwrap(), "--model", m.to_str().unwrap(), "--json"], 1);
    assert_eq!(code, Some(130));
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["finish_reason"], "cancelled");
    assert!(doc["captures"]["first"]["value"].is_string(), "what was produced is kept: {}", doc["captures"]);
}

/// The README's sample output is what `lmt run examples/trip.lmt` prints on
/// the tiny Llama-3 model today (timings aside).
#[test]
fn the_readme_sample_is_todays_output() {
    let Some((_, m)) = common::shared_dirs("tiny_models", &["llama3-tiny"], "model.safetensors").pop() else { return };
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let intro = "--model ../shared/data/tiny_models/llama3-tiny`):";
    let after = &readme[readme.find(intro).expect("the README names the command") ..];
    let start = after.find("```\n").unwrap() + 4;
    let block = &after[start..start + after[start..].find("```").unwrap()];
    let (text, summary) = block.trim_end().rsplit_once('\n').unwrap();
    let trip = format!("{ROOT}/examples/trip.lmt");
    let (code, out, err) = common::lmt(&["run", &trip, "--model", m.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim_end(), text.trim_end(), "README.md's sample output differs from today's run:\n{out}");
    // The counts, up to the timings.
    let counts = |s: &str| s.split(" · ").take(3).collect::<Vec<_>>().join(" · ");
    let line = err.lines().find(|l| l.starts_with("finish:")).unwrap_or_else(|| panic!("no summary: {err}"));
    assert_eq!(counts(line), counts(summary), "README.md's summary line differs: {line}");
}
