//! `lmt run T.lmt --samples N | --best-of N | --beam K`: a search over
//! whole runs of the template (`crate::search`), printed as the best run
//! and a summary of the others, or as `--json` with every run ranked.

use std::io::{IsTerminal, Write};

use super::run::{RunArgs, EXIT_CANCELLED, EXIT_OUTPUT_ERROR};
use crate::interp::RunOptions;
use crate::ir::Program;
use super::remote::Loaded;
use super::EXIT_USAGE;
use crate::render;
use crate::search::{self, Found, Mode, SearchOptions};
use crate::span::SourceMap;
use crate::state::FinishReason;

/// Arguments of a search over whole runs (part of `lmt run`).
#[derive(Debug, Clone, clap::Args)]
pub struct SearchArgs {
    /// Run N independent samples of the whole program (seeds derived from
    /// `--seed`; temperature 1 unless `--temperature` says otherwise), decoded together; all are reported, most likely first.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024),
          conflicts_with_all = ["best_of", "beam"])]
    pub samples: Option<u16>,
    /// Like `--samples N`, keeping only the most likely run.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024), conflicts_with = "beam")]
    pub best_of: Option<u16>,
    /// Beam search over the whole program: keep the K most likely partial
    /// runs at every decision (sampled token or select choice); the K best complete runs are reported.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub beam: Option<u16>,
    /// Rank runs by `logprob / decisions^α` instead of their log-prob
    /// alone (α > 0 favours longer runs).
    #[arg(long, value_name = "α", default_value_t = 0.0, value_parser = length_penalty)]
    pub length_penalty: f64,
}

fn length_penalty(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(a) if a.is_finite() && (0.0..=10.0).contains(&a) => Ok(a),
        _ => Err(format!("`{s}` is not a length penalty: give a number from 0 to 10")),
    }
}

impl SearchArgs {
    /// The search these arguments ask for, if any.
    pub fn mode(&self) -> Option<Mode> {
        match (self.samples, self.best_of, self.beam) {
            (Some(n), ..) => Some(Mode::Samples { n: n.into(), best_of: false }),
            (_, Some(n), _) => Some(Mode::Samples { n: n.into(), best_of: true }),
            (.., Some(k)) => Some(Mode::Beam { width: k.into() }),
            _ => None,
        }
    }
}

/// The default temperature of `gen`: `--temperature`, else 1 for samples
/// (N greedy runs would be one run N times) and 0 (greedy) otherwise.
pub fn temperature(args: &RunArgs) -> f32 {
    let sampling = matches!(args.search.mode(), Some(Mode::Samples { .. }));
    args.input.temperature.unwrap_or(if sampling { 1.0 } else { 0.0 })
}

/// Refuses what a search cannot do yet, before the model loads.
pub fn check_usage(args: &RunArgs) -> Result<(), String> {
    if args.search.mode().is_none() {
        if args.search.length_penalty != 0.0 {
            return Err("`--length-penalty` ranks the runs of a search: give `--samples`, `--best-of` or `--beam`".into());
        }
        return Ok(());
    }
    if args.events {
        return Err("`--events` streams one run; a search reports its runs at the end (use `--json`)".into());
    }
    if args.input.score == super::run::Score::All && matches!(args.search.mode(), Some(Mode::Beam { .. })) {
        return Err("`--score all` with `--beam`: a beam ranks partial runs as they go, before their template text is scored; rank samples with it (`--samples`, `--best-of`), or leave it out".into());
    }
    Ok(())
}

/// Runs the search and prints it; returns the exit code.
pub fn run(args: &RunArgs, program: &Program, sources: &SourceMap, loaded: &Loaded, opts: RunOptions, mode: Mode) -> i32 {
    let search = SearchOptions {
        mode,
        length_penalty: args.search.length_penalty,
        prefix_cache_bytes: (args.dataset.prefix_cache as usize) << 20,
    };
    let found = match loaded {
        Loaded::Local(model) => search::run(program, sources, model, &opts, &search),
        Loaded::Remote(r) => match search::run_remote(program, sources, r, &opts, &search) {
            Some(found) => found,
            None => {
                eprintln!("error: a beam needs the model's next-token log-probs at every step, which {} does not give", r.remote.describe());
                return EXIT_USAGE;
            }
        },
    };
    let Some(best) = found.runs.first() else {
        // Only when Ctrl-C came before any run got going, or every run failed inside lmt.
        eprintln!("error: the search found no run");
        let cancelled = opts.cancel.as_ref().is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst));
        return if cancelled { EXIT_CANCELLED } else { super::complete::EXIT_MODEL_ERROR };
    };
    let state = &best.outcome.state;
    let written = if args.json {
        let doc = render::search_json(&found, mode);
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string_pretty(&doc).unwrap_or_default())
    } else {
        writeln!(std::io::stdout().lock(), "{}", state.text())
    };
    let mut code = 0;
    if let Err(e) = written {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to standard output: {e}");
            code = EXIT_OUTPUT_ERROR;
        }
    }
    if let Some(path) = &args.html {
        let title = args.file.file_name().map_or("lmt run".into(), |n| n.to_string_lossy().into_owned());
        let runs: Vec<_> = found.runs.iter().map(|r| (&r.outcome.state, r.score)).collect();
        if let Err(e) = super::run::write_atomically(path, render::html_runs(&runs, &title).as_bytes()) {
            eprintln!("error: cannot write the report `{}`: {e}", path.display());
            code = EXIT_OUTPUT_ERROR;
        }
    }
    if !args.quiet {
        eprint!("{}", summary(&found, mode));
    }
    if let Some(e) = &best.outcome.error {
        let color = super::report::use_color(std::io::stderr().is_terminal());
        eprint!("{}", super::report::render(&e.to_diagnostic(), sources, color, super::terminal_width()));
        return if code == 0 { super::complete::EXIT_MODEL_ERROR } else { code };
    }
    if code == 0 && state.finish_reason == FinishReason::Cancelled {
        eprintln!("cancelled: the best runs so far are kept");
        return EXIT_CANCELLED;
    }
    code
}

/// The summary on standard error: the runs, best first, and the cost.
fn summary(found: &Found, mode: Mode) -> String {
    let u = &found.usage;
    let best = &found.runs[0];
    let what = match mode {
        Mode::Samples { n, best_of: false } => format!("{n} samples"),
        Mode::Samples { n, best_of: true } => format!("best of {n} samples"),
        Mode::Beam { width } => format!("beam {width}"),
    };
    let mut s = format!(
        "{what}: {} run{} kept of {} started · best logprob {:.3} ({} decisions)",
        found.runs.len(),
        if found.runs.len() == 1 { "" } else { "s" },
        u.runs,
        best.outcome.state.logprob,
        best.decisions
    );
    if let Some(g) = u.greedy_logprob {
        let gain = best.outcome.state.logprob - g;
        if gain > 1e-9 {
            s.push_str(&format!(" · greedy's run {g:.3}: the beam's is {gain:.3} more likely (log-prob)"));
        } else {
            s.push_str(&format!(" · greedy's run {g:.3}: the beam found none more likely"));
        }
    }
    s.push_str(&format!(
        "\n  forward tokens {} in all ({} taken from other runs' states) · {} batched passes\n",
        u.forward_tokens, u.shared_tokens, u.batches
    ));
    for (i, r) in found.runs.iter().enumerate().skip(1).take(9) {
        let text: String = r.outcome.state.text().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let short: String = text.chars().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
        s.push_str(&format!("  #{} logprob {:.3}: …{short}\n", i + 1, r.outcome.state.logprob));
    }
    s
}
