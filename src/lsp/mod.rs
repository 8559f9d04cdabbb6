//! `lmt lsp`: the language server, over stdio (or any `lsp_server`
//! connection, so tests speak to it in memory). Synchronous: one loop reads
//! messages; edits are re-checked after a short quiet period (debounce);
//! requests see the latest text. It never loads a model.
//!
//! The features are plain data from [`analysis`]; this module converts
//! byte offsets to UTF-16 LSP positions and diagnostics to LSP diagnostics.

pub mod analysis;
pub mod transport;

use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types as lt;
use lsp_types::{notification::Notification as _, request::Request as _, Uri};

use crate::diagnostic::{Diagnostic, Severity};
use crate::span::{FileId, LineIndex, Span};
use crate::workspace::{FsLoader, Workspace};
use analysis::DefKind;

/// How long an edited document waits for more edits before it is re-checked.
pub const DEBOUNCE: Duration = Duration::from_millis(75);

type BoxError = Box<dyn Error + Send + Sync>;

/// Runs the server on standard input/output; returns the exit code.
pub fn run_stdio() -> i32 {
    let (conn, io) = transport::stdio();
    let result = serve(&conn);
    drop(conn);
    match result.and(io.join().map_err(BoxError::from)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lmt lsp: {e}");
            1
        }
    }
}

/// Serves one client on `conn` until it shuts down.
pub fn serve(conn: &Connection) -> Result<(), BoxError> {
    let caps = lt::ServerCapabilities {
        position_encoding: Some(lt::PositionEncodingKind::UTF16),
        text_document_sync: Some(lt::TextDocumentSyncCapability::Options(lt::TextDocumentSyncOptions {
            open_close: Some(true),
            change: Some(lt::TextDocumentSyncKind::FULL),
            save: Some(lt::TextDocumentSyncSaveOptions::Supported(true)),
            ..Default::default()
        })),
        hover_provider: Some(lt::HoverProviderCapability::Simple(true)),
        completion_provider: Some(lt::CompletionOptions {
            trigger_characters: Some(["%", " ", "|", "\"", "/"].map(String::from).to_vec()),
            ..Default::default()
        }),
        definition_provider: Some(lt::OneOf::Left(true)),
        document_symbol_provider: Some(lt::OneOf::Left(true)),
        ..Default::default()
    };
    let init = conn.initialize(serde_json::to_value(caps)?)?;
    // Imports may reach anywhere in the editor's workspace folder.
    let root = init
        .get("rootUri")
        .and_then(|u| u.as_str())
        .or_else(|| init.pointer("/workspaceFolders/0/uri").and_then(|u| u.as_str()))
        .and_then(|u| Uri::from_str(u).ok())
        .and_then(|u| uri_to_path(&u))
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p));
    let mut server = Server { root, ..Server::default() };
    loop {
        let wait = server.next_deadline().map(|d| d.saturating_duration_since(Instant::now()));
        let msg = match wait {
            None => match conn.receiver.recv() {
                Ok(m) => m,
                Err(_) => return Ok(()),
            },
            Some(t) => match conn.receiver.recv_timeout(t) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    server.flush(conn, false)?;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            },
        };
        match msg {
            Message::Request(req) => {
                if conn.handle_shutdown(&req)? {
                    return Ok(());
                }
                // Requests answer about the latest text.
                server.flush(conn, true)?;
                let resp = server.request(req);
                conn.sender.send(Message::Response(resp))?;
            }
            Message::Notification(n) => {
                // A bad notification is the client's error, not the end of
                // the session (notifications get no answer to carry it).
                let method = n.method.clone();
                if let Err(e) = server.notification(conn, n) {
                    eprintln!("lmt lsp: ignored `{method}`: {e}");
                }
            }
            Message::Response(_) => {}
        }
    }
}

/// An open document.
struct Doc {
    text: String,
    ws: Workspace,
    /// When an edit arrived that is not checked yet.
    dirty_since: Option<Instant>,
}

#[derive(Default)]
struct Server {
    docs: HashMap<String, (Uri, Doc)>,
    /// Per root document: the other files it published diagnostics to.
    published: HashMap<String, HashSet<String>>,
    /// The editor's workspace folder: what imports of files inside it must
    /// stay under (a file outside it keeps to its own folder).
    root: Option<std::path::PathBuf>,
}

impl Server {
    fn next_deadline(&self) -> Option<Instant> {
        self.docs.values().filter_map(|(_, d)| d.dirty_since).min().map(|t| t + DEBOUNCE)
    }

    fn loader(&self, file: Option<&std::path::Path>) -> FsLoader {
        let root = self.root.clone().filter(|r| file.is_some_and(|f| f.starts_with(r)));
        let mut l = FsLoader { root, ..FsLoader::default() };
        for (uri, d) in self.docs.values() {
            if let Some(p) = uri_to_path(uri) {
                l.overlay.insert(p, d.text.clone());
            }
        }
        l
    }

    fn analyse(&self, uri: &Uri, text: &str) -> Workspace {
        let path = uri_to_path(uri);
        let name = path.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_else(|| uri.as_str().to_string());
        let canon = path.map(|p| std::fs::canonicalize(&p).unwrap_or(p));
        let loader = self.loader(canon.as_deref());
        Workspace::load_text(&name, text, canon, &loader)
    }

    /// Re-checks documents whose quiet period is over (all dirty ones when
    /// `all`), and publishes their diagnostics.
    fn flush(&mut self, conn: &Connection, all: bool) -> Result<(), BoxError> {
        let now = Instant::now();
        let due: Vec<String> = self
            .docs
            .iter()
            .filter(|(_, (_, d))| d.dirty_since.is_some_and(|t| all || t + DEBOUNCE <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.check(conn, &key)?;
        }
        Ok(())
    }

    fn check(&mut self, conn: &Connection, key: &str) -> Result<(), BoxError> {
        let Some((uri, doc)) = self.docs.get(key) else { return Ok(()) };
        let uri = uri.clone();
        let ws = self.analyse(&uri, &doc.text);
        let by_file = lsp_diagnostics(&ws, &uri);
        let mut now_published = HashSet::new();
        for (file_uri, diags) in by_file {
            if file_uri.as_str() != key {
                now_published.insert(file_uri.as_str().to_string());
            }
            publish(conn, file_uri, diags)?;
        }
        // Files that had diagnostics from this document and have none now.
        let before = self.published.insert(key.to_string(), now_published.clone()).unwrap_or_default();
        for stale in before.difference(&now_published) {
            if let Ok(u) = Uri::from_str(stale) {
                publish(conn, u, Vec::new())?;
            }
        }
        if let Some((_, doc)) = self.docs.get_mut(key) {
            doc.ws = ws;
            doc.dirty_since = None;
        }
        Ok(())
    }

    fn notification(&mut self, conn: &Connection, n: Notification) -> Result<(), BoxError> {
        use lt::notification as nt;
        match n.method.as_str() {
            nt::DidOpenTextDocument::METHOD => {
                let p: lt::DidOpenTextDocumentParams = serde_json::from_value(n.params)?;
                let key = p.text_document.uri.as_str().to_string();
                let doc = Doc { text: p.text_document.text, ws: Workspace::default(), dirty_since: Some(Instant::now()) };
                self.docs.insert(key.clone(), (p.text_document.uri, doc));
                self.check(conn, &key)?;
            }
            nt::DidChangeTextDocument::METHOD => {
                let p: lt::DidChangeTextDocumentParams = serde_json::from_value(n.params)?;
                if let Some((_, doc)) = self.docs.get_mut(p.text_document.uri.as_str()) {
                    // Full sync: the last change holds the whole text.
                    if let Some(c) = p.content_changes.into_iter().last() {
                        doc.text = c.text;
                    }
                    doc.dirty_since.get_or_insert_with(Instant::now);
                }
            }
            nt::DidSaveTextDocument::METHOD => {
                let p: lt::DidSaveTextDocumentParams = serde_json::from_value(n.params)?;
                let key = p.text_document.uri.as_str().to_string();
                if let (Some(text), Some((_, doc))) = (p.text, self.docs.get_mut(&key)) {
                    doc.text = text;
                }
                if self.docs.contains_key(&key) {
                    self.check(conn, &key)?;
                }
                // Files importing the saved one see its new text.
                let others: Vec<String> = self.docs.keys().filter(|k| **k != key).cloned().collect();
                for k in others {
                    self.check(conn, &k)?;
                }
            }
            nt::DidCloseTextDocument::METHOD => {
                let p: lt::DidCloseTextDocumentParams = serde_json::from_value(n.params)?;
                let key = p.text_document.uri.as_str().to_string();
                self.docs.remove(&key);
                publish(conn, p.text_document.uri, Vec::new())?;
                for other in self.published.remove(&key).unwrap_or_default() {
                    if let Ok(u) = Uri::from_str(&other) {
                        publish(conn, u, Vec::new())?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn request(&self, req: Request) -> Response {
        use lt::request as rq;
        let id = req.id.clone();
        let result = match req.method.as_str() {
            rq::HoverRequest::METHOD => self.at::<lt::HoverParams, _>(req, |p| &p.text_document_position_params, |ws, _, off| {
                analysis::hover(ws, off).map(|h| lt::Hover {
                    contents: lt::HoverContents::Markup(lt::MarkupContent { kind: lt::MarkupKind::Markdown, value: h.markdown }),
                    range: Some(range(ws, ws.root, h.span)),
                })
            }),
            rq::Completion::METHOD => self.at::<lt::CompletionParams, _>(req, |p| &p.text_document_position, |ws, _, off| {
                let items: Vec<lt::CompletionItem> = analysis::completions(ws, off)
                    .into_iter()
                    .map(|c| lt::CompletionItem {
                        kind: Some(completion_kind(c.kind)),
                        detail: (!c.detail.is_empty()).then(|| format!("{} {}", c.kind, c.detail)),
                        documentation: (!c.doc.is_empty()).then_some(lt::Documentation::MarkupContent(lt::MarkupContent {
                            kind: lt::MarkupKind::Markdown,
                            value: c.doc,
                        })),
                        label: c.label,
                        ..Default::default()
                    })
                    .collect();
                Some(lt::CompletionResponse::Array(items))
            }),
            rq::GotoDefinition::METHOD => self.at::<lt::GotoDefinitionParams, _>(req, |p| &p.text_document_position_params, |ws, uri, off| {
                let (file, span) = analysis::definition(ws, off)?;
                let target = if file == ws.root { uri.clone() } else { path_to_uri(ws.sources.get(file).path.as_deref()?)? };
                Some(lt::GotoDefinitionResponse::Scalar(lt::Location { uri: target, range: range(ws, file, span) }))
            }),
            rq::DocumentSymbolRequest::METHOD => {
                self.on_doc::<lt::DocumentSymbolParams, _>(req, |p| &p.text_document.uri, |ws, _, _| Some(document_symbols(ws)))
            }
            other => {
                return Response::new_err(id, ErrorCode::MethodNotFound as i32, format!("lmt lsp does not handle `{other}`"));
            }
        };
        match result {
            Ok(v) => Response::new_ok(id, v),
            Err(e) => Response::new_err(id, ErrorCode::InvalidParams as i32, e),
        }
    }

    /// Runs `f` on the document and byte offset a positional request names.
    fn at<P, R>(
        &self,
        req: Request,
        pos: impl Fn(&P) -> &lt::TextDocumentPositionParams,
        f: impl Fn(&Workspace, &Uri, usize) -> Option<R>,
    ) -> Result<serde_json::Value, String>
    where
        P: serde::de::DeserializeOwned,
        R: serde::Serialize,
    {
        self.on_doc(req, |p: &P| &pos(p).text_document.uri, |ws, uri, p| {
            let text = &ws.sources.get(ws.root).text;
            let at = pos(p).position;
            f(ws, uri, LineIndex::new(text).offset_of_utf16(text, at.line, at.character))
        })
    }

    /// Runs `f` on the open document a request names (`null` when it is
    /// not open).
    fn on_doc<P, R>(
        &self,
        req: Request,
        uri: impl Fn(&P) -> &Uri,
        f: impl Fn(&Workspace, &Uri, &P) -> Option<R>,
    ) -> Result<serde_json::Value, String>
    where
        P: serde::de::DeserializeOwned,
        R: serde::Serialize,
    {
        let p: P = serde_json::from_value(req.params).map_err(|e| e.to_string())?;
        let Some((uri, doc)) = self.docs.get(uri(&p).as_str()) else { return Ok(serde_json::Value::Null) };
        serde_json::to_value(f(&doc.ws, uri, &p)).map_err(|e| e.to_string())
    }
}

/// The outline of the root file.
fn document_symbols(ws: &Workspace) -> lt::DocumentSymbolResponse {
    let text = &ws.sources.get(ws.root).text;
    let idx = LineIndex::new(text);
    #[allow(deprecated)] // `deprecated` is a required field of the struct
    let syms = analysis::symbols(ws)
        .into_iter()
        .map(|d| lt::DocumentSymbol {
            name: d.name,
            detail: Some(d.kind.describe().to_string()),
            kind: symbol_kind(d.kind),
            tags: None,
            deprecated: None,
            range: range_in(text, &idx, d.span),
            selection_range: range_in(text, &idx, d.name_span),
            children: None,
        })
        .collect();
    lt::DocumentSymbolResponse::Nested(syms)
}

fn publish(conn: &Connection, uri: Uri, diagnostics: Vec<lt::Diagnostic>) -> Result<(), BoxError> {
    let params = lt::PublishDiagnosticsParams { uri, diagnostics, version: None };
    let n = Notification::new(lt::notification::PublishDiagnostics::METHOD.to_string(), params);
    conn.sender.send(Message::Notification(n))?;
    Ok(())
}

/// The workspace's diagnostics as LSP diagnostics, by file: the root
/// document always (an empty list clears old ones), imported files when
/// they have any.
pub fn lsp_diagnostics(ws: &Workspace, root_uri: &Uri) -> Vec<(Uri, Vec<lt::Diagnostic>)> {
    let mut out: Vec<(Uri, Vec<lt::Diagnostic>)> = vec![(root_uri.clone(), Vec::new())];
    let mut lines: HashMap<FileId, LineIndex> = HashMap::new();
    for d in &ws.diagnostics {
        let uri = if d.file == ws.root {
            root_uri.clone()
        } else {
            match ws.sources.get(d.file).path.as_deref().and_then(path_to_uri) {
                Some(u) => u,
                None => continue, // the embedded stdlib has no file to show
            }
        };
        let ld = to_lsp(ws, d, root_uri, &mut lines);
        match out.iter_mut().find(|(u, _)| *u == uri) {
            Some((_, v)) => v.push(ld),
            None => out.push((uri, vec![ld])),
        }
    }
    out
}

/// One diagnostic in LSP form: the same code, message and span as `lmt
/// check`; the help goes after the message.
fn to_lsp(ws: &Workspace, d: &Diagnostic, root_uri: &Uri, lines: &mut HashMap<FileId, LineIndex>) -> lt::Diagnostic {
    let mut range = |file: FileId, span: Span| {
        let text = &ws.sources.get(file).text;
        range_in(text, lines.entry(file).or_insert_with(|| LineIndex::new(text)), span)
    };
    let mut message = d.message.clone();
    if let Some(h) = &d.help {
        message.push_str("\nhelp: ");
        message.push_str(h);
    }
    let related: Vec<lt::DiagnosticRelatedInformation> = d
        .secondary
        .iter()
        .filter_map(|l| {
            let uri = if l.file == ws.root { root_uri.clone() } else { path_to_uri(ws.sources.get(l.file).path.as_deref()?)? };
            Some(lt::DiagnosticRelatedInformation {
                location: lt::Location { uri, range: range(l.file, l.span) },
                message: if l.message.is_empty() { "here".into() } else { l.message.clone() },
            })
        })
        .collect();
    lt::Diagnostic {
        range: range(d.file, d.span),
        severity: Some(match d.severity {
            Severity::Error => lt::DiagnosticSeverity::ERROR,
            Severity::Warning => lt::DiagnosticSeverity::WARNING,
        }),
        code: Some(lt::NumberOrString::String(d.code.as_str().to_string())),
        source: Some("lmt".into()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        ..Default::default()
    }
}

/// A byte span of `file` as an LSP range in UTF-16 code units.
pub fn range(ws: &Workspace, file: FileId, span: Span) -> lt::Range {
    let text = &ws.sources.get(file).text;
    range_in(text, &LineIndex::new(text), span)
}

/// Like [`range`], with the file's line index already built (many ranges
/// in one file would otherwise rebuild it each time).
fn range_in(text: &str, idx: &LineIndex, span: Span) -> lt::Range {
    let pos = |o: usize| {
        let (line, character) = idx.utf16_position(text, o.min(text.len()));
        lt::Position { line, character }
    };
    lt::Range { start: pos(span.range().start), end: pos(span.range().end) }
}

/// The path of a `file:` URI.
pub fn uri_to_path(uri: &Uri) -> Option<PathBuf> {
    let s = uri.as_str().strip_prefix("file://")?;
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Some(PathBuf::from(String::from_utf8(out).ok()?))
}

/// The `file:` URI of an absolute path.
pub fn path_to_uri(path: &Path) -> Option<Uri> {
    let mut s = String::from("file://");
    for &b in path.to_str()?.as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    Uri::from_str(&s).ok()
}

fn completion_kind(kind: &str) -> lt::CompletionItemKind {
    match kind {
        "keyword" => lt::CompletionItemKind::KEYWORD,
        "option" => lt::CompletionItemKind::PROPERTY,
        "filter" | "function" => lt::CompletionItemKind::FUNCTION,
        "module" | "imported module" => lt::CompletionItemKind::MODULE,
        "def" => lt::CompletionItemKind::FUNCTION,
        "grammar" => lt::CompletionItemKind::STRUCT,
        _ => lt::CompletionItemKind::VARIABLE,
    }
}

fn symbol_kind(kind: DefKind) -> lt::SymbolKind {
    match kind {
        DefKind::Def => lt::SymbolKind::FUNCTION,
        DefKind::Grammar | DefKind::Rule => lt::SymbolKind::STRUCT,
        DefKind::Import => lt::SymbolKind::MODULE,
        DefKind::Role => lt::SymbolKind::NAMESPACE,
        DefKind::Input => lt::SymbolKind::CONSTANT,
        DefKind::Capture | DefKind::Variable | DefKind::LoopVar | DefKind::Param => lt::SymbolKind::VARIABLE,
    }
}
