//! `Template`: a template checked on construction and compiled once, run
//! any number of times: one run, a search over whole runs, or a dataset of
//! rows. Results are the command line's JSON documents, as text.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use indexmap::IndexMap;
use lmt::cli::remote::Loaded;
use lmt::cli::report;
use lmt::dataset::DatasetOptions;
use lmt::diagnostic::{Diagnostic, JsonDiagnostic};
use lmt::interp::value::Value;
use lmt::interp::{self, InputDecl, RunError, RunOptions};
use lmt::ir::Program;
use lmt::render;
use lmt::search::{self, Mode, SearchOptions};
use lmt::span::SourceMap;
use lmt::workspace::{FsLoader, Workspace};
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use serde_json::{json, Value as J};

use crate::model::Model;
use crate::rows::RowStream;
use crate::wait::interruptible;
use crate::InputError;

/// Width the diagnostics are rendered at for `str(TemplateError)`.
const REPORT_WIDTH: usize = 100;
/// MiB of K/V the prefix cache of a search or dataset may hold (the CLI's default).
const PREFIX_CACHE_MIB: usize = 512;

/// A compiled template, shared with the threads that run it.
pub struct Compiled {
    /// The program.
    pub program: Program,
    /// Its files, for diagnostics.
    pub sources: SourceMap,
    /// The inputs it declares.
    pub declared: Vec<InputDecl>,
    /// Its name (the file's path, or the name given).
    pub name: String,
}

/// A template: its diagnostics, and the program when it has no errors.
#[pyclass(frozen, module = "lmt._lmt")]
pub struct Template {
    compiled: Option<Arc<Compiled>>,
    diagnostics: String,
    report: String,
    name: String,
}

/// The diagnostics as a JSON array of `lmt check --format json` objects,
/// each with its `rendered` text, and all of them rendered as one report.
fn diagnostics_json(diags: &[Diagnostic], sources: &SourceMap) -> (String, String) {
    let mut report_text = String::new();
    let list: Vec<J> = diags
        .iter()
        .map(|d| {
            let rendered = report::render(d, sources, false, REPORT_WIDTH);
            report_text.push_str(&rendered);
            let mut o = serde_json::to_value(JsonDiagnostic::new(d, sources)).unwrap_or(J::Null);
            o["rendered"] = json!(rendered);
            o
        })
        .collect();
    (J::Array(list).to_string(), report_text)
}

impl Template {
    fn from_workspace(ws: Workspace, name: String) -> Template {
        let (diagnostics, report) = diagnostics_json(&ws.diagnostics, &ws.sources);
        let compiled = (!ws.has_errors()).then(|| {
            let program = lmt::ir::compile(&ws);
            let declared = interp::inputs(&program);
            Arc::new(Compiled { program, sources: ws.sources, declared, name: name.clone() })
        });
        Template { compiled, diagnostics, report, name }
    }

    /// The program, for a template without errors.
    fn compiled(&self) -> PyResult<&Arc<Compiled>> {
        self.compiled.as_ref().ok_or_else(|| PyValueError::new_err(format!("`{}` has errors and cannot run", self.name)))
    }
}

/// The input values a run gets: `inputs` (a JSON object) checked against
/// what the template declares: none it lacks, none it needs left out.
fn input_values(c: &Compiled, inputs: &str, defaults_too: bool) -> PyResult<IndexMap<String, Value>> {
    let j: J = serde_json::from_str(inputs).map_err(|e| InputError::new_err(format!("input values: {e}")))?;
    let J::Object(o) = j else { return Err(InputError::new_err("input values must be a mapping of names to values")) };
    let vars: IndexMap<String, Value> = o.iter().map(|(k, v)| (k.clone(), Value::from_json(v))).collect();
    if let Some((_, why)) = interp::undeclared_input(vars.keys(), &c.declared) {
        return Err(InputError::new_err(why));
    }
    if !defaults_too {
        if let Some(d) = c.declared.iter().find(|d| !d.has_default && !vars.contains_key(&d.name)) {
            let name = &d.name;
            return Err(InputError::new_err(format!("the input `{name}` was not given: pass it as `{name}=...` (it is declared without a default)")));
        }
    }
    Ok(vars)
}

/// The options of one run of `c` (with its cancel flag): `inputs` checked,
/// `temperature` checked.
fn run_options(c: &Compiled, inputs: &str, seed: u64, temperature: f32, score_all: bool) -> PyResult<(RunOptions, Arc<AtomicBool>)> {
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = RunOptions {
        vars: input_values(c, inputs, false)?,
        seed,
        temperature: self::temperature(temperature)?,
        limits: Default::default(),
        cancel: Some(cancel.clone()),
        score_all,
    };
    Ok((opts, cancel))
}

/// A sampling temperature: finite and ≥ 0.
fn temperature(t: f32) -> PyResult<f32> {
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(PyValueError::new_err(format!("temperature={t}: give a finite number ≥ 0 (0 is greedy)")))
    }
}

/// A search mode from its name and size, as the CLI's flags name them.
fn search_mode(kind: &str, n: u16) -> PyResult<Mode> {
    let n = usize::from(n);
    match (kind, n) {
        (_, 0) => Err(PyValueError::new_err(format!("{kind}=0: give at least 1"))),
        ("samples", 1..=1024) => Ok(Mode::Samples { n, best_of: false }),
        ("best_of", 1..=1024) => Ok(Mode::Samples { n, best_of: true }),
        ("beam", 1..=64) => Ok(Mode::Beam { width: n }),
        ("beam", _) => Err(PyValueError::new_err(format!("beam={n}: give a width from 1 to 64"))),
        _ => Err(PyValueError::new_err(format!("{kind}={n}: give a number from 1 to 1024"))),
    }
}

/// Refuses a beam on a remote engine, which gives no next-token log-probs.
fn refuse_remote_beam(model: &Model, mode: Option<Mode>) -> PyResult<()> {
    match (&*model.loaded, mode) {
        (Loaded::Remote(r), Some(Mode::Beam { .. })) => Err(PyValueError::new_err(format!(
            "a beam needs the model's next-token log-probs at every step, which {} does not give",
            r.remote.describe()
        ))),
        _ => Ok(()),
    }
}

/// A run error as JSON: its diagnostic's fields and its kind.
pub fn error_json(e: &RunError, sources: &SourceMap) -> J {
    let mut o = serde_json::to_value(JsonDiagnostic::new(&e.to_diagnostic(), sources)).unwrap_or(J::Null);
    o["kind"] = json!(e.kind);
    o
}

#[pymethods]
impl Template {
    /// Checks and compiles template text. `path` places it for relative
    /// imports and schema files (default: `name` in the working folder);
    /// `root` is the folder those must stay under.
    #[new]
    #[pyo3(signature = (source, *, name="<template>".to_string(), path=None, root=None))]
    fn new(py: Python<'_>, source: &str, name: String, path: Option<PathBuf>, root: Option<PathBuf>) -> Template {
        let loader = FsLoader { root, ..FsLoader::default() };
        let path = path.or_else(|| std::env::current_dir().ok().map(|d| d.join(&name)));
        py.detach(|| Template::from_workspace(Workspace::load_text(&name, source, path, &loader), name.clone()))
    }

    /// Reads, checks and compiles the template file at `path`.
    #[staticmethod]
    #[pyo3(signature = (path, *, root=None))]
    fn from_file(py: Python<'_>, path: PathBuf, root: Option<PathBuf>) -> PyResult<Template> {
        let loader = FsLoader { root, ..FsLoader::default() };
        let name = path.display().to_string();
        let ws = py.detach(|| Workspace::load_file(&path, &loader)).map_err(|e| {
            let msg = format!("cannot read `{name}`: {e}");
            match e.kind() {
                std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
                _ => PyOSError::new_err(msg),
            }
        })?;
        Ok(Template::from_workspace(ws, name))
    }

    /// Its name: the file's path, or the name given.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The diagnostics (errors and warnings), as a JSON array.
    #[getter]
    fn diagnostics_json(&self) -> &str {
        &self.diagnostics
    }

    /// The diagnostics rendered as `lmt check` prints them.
    #[getter]
    fn report(&self) -> &str {
        &self.report
    }

    /// True when it has errors (and cannot run).
    #[getter]
    fn has_errors(&self) -> bool {
        self.compiled.is_none()
    }

    /// The inputs it declares: (name, has a default), in order.
    fn inputs(&self) -> Vec<(String, bool)> {
        let declared = self.compiled.as_ref().map_or(&[][..], |c| &c.declared[..]);
        declared.iter().map(|d| (d.name.clone(), d.has_default)).collect()
    }

    /// What it needs that `model`'s engine lacks (errors) or does
    /// differently (warnings), as a JSON array of diagnostics; empty for a
    /// model loaded here.
    fn engine_problems_json(&self, model: &Model) -> PyResult<String> {
        let c = self.compiled()?;
        let Loaded::Remote(r) = &*model.loaded else { return Ok("[]".into()) };
        Ok(diagnostics_json(&interp::engine_needs(&c.program, r.remote.kind), &c.sources).0)
    }

    /// One run. Returns `{"record": <lmt run --json>, "error": <the run
    /// error or null>}` (and `"html"`: the `--html` report, when asked) as
    /// JSON text, and the exception a signal handler raised while it ran
    /// (the run then ends cancelled, its record kept). `cancel` (a
    /// `threading.Event`) stops it at its next token once set.
    #[pyo3(signature = (model, inputs, *, seed=0, temperature=0.0, score_all=false, html=false, cancel=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        model: &Model,
        inputs: &str,
        seed: u64,
        temperature: f32,
        score_all: bool,
        html: bool,
        cancel: Option<Py<PyAny>>,
    ) -> PyResult<(String, Option<PyErr>)> {
        let c = self.compiled()?;
        let (opts, flag) = run_options(c, inputs, seed, temperature, score_all)?;
        let (outcome, raised) = interruptible(py, &flag, cancel.as_ref(), || {
            interp::run_with(&c.program, &c.sources, model.loaded.backend(), None, &opts, &mut |_| {})
        });
        let error = outcome.error.as_ref().map_or(J::Null, |e| error_json(e, &c.sources));
        let mut doc = json!({"record": render::one_run(render::json(&outcome.state)), "error": error});
        if html {
            // Titled as `lmt run --html` titles it: the file's name.
            let title = std::path::Path::new(&c.name).file_name().map_or(c.name.clone(), |n| n.to_string_lossy().into_owned());
            doc["html"] = json!(render::html(&outcome.state, &title));
        }
        Ok((doc.to_string(), raised))
    }

    /// A search over whole runs (`kind`: samples, best_of or beam, of size
    /// `n`). Returns `lmt run --samples/--beam --json`'s document as JSON
    /// text (`runs` empty when none got going), and the exception a signal
    /// handler raised.
    #[pyo3(signature = (model, inputs, kind, n, *, seed=0, temperature=0.0, score_all=false, length_penalty=0.0, cancel=None))]
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        py: Python<'_>,
        model: &Model,
        inputs: &str,
        kind: &str,
        n: u16,
        seed: u64,
        temperature: f32,
        score_all: bool,
        length_penalty: f64,
        cancel: Option<Py<PyAny>>,
    ) -> PyResult<(String, Option<PyErr>)> {
        let c = self.compiled()?;
        let mode = search_mode(kind, n)?;
        if !(length_penalty.is_finite() && (0.0..=10.0).contains(&length_penalty)) {
            return Err(PyValueError::new_err(format!("length_penalty={length_penalty}: give a number from 0 to 10")));
        }
        if score_all && matches!(mode, Mode::Beam { .. }) {
            return Err(PyValueError::new_err("score='all' ranks finished runs; a beam ranks partial runs as it goes: use samples= or best_of="));
        }
        refuse_remote_beam(model, Some(mode))?;
        let (opts, flag) = run_options(c, inputs, seed, temperature, score_all)?;
        let search = SearchOptions { mode, length_penalty, prefix_cache_bytes: PREFIX_CACHE_MIB << 20 };
        let (found, raised) = interruptible(py, &flag, cancel.as_ref(), || match &*model.loaded {
            Loaded::Local(m) => Some(search::run(&c.program, &c.sources, m, &opts, &search)),
            Loaded::Remote(r) => search::run_remote(&c.program, &c.sources, r, &opts, &search),
        });
        let doc = found.map_or(json!({"runs": []}), |f| render::search_json(&f, mode));
        Ok((doc.to_string(), raised))
    }

    /// Runs over `rows` (an iterator of JSON lines, as `--inputs` reads
    /// them, pulled as rows start), `parallel` at a time, on a thread of its
    /// own; the records come back through the returned iterator as they
    /// complete.
    #[pyo3(signature = (model, rows, defaults, *, parallel=1, seed=0, temperature=0.0, score_all=false, search=None, length_penalty=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn iter_many(
        &self,
        model: &Model,
        rows: Py<PyAny>,
        defaults: &str,
        parallel: u16,
        seed: u64,
        temperature: f32,
        score_all: bool,
        search: Option<(String, u16)>,
        length_penalty: f64,
    ) -> PyResult<RowStream> {
        let c = self.compiled()?;
        if !(1..=256).contains(&parallel) {
            return Err(PyValueError::new_err(format!("parallel={parallel}: give a number from 1 to 256")));
        }
        let search = search.map(|(kind, n)| search_mode(&kind, n)).transpose()?;
        refuse_remote_beam(model, search)?;
        let opts = DatasetOptions {
            parallel: usize::from(parallel),
            seed,
            temperature: self::temperature(temperature)?,
            limits: Default::default(),
            defaults: input_values(c, defaults, true)?,
            prefix_cache_bytes: PREFIX_CACHE_MIB << 20,
            cancel: Arc::new(AtomicBool::new(false)),
            search: search.map(|m| (m, length_penalty)),
            score_all,
        };
        Ok(RowStream::start(c.clone(), model.loaded.clone(), rows, opts))
    }

    /// A run as an iterator of `lmt run --events` objects (JSON text),
    /// ending with `done`; the run goes on a thread of its own.
    #[pyo3(signature = (model, inputs, *, seed=0, temperature=0.0, score_all=false))]
    fn stream(&self, model: &Model, inputs: &str, seed: u64, temperature: f32, score_all: bool) -> PyResult<crate::events::Events> {
        let c = self.compiled()?.clone();
        let (opts, cancel) = run_options(&c, inputs, seed, temperature, score_all)?;
        Ok(crate::events::Events::start(c, model.loaded.clone(), model.spec.clone(), opts, cancel))
    }

    fn __repr__(&self) -> String {
        format!("lmt.Template({:?})", self.name)
    }
}
