//! The self-contained HTML report of a run: the text with generated tokens
//! coloured by probability (hover one for its alternatives), chat turns as
//! headers, the captures and the usage. A search's report holds every run,
//! best first, one shown at a time (buttons, or `#run-N` in the address).
//! No external resources.

use std::fmt::Write;

use crate::state::{Node, Origin, Record};

/// The report as one HTML page titled `title`.
pub fn html(state: &Record, title: &str) -> String {
    page(title, "", &run_section(state, 1, true))
}

/// The report of a search's runs (best first, each with its ranking
/// score): a button per run shows that run.
pub fn html_runs(runs: &[(&Record, f64)], title: &str) -> String {
    let mut buttons = String::from("<p id=\"runs\">");
    let mut sections = String::new();
    for (i, (state, score)) in runs.iter().enumerate() {
        let _ = write!(buttons, "<button data-run=\"run-{n}\">#{n} · {score:.3}</button> ", n = i + 1);
        sections.push_str(&run_section(state, i + 1, i == 0));
    }
    buttons.push_str("</p>");
    page(title, &buttons, &sections)
}

/// One run: its finish and log-prob, the text, captures and usage.
fn run_section(state: &Record, rank: usize, shown: bool) -> String {
    let mut body = String::new();
    for n in &state.nodes {
        match n {
            Node::Text { text, origin, tokens, hidden } => {
                let class = match (origin, hidden) {
                    (_, true) => "hidden",
                    (Origin::Generated, _) => "gen",
                    (Origin::Variable, _) => "var",
                    _ => "tmpl",
                };
                if tokens.is_empty() {
                    let _ = write!(body, "<span class=\"{class}\">{}</span>", esc(text));
                    continue;
                }
                let _ = write!(body, "<span class=\"{class}\">");
                let mut rest = text.as_str();
                for (i, t) in tokens.iter().enumerate() {
                    let last = i + 1 == tokens.len();
                    // A token's text ends with its share (all of it but a
                    // healed token's prompt part); the last takes the rest.
                    let own = t.text.as_str();
                    let piece = if last {
                        rest
                    } else {
                        let k = (0..=own.len().min(rest.len()))
                            .rev()
                            .find(|&k| rest.is_char_boundary(k) && own.ends_with(&rest[..k]))
                            .unwrap_or(0);
                        &rest[..k]
                    };
                    rest = &rest[piece.len()..];
                    let p = t.logprob.map(|lp| f64::from(lp).exp());
                    let tip = t
                        .top
                        .iter()
                        .map(|a| format!("{:?} {:.1}%", a.text, f64::from(a.logprob).exp() * 100.0))
                        .collect::<Vec<_>>()
                        .join("\n");
                    let head = match p {
                        Some(p) => format!("{:?}: {:.1}% ({:?})", t.text, p * 100.0, t.kind),
                        None => format!("{:?} ({:?})", t.text, t.kind),
                    };
                    let _ = write!(
                        body,
                        "<span class=\"tok\" data-p=\"{}\" title=\"{}\">{}</span>",
                        p.map_or(String::from("1"), |p| format!("{p:.4}")),
                        esc(&format!("{head}\n{tip}")),
                        esc(piece)
                    );
                }
                body.push_str("</span>");
            }
            Node::RoleOpen { role } => {
                let _ = write!(body, "<div class=\"role\"><div class=\"rolename\">{}</div>", esc(role));
            }
            Node::RoleClose { .. } => body.push_str("</div>"),
            Node::CaptureOpen { name } => {
                let _ = write!(body, "<span class=\"cap\" data-name=\"{}\">", esc(name));
            }
            Node::CaptureClose { .. } => body.push_str("</span>"),
        }
    }
    let mut caps = String::new();
    for c in &state.captures {
        let m = &c.value.meta;
        let choices = m.choices.iter().map(|ch| format!("{} {:.1}%", esc(&ch.text), ch.probability * 100.0)).collect::<Vec<_>>().join(", ");
        let _ = write!(
            caps,
            "<tr><td>{}</td><td class=\"v\">{}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.name),
            esc(&c.value.text),
            m.logprob,
            m.tokens.len(),
            m.finish_reason.map_or("", |r| r.as_str()),
            esc(m.stop.as_deref().unwrap_or("")),
            choices
        );
    }
    let usage = serde_json::to_value(&state.usage).unwrap_or_default();
    let mut rows = String::new();
    if let serde_json::Value::Object(o) = usage {
        for (k, v) in o {
            let _ = write!(rows, "<tr><td>{}</td><td>{}</td></tr>", esc(&k), esc(&v.to_string()));
        }
    }
    let error = state.error.as_ref().map(|e| format!("<p class=\"error\">error {}: {}</p>", e.kind.code().as_str(), esc(&e.message))).unwrap_or_default();
    format!(
        r#"<section class="run" id="run-{rank}"{hide}>
<p>run #{rank} · finish: <b>{finish}</b> · joint log-probability {logprob:.3}{all} · <span class="summary"></span></p>
{error}<div class="text">{body}</div>
<h2>Captures</h2>
<table><tr><th>name</th><th>value</th><th>logprob</th><th>tokens</th><th>finish</th><th>stop</th><th>choices</th></tr>{caps}</table>
<h2>Usage</h2>
<table>{rows}</table>
</section>
"#,
        hide = if shown { "" } else { " hidden" },
        all = state.logprob_all.map(|a| format!(" (every token: {a:.3})")).unwrap_or_default(),
        finish = state.finish_reason.as_str(),
        logprob = state.logprob,
    )
}

/// The page around the runs' sections.
fn page(title: &str, buttons: &str, sections: &str) -> String {
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 15px/1.5 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }}
.text {{ white-space: pre-wrap; font-family: ui-monospace, monospace; background: #fafafa; border: 1px solid #ddd; padding: 1em; }}
.gen .tok {{ border-radius: 2px; }}
.tok:hover {{ outline: 1px solid #333; }}
.var {{ color: #1a4f8b; }}
.hidden {{ color: #999; text-decoration: line-through; }}
.role {{ border-left: 3px solid #a347ba; padding-left: .6em; margin: .4em 0; }}
.rolename {{ color: #a347ba; font-weight: bold; }}
table {{ border-collapse: collapse; margin-top: 1em; }}
td, th {{ border: 1px solid #ddd; padding: .2em .5em; text-align: left; vertical-align: top; }}
.v {{ font-family: ui-monospace, monospace; white-space: pre-wrap; }}
.error {{ color: #b00; font-weight: bold; }}
button.on {{ font-weight: bold; }}
</style></head><body>
<h1>{title}</h1>
{buttons}{sections}<script>
// Colour sampled tokens by probability: red (unlikely) to green (likely).
for (const run of document.querySelectorAll('.run')) {{
  let n = 0, low = 0;
  for (const t of run.querySelectorAll('.gen .tok')) {{
    const p = parseFloat(t.dataset.p);
    t.style.background = `hsla(${{Math.round(120 * p)}}, 75%, 60%, 0.35)`;
    n += 1; if (p < 0.5) low += 1;
  }}
  run.querySelector('.summary').textContent = `${{n}} generated tokens, ${{low}} below 50%`;
}}
// One run shown at a time: a button, or #run-N in the address.
function show(id) {{
  if (!document.getElementById(id)) return;
  for (const run of document.querySelectorAll('.run')) run.hidden = run.id !== id;
  for (const b of document.querySelectorAll('#runs button')) b.className = b.dataset.run === id ? 'on' : '';
}}
for (const b of document.querySelectorAll('#runs button')) b.onclick = () => {{ show(b.dataset.run); history.replaceState(null, '', '#' + b.dataset.run); }};
show(location.hash.slice(1) || 'run-1');
</script>
</body></html>
"#,
        title = esc(title),
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
