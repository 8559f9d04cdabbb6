//! Beam search over whole runs. Each beam is a run on a thread of its own
//! whose [`Decider`] posts its candidates (the most likely allowed tokens,
//! or a select's options, with their log-probs) on a board and waits. Once
//! no beam is running, the controller ranks every candidate extension
//! (beam score + candidate log-prob) with the runs that have finished, keeps
//! the `width` best, and answers: a beam goes on with its best kept
//! candidate, its other kept candidates become new beams, and a beam with
//! none is stopped. A new beam replays its parent's decisions without
//! forward passes and starts from a copy of the parent's K/V state (kept in
//! the batcher's prefix cache before the new beam starts). The search ends
//! when the `width` best are all finished runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{cancelled, count, normalised, rank_score, ranked, Found, Ranked, SearchUsage};
use crate::engine::TokenMask;
use crate::interp::decide::{Decider, Decision};
use crate::interp::lm::TOP_ALTERNATIVES;
use crate::interp::{self, Outcome, RunOptions};
use crate::ir::Program;
use crate::model::{log_softmax, top_n, Batcher, KvState, Member, Model, Sampled};
use crate::span::SourceMap;

/// Most beams alive at once (each is a thread and a K/V state).
pub const MAX_WIDTH: usize = 64;

/// A beam's place on the board.
enum Slot {
    /// Running towards its next decision.
    Running,
    /// At a decision: its candidates, best first, with their log-probs.
    Waiting(Vec<(Decision, f64)>),
    /// Told what to do; it has not taken the answer yet.
    Answered(Verdict),
    /// Its run ended (`None` once the controller took the outcome).
    Finished(Option<Box<Outcome>>),
}

#[derive(Clone, Copy)]
enum Verdict {
    /// Go on with candidate `index`; first keep a copy of the state when
    /// other beams fork from this point.
    Take { index: usize, keep: bool },
    /// Stop here.
    Stop,
}

/// The board the beams and the controller share.
struct Board {
    slots: Vec<Slot>,
}

struct Shared<'a> {
    board: Mutex<Board>,
    changed: Condvar,
    batcher: &'a Batcher<'a>,
    width: usize,
}

impl Shared<'_> {
    fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One beam's decider: replays its parent's decisions, then asks the board.
struct BeamDecider<'a, 'b, 'd> {
    id: usize,
    shared: &'a Shared<'a>,
    member: &'a Member<'b, 'd>,
    replay: Mutex<VecDeque<Decision>>,
    cancel: Arc<AtomicBool>,
}

impl BeamDecider<'_, '_, '_> {
    /// Posts `candidates` and waits for the verdict.
    fn ask(&self, kv: &KvState, candidates: Vec<(Decision, f64)>) -> Option<Decision> {
        let shared = self.shared;
        // A stopped beam (Ctrl-C: the controller answers no more) stops.
        let stopped = || self.cancel.load(Ordering::SeqCst);
        {
            let mut b = shared.lock();
            if stopped() {
                return None;
            }
            b.slots[self.id] = Slot::Waiting(candidates.clone());
            shared.changed.notify_all();
        }
        let verdict = self.member.away(|| {
            let mut b = shared.lock();
            loop {
                if let Slot::Answered(v) = b.slots[self.id] {
                    return v;
                }
                if stopped() {
                    return Verdict::Stop;
                }
                b = shared.changed.wait(b).unwrap_or_else(|e| e.into_inner());
            }
        });
        let decision = match verdict {
            Verdict::Take { index, keep } => {
                if keep {
                    if let Ok(copy) = kv.fork_prefix(kv.len()) {
                        shared.batcher.keep(copy);
                    }
                }
                candidates.into_iter().nth(index).map(|(d, _)| d)
            }
            Verdict::Stop => None,
        };
        if decision.is_none() {
            self.cancel.store(true, Ordering::SeqCst);
        }
        let mut b = shared.lock();
        b.slots[self.id] = Slot::Running;
        shared.changed.notify_all();
        decision
    }
}

impl Decider for BeamDecider<'_, '_, '_> {
    fn replayed(&self) -> Option<Decision> {
        self.replay.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    fn token(&self, kv: &KvState, logits: &[f32], mask: &TokenMask) -> Option<Sampled> {
        let lp = log_softmax(logits);
        let mut allowed: Vec<(u32, f32)> =
            mask.ones().filter(|&t| (t as usize) < lp.len() && lp[t as usize].is_finite()).map(|t| (t, lp[t as usize])).collect();
        allowed.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        allowed.truncate(self.shared.width);
        let top = top_n(&lp, TOP_ALTERNATIVES);
        let candidates =
            allowed.into_iter().map(|(token, logprob)| (Decision::Token(Sampled { token, logprob, top: top.clone() }), f64::from(logprob))).collect();
        match self.ask(kv, candidates)? {
            Decision::Token(s) => Some(s),
            Decision::Option(_) => None,
        }
    }

    fn option(&self, kv: &KvState, scores: &[f64]) -> Option<usize> {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order.truncate(self.shared.width);
        let candidates = order.into_iter().map(|k| (Decision::Option(k), scores[k])).collect();
        match self.ask(kv, candidates)? {
            Decision::Option(k) => Some(k),
            Decision::Token(_) => None,
        }
    }
}

/// What the controller knows of a beam.
struct Beam {
    history: Vec<Decision>,
    score: f64,
    /// Stopped by the search: its outcome and history are dropped.
    stopped: bool,
    /// Its finished run.
    outcome: Option<Outcome>,
    flag: Arc<AtomicBool>,
}

impl Beam {
    /// The search stops this beam: nothing of it is kept.
    fn stop(&mut self) {
        self.stopped = true;
        self.outcome = None;
        self.history = Vec::new();
    }
}

/// Beam search of width `width` (see the module's documentation).
pub(super) fn search(
    program: &Program,
    sources: &SourceMap,
    model: &Model,
    batcher: &Batcher<'_>,
    opts: &RunOptions,
    width: usize,
    alpha: f64,
) -> Found {
    let width = width.clamp(1, MAX_WIDTH);
    let shared = Shared { board: Mutex::new(Board { slots: Vec::new() }), changed: Condvar::new(), batcher, width };
    let mut beams: Vec<Beam> = Vec::new();
    let mut usage = SearchUsage::default();
    std::thread::scope(|scope| {
        let spawn = |beams: &mut Vec<Beam>, history: Vec<Decision>, score: f64| {
            let id = beams.len();
            let flag = Arc::new(AtomicBool::new(false));
            shared.lock().slots.push(Slot::Running);
            beams.push(Beam { history: history.clone(), score, stopped: false, outcome: None, flag: flag.clone() });
            let shared = &shared;
            let run_opts = RunOptions { cancel: Some(flag.clone()), temperature: 0.0, ..opts.clone() };
            scope.spawn(move || {
                let member = shared.batcher.join();
                let decider = BeamDecider { id, shared, member: &member, replay: Mutex::new(history.into()), cancel: flag };
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    interp::run_with(program, sources, interp::Backend::Local { model, forward: &member }, Some(&decider), &run_opts, &mut |_| {})
                }));
                drop(member);
                let mut b = shared.lock();
                // A panic is a bug: the beam ends without a run.
                b.slots[id] = Slot::Finished(ran.ok().map(Box::new));
                shared.changed.notify_all();
            });
        };
        spawn(&mut beams, Vec::new(), 0.0);
        loop {
            let candidates = wait_for_decisions(&shared, &mut beams, &mut usage, opts);
            if cancelled(opts) {
                stop_all(&shared, &beams);
                break;
            }
            // Every finished run competes with every extension.
            let mut pool: Vec<(f64, usize, Option<usize>)> = Vec::new(); // (rank score, beam, candidate)
            for (id, beam) in beams.iter().enumerate() {
                if let (Some(o), false) = (&beam.outcome, beam.stopped) {
                    pool.push((rank_score(o, beam.history.len(), alpha), id, None));
                }
            }
            for (id, cands) in &candidates {
                let beam = &beams[*id];
                for (k, (_, lp)) in cands.iter().enumerate() {
                    pool.push((normalised(beam.score + lp, beam.history.len() + 1, alpha), *id, Some(k)));
                }
            }
            pool.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            pool.truncate(width);
            // Finished runs that fell out of the best are dropped.
            for (id, beam) in beams.iter_mut().enumerate() {
                if beam.outcome.is_some() && !pool.iter().any(|&(_, b, c)| b == id && c.is_none()) {
                    beam.stop();
                }
            }
            if candidates.is_empty() {
                break;
            }
            let mut forks = Vec::new();
            {
                let mut b = shared.lock();
                for (id, cands) in &candidates {
                    let kept: Vec<usize> = pool.iter().filter(|&&(_, bid, c)| bid == *id && c.is_some()).filter_map(|&(_, _, c)| c).collect();
                    let Some((&first, rest)) = kept.split_first() else {
                        b.slots[*id] = Slot::Answered(Verdict::Stop);
                        beams[*id].stop();
                        continue;
                    };
                    b.slots[*id] = Slot::Answered(Verdict::Take { index: first, keep: !rest.is_empty() });
                    for &k in rest {
                        let mut history = beams[*id].history.clone();
                        history.push(cands[k].0.clone());
                        forks.push((history, beams[*id].score + cands[k].1));
                    }
                    beams[*id].history.push(cands[first].0.clone());
                    beams[*id].score += cands[first].1;
                }
                shared.changed.notify_all();
            }
            // New beams start once their parents' states are in the cache.
            wait_until(&shared, |b| !b.slots.iter().any(|s| matches!(s, Slot::Answered(Verdict::Take { keep: true, .. }))));
            for (history, score) in forks {
                spawn(&mut beams, history, score);
            }
        }
        // Stopped beams end their runs; the scope joins every thread.
    });
    // Outcomes of beams that finished after the loop (cancelled by Ctrl-C).
    for (id, slot) in shared.board.into_inner().unwrap_or_else(|e| e.into_inner()).slots.into_iter().enumerate() {
        if let Slot::Finished(Some(o)) = slot {
            count(&mut usage, &o);
            if !beams[id].stopped {
                beams[id].outcome = Some(*o);
            }
        }
    }
    usage.runs = beams.len();
    let mut runs = Vec::new();
    for beam in beams {
        // Runs the search stopped are gone; those Ctrl-C stopped are the
        // best partial runs so far and come back, but not a fork stopped
        // while it replayed its parent (its record lacks decisions it took).
        let Some(o) = beam.outcome else { continue };
        let decisions = beam.history.len();
        if (o.state.usage.decisions as usize) < decisions {
            continue;
        }
        runs.push(Ranked { score: rank_score(&o, decisions, alpha), outcome: o, decisions });
    }
    let mut runs = ranked(runs);
    runs.truncate(width);
    Found { runs, usage }
}

/// Waits until no beam is running; takes the outcomes of beams that
/// finished, and returns the candidates of those waiting (by beam).
fn wait_for_decisions(
    shared: &Shared<'_>,
    beams: &mut [Beam],
    usage: &mut SearchUsage,
    opts: &RunOptions,
) -> Vec<(usize, Vec<(Decision, f64)>)> {
    let mut b = shared.lock();
    loop {
        let busy = b.slots.iter().any(|s| matches!(s, Slot::Running | Slot::Answered(_)));
        if !busy || cancelled(opts) {
            break;
        }
        // Ctrl-C sets a flag and wakes nobody: look again now and then.
        b = shared.changed.wait_timeout(b, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
    }
    let mut waiting = Vec::new();
    for (id, slot) in b.slots.iter_mut().enumerate() {
        match slot {
            // What a stopped beam made is dropped at once: a long search
            // starts many beams.
            Slot::Finished(o @ Some(_)) => {
                let o = o.take().map(|o| *o);
                if let Some(o) = &o {
                    count(usage, o);
                }
                if !beams[id].stopped {
                    beams[id].outcome = o;
                }
            }
            Slot::Waiting(c) => waiting.push((id, c.clone())),
            _ => {}
        }
    }
    waiting
}

/// Waits until `done` holds of the board.
fn wait_until(shared: &Shared<'_>, done: impl Fn(&Board) -> bool) {
    let mut b = shared.lock();
    while !done(&b) {
        b = shared.changed.wait(b).unwrap_or_else(|e| e.into_inner());
    }
}

/// Ctrl-C: every beam stops (waiting ones are told, running ones see their
/// flag at the next token).
fn stop_all(shared: &Shared<'_>, beams: &[Beam]) {
    let mut b = shared.lock();
    for (id, beam) in beams.iter().enumerate() {
        beam.flag.store(true, Ordering::SeqCst);
        if let Slot::Waiting(_) = b.slots[id] {
            b.slots[id] = Slot::Answered(Verdict::Stop);
        }
    }
    shared.changed.notify_all();
}
