//! `Model`: a model loaded once (or an engine connected to), shared by any
//! number of runs, in any number of threads.

use std::path::PathBuf;
use std::sync::Arc;

use lmt::cli::remote::{load_any, Loaded};
use lmt::cli::run::ModelArgs;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::ModelError;

/// A model: a directory, a .gguf file, a hub id, or a remote engine's URL,
/// as `--model` takes them.
#[pyclass(frozen, module = "lmt._lmt")]
pub struct Model {
    /// What runs the model work; runs on other threads hold it too.
    pub loaded: Arc<Loaded>,
    /// The spec it was loaded from.
    pub spec: String,
}

#[pymethods]
impl Model {
    /// Loads the model (the GIL released meanwhile).
    #[new]
    #[pyo3(signature = (spec, *, tokenizer=None, chat_template=None, threads=None, engine=None, timeout=None))]
    fn new(
        py: Python<'_>,
        spec: String,
        tokenizer: Option<PathBuf>,
        chat_template: Option<PathBuf>,
        threads: Option<i64>,
        engine: Option<String>,
        timeout: Option<f64>,
    ) -> PyResult<Model> {
        let threads = match threads {
            None => None,
            Some(n @ 1..=1024) => Some(n as u16),
            Some(n) => return Err(PyValueError::new_err(format!("threads={n}: give a number from 1 to 1024"))),
        };
        if let Some(t) = timeout.filter(|t| !(t.is_finite() && *t > 0.0 && *t < 1e9)) {
            return Err(PyValueError::new_err(format!("timeout={t}: give a number of seconds > 0")));
        }
        let args = ModelArgs { model: Some(spec.clone()), tokenizer, chat_template, threads, engine, timeout };
        let loaded = py.detach(|| load_any(&args, true)).map_err(ModelError::new_err)?;
        Ok(Model { loaded: Arc::new(loaded), spec })
    }

    /// The spec it was loaded from.
    #[getter]
    fn spec(&self) -> &str {
        &self.spec
    }

    /// True for a remote engine.
    #[getter]
    fn is_remote(&self) -> bool {
        matches!(*self.loaded, Loaded::Remote(_))
    }

    /// What it is, in words: the architecture and layers, or the engine.
    fn describe(&self) -> String {
        match &*self.loaded {
            Loaded::Local(m) => {
                let c = &m.decoder.config;
                format!("{} ({}, {} layers)", self.spec, c.arch.name(), c.num_layers)
            }
            Loaded::Remote(r) => r.remote.describe(),
        }
    }

    fn __repr__(&self) -> String {
        format!("lmt.Model({:?})", self.spec)
    }
}
