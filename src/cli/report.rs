//! Renders diagnostics for people (miette: source snippet, labels, help) and
//! for machines (one JSON object per line).

use std::fmt;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents, SourceCode};
use miette::{SourceSpan, SpanContents};

use crate::diagnostic::{Diagnostic, JsonDiagnostic, Severity};
use crate::span::{floor_char_boundary, LineIndex, SourceFile, SourceMap, Span};

/// Lines longer than this many bytes are cut to a window around their labels,
/// so one long line (a minified file, a generated prompt) cannot make a
/// snippet of megabytes, nor a column past what the renderer can pad.
const MAX_LINE: usize = 240;
/// Bytes kept before and after a cut line's first label.
const CUT_BEFORE: usize = 80;
const CUT_AFTER: usize = 160;
/// A label spanning more lines than this is shown on its first line only.
const MAX_LABEL_LINES: usize = 12;

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
struct View<'f> {
    code: &'static str,
    severity: Severity,
    message: String,
    help: Option<String>,
    source: Excerpt<'f>,
    labels: Vec<LabeledSpan>,
}

impl<'f> View<'f> {
    fn new(d: &Diagnostic, sources: &'f SourceMap) -> View<'f> {
        let file = sources.get(d.file);
        let mut spans = vec![d.span];
        spans.extend(d.secondary.iter().filter(|l| l.file == d.file).map(|l| l.span));
        let excerpt = Excerpt::new(file, &spans);
        let primary = if d.label.is_empty() { None } else { Some(d.label.clone()) };
        let mut labels = vec![LabeledSpan::new_primary_with_span(primary, excerpt.span(d.span))];
        let mut help = d.help.clone();
        for l in &d.secondary {
            if l.file == d.file {
                labels.push(LabeledSpan::new_with_span(Some(l.message.clone()), excerpt.span(l.span)));
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
            source: excerpt,
            labels,
        }
    }
}

impl fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl fmt::Display for View<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for View<'_> {}

impl miette::Diagnostic for View<'_> {
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

/// The lines of a file that a diagnostic shows, each cut to a window around
/// its labels when it is long. Offsets into the excerpt map back to the file,
/// so line numbers and the header's column are the file's own.
struct Excerpt<'f> {
    file: &'f SourceFile,
    text: String,
    /// The file's 0-based line where the excerpt starts.
    first_line: usize,
    /// Per excerpt line: its start in `text`, the file offset it shows from,
    /// and the bytes of the marker before it ("…" when cut, else 0).
    lines: Vec<ExcerptLine>,
}

#[derive(Clone, Copy)]
struct ExcerptLine {
    start: usize,
    len: usize,
    file_start: usize,
    file_end: usize,
    marker: usize,
}

const MARK: &str = "…";

impl<'f> Excerpt<'f> {
    fn new(file: &'f SourceFile, spans: &[Span]) -> Excerpt<'f> {
        let text: &str = &file.text;
        let index = &file.lines;
        let spans: Vec<(usize, usize)> = spans.iter().map(|s| shorten(text, index, *s)).collect();
        let lo = spans.iter().map(|s| index.line_of(s.0)).min().unwrap_or(0).saturating_sub(1);
        let last_line = index.line_of(text.len());
        let hi = (spans.iter().map(|s| index.line_of(s.1)).max().unwrap_or(0) + 1).min(last_line);
        let mut out = String::new();
        let mut lines = Vec::new();
        for line in lo..=hi {
            let start = index.line_start(line);
            let mut end = if line == last_line { text.len() } else { index.line_start(line + 1) - 1 };
            if end > start && text.as_bytes()[end - 1] == b'\r' {
                end -= 1;
            }
            let (a, b) = window(text, start, end, &spans);
            if line > lo {
                out.push('\n');
            }
            let marker = if a > start { MARK.len() } else { 0 };
            let at = out.len();
            if marker > 0 {
                out.push_str(MARK);
            }
            out.push_str(&text[a..b]);
            let len = out.len() - at;
            if b < end {
                out.push_str(MARK);
            }
            lines.push(ExcerptLine { start: at, len, file_start: a, file_end: b, marker });
        }
        Excerpt { file, text: out, first_line: lo, lines }
    }

    /// Where a file span falls in the excerpt (clamped into cut windows).
    fn span(&self, s: Span) -> SourceSpan {
        let a = self.to_excerpt(s.start as usize);
        let b = self.to_excerpt(s.end as usize).max(a);
        SourceSpan::new(a.into(), b - a)
    }

    fn to_excerpt(&self, offset: usize) -> usize {
        let line = self.file.lines.line_of(offset.min(self.file.text.len()));
        let Some(l) = line.checked_sub(self.first_line).and_then(|i| self.lines.get(i)) else {
            return if line < self.first_line { 0 } else { self.text.len() };
        };
        let o = offset.clamp(l.file_start, l.file_end);
        l.start + l.marker + (o - l.file_start)
    }

    fn to_file(&self, offset: usize) -> usize {
        let i = self.lines.partition_point(|l| l.start <= offset).saturating_sub(1);
        let l = self.lines[i];
        let within = offset.saturating_sub(l.start + l.marker).min(l.len - l.marker);
        l.file_start + within
    }
}

/// A span shortened to its first line when it covers many lines.
fn shorten(text: &str, index: &LineIndex, s: Span) -> (usize, usize) {
    let a = floor_char_boundary(text, s.start as usize);
    let b = floor_char_boundary(text, (s.end as usize).max(a));
    let (la, lb) = (index.line_of(a), index.line_of(b));
    if lb - la <= MAX_LABEL_LINES {
        return (a, b);
    }
    (a, index.line_start(la + 1).saturating_sub(1).max(a))
}

/// The part of line `start..end` to show: all of it when short, else a
/// window around the first span point on it.
fn window(text: &str, start: usize, end: usize, spans: &[(usize, usize)]) -> (usize, usize) {
    if end - start <= MAX_LINE {
        return (start, end);
    }
    let anchor = spans
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .find(|&p| (start..=end).contains(&p))
        .unwrap_or(start);
    let a = floor_char_boundary(text, anchor.saturating_sub(CUT_BEFORE).max(start));
    let b = floor_char_boundary(text, (anchor + CUT_AFTER).min(end));
    (a, b.max(a))
}

impl SourceCode for Excerpt<'_> {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self.text.read_span(span, before, after)?;
        let (line, column) = if before == 0 {
            // The header's location: the file's own line and column.
            let lc = self.file.lines.line_col(&self.file.text, self.to_file(span.offset()));
            (lc.line as usize - 1, lc.column as usize - 1)
        } else {
            (inner.line() + self.first_line, inner.column())
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.file.name.clone(),
            inner.data(),
            *inner.span(),
            line,
            column,
            inner.line_count(),
        )))
    }
}
