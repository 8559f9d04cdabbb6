//! Choosing the next token: greedy, temperature, top-k, top-p and min-p,
//! seeded and reproducible, after the grammar engine's mask and biases.
//! The log-prob reported for a token is the model's own (temperature 1, no
//! mask): the number a likelihood of the run is made of.

use crate::engine::TokenMask;

use super::decoder::log_sum_exp;
use super::ModelError;

/// How to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely (0: none).
    pub min_p: f32,
    /// The random seed.
    pub seed: u64,
    /// How many top alternatives to report per token.
    pub top_alternatives: usize,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, top_alternatives: 5 }
    }
}

impl SamplingParams {
    /// An error naming the first parameter out of range.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: &str| Err(ModelError::Runtime(m.to_string()));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature must be a finite number ≥ 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        Ok(())
    }
}

/// A sampled token and what the model thought of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-prob under the model (temperature 1, unmasked).
    pub logprob: f32,
    /// The most likely tokens under the model, best first, with log-probs.
    pub top: Vec<(u32, f32)>,
}

/// A seeded sampler; the same seed and inputs give the same tokens.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// The parameters.
    pub params: SamplingParams,
    rng: SplitMix64,
}

impl Sampler {
    /// A sampler with `params`.
    pub fn new(params: SamplingParams) -> Result<Sampler, ModelError> {
        params.validate()?;
        let rng = SplitMix64(params.seed);
        Ok(Sampler { params, rng })
    }

    /// Picks a token from `logits`, allowing only `mask`'s tokens (when
    /// given) and adding `bias` (token, logit offset) first.
    pub fn sample(&mut self, logits: &[f32], mask: Option<&TokenMask>, bias: &[(u32, f32)]) -> Result<Sampled, ModelError> {
        // The model's log-probabilities are `logit − lse`, computed where
        // read (no vocabulary-sized buffers a token: this runs once per
        // generated token of every sequence, between batched passes).
        let lse = log_sum_exp(logits);
        let biased;
        let adj: &[f32] = if bias.is_empty() {
            logits
        } else {
            let mut a = logits.to_vec();
            for &(t, b) in bias {
                if let Some(v) = a.get_mut(t as usize) {
                    *v += b;
                }
            }
            biased = a;
            &biased
        };
        let none = || ModelError::Runtime("no token is allowed here: the constraint admits nothing the model can emit".into());
        let p = &self.params;
        let token = if p.temperature == 0.0 {
            argmax_allowed(adj, mask).ok_or_else(none)?
        } else {
            // Candidates, in id order: allowed tokens with a finite logit.
            let ids: Box<dyn Iterator<Item = usize> + '_> = match mask {
                Some(m) => Box::new(m.ones().map(|i| i as usize).take_while(|&i| i < adj.len())),
                None => Box::new(0..adj.len()),
            };
            let mut cand: Vec<(u32, f32)> = ids.map(|i| (i as u32, adj[i])).filter(|c| c.1.is_finite()).collect();
            if cand.is_empty() {
                return Err(none());
            }
            cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if p.top_k > 0 {
                cand.truncate(p.top_k);
            }
            let max = cand[0].1;
            let mut probs: Vec<f64> = cand.iter().map(|c| (((c.1 - max) / p.temperature) as f64).exp()).collect();
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|q| *q /= total);
            let mut keep = probs.len();
            if p.top_p < 1.0 {
                let mut acc = 0.0;
                for (i, q) in probs.iter().enumerate() {
                    acc += q;
                    if acc >= p.top_p as f64 {
                        keep = i + 1;
                        break;
                    }
                }
            }
            if p.min_p > 0.0 {
                let floor = probs[0] * p.min_p as f64;
                keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
            }
            let total: f64 = probs[..keep].iter().sum();
            let mut r = self.rng.next_f64() * total;
            let mut pick = cand[keep - 1].0;
            for (c, q) in cand.iter().zip(&probs[..keep]) {
                if r < *q {
                    pick = c.0;
                    break;
                }
                r -= q;
            }
            pick
        };
        let top = top_n_shifted(logits, lse, p.top_alternatives);
        Ok(Sampled { token, logprob: logits[token as usize] - lse, top })
    }
}

/// The `n` largest entries, best first (ties by lower id).
pub fn top_n(values: &[f32], n: usize) -> Vec<(u32, f32)> {
    // `v − 0` is `v`, bit for bit (−0 included).
    top_n_shifted(values, 0.0, n)
}

/// Takes `(i, v)` into `best`, the `n` largest values so far in
/// descending order (the earlier index first among equals).
#[inline]
fn keep_best(best: &mut Vec<(u32, f32)>, n: usize, i: u32, v: f32) {
    if best.len() == n && v <= best[n - 1].1 {
        return;
    }
    let at = best.partition_point(|&(_, b)| b >= v);
    best.insert(at, (i, v));
    best.truncate(n);
}

/// [`top_n`] of `x[i] − shift` (log-probabilities from logits), without
/// visiting most of a vocabulary one value at a time: once `n` are kept,
/// a run of 64 none of which would enter is passed over whole.
fn top_n_shifted(x: &[f32], shift: f32, n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (c, run) in x.chunks(64).enumerate() {
        if best.len() == n && all_at_most(run, shift, best[n - 1].1) {
            continue;
        }
        for (k, &v) in run.iter().enumerate() {
            keep_best(&mut best, n, (64 * c + k) as u32, v - shift);
        }
    }
    best
}

/// Whether every `v` of `run` has `v − shift <= floor`: [`keep_best`]'s
/// own test for passing a value over (so never true of a NaN), in eight
/// lanes the compiler vectorises.
fn all_at_most(run: &[f32], shift: f32, floor: f32) -> bool {
    let mut at_most = [true; 8];
    let mut eights = run.chunks_exact(8);
    for e in eights.by_ref() {
        for l in 0..8 {
            at_most[l] &= e[l] - shift <= floor;
        }
    }
    at_most.iter().all(|&b| b) && eights.remainder().iter().all(|&v| v - shift <= floor)
}

/// The first allowed id (any, when `mask` is `None`) with the largest
/// finite value; `None` when no allowed value is finite.
fn argmax_allowed(x: &[f32], mask: Option<&TokenMask>) -> Option<u32> {
    let Some(m) = mask else {
        // The largest finite value, then its first place (only a finite
        // value equals a finite largest).
        let max = finite_max(x);
        return max.is_finite().then(|| x.iter().position(|&v| v == max)).flatten().map(|i| i as u32);
    };
    // A word of the mask at a time, as a walk over its ids would go (ties
    // keep the earlier id): a run of 64 logits none of which beats the
    // best so far is passed over whole (one vectorised test), so only the
    // few runs that raise the best are walked id by id.
    let mut best: Option<(u32, f32)> = None;
    for (w, (run, &bits)) in x.chunks(64).zip(m.words()).enumerate() {
        if bits == 0 || best.is_some_and(|(_, b)| all_at_most(run, 0.0, b)) {
            continue;
        }
        let mut bits = bits;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let Some(&v) = run.get(k) else { break };
            if v.is_finite() && best.is_none_or(|(_, b)| v > b) {
                best = Some(((64 * w + k) as u32, v));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// The largest finite value of `x` (−∞ when none is), in sixteen running
/// maxima (independent chains the compiler vectorises).
fn finite_max(x: &[f32]) -> f32 {
    let mut max = [f32::NEG_INFINITY; 16];
    let mut runs = x.chunks_exact(16);
    for e in runs.by_ref() {
        for l in 0..16 {
            // (`&`: both tests on every lane, no branch.)
            max[l] = if e[l].is_finite() & (e[l] > max[l]) { e[l] } else { max[l] };
        }
    }
    for (l, &v) in runs.remainder().iter().enumerate() {
        max[l] = if v.is_finite() && v > max[l] { v } else { max[l] };
    }
    max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// SplitMix64: tiny, fast and the same on every platform and version, so a
/// seed means the same tokens forever.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values with ties, infinities and (when asked) NaNs, from a seed.
    fn logits(len: usize, seed: u64, nan: bool) -> Vec<f32> {
        let mut r = SplitMix64(seed);
        (0..len)
            .map(|i| match r.next_f64() {
                u if u < 0.02 => f32::NEG_INFINITY,
                u if u < 0.03 => f32::INFINITY,
                u if u < 0.04 && nan => f32::NAN,
                // Ties at the top.
                u if u < 0.05 => 30.0,
                // Ties, and neighbours that a shift rounds together.
                u if u < 0.2 => (i % 7) as f32,
                u => (u * 40.0 - 20.0) as f32 + (i as f32) * 1e-7,
            })
            .collect()
    }

    /// The `n` largest of `values`, one at a time: the plain loop.
    fn top_n_of(values: impl Iterator<Item = f32>, n: usize) -> Vec<(u32, f32)> {
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n == 0 {
            return best;
        }
        for (i, v) in values.enumerate() {
            keep_best(&mut best, n, i as u32, v);
        }
        best
    }

    /// The shortcuts give what the plain loops give, bit for bit.
    #[test]
    fn the_sampling_shortcuts_match_the_plain_loops() {
        let bits = |v: &[(u32, f32)]| v.iter().map(|&(i, f)| (i, f.to_bits())).collect::<Vec<_>>();
        for seed in 0..60 {
            let len = [1, 63, 64, 65, 1000, 49_152][seed as usize % 6];
            let x = logits(len, seed, (seed / 6) % 2 == 0);
            for shift in [0.0, 3.5, -1e30, f32::INFINITY, f32::NAN] {
                for n in [0, 1, 5, 70] {
                    let want = top_n_of(x.iter().map(|&v| v - shift), n);
                    assert_eq!(bits(&top_n_shifted(&x, shift, n)), bits(&want), "seed {seed} shift {shift} n {n}");
                    if shift == 0.0 {
                        assert_eq!(bits(&top_n(&x, n)), bits(&top_n_of(x.iter().copied(), n)), "seed {seed} n {n}");
                    }
                }
            }
            let mut r = SplitMix64(seed ^ 0x5eed);
            for density in [0.0, 0.001, 0.5, 0.99, 1.0] {
                // Longer than the logits: ids past them are never picked.
                let mut m = TokenMask::new(len + 3);
                (0..len as u32 + 3).filter(|_| r.next_f64() < density).for_each(|i| m.set(i));
                for mask in [None, Some(&m)] {
                    let ids: Vec<usize> = match mask {
                        Some(m) => m.ones().map(|i| i as usize).take_while(|&i| i < len).collect(),
                        None => (0..len).collect(),
                    };
                    let mut cand = ids.into_iter().map(|i| (i as u32, x[i])).filter(|c| c.1.is_finite());
                    let want = cand.next().map(|first| cand.fold(first, |best, c| if c.1 > best.1 { c } else { best }).0);
                    assert_eq!(argmax_allowed(&x, mask), want, "seed {seed} density {density}");
                }
            }
        }
    }
}
