//! `--model http(s)://…`: connecting to a serving engine, finding the
//! tokenizer lmt makes its prompts with, and refusing before any request a
//! template that needs what the engine lacks.

use std::path::Path;
use std::time::Duration;

use super::report;
use super::run::{load_model, ModelArgs};
use crate::diagnostic::Severity;
use crate::interp::Backend;
use crate::ir::Program;
use crate::model::remote::{hub_tokenizer, EngineKind, Remote, RemoteModel, RemoteOptions};
use crate::model::{LoadOptions, Model, ModelInfo};
use crate::span::SourceMap;

/// The model a run goes through: loaded here, or a remote engine.
pub enum Loaded {
    /// lmt's own runtime.
    Local(Model),
    /// A serving engine.
    Remote(RemoteModel),
}

impl Loaded {
    /// What runs the model work.
    pub fn backend(&self) -> Backend<'_> {
        match self {
            Loaded::Local(m) => Backend::local(m),
            Loaded::Remote(r) => Backend::Remote(r),
        }
    }
}

/// True when `--model` names a remote engine.
pub fn is_url(spec: &str) -> bool {
    spec.starts_with("http://") || spec.starts_with("https://")
}

/// Loads the model, or connects to the engine `--model` names.
pub fn load_any(args: &ModelArgs, quiet: bool) -> Result<Loaded, String> {
    let spec = super::complete::model_spec(args.model.as_deref());
    match is_url(&spec) {
        true => connect(args, &spec, quiet).map(Loaded::Remote),
        false => load_model(args, quiet).map(Loaded::Local),
    }
}

/// Connects to `url` and loads the tokenizer of the model it serves.
fn connect(args: &ModelArgs, url: &str, quiet: bool) -> Result<RemoteModel, String> {
    let mut opts = RemoteOptions::new(url);
    opts.engine = match args.engine.as_deref() {
        Some(name) => Some(EngineKind::parse(name).ok_or_else(|| format!("`--engine {name}`: not an engine lmt knows"))?),
        None => None,
    };
    if let Some(t) = args.timeout {
        opts.timeout = Duration::from_secs_f64(t);
    }
    let remote = Remote::connect(&opts).map_err(|e| e.to_string())?;
    let (tokenizer, config_context, from) = match (&args.tokenizer, &remote.model_file, &remote.model_id) {
        (Some(path), _, _) | (None, Some(path), _) => {
            let info = read_tokenizer(path, args)?;
            (info.tokenizer, info.config.max_position_embeddings, path.display().to_string())
        }
        (None, None, Some(id)) => {
            let (tok, context) = hub_tokenizer(id).map_err(|e| {
                format!("the tokenizer of `{id}`, the model {} serves: {e} (or give it with --tokenizer)", remote.describe())
            })?;
            let tok = match &args.chat_template {
                Some(t) => tok.choose_chat_template(t).map_err(|e| e.to_string())?,
                None => tok,
            };
            (tok, context, format!("the hub model {id}"))
        }
        (None, None, None) => {
            return Err(format!(
                "{} does not say which model it serves: give the model's tokenizer with --tokenizer (its .gguf or model directory)",
                remote.describe()
            ))
        }
    };
    let context_length = remote.context_length.unwrap_or(config_context);
    if !quiet {
        eprintln!("connected to {} (context {context_length}; tokenizer from {from})", remote.describe());
    }
    Ok(RemoteModel { remote, tokenizer, context_length })
}

/// The tokenizer (and config) of the model at `path`, read from metadata
/// alone: no weights are loaded.
fn read_tokenizer(path: &Path, args: &ModelArgs) -> Result<ModelInfo, String> {
    let opts = LoadOptions { chat_template: args.chat_template.clone(), ..LoadOptions::default() };
    ModelInfo::read(path, &opts).map_err(|e| format!("the tokenizer for the remote engine: {e}"))
}

/// What `lmt run`'s flags ask that a remote engine cannot do yet.
pub fn unsupported_flags(args: &super::run::RunArgs, loaded: &Loaded) -> Option<String> {
    let Loaded::Remote(r) = loaded else { return None };
    let caps = r.remote.kind.capabilities();
    if let Some(crate::search::Mode::Beam { .. }) = args.search.mode() {
        return Some(format!("`--beam` needs the model's next-token log-probs at every step, which {} does not give (`--samples` and `--best-of` work)", r.remote.describe()));
    }
    if args.input.score == super::run::Score::All && !caps.prompt_scoring {
        return Some(format!("`--score all` needs log-probs of given text, which {} does not give", r.remote.describe()));
    }
    None
}

/// Prints what `program` needs that the engine lacks (errors) or does
/// differently (warnings, unless `quiet`); true when it cannot run there.
pub fn refuse_unsupported(program: &Program, sources: &SourceMap, loaded: &Loaded, quiet: bool) -> bool {
    let Loaded::Remote(r) = loaded else { return false };
    let color = report::use_color(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let diags = crate::interp::engine_needs(program, r.remote.kind);
    for d in &diags {
        if d.severity == Severity::Error || !quiet {
            eprint!("{}", report::render(d, sources, color, super::terminal_width()));
        }
    }
    diags.iter().any(|d| d.severity == Severity::Error)
}
