//! Several sequences, each driven by a thread of its own (a dataset row's
//! interpreter), decoded together: every thread asks for its forward pass
//! through a [`Member`] and blocks; once every member is waiting, the last
//! to arrive runs all their work in one batched pass (each weight matrix
//! read once for all) and wakes the rest. A row's logits do not depend on
//! the rows beside it (the kernels compute each row alike), so results are
//! the same at any number of threads.
//!
//! Appends of prompt text go through a [`PrefixCache`] of KV states: a
//! sequence that shares a prefix with an earlier one starts from a copy of
//! it instead of computing it again; when several sequences waiting in one
//! batch share a prefix nobody has computed, it is computed once first.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::decoder::{Decoder, ForwardStats, KvState, PIECE};
use super::ModelError;

/// What runs a sequence's forward passes: the decoder itself, or a
/// [`Member`] of a batch.
pub trait Forward: Sync {
    /// Feeds `tokens` to `st` and returns the logits after the last one
    /// (the current logits when `tokens` is empty).
    fn append(&self, st: &mut KvState, tokens: &[u32]) -> Result<Vec<f32>, ModelError>;
    /// Log-probabilities of each token of each option after `st`'s tokens,
    /// `first` the logits after them; `st` is left as it was (see
    /// [`Decoder::score`]).
    fn score(&self, st: &mut KvState, first: &[f32], options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError>;
}

impl Forward for Decoder {
    fn append(&self, st: &mut KvState, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        Decoder::append(self, st, tokens)
    }

    fn score(&self, st: &mut KvState, first: &[f32], options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        Decoder::score(self, st, first, options)
    }
}

/// Appends at least this long are prompt text worth looking up in (and
/// keeping in) the prefix cache, and a prefix shared in a batch is worth a
/// pass of its own from this length on.
const MIN_SHARED: usize = 16;

/// Counters of a batcher's work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batched passes run (each may hold several sequences).
    pub batches: u64,
    /// Sequence appends served, summed over batches.
    pub appends: u64,
    /// Tokens computed once for a prefix several sequences shared (not
    /// counted in any sequence's own forward tokens).
    pub shared_tokens: u64,
    /// Microseconds spent running batches (the rest of a run's time is
    /// the sequences' own work between passes: masks, sampling, text).
    pub busy_us: u64,
}

/// Serves forward passes to several threads at once, batching them.
pub struct Batcher<'d> {
    decoder: &'d Decoder,
    queue: Mutex<Queue>,
    wake: Condvar,
    prefixes: Mutex<PrefixCache>,
}

#[derive(Default)]
struct Queue {
    /// Threads that may still ask for work: a batch runs when all wait.
    members: usize,
    jobs: Vec<Job>,
    done: HashMap<u64, (KvState, Result<Reply, ModelError>)>,
    next_ticket: u64,
    /// A batch is running (its leader released the lock).
    busy: bool,
    stats: BatchStats,
}

/// A sequence waiting for its work: its ticket and its state.
struct Seq {
    ticket: u64,
    st: KvState,
}

struct Job {
    seq: Seq,
    work: Work,
}

/// What a batch hands back for each sequence.
type Done = (Seq, Result<Reply, ModelError>);

enum Work {
    Append(Vec<u32>),
    /// The logits after the state's tokens, and the options.
    Score(Vec<f32>, Vec<Vec<u32>>),
}

enum Reply {
    Logits(Vec<f32>),
    Scores(Vec<Vec<f32>>),
}

impl<'d> Batcher<'d> {
    /// A batcher over `decoder` whose prefix cache holds at most
    /// `cache_bytes` of K/V (least recently used states leave first).
    pub fn new(decoder: &'d Decoder, cache_bytes: usize) -> Batcher<'d> {
        Batcher {
            decoder,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            prefixes: Mutex::new(PrefixCache { entries: Vec::new(), limit: cache_bytes, clock: 0 }),
        }
    }

    /// Joins a new member: batches wait for it until it is dropped.
    pub fn join(&self) -> Member<'_, 'd> {
        self.lock().members += 1;
        Member { batcher: self }
    }

    /// Keeps `st` in the prefix cache, for sequences that will start with
    /// its tokens (a search's run forked from another).
    pub fn keep(&self, st: KvState) {
        self.prefixes.lock().unwrap_or_else(|e| e.into_inner()).insert(st);
    }

    /// The work done so far.
    pub fn stats(&self) -> BatchStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` on `st` and blocks until it is done; the calling
    /// thread runs the batch itself when it completes the set of waiters.
    fn call(&self, st: &mut KvState, work: Work) -> Result<Reply, ModelError> {
        let mut q = self.lock();
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        let job_state = std::mem::replace(st, self.decoder.new_state());
        q.jobs.push(Job { seq: Seq { ticket, st: job_state }, work });
        if !q.busy {
            self.pace(q.members.saturating_sub(q.jobs.len()));
        }
        loop {
            if let Some((back, result)) = q.done.remove(&ticket) {
                *st = back;
                return result;
            }
            if !q.busy && !q.jobs.is_empty() && q.jobs.len() >= q.members {
                let jobs = std::mem::take(&mut q.jobs);
                let tickets: Vec<u64> = jobs.iter().map(|j| j.seq.ticket).collect();
                q.busy = true;
                drop(q);
                let started = std::time::Instant::now();
                // A panic in a pass must not leave the others waiting forever.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(jobs)));
                let (results, stats) = ran.unwrap_or_else(|_| {
                    let failed = |ticket| {
                        let seq = Seq { ticket, st: self.decoder.new_state() };
                        (seq, Err(ModelError::Runtime("a batched forward pass panicked".into())))
                    };
                    (tickets.into_iter().map(failed).collect(), BatchStats::default())
                });
                q = self.lock();
                // Every member now does its own work before the next pass.
                self.pace(q.members);
                q.busy = false;
                q.stats.batches += 1;
                q.stats.appends += stats.appends;
                q.stats.shared_tokens += stats.shared_tokens;
                q.stats.busy_us += started.elapsed().as_micros() as u64;
                q.done.extend(results.into_iter().map(|(seq, r)| (seq.ticket, (seq.st, r))));
                self.wake.notify_all();
                continue;
            }
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Sets the model's idle workers for the time until the next pass,
    /// while `working` members are at their own work (masks, sampling):
    /// as many as the pass has threads or more, and the workers sleep,
    /// leaving them the cores; fewer, and the workers spin on the cores
    /// left idle, to start the pass as soon as those members ask for it.
    fn pace(&self, working: usize) {
        if working >= self.decoder.threads() {
            self.decoder.rest();
        } else if working > 0 {
            self.decoder.ready();
        }
    }

    /// Runs one batch: shared prefixes first, then every append in one
    /// pass (a long one alone, in pieces), then scores one by one.
    fn run(&self, jobs: Vec<Job>) -> (Vec<Done>, BatchStats) {
        let mut stats = BatchStats::default();
        let mut cache = self.prefixes.lock().unwrap_or_else(|e| e.into_inner());
        let (mut seqs, mut tokens, mut scores) = (Vec::new(), Vec::new(), Vec::new());
        for Job { seq, work } in jobs {
            match work {
                Work::Append(t) => {
                    seqs.push(seq);
                    tokens.push(t);
                }
                Work::Score(first, options) => scores.push((seq, first, options)),
            }
        }
        // Prompt appends, whole (the state's tokens and the new ones): the
        // ones the prefix cache serves and keeps.
        let fulls: Vec<Option<Vec<u32>>> =
            seqs.iter().zip(&tokens).map(|(s, t)| (t.len() >= MIN_SHARED).then(|| [s.st.tokens(), t].concat())).collect();
        stats.shared_tokens = self.share_prefixes(&mut cache, &seqs, &fulls);
        // Each prompt append starts from the longest cached prefix it shares.
        for ((s, t), f) in seqs.iter_mut().zip(&mut tokens).zip(&fulls) {
            let Some(f) = f else { continue };
            let have = s.st.len();
            if let Some((e, n)) = cache.longest(f) {
                // At least one token is fed: the logits after it are wanted.
                let n = n.min(f.len() - 1);
                if n > have {
                    if let Ok(mut st) = cache.entries[e].st.fork_prefix(n) {
                        st.stats = s.st.stats;
                        st.stats.cached += (n - have) as u64;
                        s.st = st;
                        *t = f[n..].to_vec();
                    }
                }
            }
        }
        let results = self.append_all(&mut seqs, &tokens);
        stats.appends = seqs.len() as u64;
        for ((s, f), r) in seqs.iter_mut().zip(&fulls).zip(&results) {
            if f.is_some() && r.is_ok() {
                let mut copy = s.st.copy_to_keep();
                copy.stats = ForwardStats::default();
                cache.insert(copy);
            }
        }
        drop(cache);
        let mut out: Vec<Done> = seqs.into_iter().zip(results).map(|(s, r)| (s, r.map(Reply::Logits))).collect();
        for (mut s, first, options) in scores {
            let r = self.decoder.score(&mut s.st, &first, &options).map(Reply::Scores);
            out.push((s, r));
        }
        (out, stats)
    }

    /// Computes, once, prefixes that two or more waiting prompt appends
    /// share beyond what the cache already holds for them; returns the
    /// tokens computed.
    fn share_prefixes(&self, cache: &mut PrefixCache, seqs: &[Seq], fulls: &[Option<Vec<u32>>]) -> u64 {
        let mut computed = 0;
        // Each round adds one cache entry that gains its pair ≥ MIN_SHARED
        // tokens, so rounds are few; the bound is for safety.
        for _ in 0..seqs.len() {
            let mut best: Option<(usize, usize, usize)> = None; // (job, shared length, from)
            for (a, fa) in fulls.iter().enumerate() {
                let Some(fa) = fa else { continue };
                let have = cache.longest(fa).map_or(0, |(_, n)| n).max(seqs[a].st.len());
                for fb in fulls.iter().skip(a + 1).flatten() {
                    // Stop one short of the end: each append feeds ≥ 1 token.
                    let shared = common(fa, fb).min(fa.len() - 1).min(fb.len() - 1);
                    if shared >= have + MIN_SHARED && best.is_none_or(|(_, n, h)| shared - have > n - h) {
                        best = Some((a, shared, have));
                    }
                }
            }
            let Some((a, shared, _)) = best else { break };
            let f = fulls[a].as_deref().unwrap_or_default();
            let (mut st, from) = match cache.longest(f) {
                Some((e, n)) => match cache.entries[e].st.fork_prefix(n) {
                    Ok(st) => (st, n),
                    Err(_) => break,
                },
                None => (self.decoder.new_state(), 0),
            };
            if self.decoder.append(&mut st, &f[from..shared]).is_err() {
                break;
            }
            computed += (shared - from) as u64;
            cache.insert(st);
        }
        computed
    }

    /// Feeds each sequence its tokens (results in their order): short
    /// appends together in one pass, long ones alone; when the batch fails
    /// (a sequence past its context, say), each goes alone so only the one
    /// at fault gets the error.
    fn append_all(&self, seqs: &mut [Seq], tokens: &[Vec<u32>]) -> Vec<Result<Vec<f32>, ModelError>> {
        let batched: Vec<bool> = tokens.iter().map(|t| !t.is_empty() && t.len() <= PIECE).collect();
        let mut out: Vec<Option<Result<Vec<f32>, ModelError>>> = seqs.iter().map(|_| None).collect();
        let mut states: Vec<&mut KvState> = seqs.iter_mut().zip(&batched).filter(|(_, &b)| b).map(|(s, _)| &mut s.st).collect();
        let chunks: Vec<&[u32]> = tokens.iter().zip(&batched).filter(|(_, &b)| b).map(|(t, _)| t.as_slice()).collect();
        if let Ok(logits) = self.decoder.append_batch(&mut states, &chunks) {
            let slots = out.iter_mut().zip(&batched).filter(|(_, &b)| b).map(|(o, _)| o);
            for (slot, l) in slots.zip(logits) {
                *slot = Some(Ok(l));
            }
        }
        drop(states);
        seqs.iter_mut().zip(tokens).zip(out).map(|((s, t), o)| o.unwrap_or_else(|| self.decoder.append(&mut s.st, t))).collect()
    }
}

/// One thread's handle on a [`Batcher`]: its passes wait for the other
/// members' and run with them. Dropping it lets batches go on without it.
pub struct Member<'b, 'd> {
    batcher: &'b Batcher<'d>,
}

impl Member<'_, '_> {
    /// Runs `f` (a wait on something other than the model) with this
    /// member out of the batch, so the others' passes do not wait for it.
    pub fn away<R>(&self, f: impl FnOnce() -> R) -> R {
        {
            let mut q = self.batcher.lock();
            q.members -= 1;
            self.batcher.wake.notify_all();
        }
        // Back in the batch even if `f` panics.
        struct Back<'m, 'b, 'd>(&'m Member<'b, 'd>);
        impl Drop for Back<'_, '_, '_> {
            fn drop(&mut self) {
                self.0.batcher.lock().members += 1;
            }
        }
        let _back = Back(self);
        f()
    }
}

impl Drop for Member<'_, '_> {
    fn drop(&mut self) {
        let mut q = self.batcher.lock();
        q.members -= 1;
        // Those waiting may now be everyone: one of them runs the batch.
        self.batcher.wake.notify_all();
    }
}

impl Forward for Member<'_, '_> {
    fn append(&self, st: &mut KvState, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        match self.batcher.call(st, Work::Append(tokens.to_vec()))? {
            Reply::Logits(l) => Ok(l),
            Reply::Scores(_) => Err(ModelError::Runtime("a batch answered an append with scores".into())),
        }
    }

    fn score(&self, st: &mut KvState, first: &[f32], options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        match self.batcher.call(st, Work::Score(first.to_vec(), options.to_vec()))? {
            Reply::Scores(s) => Ok(s),
            Reply::Logits(_) => Err(ModelError::Runtime("a batch answered a score with logits".into())),
        }
    }
}

/// KV states of earlier prompts, to start later ones from, within a bound
/// on their bytes; the least recently used leave first.
struct PrefixCache {
    entries: Vec<Entry>,
    limit: usize,
    clock: u64,
}

struct Entry {
    st: KvState,
    used: u64,
}

impl PrefixCache {
    /// The entry sharing the longest prefix with `tokens`, and its length.
    fn longest(&mut self, tokens: &[u32]) -> Option<(usize, usize)> {
        let (i, n) = self.entries.iter().enumerate().map(|(i, e)| (i, common(e.st.tokens(), tokens))).max_by_key(|&(_, n)| n)?;
        if n == 0 {
            return None;
        }
        self.clock += 1;
        self.entries[i].used = self.clock;
        Some((i, n))
    }

    /// Keeps `st` (dropping entries it extends), then evicts the least
    /// recently used until the bound holds.
    fn insert(&mut self, mut st: KvState) {
        // Forks of the entry share its positions instead of copying them.
        st.freeze();
        self.entries.retain(|e| common(e.st.tokens(), st.tokens()) < e.st.len());
        self.clock += 1;
        self.entries.push(Entry { st, used: self.clock });
        while self.entries.iter().map(|e| e.st.cache_bytes()).sum::<usize>() > self.limit {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else { break };
            self.entries.swap_remove(oldest);
        }
    }
}

/// Length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
