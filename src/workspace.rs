//! Loads a template and everything it imports, parses and checks each file
//! once, and keeps the results for the compiler, the CLI and the language
//! server. Imports resolve relative to the importing file, or to the
//! embedded stdlib for `std/...`; cycles are reported, never followed.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::check::{self, ModuleInfo, Prelude};
use crate::diagnostic::{self, Code, Diagnostic};
use crate::span::{FileId, SourceFile, SourceMap, Span};
use crate::syntax::{self, ast};

/// Deepest chain of imports followed; deeper is reported, not followed.
pub const MAX_IMPORT_DEPTH: usize = 64;

pub use crate::files::{FsLoader, Loader};

/// One parsed and checked file.
#[derive(Debug, Clone)]
pub struct Module {
    /// Its file.
    pub file: FileId,
    /// Its tree.
    pub template: ast::Template,
    /// What it defines for importers.
    pub info: ModuleInfo,
    /// Its imports: the path as written and the file it resolved to.
    pub imports: Vec<(String, FileId)>,
}

/// A template with all the files it imports.
#[derive(Debug, Clone, Default)]
pub struct Workspace {
    /// Every file read.
    pub sources: SourceMap,
    /// Parsed modules, indexed like `sources` (one per file).
    pub modules: Vec<Module>,
    /// The file that was asked for.
    pub root: FileId,
    /// Every diagnostic of every file, sorted by file and position.
    pub diagnostics: Vec<Diagnostic>,
}

impl Workspace {
    /// Loads the template at `path` and its imports. Fails only when `path`
    /// itself cannot be read.
    pub fn load_file(path: &Path, loader: &dyn Loader) -> io::Result<Workspace> {
        let text = loader.read(path)?;
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let file = SourceFile::new(path.display().to_string(), Some(canon), text);
        Ok(Self::load(file, loader))
    }

    /// Loads a template given as text (standard input, a REPL entry, an
    /// editor buffer); `path`, if given, is where relative imports resolve from.
    pub fn load_text(name: &str, text: &str, path: Option<PathBuf>, loader: &dyn Loader) -> Workspace {
        Self::load(SourceFile::new(name, path, text.to_string()), loader)
    }

    /// Loads a REPL entry: like [`Workspace::load_text`], with the names
    /// earlier entries defined visible to the checker.
    pub fn load_entry(name: &str, text: &str, path: Option<PathBuf>, loader: &dyn Loader, prelude: &Prelude) -> Workspace {
        Self::load_with(SourceFile::new(name, path, text.to_string()), loader, Some(prelude))
    }

    fn load(file: SourceFile, loader: &dyn Loader) -> Workspace {
        Self::load_with(file, loader, None)
    }

    fn load_with(file: SourceFile, loader: &dyn Loader, prelude: Option<&Prelude>) -> Workspace {
        let mut ws = Workspace::default();
        ws.sources.root = match loader.root() {
            Some(r) => Some(r.to_path_buf()),
            None => match &file.path {
                Some(p) => p.parent().map(Path::to_path_buf),
                None => std::env::current_dir().ok(),
            },
        };
        let mut l = Load { ws: &mut ws, loader, done: HashMap::new(), parsed: HashMap::new(), prelude };
        let root = l.ws.sources.add(file);
        l.module(root, &mut Vec::new());
        let mut modules: Vec<Module> = std::mem::take(&mut l.parsed).into_values().collect();
        modules.sort_by_key(|m| m.file);
        ws.modules = modules;
        ws.root = root;
        ws.side_effects();
        diagnostic::sort(&mut ws.diagnostics);
        ws
    }

    /// True when any file has an error (warnings do not count).
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// The module of `file`.
    pub fn module(&self, file: FileId) -> &Module {
        &self.modules[file.0 as usize]
    }

    /// Imported modules may define things but not generate: their top-level
    /// code runs when imported, with no place in the prompt.
    fn side_effects(&mut self) {
        let imported: std::collections::BTreeSet<FileId> = self.modules.iter().flat_map(|m| m.imports.iter().map(|(_, f)| *f)).collect();
        for f in imported {
            if f == self.root {
                continue;
            }
            let mut spans = Vec::new();
            top_level_effects(&self.modules[f.0 as usize].template.body, &mut spans);
            for (span, what) in spans {
                self.diagnostics.push(
                    Diagnostic::new(Code::ImportedSideEffect, f, span, format!("an imported module cannot {what} at its top level"))
                        .with_help("move it into a `{% def %}` and call that from the importing template"),
                );
            }
        }
    }
}

fn top_level_effects(body: &[ast::Node], out: &mut Vec<(Span, &'static str)>) {
    use ast::Node;
    for n in body {
        match n {
            Node::Gen(g) => out.push((g.span, "generate")),
            Node::Select(s) => out.push((s.open, "select")),
            Node::Role(b) => out.push((b.open, "open a role")),
            // A def's body runs only when called.
            Node::Def(_) => {}
            other => other.bodies().into_iter().for_each(|b| top_level_effects(b, out)),
        }
    }
}

struct Load<'w> {
    ws: &'w mut Workspace,
    loader: &'w dyn Loader,
    /// Files already loaded, by key (canonical path or `std/name`).
    done: HashMap<String, FileId>,
    parsed: HashMap<FileId, Module>,
    /// For the root file (the first one loaded): names defined before it.
    prelude: Option<&'w Prelude>,
}

/// Where an import path leads.
struct Resolved {
    key: String,
    name: String,
    path: Option<PathBuf>,
    text: String,
}

impl Load<'_> {
    /// Parses and checks `file` after its imports (depth first).
    /// `stack` holds the files being loaded, for cycle detection.
    fn module(&mut self, file: FileId, stack: &mut Vec<FileId>) {
        let src = self.ws.sources.get(file).clone();
        let key = src.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| src.name.clone());
        self.done.insert(key, file);
        let parsed = syntax::parse(&src.text, file);
        self.ws.diagnostics.extend(parsed.diagnostics);
        let template = parsed.template;
        stack.push(file);
        let mut imports = Vec::new();
        let mut infos: HashMap<String, ModuleInfo> = HashMap::new();
        let base_dir = src.path.as_ref().and_then(|p| p.parent().map(Path::to_path_buf));
        for imp in collect_imports(&template.body) {
            let target = match self.resolve(&imp.path, base_dir.as_deref()) {
                Ok(r) => r,
                Err(msg) => {
                    let d = Diagnostic::new(Code::ImportNotFound, file, imp.path_span, msg.0).with_help(msg.1);
                    self.ws.diagnostics.push(d);
                    continue;
                }
            };
            let id = match self.done.get(&target.key) {
                Some(&id) => {
                    if let Some(pos) = stack.iter().position(|f| *f == id) {
                        let chain: Vec<String> =
                            stack[pos..].iter().chain(std::iter::once(&id)).map(|f| self.ws.sources.get(*f).name.clone()).collect();
                        self.ws.diagnostics.push(
                            Diagnostic::new(Code::ImportCycle, file, imp.path_span, format!("import cycle: {}", chain.join(" → ")))
                                .with_help("move what both files need into a third module that imports neither"),
                        );
                        continue;
                    }
                    id
                }
                None if stack.len() >= MAX_IMPORT_DEPTH => {
                    self.ws.diagnostics.push(
                        Diagnostic::new(
                            Code::ImportCycle,
                            file,
                            imp.path_span,
                            format!("imports nest deeper than {MAX_IMPORT_DEPTH} files"),
                        )
                        .with_help("flatten the chain of imports"),
                    );
                    continue;
                }
                None => {
                    let id = self.ws.sources.add(SourceFile::new(target.name, target.path, target.text));
                    self.module(id, stack);
                    id
                }
            };
            imports.push((imp.path.clone(), id));
            if let Some(m) = self.parsed.get(&id) {
                infos.insert(imp.path.clone(), m.info.clone());
            }
        }
        stack.pop();
        let prelude = self.prelude.filter(|_| file == FileId(0));
        let root = self.ws.sources.root.as_deref();
        let ctx = check::Ctx { file, text: &src.text, base_dir, root, loader: self.loader, imports: &infos, prelude };
        self.ws.diagnostics.extend(check::check_template(&template, &ctx));
        let info = check::module_info(&src.name, &template);
        self.parsed.insert(file, Module { file, template, info, imports });
    }

    fn resolve(&self, path: &str, base: Option<&Path>) -> Result<Resolved, (String, String)> {
        if path.starts_with("std/") {
            let (name, text) = crate::stdlib::resolve(path)?;
            return Ok(Resolved { key: name.clone(), name, path: None, text: text.to_string() });
        }
        if path.is_empty() {
            return Err(("the import path is empty".into(), "write a path such as `./lib.lmt` or `std/json`".into()));
        }
        let root = self.ws.sources.root.as_deref();
        let mut candidates = vec![path.to_string()];
        if Path::new(path).extension().is_none() {
            candidates.push(format!("{path}.lmt"));
        }
        let mut looked = Vec::new();
        for c in &candidates {
            let full = crate::files::resolve_named(c, base, root).map_err(|r| (r.message(c), r.help().to_string()))?;
            match self.loader.read(&full) {
                Ok(text) => {
                    let canon = std::fs::canonicalize(&full).unwrap_or_else(|_| full.clone());
                    let name = pretty(&full);
                    return Ok(Resolved { key: canon.display().to_string(), name, path: Some(canon), text });
                }
                // Found but unreadable (a device, too large, not UTF-8): say so.
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err((format!("cannot read `{path}`: {e}"), "imports must be UTF-8 text files".into()));
                }
                Err(_) => looked.push(pretty(&full)),
            }
        }
        Err((
            format!("cannot find `{path}` (looked for `{}`)", looked.first().map_or("", String::as_str)),
            "relative imports are resolved from the importing file's folder; stdlib modules start with `std/`".into(),
        ))
    }
}

/// `./a/../b.lmt` shown as `b.lmt`, relative to the working directory when inside it.
fn pretty(p: &Path) -> String {
    let mut parts: Vec<std::path::Component> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if matches!(parts.last(), Some(std::path::Component::Normal(_))) => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let clean: PathBuf = parts.iter().collect();
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = clean.strip_prefix(&cwd) {
            return rel.display().to_string();
        }
    }
    clean.display().to_string()
}

fn collect_imports(body: &[ast::Node]) -> Vec<&ast::Import> {
    fn walk<'a>(body: &'a [ast::Node], out: &mut Vec<&'a ast::Import>) {
        for n in body {
            match n {
                ast::Node::Import(i) => out.push(i),
                other => other.bodies().into_iter().for_each(|b| walk(b, out)),
            }
        }
    }
    let mut out = Vec::new();
    walk(body, &mut out);
    out
}
