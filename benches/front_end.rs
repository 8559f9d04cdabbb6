//! The front end on a generated 2,000-line template: parse, full check
//! (parse + imports + static checks), and compile to IR. The language server
//! re-runs the full check on every change, so it must feel live.
//!
//! `cargo bench --bench front_end`

use criterion::{criterion_group, criterion_main, Criterion};
use lmt::span::FileId;
use lmt::workspace::{FsLoader, Workspace};

/// A template of `lines` lines mixing every kind of statement.
pub fn big_template(lines: usize) -> String {
    let mut out = String::from("{% input topic, n=3 %}\n");
    for i in 0..lines {
        let line = match i % 8 {
            0 => format!("Item {i}: {{{{ topic | upper }}}} and {{{{ n + {i} }}}}"),
            1 => format!("{{% gen v{i} stop=\"\\n\" max_tokens=20 regex=\"[a-z]+ [0-9]{{2}}\" %}}"),
            2 => format!("{{% if n > {i} %}}big{{% elif n == {i} %}}eq{{% else %}}small{{% end %}}"),
            3 => "{% for x in range(n) %}{{ loop.index }}{% end %}".to_string(),
            4 => format!("{{% select s{i} in [\"a\", \"b\", \"c\"] %}}"),
            5 => format!("{{% set m{i} = {{\"type\": \"object\", \"properties\": {{\"a\": {{\"type\": \"integer\"}}}}}} %}}"),
            6 => format!("{{% gen j{i} json={{\"type\": \"array\", \"items\": {{\"type\": \"string\"}}, \"maxItems\": 3}} %}}"),
            _ => format!("Plain text line {i} with some words in it, nothing more."),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn front_end(c: &mut Criterion) {
    let text = big_template(2000);
    let loader = FsLoader::default();
    let mut g = c.benchmark_group("front_end_2000_lines");
    g.bench_function("parse", |b| b.iter(|| lmt::syntax::parse(&text, FileId(0))));
    g.bench_function("check", |b| b.iter(|| Workspace::load_text("big.lmt", &text, None, &loader)));
    let ws = Workspace::load_text("big.lmt", &text, None, &loader);
    assert!(!ws.has_errors(), "the generated template must be valid");
    g.bench_function("compile", |b| b.iter(|| lmt::ir::compile(&ws)));
    g.finish();
}

/// The language server after an edit in the 2,000-line file: the re-check
/// with diagnostics converted to LSP ranges, and the whole round trip
/// through a server in memory (a change, then a hover that waits for the
/// re-check: what an editor sees, minus the debounce of `lsp::DEBOUNCE`).
fn lsp(c: &mut Criterion) {
    use lsp_server::{Connection, Message, Notification, Request, RequestId};
    use serde_json::json;
    let good = big_template(2000);
    // An edit that breaks line 1000, and one that repairs it.
    let bad = good.replacen("Plain text line 999", "Plain {{ nope }} line 999", 1);
    let uri: lsp_types::Uri = "file:///bench/big.lmt".parse().unwrap();
    let loader = FsLoader::default();
    let mut g = c.benchmark_group("lsp_2000_lines");
    g.bench_function("recheck_and_convert", |b| {
        b.iter(|| {
            let ws = Workspace::load_text("big.lmt", &bad, None, &loader);
            lmt::lsp::lsp_diagnostics(&ws, &uri)
        })
    });
    let (server, client) = Connection::memory();
    let thread = std::thread::spawn(move || lmt::lsp::serve(&server).unwrap());
    let mut id = 0;
    let mut request = |method: &str, params: serde_json::Value| {
        id += 1;
        client.sender.send(Message::Request(Request::new(RequestId::from(id), method.into(), params))).unwrap();
        loop {
            if let Message::Response(r) = client.receiver.recv().unwrap() {
                return r;
            }
        }
    };
    request("initialize", json!({"capabilities": {}}));
    let notify = |method: &str, params: serde_json::Value| {
        client.sender.send(Message::Notification(Notification::new(method.into(), params))).unwrap();
    };
    notify("initialized", json!({}));
    notify("textDocument/didOpen", json!({"textDocument": {"uri": "file:///bench/big.lmt", "languageId": "lmt", "version": 1, "text": good}}));
    let mut version = 1;
    g.bench_function("edit_then_hover_round_trip", |b| {
        b.iter(|| {
            version += 1;
            let text = if version % 2 == 0 { &bad } else { &good };
            notify("textDocument/didChange", json!({"textDocument": {"uri": "file:///bench/big.lmt", "version": version}, "contentChanges": [{"text": text}]}));
            request("textDocument/hover", json!({"textDocument": {"uri": "file:///bench/big.lmt"}, "position": {"line": 1000, "character": 10}}))
        })
    });
    g.finish();
    request("shutdown", serde_json::Value::Null);
    notify("exit", serde_json::Value::Null);
    thread.join().unwrap();
}

criterion_group!(benches, front_end, lsp);
criterion_main!(benches);
