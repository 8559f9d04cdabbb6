//! Searches over whole programs: `n` independent samples of a run, or a
//! beam of the `k` most likely partial runs. Every run is a full run of the
//! interpreter (control flow, loops, roles, selects and all) on a thread of
//! its own; their forward passes go through one [`Batcher`], so runs are
//! decoded together and a prefix they share (the template up to the first
//! decision, and everything a beam shares with the beam it forked from) is
//! computed once.
//!
//! A run's score is the sum of the log-probabilities of its decisions: the
//! tokens the model sampled (the one that ended a value included) and the
//! options selects chose by score. Template text is conditioning and is not
//! scored. [`Record::logprob`] holds it.

mod beam;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::interp::{self, Backend, Outcome, RunOptions};
use crate::ir::Program;
use crate::model::remote::RemoteModel;
use crate::model::{Batcher, Model};
use crate::span::SourceMap;
use crate::state::FinishReason;

/// What to search for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// `n` independent samples; with `best_of`, only the most likely is kept.
    Samples {
        /// How many.
        n: usize,
        /// Keep the best one only.
        best_of: bool,
    },
    /// Beam search keeping the `width` most likely partial runs.
    Beam {
        /// How many.
        width: usize,
    },
}

/// How to search.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// Samples or beam.
    pub mode: Mode,
    /// Runs are ranked by `logprob / decisions^α` (0: by log-prob alone).
    pub length_penalty: f64,
    /// Bytes of K/V states the prefix cache keeps.
    pub prefix_cache_bytes: usize,
}

/// Most runs on threads at once in a search.
pub const MAX_RUNS: usize = 64;

/// One run a search returns.
#[derive(Debug)]
pub struct Ranked {
    /// The run.
    pub outcome: Outcome,
    /// Its ranking score (the log-prob, length-normalised when asked).
    pub score: f64,
    /// The decisions it took (tokens sampled and options chosen).
    pub decisions: usize,
}

/// What a search cost, over all its runs (those a beam dropped included).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SearchUsage {
    /// Runs started.
    pub runs: usize,
    /// Tokens run through the model by all runs, and once for shared prefixes.
    pub forward_tokens: u64,
    /// Tokens runs took from states other runs computed (the prefix cache).
    pub shared_tokens: u64,
    /// Batched forward passes.
    pub batches: u64,
    /// For a beam: the log-prob of the greedy run, to compare with.
    pub greedy_logprob: Option<f64>,
}

/// The runs a search found, best first, and its cost.
#[derive(Debug)]
pub struct Found {
    /// Ranked runs.
    pub runs: Vec<Ranked>,
    /// The cost.
    pub usage: SearchUsage,
}

/// Runs the search `search` of `program`. `opts.cancel` stops it: the runs
/// so far come back, best first.
pub fn run(program: &Program, sources: &SourceMap, model: &Model, opts: &RunOptions, search: &SearchOptions) -> Found {
    let batcher = Batcher::new(&model.decoder, search.prefix_cache_bytes);
    let mut found = run_in(program, sources, model, &batcher, opts, search.mode, search.length_penalty);
    let stats = batcher.stats();
    found.usage.forward_tokens += stats.shared_tokens;
    found.usage.batches = stats.batches;
    found
}

/// Samples of `program` on a remote engine: runs on threads, each its own
/// requests (the engine batches and caches their shared prompt). A beam
/// needs the model's next-token log-probs at every step: `None`.
pub fn run_remote(program: &Program, sources: &SourceMap, remote: &RemoteModel, opts: &RunOptions, search: &SearchOptions) -> Option<Found> {
    let Mode::Samples { n, best_of } = search.mode else { return None };
    let mut f = samples(program, sources, Runner::Remote(remote), opts, n, search.length_penalty);
    if best_of {
        f.runs.truncate(1);
    }
    Some(f)
}

/// What a search's runs run on.
#[derive(Clone, Copy)]
enum Runner<'a> {
    /// lmt's runtime, passes batched.
    Local(&'a Model, &'a Batcher<'a>),
    /// A remote engine.
    Remote(&'a RemoteModel),
}

/// [`run`] through `batcher`, which other work may share (a dataset's rows):
/// its counters are not in the usage.
pub fn run_in(
    program: &Program,
    sources: &SourceMap,
    model: &Model,
    batcher: &Batcher<'_>,
    opts: &RunOptions,
    mode: Mode,
    length_penalty: f64,
) -> Found {
    let mut found = match mode {
        Mode::Samples { n, best_of } => {
            let mut f = samples(program, sources, Runner::Local(model, batcher), opts, n, length_penalty);
            if best_of {
                f.runs.truncate(1);
            }
            f
        }
        Mode::Beam { width } => beam::search(program, sources, model, batcher, opts, width, length_penalty),
    };
    if let Mode::Beam { .. } = mode {
        if !cancelled(opts) {
            // The greedy run, to say what the search gained over it.
            let greedy = RunOptions { temperature: 0.0, ..opts.clone() };
            let member = batcher.join();
            let o = interp::run_on(program, sources, model, &member, &greedy, &mut |_| {});
            count(&mut found.usage, &o);
            found.usage.greedy_logprob = (o.error.is_none()).then_some(o.state.logprob);
        }
    }
    found
}

/// Adds a finished run's forward work to the search's.
fn count(usage: &mut SearchUsage, o: &Outcome) {
    usage.forward_tokens += o.state.usage.forward_tokens;
    usage.shared_tokens += o.state.usage.prefix_cached_tokens;
}

fn cancelled(opts: &RunOptions) -> bool {
    opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst))
}

/// The seed of sample `i`: sample 0 is the run `--seed` gives alone.
pub fn sample_seed(base: u64, i: usize) -> u64 {
    base.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// `n` runs with seeds [`sample_seed`], on up to [`MAX_RUNS`] threads.
fn samples(program: &Program, sources: &SourceMap, runner: Runner<'_>, opts: &RunOptions, n: usize, alpha: f64) -> Found {
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..n.clamp(1, MAX_RUNS) {
            scope.spawn(|| {
                // A local sample's thread is a member of the batch while it lives.
                let member;
                let backend = match runner {
                    Runner::Local(model, batcher) => {
                        member = batcher.join();
                        Backend::Local { model, forward: &member }
                    }
                    Runner::Remote(r) => Backend::Remote(r),
                };
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= n || cancelled(opts) {
                        return;
                    }
                    let o = RunOptions { seed: sample_seed(opts.seed, i), ..opts.clone() };
                    // A panic is a bug: that sample is missing, the others go on.
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        interp::run_with(program, sources, backend, None, &o, &mut |_| {})
                    }));
                    if let Ok(outcome) = ran {
                        done.lock().unwrap_or_else(|e| e.into_inner()).push((i, outcome));
                    }
                }
            });
        }
    });
    let mut outcomes = done.into_inner().unwrap_or_else(|e| e.into_inner());
    outcomes.sort_by_key(|(i, _)| *i);
    let mut usage = SearchUsage { runs: outcomes.len(), ..SearchUsage::default() };
    let runs = outcomes
        .into_iter()
        .map(|(_, outcome)| {
            count(&mut usage, &outcome);
            let decisions = outcome.state.usage.decisions as usize;
            Ranked { score: rank_score(&outcome, decisions, alpha), outcome, decisions }
        })
        .collect();
    Found { runs: ranked(runs), usage }
}

/// A run's ranking score: its log-prob over `decisions^α` (its
/// `logprob_all` over its tokens', when scored); a run that failed ranks
/// below every run that did not.
pub(crate) fn rank_score(o: &Outcome, decisions: usize, alpha: f64) -> f64 {
    if o.error.is_some() {
        return f64::NEG_INFINITY;
    }
    match o.state.logprob_all {
        // Every token scored: normalised by the tokens scored.
        Some(all) => normalised(all, o.state.tokens.len().saturating_sub(1), alpha),
        None => normalised(o.state.logprob, decisions, alpha),
    }
}

/// `logprob / max(decisions, 1)^α`.
pub fn normalised(logprob: f64, decisions: usize, alpha: f64) -> f64 {
    if alpha == 0.0 {
        logprob
    } else {
        logprob / (decisions.max(1) as f64).powf(alpha)
    }
}

/// Best first: complete runs before those Ctrl-C cut short (a partial
/// run has fewer terms in its log-prob), each by score (stable: equal
/// scores keep their order).
fn ranked(mut runs: Vec<Ranked>) -> Vec<Ranked> {
    let cut = |r: &Ranked| r.outcome.state.finish_reason == FinishReason::Cancelled;
    runs.sort_by(|a, b| cut(a).cmp(&cut(b)).then(b.score.total_cmp(&a.score)));
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Record;

    fn run(score: f64, finish: FinishReason) -> Ranked {
        let state = Record { logprob: score, finish_reason: finish, ..Record::default() };
        Ranked { outcome: Outcome { state, error: None }, score, decisions: 1 }
    }

    /// Complete runs come before runs Ctrl-C cut short, each by score.
    #[test]
    fn complete_runs_rank_before_partial_ones() {
        let runs = vec![
            run(-1.0, FinishReason::Cancelled),
            run(-5.0, FinishReason::Done),
            run(-0.5, FinishReason::Cancelled),
            run(-3.0, FinishReason::Done),
        ];
        let order: Vec<f64> = ranked(runs).iter().map(|r| r.score).collect();
        assert_eq!(order, [-3.0, -5.0, -0.5, -1.0]);
    }
}
