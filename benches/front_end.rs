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

criterion_group!(benches, front_end);
criterion_main!(benches);
