//! Renders diagnostics for people (miette: source snippet, labels, help) and
//! for machines (one JSON object per line).

use std::fmt;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};

use crate::diagnostic::{Diagnostic, JsonDiagnostic, Severity};
use crate::span::SourceMap;

/// Renders `d` as text with a source snippet. `color` turns on ANSI colours.
pub fn render(d: &Diagnostic, sources: &SourceMap, color: bool, width: usize) -> String {
    let theme = if color { GraphicalTheme::unicode() } else { GraphicalTheme::unicode_nocolor() };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(width).with_links(false);
    let view = View::new(d, sources);
    let mut out = String::new();
    if handler.render_report(&mut out, &view).is_err() {
        out = format!("{}: {}\n", d.code.as_str(), d.message);
    }
    out
}

/// Renders `d` as one line of JSON.
pub fn render_json(d: &Diagnostic, sources: &SourceMap) -> String {
    serde_json::to_string(&JsonDiagnostic::new(d, sources)).expect("diagnostic serialises")
}

/// Whether to colour output written to a stream: only on a terminal, and
/// never with `NO_COLOR` set; `CLICOLOR_FORCE` forces it on.
pub fn use_color(is_terminal: bool) -> bool {
    if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
        return false;
    }
    if std::env::var_os("CLICOLOR_FORCE").is_some_and(|v| !v.is_empty() && v != "0") {
        return true;
    }
    is_terminal && std::env::var("TERM").map(|t| t != "dumb").unwrap_or(true)
}

/// A diagnostic as miette sees it.
struct View {
    code: &'static str,
    severity: Severity,
    message: String,
    help: Option<String>,
    source: NamedSource<String>,
    labels: Vec<LabeledSpan>,
}

impl View {
    fn new(d: &Diagnostic, sources: &SourceMap) -> View {
        let file = sources.get(d.file);
        let text = file.text.to_string();
        let clamp = |s: crate::span::Span| {
            let a = crate::span::floor_char_boundary(&text, s.start as usize);
            let b = crate::span::floor_char_boundary(&text, (s.end as usize).max(a));
            SourceSpan::new(a.into(), b - a)
        };
        let primary = if d.label.is_empty() { None } else { Some(d.label.clone()) };
        let mut labels = vec![LabeledSpan::new_primary_with_span(primary, clamp(d.span))];
        let mut help = d.help.clone();
        for l in &d.secondary {
            if l.file == d.file {
                labels.push(LabeledSpan::new_with_span(Some(l.message.clone()), clamp(l.span)));
            } else {
                // miette shows one source per report: name the other file in the help.
                let other = sources.get(l.file);
                let lc = other.lines.line_col(&other.text, l.span.start as usize);
                let note = format!("{} at {}:{}:{}", l.message, other.name, lc.line, lc.column);
                help = Some(match help {
                    Some(h) => format!("{h}\n{note}"),
                    None => note,
                });
            }
        }
        View {
            code: d.code.as_str(),
            severity: d.severity,
            message: d.message.clone(),
            help,
            source: NamedSource::new(file.name.clone(), text),
            labels,
        }
    }
}

impl fmt::Debug for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for View {}

impl miette::Diagnostic for View {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help.as_ref().map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.clone().into_iter()))
    }
}
