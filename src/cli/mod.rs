//! The `lmt` command line: argument parsing and the commands. Everything
//! here is an edge: it reads files, renders diagnostics and sets the exit
//! code; the work is done by the library's stages.

pub mod complete;
pub mod dataset;
pub mod matching;
pub mod model;
pub mod remote;
pub mod repl;
pub mod report;
pub mod run;
pub mod search;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use crate::diagnostic::{Code, Severity};
use crate::workspace::{FsLoader, Workspace};

/// Exit code: the template has errors.
pub const EXIT_TEMPLATE_ERROR: i32 = 1;
/// Exit code: bad usage, or an input file that cannot be read.
pub const EXIT_USAGE: i32 = 2;

/// lmt: templates that interleave text with language-model generation.
#[derive(Debug, Parser)]
#[command(name = "lmt", version, about, propagate_version = true)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a template on a model.
    Run(run::RunArgs),
    /// An interactive session on one live model state (entries, `:undo`, `:vars`…).
    Repl(repl::ReplArgs),
    /// Check templates for errors without loading a model.
    Check(CheckArgs),
    /// Check a text against a constraint token by token, with no model.
    Match(matching::MatchArgs),
    /// Load a model and continue a plain prompt (no template).
    Complete(complete::CompleteArgs),
    /// Describe a model from its metadata (`lmt model info`).
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Run the language server over standard input/output (for editors).
    Lsp,
    /// Explain a diagnostic code, e.g. `lmt explain E0201`.
    Explain {
        /// The code (`E0201`) or its name (`unclosed-block`); all codes when omitted.
        code: Option<String>,
    },
}

/// Arguments of `lmt check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Template files (`-` reads standard input).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// How to print diagnostics.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Also print the AST or the IR disassembly to standard output.
    #[arg(long, value_enum)]
    pub emit: Option<Emit>,
    /// The folder imports and schema files must stay under (default: each template's folder).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Also check what the templates need of the engine at this URL (E0901, W0902).
    #[arg(long, value_name = "URL")]
    pub model: Option<String>,
    /// Also check what the templates need of this engine (no connection).
    #[arg(long, value_name = "ENGINE", value_parser = ["llama-server", "vllm", "sglang", "openai"])]
    pub engine: Option<String>,
}

/// The engine `lmt check` checks templates against: named, or detected at
/// `--model`'s URL; `Err` with a message when that fails.
fn check_engine(args: &CheckArgs) -> Result<Option<crate::model::remote::EngineKind>, String> {
    use crate::model::remote::{EngineKind, Remote, RemoteOptions};
    if let Some(name) = &args.engine {
        return EngineKind::parse(name).map(Some).ok_or_else(|| format!("`--engine {name}`: not an engine lmt knows"));
    }
    match args.model.as_deref() {
        None => Ok(None),
        Some(url) if remote::is_url(url) => Remote::connect(&RemoteOptions::new(url)).map(|r| Some(r.kind)).map_err(|e| e.to_string()),
        Some(m) => Err(format!("`--model {m}`: `lmt check` checks against a remote engine's URL (a local model can run any template)")),
    }
}

/// Diagnostic output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Source snippets with labels and help, on standard error.
    Human,
    /// One JSON object per diagnostic per line, on standard output.
    Json,
}

/// What `--emit` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Emit {
    /// The syntax tree.
    Ast,
    /// The compiled instructions.
    Ir,
}

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Repl(args) => repl::run(&args),
        Command::Check(args) => check(&args),
        Command::Match(args) => matching::run(&args),
        Command::Complete(args) => complete::run(&args),
        Command::Model(cmd) => model::run(&cmd),
        Command::Lsp => crate::lsp::run_stdio(),
        Command::Explain { code } => explain(code.as_deref()),
    }
}

/// Loads the template at `path` (`-`: standard input) and its imports.
fn load(path: &Path, loader: &FsLoader) -> Result<Workspace, String> {
    if path == Path::new("-") {
        let text = crate::files::read_bounded(std::io::stdin().lock(), "standard input")
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        let cwd = std::env::current_dir().ok().map(|d| d.join("<stdin>"));
        return Ok(Workspace::load_text("<stdin>", &text, cwd, loader));
    }
    Workspace::load_file(path, loader).map_err(|e| {
        let hint = if path.starts_with("/dev") || path.starts_with("/proc") { " (use `-` to read standard input)" } else { "" };
        format!("cannot read `{}`: {e}{hint}", path.display())
    })
}

/// `lmt check`: 0 when no file has errors, 1 when one has, 2 when a file cannot be read.
pub fn check(args: &CheckArgs) -> i32 {
    let loader = FsLoader { root: args.root.clone(), ..FsLoader::default() };
    let color = report::use_color(std::io::stderr().is_terminal());
    let width = terminal_width();
    let (mut errors, mut warnings, mut unreadable) = (0, 0, 0);
    let engine = match check_engine(args) {
        Ok(e) => e,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_USAGE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for path in &args.files {
        let ws = match load(path, &loader) {
            Ok(ws) => ws,
            Err(msg) => {
                eprintln!("error: {msg}");
                unreadable += 1;
                continue;
            }
        };
        let mut diags = ws.diagnostics.clone();
        if let (Some(kind), false) = (engine, ws.has_errors()) {
            diags.extend(crate::interp::engine_needs(&crate::ir::compile(&ws), kind));
        }
        for d in &diags {
            match d.severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
            match args.format {
                Format::Human => eprint!("{}", report::render(d, &ws.sources, color, width)),
                Format::Json => {
                    let _ = writeln!(out, "{}", report::render_json(d, &ws.sources));
                }
            }
        }
        match args.emit {
            Some(Emit::Ast) => {
                let _ = write!(out, "{}", crate::syntax::dump::dump(&ws.module(ws.root).template));
            }
            Some(Emit::Ir) if !ws.has_errors() => {
                let program = crate::ir::compile(&ws);
                let _ = write!(out, "{}", crate::ir::disasm::disassemble(&program, &ws.sources));
            }
            Some(Emit::Ir) => eprintln!("note: no IR for `{}`: it has errors", path.display()),
            None => {}
        }
    }
    if args.format == Format::Human && (errors > 0 || warnings > 0) {
        eprintln!("{}", summary(errors, warnings));
    }
    if unreadable > 0 {
        EXIT_USAGE
    } else if errors > 0 {
        EXIT_TEMPLATE_ERROR
    } else {
        0
    }
}

/// Writes `text` to standard output. A reader that has gone away (`lmt
/// explain | head -1`) ends the program quietly, as a closed pipe ends
/// other command-line tools, instead of a panic in `println!`.
pub(crate) fn out(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

fn summary(errors: usize, warnings: usize) -> String {
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    match (errors, warnings) {
        (0, w) => format!("{} found", plural(w, "warning")),
        (e, 0) => format!("{} found", plural(e, "error")),
        (e, w) => format!("{} and {} found", plural(e, "error"), plural(w, "warning")),
    }
}

fn terminal_width() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|w| *w >= 40).unwrap_or(100)
}

/// `lmt explain`: what a code means.
pub fn explain(code: Option<&str>) -> i32 {
    match code {
        None => {
            for c in Code::ALL {
                out(format_args!("{}  {:<24} {}\n", c.as_str(), c.name(), c.summary()));
            }
            0
        }
        Some(s) => match Code::ALL.iter().find(|c| c.as_str().eq_ignore_ascii_case(s) || c.name() == s) {
            Some(c) => {
                let sev = match c.severity() {
                    Severity::Error => "error",
                    Severity::Warning => "warning",
                };
                out(format_args!("{} ({}, {sev})\n\n{}\n", c.as_str(), c.name(), c.summary()));
                0
            }
            None => {
                eprintln!("error: no diagnostic code `{s}`; `lmt explain` lists them all");
                EXIT_USAGE
            }
        },
    }
}
