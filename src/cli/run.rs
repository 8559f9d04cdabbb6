//! `lmt run`: check a template, load a model, run it with text streaming
//! to the terminal, and write the JSON or HTML views of the result.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indexmap::IndexMap;

use super::complete::{model_spec, EXIT_MODEL_ERROR};
use super::remote::{load_any, refuse_unsupported, unsupported_flags};
use super::{report, terminal_width, EXIT_TEMPLATE_ERROR, EXIT_USAGE};
use crate::diagnostic::{Code, Diagnostic, JsonDiagnostic, Severity};
use crate::interp::value::Value;
use crate::state::FinishReason;
use crate::interp::{self, Event, RunOptions};
use crate::model::{LoadOptions, Model, ModelSpec};
use crate::render::{self, EventStream, Styles};
use crate::state::Origin;
use crate::workspace::FsLoader;

/// Exit code: what the run made could not be written (standard output, the report).
pub const EXIT_OUTPUT_ERROR: i32 = 1;
/// Exit code: the run was interrupted (Ctrl-C), as shells report SIGINT.
pub const EXIT_CANCELLED: i32 = 130;

/// Arguments of `lmt run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The template.
    pub file: PathBuf,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Inputs and sampling.
    #[command(flatten)]
    pub input: InputArgs,
    /// Runs over a dataset.
    #[command(flatten)]
    pub dataset: super::dataset::DatasetArgs,
    /// A search over whole runs.
    #[command(flatten)]
    pub search: super::search::SearchArgs,
    /// Print one JSON document (text, messages, captures, tokens, usage, finish_reason) instead of streaming text.
    #[arg(long, conflicts_with = "events")]
    pub json: bool,
    /// Stream the run as JSON lines (`start`, `text`, `role`, `capture`, `error`, and a last `done` with the `--json` fields).
    #[arg(long)]
    pub events: bool,
    /// Also write a self-contained HTML report here.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    /// No progress, warnings or summary on standard error.
    #[arg(long, short)]
    pub quiet: bool,
    /// The folder imports and schema files must stay under (default: the template's folder).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

/// Which model to load (`lmt run`, `lmt repl`, `lmt complete`, `lmt model info`).
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// A model directory, a .gguf file, a hub id `org/name[@revision]`, or
    /// a GGUF on the hub: `org/name:QUANT` or `org/name/file.gguf`
    /// (default: $LMT_MODEL, else the default model).
    #[arg(long, short)]
    pub model: Option<String>,
    /// A tokenizer.json (or a directory holding one) to use instead of the
    /// model's own tokenizer.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// A Jinja chat template file, or the name of one of the model's named
    /// templates (`tool_use`), to use instead of its default template.
    #[arg(long, value_name = "FILE|NAME")]
    pub chat_template: Option<PathBuf>,
    /// Threads the CPU runtime computes on (default: the physical cores).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// With `--model http(s)://…`: the engine (default: detected).
    #[arg(long, value_name = "ENGINE", value_parser = ["llama-server", "vllm", "sglang", "openai"])]
    pub engine: Option<String>,
    /// With `--model http(s)://…`: seconds one request may take, its answer included (default 120).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    pub timeout: Option<f64>,
}

/// Parses a timeout: a finite number of seconds > 0.
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t < 1e9 => Ok(t),
        _ => Err(format!("`{s}` is not a timeout: give a number of seconds > 0")),
    }
}

impl ModelArgs {
    /// The load options these arguments ask for, on the best device.
    pub fn load_options(&self) -> LoadOptions {
        let mut opts = LoadOptions::best_device();
        opts.tokenizer = self.tokenizer.clone();
        opts.chat_template = self.chat_template.clone();
        // More threads than CPUs only wait on each other (the pool's workers
        // spin between jobs): a request past the CPUs available gets those.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        opts.threads = self.threads.map_or(0, |t| usize::from(t).min(cpus));
        opts
    }
}

/// Parses a temperature: a finite number ≥ 0, refused before any model loads.
pub(super) fn temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!("`{s}` is not a temperature: give a finite number ≥ 0 (0 is greedy)")),
    }
}

/// Input values and sampling defaults (`lmt run`, `lmt repl`).
#[derive(Debug, clap::Args)]
pub struct InputArgs {
    /// An input value, `NAME=VALUE` (VALUE is read as JSON when it parses, else as a string). Repeatable.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
    /// Input values from a JSON object file (`--var` wins over it).
    #[arg(long = "vars", value_name = "FILE.json")]
    pub vars_file: Option<PathBuf>,
    /// Base random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Default sampling temperature for `gen` (default 0: greedy; 1 for `--samples`).
    #[arg(long, value_parser = temperature)]
    pub temperature: Option<f32>,
    /// What a run's score counts: the tokens the model chose (`logprob`),
    /// or `all` tokens, template text included (adds `logprob_all`, from one
    /// more pass over the run's tokens; samples are ranked by it).
    #[arg(long, value_enum, default_value_t = Score::Chosen)]
    pub score: Score,
}

/// What a run's score counts (`--score`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Score {
    /// The tokens the model chose: sampled tokens and select choices.
    Chosen,
    /// Every token, template text included.
    All,
}

/// Runs `lmt run` and returns the exit code.
pub fn run(args: &RunArgs) -> i32 {
    let color = report::use_color(std::io::stderr().is_terminal());
    let width = terminal_width();
    let loader = FsLoader { root: args.root.clone(), ..FsLoader::default() };
    let ws = match super::load(&args.file, &loader) {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("error: {e}");
            args.events_end_early("usage", &e.to_string());
            return EXIT_USAGE;
        }
    };
    for d in &ws.diagnostics {
        if d.severity == Severity::Error || !args.quiet {
            eprint!("{}", report::render(d, &ws.sources, color, width));
        }
    }
    if ws.has_errors() {
        if args.events {
            for d in ws.diagnostics.iter().filter(|d| d.severity == Severity::Error) {
                print_line(&serde_json::json!({"event": "error", "kind": "template", "diagnostic": JsonDiagnostic::new(d, &ws.sources)}));
            }
            args.events_end_early("template", "the template has errors");
        }
        return EXIT_TEMPLATE_ERROR;
    }
    let program = crate::ir::compile(&ws);
    if let Err(msg) = super::search::check_usage(args) {
        eprintln!("error: {msg}");
        return EXIT_USAGE;
    }
    if args.dataset.inputs.is_some() {
        return super::dataset::run(args, &program, &ws.sources);
    }
    let vars = match read_vars(&args.input) {
        Ok(v) => v,
        Err(msg) => {
            eprintln!("error: {msg}");
            args.events_end_early("usage", &msg);
            return EXIT_USAGE;
        }
    };
    // Inputs are checked before the model loads: no wait to learn of a typo.
    let declared = interp::inputs(&program);
    if let Some((unknown, why)) = interp::undeclared_input(vars.keys(), &declared) {
        let msg = format!("`--var {unknown}`: {why}; declare it with `{{% input {unknown} %}}`");
        eprintln!("error: {msg}");
        args.events_end_early("usage", &msg);
        return EXIT_USAGE;
    }
    if let Some(d) = declared.iter().find(|d| !d.has_default && !vars.contains_key(&d.name)).map(missing_input) {
        eprint!("{}", report::render(&d, &ws.sources, color, width));
        args.events_end_early("missing-input", &d.message);
        return EXIT_MODEL_ERROR;
    }
    let loaded = match load_any(&args.model, args.quiet) {
        Ok(m) => m,
        Err(msg) => {
            eprintln!("error: {msg}");
            args.events_end_early("model-failed", &msg);
            return EXIT_MODEL_ERROR;
        }
    };
    if refuse_unsupported(&program, &ws.sources, &loaded, args.quiet) {
        args.events_end_early("template", "the template needs what the remote engine lacks");
        return EXIT_TEMPLATE_ERROR;
    }
    let cancel = cancel_on_ctrl_c();
    let opts = RunOptions { temperature: super::search::temperature(args), ..args.input.run_options(vars, cancel.clone()) };
    if let Some(msg) = unsupported_flags(args, &loaded) {
        eprintln!("error: {msg}");
        args.events_end_early("usage", &msg);
        return EXIT_USAGE;
    }
    if let Some(mode) = args.search.mode() {
        return super::search::run(args, &program, &ws.sources, &loaded, opts, mode);
    }
    let stream = !args.json && !args.events;
    let styles = Styles::new(stream && std::io::stdout().is_terminal() && report::use_color(true));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // The first failed write to standard output: the run stops (nobody
    // reads what it makes) and the exit code says so.
    let mut write_error: Option<std::io::Error> = None;
    let mut events = EventStream::default();
    // `done` is written after the `error` event, once the run has returned.
    let mut done_event = None;
    if args.events {
        let start = EventStream::start(&args.file.display().to_string(), &model_spec(args.model.model.as_deref()), &opts.vars, opts.seed);
        write_error = write_line(&mut out, &start).err();
    }
    let mut on_event = |e: Event<'_>| {
        if write_error.is_some() || !(stream || args.events) {
            return;
        }
        let written = if args.events {
            match events.event(&e) {
                Some(o) if matches!(e, Event::Done(_)) => {
                    done_event = Some(o);
                    Ok(())
                }
                Some(o) => write_line(&mut out, &o),
                None => Ok(()),
            }
        } else {
            write_event(&mut out, &styles, &e).and_then(|()| out.flush())
        };
        if let Err(e) = written {
            cancel.store(true, Ordering::SeqCst);
            write_error = Some(e);
        }
    };
    let outcome = interp::run_with(&program, &ws.sources, loaded.backend(), None, &opts, &mut on_event);
    let state = &outcome.state;
    let mut out = stdout.lock();
    if write_error.is_none() {
        let written = if args.events {
            let error = outcome.error.as_ref().map(|e| EventStream::error(e, &ws.sources));
            error.iter().chain(&done_event).try_for_each(|o| write_line(&mut out, o))
        } else {
            let doc = if args.json { serde_json::to_string_pretty(&render::one_run(render::json(state))).unwrap_or_default() } else { String::new() };
            writeln!(out, "{doc}").and_then(|()| out.flush())
        };
        if let Err(e) = written {
            write_error = Some(e);
        }
    }
    drop(out);
    let mut failed_output = false;
    if let Some(path) = &args.html {
        let title = args.file.file_name().map_or("lmt run".into(), |n| n.to_string_lossy().into_owned());
        if let Err(e) = write_atomically(path, render::html(state, &title).as_bytes()) {
            eprintln!("error: cannot write the report `{}`: {e}", path.display());
            failed_output = true;
        }
    }
    match write_error {
        // The reader went away (`lmt run … | head`): a quiet end.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return if failed_output { EXIT_TEMPLATE_ERROR } else { 0 },
        Some(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            failed_output = true;
        }
        None => {}
    }
    if !args.quiet {
        let u = &state.usage;
        eprintln!(
            "finish: {} · {} prompt + {} generated + {} forced tokens · {} forward passes ({} tokens, {} reused from the cache) · {:.1} tokens/s · {:.0} ms",
            state.finish_reason.as_str(),
            u.prompt_tokens,
            u.generated_tokens,
            u.forced_tokens,
            u.forward_passes,
            u.forward_tokens,
            u.reused_tokens,
            u.tokens_per_second,
            u.total_ms
        );
    }
    if let Some(e) = &outcome.error {
        eprint!("{}", report::render(&e.to_diagnostic(), &ws.sources, color, width));
    }
    if failed_output {
        return EXIT_OUTPUT_ERROR;
    }
    if outcome.error.is_some() {
        return EXIT_MODEL_ERROR;
    }
    if state.finish_reason == FinishReason::Cancelled {
        eprintln!("cancelled: partial result kept");
        return EXIT_CANCELLED;
    }
    0
}

impl RunArgs {
    /// With `--events`, a run that ends before it starts still ends the
    /// stream: an `error` event and a `done` whose finish reason is `error`.
    fn events_end_early(&self, kind: &str, message: &str) {
        if self.events {
            print_line(&serde_json::json!({"event": "error", "kind": kind, "message": message}));
            print_line(&serde_json::json!({"event": "done", "finish_reason": "error", "error": {"kind": kind, "message": message}}));
        }
    }
}

/// Writes `o` as one line and flushes, so a reader sees it at once.
fn write_line(out: &mut dyn Write, o: &serde_json::Value) -> std::io::Result<()> {
    writeln!(out, "{o}")?;
    out.flush()
}

/// [`write_line`] to standard output, for the events of a run that never
/// started (a failed write has no run left to stop).
fn print_line(o: &serde_json::Value) {
    let _ = write_line(&mut std::io::stdout().lock(), o);
}

impl InputArgs {
    /// How to run, with the input values `vars` and the cancel flag.
    pub(super) fn run_options(&self, vars: IndexMap<String, Value>, cancel: Arc<AtomicBool>) -> RunOptions {
        RunOptions {
            vars,
            seed: self.seed,
            temperature: self.temperature.unwrap_or(0.0),
            limits: Default::default(),
            cancel: Some(cancel),
            score_all: self.score == Score::All,
        }
    }
}

/// A flag Ctrl-C sets: the run stops at the next token or instruction and
/// writes what it has. Pressed again while the flag is set it changes
/// nothing (the record still comes); only a third press ends the process at
/// once, for a run stuck in one long computation.
pub(super) fn cancel_on_ctrl_c() -> Arc<AtomicBool> {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    if let Ok(mut signals) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT]) {
        std::thread::spawn(move || {
            let mut presses = 0;
            for _ in signals.forever() {
                // The REPL clears the flag for each entry: count afresh.
                if !flag.swap(true, Ordering::SeqCst) {
                    presses = 0;
                }
                presses += 1;
                if presses >= 3 {
                    eprintln!("\ninterrupted three times: exiting without the record");
                    std::process::exit(EXIT_CANCELLED);
                }
            }
        });
    }
    cancel
}

/// Writes `bytes` to `path` whole or not at all: into a temporary file
/// beside it, then renamed over it, so a failed write never leaves half a
/// report where the old one was.
pub(super) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    if path.is_dir() {
        return Err(std::io::Error::new(std::io::ErrorKind::IsADirectory, "it is a directory"));
    }
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Streams an event to the terminal: text (generated and hidden text
/// styled) and role headers.
pub(super) fn write_event(out: &mut dyn Write, styles: &Styles, e: &Event<'_>) -> std::io::Result<()> {
    match e {
        Event::Text { text, origin, hidden } => {
            let style = match (origin, hidden) {
                (_, true) => styles.hidden,
                (Origin::Generated, _) => styles.generated,
                _ => "",
            };
            if style.is_empty() {
                write!(out, "{text}")?;
            } else {
                write!(out, "{style}{text}{}", styles.reset)?;
            }
        }
        Event::RoleOpen(role) => writeln!(out, "{}[{role}]{}", styles.role, styles.reset)?,
        Event::RoleClose(_) => writeln!(out)?,
        _ => return Ok(()),
    }
    out.flush()
}

/// A required input that was not given, as a diagnostic at its declaration.
fn missing_input(d: &interp::InputDecl) -> Diagnostic {
    let name = &d.name;
    Diagnostic::new(Code::MissingInput, d.file, d.span, format!("the input `{name}` was not given"))
        .with_label("declared here without a default")
        .with_help(format!(
            "pass it with `--var {name}=VALUE` or in `--vars FILE.json`, or give it a default: `{{% input {name}=\"…\" %}}`"
        ))
}

/// The `--vars` file and `--var` values.
pub(super) fn read_vars(args: &InputArgs) -> Result<IndexMap<String, Value>, String> {
    let mut vars = IndexMap::new();
    if let Some(path) = &args.vars_file {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        let j: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("`{}` is not JSON: {e}", path.display()))?;
        let serde_json::Value::Object(o) = j else {
            return Err(format!("`{}` must hold a JSON object of input values", path.display()));
        };
        for (k, v) in o {
            vars.insert(k, Value::from_json(&v));
        }
    }
    for kv in &args.vars {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("`--var {kv}`: expected NAME=VALUE"))?;
        let value = serde_json::from_str::<serde_json::Value>(v).map(|j| Value::from_json(&j)).unwrap_or_else(|_| Value::str(v));
        vars.insert(k.trim().to_string(), value);
    }
    Ok(vars)
}

/// Loads the model with a spinner, and says what loaded unless `quiet`.
pub(super) fn load_model(args: &ModelArgs, quiet: bool) -> Result<Model, String> {
    let spec_text = model_spec(args.model.as_deref());
    if super::remote::is_url(&spec_text) {
        return Err(format!("`--model {spec_text}` names a remote engine: `lmt run` and `lmt check` use those; this command needs a model loaded here"));
    }
    let spec = ModelSpec::parse(&spec_text).map_err(|e| e.to_string())?;
    let opts = args.load_options();
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        b.set_message(format!("loading {spec_text}"));
        b.enable_steady_tick(Duration::from_millis(100));
        b
    };
    let t0 = Instant::now();
    let model = Model::load(&spec, &opts).map_err(|e| e.to_string());
    bar.finish_and_clear();
    let model = model?;
    if !quiet {
        let c = &model.decoder.config;
        eprintln!("loaded {} ({}, {} layers) in {:.1?}", spec_text, c.arch.name(), c.num_layers, t0.elapsed());
    }
    Ok(model)
}
