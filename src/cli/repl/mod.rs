//! `lmt repl`: an interactive session on one live model state. Each entry
//! is `.lmt` source run after the previous ones by an
//! [`interp::session::Session`], so it costs only its own tokens; commands
//! (`:undo`, `:vars`, `:tokens`, …) look at or rewind that state. Reads a
//! terminal with rustyline (completion, colours, history) and piped standard
//! input the same way, so sessions can be scripted.

pub mod editor;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{CompletionType, Config, Editor};

use super::complete::EXIT_MODEL_ERROR;
use super::run::{cancel_on_ctrl_c, load_model, read_vars, write_event, InputArgs, ModelArgs};
use super::{report, terminal_width, EXIT_TEMPLATE_ERROR, EXIT_USAGE};
use crate::interp::session::Session;
use crate::interp::value::Value;
use crate::state::{FinishReason, Meta};
use crate::interp::Event;
use crate::render::{self, Styles};
use crate::state::{Node, Record, TokenKind};
use crate::workspace::FsLoader;
use editor::{ReplHelper, COMMANDS};

/// Arguments of `lmt repl`.
#[derive(Debug, clap::Args)]
pub struct ReplArgs {
    /// A template to run first: its text and definitions start the session.
    pub file: Option<PathBuf>,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Inputs (variables of the session from the start) and sampling.
    #[command(flatten)]
    pub input: InputArgs,
    /// No banner or model summary on standard error.
    #[arg(long, short)]
    pub quiet: bool,
    /// Neither read nor write the history file.
    #[arg(long)]
    pub no_history: bool,
}

/// Runs `lmt repl`. Exits 0, or 1 when standard input is not a terminal and
/// an entry or command failed (so scripts notice).
pub fn run(args: &ReplArgs) -> i32 {
    let vars = match read_vars(&args.input) {
        Ok(v) => v,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_USAGE;
        }
    };
    let model = match load_model(&args.model, args.quiet) {
        Ok(m) => m,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_MODEL_ERROR;
        }
    };
    // Ctrl-C stops the running entry (the flag is cleared before the next one).
    let cancel = cancel_on_ctrl_c();
    let opts = args.input.run_options(vars, cancel.clone());
    let session = match Session::new(&model, opts) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_MODEL_ERROR;
        }
    };
    let interactive = std::io::stdin().is_terminal();
    let color = report::use_color(std::io::stderr().is_terminal());
    let mut repl = Repl {
        session,
        cancel,
        styles: Styles::new(std::io::stdout().is_terminal() && report::use_color(true)),
        color,
        width: terminal_width(),
        typed: 0,
        failures: 0,
    };
    let config = Config::builder().auto_add_history(true).max_history_size(1000).map(|b| b.completion_type(CompletionType::List).build());
    let mut rl: Editor<ReplHelper, FileHistory> = match config.and_then(Editor::with_config) {
        Ok(rl) => rl,
        Err(e) => {
            eprintln!("error: cannot start the line editor: {e}");
            return EXIT_USAGE;
        }
    };
    // On a terminal the helper's validator joins the lines of an entry in
    // the editor; piped lines are joined here, so that input ending inside
    // an entry is reported rather than dropped.
    if interactive {
        rl.set_helper(Some(ReplHelper::new(color)));
    }
    let mut unfinished = String::new();
    let history = history_path().filter(|_| interactive && !args.no_history);
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    if interactive && !args.quiet {
        eprintln!("lmt repl · :help lists the commands · Ctrl-C stops a generation · Ctrl-D leaves");
    }
    if let Some(file) = &args.file {
        repl.load(file);
    }
    loop {
        if let Some(h) = rl.helper_mut() {
            h.vars = repl.session.vars().into_iter().map(|(k, _)| k.to_string()).collect();
        }
        match rl.readline("lmt> ") {
            Ok(line) => {
                let input = if interactive { line } else { std::mem::take(&mut unfinished) + &line };
                if !interactive && editor::is_incomplete(&input) {
                    unfinished = input + "\n";
                    continue;
                }
                if repl.handle(&input) == Next::Quit {
                    break;
                }
            }
            // Ctrl-C at the prompt drops the line being typed.
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => {
                if !unfinished.is_empty() {
                    eprintln!(
                        "error: the input ended inside an unfinished entry (an open block, tag, comment or string, or a final `\\`):"
                    );
                    eprintln!("{}", unfinished.trim_end());
                    repl.failures += 1;
                }
                break;
            }
            // A line that is not UTF-8 is dropped; the session goes on.
            Err(e) if is_not_text(&e) => {
                eprintln!("error: a line that is not UTF-8 text was skipped");
                repl.failures += 1;
            }
            Err(e) => {
                eprintln!("error: cannot read the next line: {e}");
                repl.failures += 1;
                break;
            }
        }
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = rl.save_history(h) {
            eprintln!("warning: cannot save the history to `{}`: {e}", h.display());
        }
    }
    if !interactive && repl.failures > 0 {
        EXIT_TEMPLATE_ERROR
    } else {
        0
    }
}

/// Whether a read failed on bytes that are not UTF-8 (the line is consumed).
fn is_not_text(e: &ReadlineError) -> bool {
    matches!(e, ReadlineError::Io(io) if io.kind() == std::io::ErrorKind::InvalidData)
}

/// Where the history is kept: the user's data directory.
pub fn history_path() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("lmt").join("repl_history"))
}

#[derive(Debug, PartialEq, Eq)]
enum Next {
    Go,
    Quit,
}

struct Repl<'m> {
    session: Session<'m>,
    cancel: Arc<AtomicBool>,
    styles: Styles,
    color: bool,
    width: usize,
    /// Entries typed so far (they are named `<entry N>`).
    typed: usize,
    failures: usize,
}

impl Repl<'_> {
    fn handle(&mut self, input: &str) -> Next {
        let command = input.trim();
        if command.starts_with(':') {
            return self.command(command);
        }
        // A line ending in `\` goes on with its newline kept.
        let text = input.replace("\\\n", "\n");
        let text = text.strip_suffix('\\').unwrap_or(&text);
        if text.is_empty() {
            return Next::Go;
        }
        self.typed += 1;
        let name = format!("<entry {}>", self.typed);
        let path = std::env::current_dir().ok().map(|d| d.join(&name));
        self.entry(&name, text, path);
        Next::Go
    }

    fn command(&mut self, line: &str) -> Next {
        let (cmd, arg) = line.split_once(char::is_whitespace).map_or((line, ""), |(c, a)| (c, a.trim()));
        let mut out = std::io::stdout().lock();
        let state = self.session.state();
        let _ = match cmd {
            ":help" | ":h" => help(&mut out),
            ":vars" => vars(&mut out, &self.session.vars()),
            ":state" => describe_state(&mut out, state),
            ":tokens" => tokens(&mut out, state),
            ":json" => writeln!(out, "{}", serde_json::to_string_pretty(&render::json(state)).unwrap_or_default()),
            ":usage" => usage(&mut out, state),
            ":undo" => {
                let before = state.tokens.len();
                match self.session.undo() {
                    Ok(Some(e)) => writeln!(
                        out,
                        "undid {}: the sequence went from {before} to {} tokens",
                        excerpt(&e.text),
                        self.session.state().tokens.len()
                    ),
                    Ok(None) => writeln!(out, "nothing to undo"),
                    Err(e) => self.fail(&format!("cannot undo: {e}")),
                }
            }
            ":reset" => match self.session.reset() {
                Ok(()) => writeln!(out, "reset: no entries, an empty KV cache"),
                Err(e) => self.fail(&format!("cannot reset: {e}")),
            },
            ":save" if arg.is_empty() => self.fail("usage: :save FILE.lmt"),
            ":save" => {
                let unfinished: Vec<String> = (self.session.entries().iter().enumerate())
                    .filter(|(_, e)| e.finish_reason != FinishReason::Done)
                    .map(|(i, e)| format!("{} ({})", i + 1, e.finish_reason.as_str()))
                    .collect();
                match std::fs::write(arg, self.session.template()) {
                    Ok(()) => {
                        let n = self.session.entries().len();
                        let _ = writeln!(out, "saved {n} entr{} to {arg}; `lmt run {arg}` runs it", if n == 1 { "y" } else { "ies" });
                        if unfinished.is_empty() {
                            Ok(())
                        } else {
                            writeln!(out, "note: entries {} stopped early here; the saved template runs them whole", unfinished.join(", "))
                        }
                    }
                    Err(e) => self.fail(&format!("cannot write `{arg}`: {e}")),
                }
            }
            ":load" if arg.is_empty() => self.fail("usage: :load FILE.lmt"),
            ":load" => {
                drop(out);
                self.load(Path::new(arg));
                Ok(())
            }
            ":quit" | ":q" | ":exit" => return Next::Quit,
            other => {
                let hint =
                    crate::diagnostic::suggest(other, editor::command_names()).map(|s| format!("did you mean `{s}`? ")).unwrap_or_default();
                self.fail(&format!("unknown command `{other}`; {hint}`:help` lists the commands"))
            }
        };
        Next::Go
    }

    /// Runs a template file as the next entry.
    fn load(&mut self, path: &Path) {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let full = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
                self.entry(&path.display().to_string(), &text, Some(full));
            }
            Err(e) => {
                let _ = self.fail(&format!("cannot read `{}`: {e}", path.display()));
            }
        }
    }

    /// Checks and runs one entry, streaming its output.
    fn entry(&mut self, name: &str, text: &str, path: Option<PathBuf>) {
        let ws = self.session.load(name, text, path, &FsLoader::default());
        for d in &ws.diagnostics {
            eprint!("{}", report::render(d, &ws.sources, self.color, self.width));
        }
        if ws.has_errors() {
            self.failures += 1;
            return;
        }
        self.cancel.store(false, Ordering::Relaxed);
        let mut out = std::io::stdout().lock();
        let styles = self.styles;
        let mut line_open = false;
        let mut on_event = |e: Event<'_>| {
            match &e {
                Event::Text { text, .. } if !text.is_empty() => line_open = !text.ends_with('\n'),
                Event::RoleOpen(_) | Event::RoleClose(_) => line_open = false,
                _ => {}
            }
            let _ = write_event(&mut out, &styles, &e);
        };
        let result = self.session.run(&ws, &mut on_event);
        if line_open {
            let _ = writeln!(out);
        }
        let _ = out.flush();
        drop(out);
        if let Err(e) = result {
            eprint!("{}", report::render(&e.to_diagnostic(), self.session.sources(), self.color, self.width));
            eprintln!("the entry stopped here; its partial output is kept (`:undo` takes it back)");
            self.failures += 1;
        } else if self.session.state().finish_reason == FinishReason::Cancelled {
            eprintln!("cancelled: partial output kept (`:undo` takes it back)");
        }
        self.cancel.store(false, Ordering::Relaxed);
    }

    fn fail(&mut self, message: &str) -> std::io::Result<()> {
        self.failures += 1;
        eprintln!("error: {message}");
        Ok(())
    }
}

fn help(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "Type template text to append it to the session and run it: text, {{{{ expressions }}}}, {{% gen %}}, {{% select %}}, roles…"
    )?;
    writeln!(out, "An entry that ends inside an open block goes on on the next line; end a line with \\ to keep its newline and go on.")?;
    for (c, h) in COMMANDS {
        writeln!(out, "  {c:<16} {h}")?;
    }
    Ok(())
}

fn vars(out: &mut dyn Write, vars: &[(&str, &Value)]) -> std::io::Result<()> {
    if vars.is_empty() {
        return writeln!(out, "no variables yet");
    }
    for (name, v) in vars {
        match v {
            Value::Captured(c) => {
                writeln!(out, "{name} = {}", quoted(&c.text))?;
                writeln!(out, "    {}", meta(&c.meta))?;
            }
            Value::List(items) if items.iter().any(|i| matches!(i, Value::Captured(_))) => {
                writeln!(out, "{name} = list of {}", items.len())?;
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::Captured(c) => writeln!(out, "  [{i}] {}    {}", quoted(&c.text), meta(&c.meta))?,
                        other => writeln!(out, "  [{i}] {}", show(other))?,
                    }
                }
            }
            other => writeln!(out, "{name} = {}", show(other))?,
        }
    }
    Ok(())
}

/// A value as a line: data as JSON, definitions by what they are.
fn show(v: &Value) -> String {
    match v {
        Value::Func { .. } | Value::Builtin(_) | Value::Module(_) | Value::Grammar { .. } => v.to_string(),
        other => other.to_json().to_string(),
    }
}

fn meta(m: &Meta) -> String {
    let mut parts = vec![format!("logprob {:.3}", m.logprob), format!("{} tokens", m.tokens.len())];
    if let Some(r) = m.finish_reason {
        parts.push(format!("finish {}", r.as_str()));
    }
    if let Some(s) = &m.stop {
        parts.push(format!("stop {}", quoted(s)));
    }
    if !m.choices.is_empty() {
        let choices: Vec<String> = m.choices.iter().map(|c| format!("{} {:.1}%", quoted(&c.text), c.probability * 100.0)).collect();
        parts.push(format!("choices {}", choices.join(", ")));
    }
    parts.join(" · ")
}

fn describe_state(out: &mut dyn Write, s: &Record) -> std::io::Result<()> {
    let roles: Vec<&str> = s.messages.iter().map(|m| m.role.as_str()).collect();
    writeln!(out, "turns: {} ({})", roles.len(), if roles.is_empty() { "none".to_string() } else { roles.join(", ") })?;
    writeln!(out, "nodes: {}", s.nodes.len())?;
    let mut depth = 1;
    for n in &s.nodes {
        let pad = "  ".repeat(depth);
        match n {
            Node::Text { text, origin, tokens, hidden } => {
                let origin = serde_json::to_value(origin).ok().and_then(|o| o.as_str().map(str::to_string)).unwrap_or_default();
                let extra = if tokens.is_empty() { String::new() } else { format!(" · {} tokens", tokens.len()) };
                let hidden = if *hidden { " (hidden)" } else { "" };
                writeln!(out, "{pad}{origin:<9} {}{extra}{hidden}", quoted(text))?;
            }
            Node::RoleOpen { role } | Node::CaptureOpen { name: role } => {
                let what = if matches!(n, Node::RoleOpen { .. }) { "role" } else { "capture" };
                writeln!(out, "{pad}{what} {role} {{")?;
                depth += 1;
            }
            Node::RoleClose { .. } | Node::CaptureClose { .. } => {
                depth = depth.saturating_sub(1).max(1);
                writeln!(out, "{}}}", "  ".repeat(depth))?;
            }
        }
    }
    let count = |k: TokenKind| s.tokens.iter().filter(|t| t.kind == k).count();
    writeln!(
        out,
        "tokens: {} ({} prompt, {} sampled, {} forced, {} healed)",
        s.tokens.len(),
        count(TokenKind::Prompt),
        count(TokenKind::Sampled),
        count(TokenKind::Forced),
        count(TokenKind::Healed)
    )?;
    writeln!(out, "finish: {}", s.finish_reason.as_str())
}

fn tokens(out: &mut dyn Write, s: &Record) -> std::io::Result<()> {
    writeln!(out, "{:>5} {:>7}  {:<8} {:<9} text", "pos", "id", "kind", "origin")?;
    for (i, t) in s.tokens.iter().enumerate() {
        let name = |v: serde_json::Result<serde_json::Value>| v.ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let lp = t.logprob.map(|l| format!("  {l:.3}")).unwrap_or_default();
        writeln!(
            out,
            "{i:>5} {:>7}  {:<8} {:<9} {}{lp}",
            t.id,
            name(serde_json::to_value(t.kind)),
            name(serde_json::to_value(t.origin)),
            quoted(&t.text)
        )?;
    }
    Ok(())
}

fn usage(out: &mut dyn Write, s: &Record) -> std::io::Result<()> {
    let u = &s.usage;
    writeln!(out, "sequence: {} tokens (what the KV cache holds)", u.sequence_tokens)?;
    writeln!(
        out,
        "fed: {} tokens in {} forward passes = {} in the sequence + {} re-fed (rewound by stops, token-boundary repairs, healing, hidden blocks, undo) + {} scored for select",
        u.forward_tokens, u.forward_passes, u.sequence_tokens, u.rewound_tokens, u.scored_tokens
    )?;
    writeln!(out, "reused from the cache: {} token positions (what re-sending each prefix would have cost)", u.reused_tokens)?;
    writeln!(out, "prompt {} · generated {} · forced {}", u.prompt_tokens, u.generated_tokens, u.forced_tokens)?;
    let ttft = u.time_to_first_token_ms.map(|t| format!("{t:.0} ms")).unwrap_or_else(|| "-".into());
    writeln!(out, "time: {:.0} ms · first token {ttft} · {:.1} tokens/s · masks {:.1} ms", u.total_ms, u.tokens_per_second, u.mask_ms)
}

/// A string as JSON writes it (quotes, escaped newlines).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The start of an entry's text, on one line.
fn excerpt(text: &str) -> String {
    let one: String = text.chars().take(40).collect::<String>().replace('\n', "⏎");
    let more = if text.chars().count() > 40 { "…" } else { "" };
    format!("`{one}{more}`")
}
