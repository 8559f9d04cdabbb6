//! `lmt run T.lmt --inputs rows.jsonl [--out results.jsonl]`: one template
//! over many rows, `--parallel` at a time, each row's record written and
//! flushed as it completes, `--resume` to continue a run that was stopped.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::remote::{load_any, refuse_unsupported, unsupported_flags};
use super::run::{cancel_on_ctrl_c, read_vars, RunArgs, EXIT_CANCELLED};
use super::EXIT_USAGE;
use crate::dataset::{self, CsvRows, DatasetOptions, JsonlRows, RowKey};
use crate::interp;
use crate::ir::Program;
use crate::span::SourceMap;

/// Exit code: some rows failed (their errors are in their records).
pub const EXIT_ROWS_FAILED: i32 = 1;
/// Exit code: the model could not load, or the input stopped being readable.
const EXIT_RUN_ERROR: i32 = 3;

/// Arguments of a dataset run (part of `lmt run`).
#[derive(Debug, Clone, clap::Args)]
pub struct DatasetArgs {
    /// Run once per row of this file: JSON lines, each an object of input
    /// values with an optional `id` (`-`: standard input), or CSV with a
    /// header (a `.csv` file).
    #[arg(long, value_name = "ROWS.jsonl")]
    pub inputs: Option<PathBuf>,
    /// Where each row's record goes, one JSON line per row as it completes (default and `-`: standard output).
    #[arg(long, value_name = "OUT.jsonl", requires = "inputs")]
    pub out: Option<PathBuf>,
    /// Rows in flight at once; their forward passes run together.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "inputs",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Continue the run recorded in `--out`: rows whose id is there are skipped.
    #[arg(long, requires = "out")]
    pub resume: bool,
    /// MiB of K/V states the shared prefix cache may hold (rows of `--inputs`, runs of a search).
    #[arg(long, value_name = "MiB", default_value_t = 512)]
    pub prefix_cache: u32,
}

/// Runs the dataset form of `lmt run` and returns the exit code.
pub fn run(args: &RunArgs, program: &Program, sources: &SourceMap) -> i32 {
    let data = &args.dataset;
    let Some(input_path) = &data.inputs else { return EXIT_USAGE };
    if args.json || args.events || args.html.is_some() {
        eprintln!("error: `--inputs` writes one JSON record per row; `--json`, `--events` and `--html` are for a single run");
        return EXIT_USAGE;
    }
    let defaults = match read_vars(&args.input) {
        Ok(v) => v,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_USAGE;
        }
    };
    let declared = interp::inputs(program);
    if let Some((unknown, why)) = interp::undeclared_input(defaults.keys(), &declared) {
        eprintln!("error: `--var {unknown}`: {why}");
        return EXIT_USAGE;
    }
    let mut out = match Output::open(data.out.as_deref(), data.resume) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_USAGE;
        }
    };
    let (reader, total): (Box<dyn BufRead + Send>, Option<u64>) = if input_path == Path::new("-") {
        (Box::new(BufReader::new(std::io::stdin())), None)
    } else {
        match File::open(input_path).and_then(|f| Ok((count_rows(input_path)?, f))) {
            // (A CSV header is no row; a cell with line breaks makes this an estimate.)
            Ok((n, f)) => (Box::new(BufReader::new(f)), Some(n.saturating_sub(u64::from(is_csv(input_path))))),
            Err(e) => {
                eprintln!("error: cannot read `{}`: {e}", input_path.display());
                return EXIT_USAGE;
            }
        }
    };
    let loaded = match load_any(&args.model, args.quiet) {
        Ok(m) => m,
        Err(msg) => {
            eprintln!("error: {msg}");
            out.discard_new();
            return EXIT_RUN_ERROR;
        }
    };
    if refuse_unsupported(program, sources, &loaded, args.quiet) {
        out.discard_new();
        return super::EXIT_TEMPLATE_ERROR;
    }
    if let Some(msg) = unsupported_flags(args, &loaded) {
        eprintln!("error: {msg}");
        out.discard_new();
        return EXIT_USAGE;
    }
    let skip = out.recorded.clone();
    let skipped = std::sync::atomic::AtomicU64::new(0);
    let rows: Box<dyn Iterator<Item = std::io::Result<dataset::Row>> + Send> =
        if is_csv(input_path) { Box::new(CsvRows::new(reader, declared)) } else { Box::new(JsonlRows::new(reader, declared)) };
    let rows = rows.filter(|r| match r {
        Ok(row) if skip.contains(&row.key()) => {
            skipped.fetch_add(1, Ordering::Relaxed);
            false
        }
        _ => true,
    });
    let cancel = cancel_on_ctrl_c();
    let opts = DatasetOptions {
        parallel: usize::from(data.parallel),
        seed: args.input.seed,
        temperature: super::search::temperature(args),
        limits: Default::default(),
        defaults,
        prefix_cache_bytes: (data.prefix_cache as usize) << 20,
        cancel: cancel.clone(),
        search: args.search.mode().map(|m| (m, args.search.length_penalty)),
        score_all: args.input.score == super::run::Score::All,
    };
    let bar = progress_bar(total.map(|t| t.saturating_sub(skip.len() as u64)), args.quiet);
    let started = Instant::now();
    let mut generated = 0u64;
    let mut write_error = None;
    let result = dataset::run(program, sources, loaded.backend(), rows, &opts, &mut |r| {
        if r.cancelled {
            return;
        }
        if write_error.is_none() {
            if let Err(e) = out.write(&r.record) {
                write_error = Some(e);
                cancel.store(true, Ordering::SeqCst);
            }
        }
        generated += r.usage.generated_tokens;
        bar.inc(1);
        bar.set_message(format!("{:.1} tokens/s", generated as f64 / started.elapsed().as_secs_f64().max(1e-9)));
    });
    bar.finish_and_clear();
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot read `{}`: {e} (the rows before it are recorded)", input_path.display());
            return EXIT_RUN_ERROR;
        }
    };
    if let Some(e) = write_error {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write the records: {e}");
        }
        return super::run::EXIT_OUTPUT_ERROR;
    }
    let secs = started.elapsed().as_secs_f64();
    if !args.quiet {
        let u = &summary.usage;
        let b = &summary.batches;
        let skipped = skipped.load(Ordering::Relaxed);
        let skipped = if skipped > 0 { format!(" ({skipped} already recorded)") } else { String::new() };
        eprintln!(
            "{} rows{skipped}: {} ok, {} failed in {secs:.1} s · {:.2} rows/s · {} generated tokens ({:.1}/s) · {} forward tokens + {} shared prefix, {} from the prefix cache · {} batched passes ({:.0} % of the time)",
            summary.done,
            summary.done - summary.failed,
            summary.failed,
            summary.done as f64 / secs.max(1e-9),
            u.generated_tokens,
            u.generated_tokens as f64 / secs.max(1e-9),
            u.forward_tokens,
            b.shared_tokens,
            u.prefix_cached_tokens,
            b.batches,
            b.busy_us as f64 / 1e4 / secs.max(1e-9),
        );
    }
    if cancel.load(Ordering::SeqCst) {
        eprintln!("cancelled: {} rows in flight not recorded; `--resume` runs them", summary.cancelled);
        return EXIT_CANCELLED;
    }
    if summary.failed > 0 {
        eprintln!("{} of {} rows failed (their errors are in their records)", summary.failed, summary.done);
        return EXIT_ROWS_FAILED;
    }
    0
}

/// Where records go: standard output or a file, flushed line by line.
struct Output {
    sink: Box<dyn Write>,
    /// Rows an earlier run recorded (with `--resume`).
    recorded: std::collections::HashSet<RowKey>,
    /// The file this run created, while nothing is written to it.
    created: Option<PathBuf>,
}

impl Output {
    fn open(path: Option<&Path>, resume: bool) -> Result<Output, String> {
        let Some(path) = path.filter(|p| *p != Path::new("-")) else {
            if resume {
                return Err("`--resume` needs `--out FILE`: it reads the records already there".into());
            }
            return Ok(Output { sink: Box::new(std::io::stdout()), recorded: Default::default(), created: None });
        };
        let shown = path.display();
        if !resume {
            let file = OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    format!("`{shown}` exists: pass `--resume` to continue that run, or remove it first")
                }
                _ => format!("cannot create `{shown}`: {e}"),
            })?;
            return Ok(Output { sink: Box::new(file), recorded: Default::default(), created: Some(path.to_path_buf()) });
        }
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(|e| format!("cannot open `{shown}`: {e}"))?;
        let recorded = dataset::recorded(&mut file).map_err(|e| format!("cannot resume from `{shown}`: {e}"))?;
        Ok(Output { sink: Box::new(file), recorded, created: None })
    }

    /// Removes the file this run created when the run ends before any row
    /// (the model did not load): a retry should not find it in the way.
    fn discard_new(&mut self) {
        if let Some(path) = self.created.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// One record, one line, written whole and flushed.
    fn write(&mut self, record: &serde_json::Value) -> std::io::Result<()> {
        self.created = None;
        let mut line = record.to_string();
        line.push('\n');
        self.sink.write_all(line.as_bytes())?;
        self.sink.flush()
    }
}

/// Whether rows are read as CSV (by the file's extension).
fn is_csv(path: &Path) -> bool {
    path.extension().is_some_and(|x| x.eq_ignore_ascii_case("csv"))
}

/// Non-blank lines of a file (the total for the progress bar).
fn count_rows(path: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    let mut r = BufReader::new(File::open(path)?);
    let mut line = Vec::new();
    loop {
        line.clear();
        if std::io::Read::take(&mut r, dataset::MAX_LINE as u64 + 1).read_until(b'\n', &mut line)? == 0 {
            return Ok(n);
        }
        if line.len() > dataset::MAX_LINE {
            return Ok(n + 1);
        }
        n += u64::from(!line.iter().all(u8::is_ascii_whitespace));
    }
}

/// Rows done of the total, rows/s, tokens/s and the time left, on standard
/// error when it is a terminal.
fn progress_bar(total: Option<u64>, quiet: bool) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(n) => (indicatif::ProgressBar::new(n), "{bar:30} {pos}/{len} rows · {per_sec} · {msg} · ETA {eta}"),
        None => (indicatif::ProgressBar::no_length(), "{spinner} {pos} rows · {per_sec} · {msg}"),
    };
    bar.set_style(indicatif::ProgressStyle::with_template(template).unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
