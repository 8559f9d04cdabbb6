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
        // Candidates, in id order: allowed tokens with a finite logit.
        let ids: Box<dyn Iterator<Item = usize> + '_> = match mask {
            Some(m) => Box::new(m.ones().map(|i| i as usize).take_while(|&i| i < adj.len())),
            None => Box::new(0..adj.len()),
        };
        let mut cand = ids.map(|i| (i as u32, adj[i])).filter(|c| c.1.is_finite());
        let Some(first) = cand.next() else {
            return Err(ModelError::Runtime("no token is allowed here: the constraint admits nothing the model can emit".into()));
        };
        let p = &self.params;
        let token = if p.temperature == 0.0 {
            // The first of the largest.
            cand.fold(first, |best, c| if c.1 > best.1 { c } else { best }).0
        } else {
            let mut cand: Vec<(u32, f32)> = std::iter::once(first).chain(cand).collect();
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
        let top = top_n_of(logits.iter().map(|&v| v - lse), p.top_alternatives);
        Ok(Sampled { token, logprob: logits[token as usize] - lse, top })
    }
}

/// The `n` largest entries, best first (ties by lower id).
pub fn top_n(values: &[f32], n: usize) -> Vec<(u32, f32)> {
    top_n_of(values.iter().copied(), n)
}

/// [`top_n`] of values as they come (id = place in the sequence).
fn top_n_of(values: impl Iterator<Item = f32>, n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (i, v) in values.enumerate() {
        if best.len() == n && v <= best[n - 1].1 {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= v);
        best.insert(at, (i as u32, v));
        best.truncate(n);
    }
    best
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
