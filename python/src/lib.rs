//! `lmt._lmt`: the compiled half of the `lmt` Python package.
//!
//! Deliberately thin: every call goes to the same library functions the
//! `lmt` command line uses, and results cross into Python as the JSON
//! documents the command line prints (`lmt run --json`, `--events`, dataset
//! records), which `lmt/__init__.py` turns into typed objects. Errors a
//! caller can act on with a partial result (a run error, Ctrl-C) come back
//! as data for the Python layer to raise with that result attached.

use pyo3::prelude::*;

mod events;
mod model;
mod rows;
mod template;
mod wait;

pyo3::create_exception!(_lmt, ModelError, pyo3::exceptions::PyRuntimeError, "A model could not be loaded, or an engine reached.");
pyo3::create_exception!(_lmt, InputError, pyo3::exceptions::PyValueError, "An input value the template does not declare, or a required one missing.");

/// Walks `text`, tokenized by the tokenizer at `tokenizer`, through a
/// constraint (`kind`: regex, regex_from, choices, grammar, json_schema;
/// `value`: its text, a JSON list of options, or a JSON schema) and returns
/// `lmt match --json`'s object as JSON text, with `message` added.
#[pyfunction]
#[pyo3(signature = (kind, value, text, tokenizer, json_open=false))]
fn match_text(py: Python<'_>, kind: &str, value: &str, text: &str, tokenizer: std::path::PathBuf, json_open: bool) -> PyResult<String> {
    use lmt::cli::matching::{match_text, ConstraintSpec};
    let bad = |e: serde_json::Error| pyo3::exceptions::PyValueError::new_err(format!("`{kind}` constraint: {e}"));
    let spec = match kind {
        "regex" => ConstraintSpec::Regex(value.to_string()),
        "regex_from" => ConstraintSpec::RegexFrom(value.to_string()),
        "grammar" => ConstraintSpec::Grammar(value.to_string()),
        "choices" => ConstraintSpec::Choices(serde_json::from_str(value).map_err(bad)?),
        "json_schema" => ConstraintSpec::JsonSchema { schema: serde_json::from_str(value).map_err(bad)?, open: json_open },
        _ => return Err(pyo3::exceptions::PyValueError::new_err(format!("`{kind}` is not a kind of constraint"))),
    };
    let outcome = py.detach(|| match_text(&spec, text, &tokenizer)).map_err(pyo3::exceptions::PyValueError::new_err)?;
    let mut doc = outcome.json;
    doc["message"] = outcome.message.into();
    Ok(doc.to_string())
}

/// The module.
#[pymodule]
fn _lmt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<model::Model>()?;
    m.add_class::<template::Template>()?;
    m.add_class::<events::Events>()?;
    m.add_class::<rows::RowStream>()?;
    m.add_function(wrap_pyfunction!(match_text, m)?)?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
