//! `lmt run --events`: every example streams JSON lines whose counts never
//! go down and that end in one `done` equal to the `--json` document; a
//! run stopped by Ctrl-C or an error still ends in `done`.

mod common;


use common::tiny::temp_dir;
use serde_json::Value as J;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");



/// Parses an event stream and checks its shape: every line an object with
/// an `event`, `start` first, token counts never going down, one `done`,
/// last. Returns the events.
fn check_stream(name: &str, out: &str) -> Vec<J> {
    let events: Vec<J> = out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}"))).collect();
    assert_eq!(events.first().map(|e| &e["event"]), Some(&J::from("start")), "{name}");
    let mut counts = (0, 0);
    for e in &events {
        let kind = e["event"].as_str().unwrap_or_else(|| panic!("{name}: no `event` in {e}"));
        assert!(["start", "text", "role", "capture", "error", "done"].contains(&kind), "{name}: {kind}");
        if kind == "text" {
            let now = (e["generated_tokens"].as_u64().unwrap(), e["forced_tokens"].as_u64().unwrap());
            assert!(now.0 >= counts.0 && now.1 >= counts.1, "{name}: counts went down: {counts:?} → {now:?}");
            counts = now;
        }
    }
    assert_eq!(events.iter().filter(|e| e["event"] == "done").count(), 1, "{name}: one done");
    assert_eq!(events.last().unwrap()["event"], "done", "{name}: done comes last");
    events
}

/// Usage without the timings, which differ run to run.
fn counters(usage: &J) -> J {
    let mut u = usage.clone();
    for k in ["total_ms", "tokens_per_second", "time_to_first_token_ms", "mask_ms"] {
        u.as_object_mut().unwrap().remove(k);
    }
    u
}

#[test]
fn every_example_streams_events_ending_in_the_json_document() {
    let tmp = temp_dir("events-examples");
    let m = common::cli_model(&tmp);
    let m = m.to_str().unwrap();
    let mut n = 0;
    for entry in std::fs::read_dir(format!("{ROOT}/examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "lmt") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let file = path.to_str().unwrap();
        let mut args = vec!["run", file, "--model", m, "--quiet"];
        match name.as_str() {
            "chat.lmt" => args.extend(["--var", "question=Why is the sky blue?"]),
            "reviews.lmt" => args.extend(["--var", "review=The kettle is quick and quiet."]),
            _ => {}
        }
        let (code, out, err) = common::lmt(&[&args[..], &["--events"]].concat());
        let events = check_stream(&name, &out);
        let (json_code, doc, _) = common::lmt(&[&args[..], &["--json"]].concat());
        assert_eq!(code, json_code, "{name}: {err}");
        let doc: J = serde_json::from_str(&doc).unwrap();
        let done = events.last().unwrap();
        for k in ["text", "messages", "captures", "tokens", "finish_reason", "error"] {
            assert_eq!(done.get(k), doc.get(k), "{name}: `{k}` of done differs from --json");
        }
        assert_eq!(counters(&done["usage"]), counters(&doc["usage"]), "{name}: usage");
        // The streamed text is the record's text (in chat, each message's:
        // the chat template writes the rest); captures were announced.
        // (Hidden text is streamed, marked, and left out of the record; layout
        // white space may be dropped at the end: compare without it.)
        let squeeze = |s: &str| s.split_whitespace().collect::<String>();
        let streamed: String =
            events.iter().filter(|e| e["event"] == "text" && e["hidden"] == false).map(|e| e["text"].as_str().unwrap()).collect();
        let streamed = squeeze(&streamed);
        let messages = doc["messages"].as_array().unwrap();
        let wanted: Vec<&str> = if messages.is_empty() {
            vec![doc["text"].as_str().unwrap().trim()]
        } else {
            messages.iter().map(|m| m["content"].as_str().unwrap().trim()).collect()
        };
        for w in wanted {
            assert!(streamed.contains(&squeeze(w)), "{name}: streamed text lacks {w:?}");
        }
        let captured = events.iter().filter(|e| e["event"] == "capture").count();
        assert!(captured > 0 || doc["captures"].as_object().unwrap().is_empty(), "{name}: no capture events");
        if code != 0 {
            let error = events.iter().find(|e| e["event"] == "error").unwrap_or_else(|| panic!("{name}: exit {code}, no error event"));
            assert!(error["code"].as_str().unwrap().starts_with('E') && error["line"].as_u64() > Some(0), "{error}");
        }
        n += 1;
    }
    assert!(n >= 10, "{n} examples");
}

#[test]
fn a_stopped_or_failed_run_still_ends_in_done() {
    let tmp = temp_dir("events-stop");
    let m = common::cli_model(&tmp);
    let long = tmp.join("long.lmt");
    std::fs::write(&long, "Start: {% gen first max_tokens=3 %}\n{% for i in range(1000000) %}{% hidden %}{% gen x max_tokens=40 %}{% end %}{% end %}")
        .unwrap();
    let (code, out) = common::interrupted_run(&["run", long.to_str().unwrap(), "--model", m.to_str().unwrap(), "--events"], 1);
    assert_eq!(code, Some(130));
    let events = check_stream("interrupted", &out);
    let done = events.last().unwrap();
    assert_eq!(done["finish_reason"], "cancelled");
    assert!(done["captures"]["first"]["value"].is_string(), "{done}");
    assert!(events.iter().any(|e| e["event"] == "capture" && e["name"] == "first"));

    // A template error and a missing input end the stream too.
    let bad = tmp.join("bad.lmt");
    std::fs::write(&bad, "{% gen x max_tokens= %}").unwrap();
    let (code, out, _) = common::lmt(&["run", bad.to_str().unwrap(), "--model", m.to_str().unwrap(), "--events"]);
    assert_eq!(code, 1);
    let lines: Vec<J> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["event"], "error");
    assert!(lines[0]["diagnostic"]["code"].as_str().unwrap().starts_with('E'), "{}", lines[0]);
    assert_eq!(lines.last().unwrap()["event"], "done");
    assert_eq!(lines.last().unwrap()["finish_reason"], "error");
    let needs = tmp.join("needs.lmt");
    std::fs::write(&needs, "{% input q %}{{ q }}").unwrap();
    let (code, out, _) = common::lmt(&["run", needs.to_str().unwrap(), "--model", m.to_str().unwrap(), "--events"]);
    assert_ne!(code, 0);
    let last: J = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!((&last["event"], &last["error"]["kind"]), (&J::from("done"), &J::from("missing-input")));
}
