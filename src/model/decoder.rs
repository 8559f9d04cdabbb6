//! The Llama-family decoder on candle ops, with a KV state lmt owns:
//! append any chunk (prefill and decode are one call), truncate to any
//! earlier length, fork by cloning, and score several continuations of one
//! prefix in one forward pass.
//!
//! The cache never writes in place: an append builds new K/V tensors from
//! the old ones, so a clone of a state is an independent fork and a
//! truncation is a narrow (a view, O(1)).

use candle_core::{DType, Device, Tensor, D};

use super::config::ModelConfig;
use super::weights::{Layer, Weights};
use super::ModelError;

/// Model weights and configuration, ready to run.
#[derive(Debug, Clone)]
pub struct Decoder {
    /// The configuration.
    pub config: ModelConfig,
    pub(crate) weights: Weights,
    pub(crate) device: Device,
    pub(crate) dtype: DType,
}

/// Counters of the work a state has cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Forward passes run.
    pub passes: u64,
    /// Tokens fed through the model (each scored option token counts).
    pub tokens: u64,
}

/// One sequence's KV cache and the tokens it holds.
#[derive(Debug, Clone)]
pub struct KvState {
    tokens: Vec<u32>,
    /// Per layer: K and V, `(1, kv_heads, len, head_dim)`.
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Logits after the last token, when known.
    last: Option<Vec<f32>>,
    /// Work done so far (a fork carries its parent's counts).
    pub stats: ForwardStats,
}

impl KvState {
    /// The tokens in the cache, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many tokens the cache holds.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing has been fed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forgets every token from `len` on (no-op when `len` ≥ the length).
    /// O(1): the K/V tensors are narrowed, not copied.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if len >= self.tokens.len() {
            return Ok(());
        }
        self.tokens.truncate(len);
        self.last = None;
        for l in &mut self.layers {
            if let Some((k, v)) = l {
                if len == 0 {
                    *l = None;
                } else {
                    *l = Some((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?));
                }
            }
        }
        Ok(())
    }

    /// An independent copy: appending to either never changes the other.
    pub fn fork(&self) -> KvState {
        self.clone()
    }
}

/// Which earlier tokens each new token attends to (besides the cache).
enum Visibility<'a> {
    /// Each token sees the tokens before it in the chunk.
    Causal,
    /// Tokens are in groups (scored options): each sees the earlier tokens
    /// of its own group only.
    Groups(&'a [u32]),
}

impl Decoder {
    /// A fresh, empty state.
    pub fn new_state(&self) -> KvState {
        KvState { tokens: Vec::new(), layers: vec![None; self.config.num_layers], last: None, stats: ForwardStats::default() }
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of weights a forward pass reads.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes
    }

    /// Feeds `tokens` and returns the logits after the last one.
    pub fn append(&self, st: &mut KvState, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return self.logits(st);
        }
        let mut rows = self.append_rows(st, tokens, &[tokens.len() - 1])?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// Feeds `tokens` and returns the logits after each token whose index
    /// (in `tokens`) is in `rows`.
    pub fn append_rows(&self, st: &mut KvState, tokens: &[u32], rows: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let start = st.tokens.len();
        let positions: Vec<usize> = (start..start + tokens.len()).collect();
        let out = self.forward(st, tokens, &positions, Visibility::Causal, rows)?;
        st.tokens.extend_from_slice(tokens);
        st.last = if rows.last() == Some(&(tokens.len() - 1)) { out.last().cloned() } else { None };
        Ok(out)
    }

    /// The logits after the last token of `st` (recomputed by re-feeding
    /// the last token when a truncation dropped them).
    pub fn logits(&self, st: &mut KvState) -> Result<Vec<f32>, ModelError> {
        if let Some(l) = &st.last {
            return Ok(l.clone());
        }
        let Some(&last) = st.tokens.last() else {
            return Err(ModelError::Runtime("no logits before the first token: feed at least one token (BOS)".into()));
        };
        st.truncate(st.tokens.len() - 1)?;
        self.append(st, &[last])
    }

    /// Log-probabilities of each token of each option given the state's
    /// tokens as prefix, all options in one forward pass; the state is left
    /// holding the prefix only.
    pub fn score(&self, st: &mut KvState, options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let first = self.logits(st)?;
        let prefix = st.tokens.len();
        let mut tokens = Vec::new();
        let mut groups = Vec::new();
        let mut positions = Vec::new();
        let mut rows = Vec::new();
        for (g, opt) in options.iter().enumerate() {
            for (i, &t) in opt.iter().enumerate() {
                // The logits after every option token but the last predict
                // the option's next token.
                if i + 1 < opt.len() {
                    rows.push(tokens.len());
                }
                tokens.push(t);
                groups.push(g as u32);
                positions.push(prefix + i);
            }
        }
        let out = if tokens.is_empty() {
            Vec::new()
        } else {
            let saved = st.last.take();
            let out = self.forward(st, &tokens, &positions, Visibility::Groups(&groups), &rows);
            // Back to the prefix whatever happened: the options were never
            // part of the sequence.
            st.tokens.extend_from_slice(&tokens);
            st.truncate(prefix)?;
            st.last = saved;
            out?
        };
        // The forward pass checked every id; each option's first token is
        // predicted by the prefix, the others by the rows in order.
        let first_lse = log_sum_exp(&first);
        let mut next = out.iter();
        Ok(options
            .iter()
            .map(|opt| {
                opt.iter()
                    .enumerate()
                    .map(|(i, &t)| match i {
                        0 => first[t as usize] - first_lse,
                        _ => next.next().map_or(f32::NAN, |row| row[t as usize] - log_sum_exp(row)),
                    })
                    .collect()
            })
            .collect())
    }

    /// One forward pass over `tokens` at `positions`, appending their K/V
    /// to the cache; the logits of `rows`.
    fn forward(
        &self,
        st: &mut KvState,
        tokens: &[u32],
        positions: &[usize],
        vis: Visibility<'_>,
        rows: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let cfg = &self.config;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ModelError::Runtime(format!("token id {t} is outside the model's vocabulary of {}", cfg.vocab_size)));
        }
        if let Some(&p) = positions.iter().max() {
            if p >= cfg.max_position_embeddings {
                return Err(ModelError::ContextFull { max: cfg.max_position_embeddings });
            }
        }
        if let Some(&r) = rows.iter().find(|&&r| r >= tokens.len()) {
            return Err(ModelError::Runtime(format!("logits row {r} asked of a chunk of {}", tokens.len())));
        }
        let dev = &self.device;
        // A failed pass must leave the cache as it was (cheap: tensors are
        // reference-counted).
        let saved = st.layers.clone();
        let x = match self.run_layers(st, tokens, positions, &vis) {
            Ok(x) => x,
            Err(e) => {
                st.layers = saved;
                return Err(e);
            }
        };
        st.stats.passes += 1;
        st.stats.tokens += tokens.len() as u64;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let idx = Tensor::new(rows.iter().map(|&r| r as u32).collect::<Vec<_>>(), dev)?;
        let h = x.squeeze(0)?.index_select(&idx, 0)?;
        let h = candle_nn::ops::rms_norm(&h, &self.weights.norm, cfg.rms_norm_eps as f32)?;
        let logits = h.apply(&self.weights.lm_head)?.to_dtype(DType::F32)?;
        Ok(logits.to_vec2::<f32>()?)
    }

    /// Embeds `tokens` and runs every layer, appending to the caches (which
    /// hold the state's tokens, not yet these).
    fn run_layers(&self, st: &mut KvState, tokens: &[u32], positions: &[usize], vis: &Visibility<'_>) -> Result<Tensor, ModelError> {
        let cfg = &self.config;
        let past = st.tokens.len();
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.weights.embed.index_select(&ids, 0)?.unsqueeze(0)?;
        let (cos, sin) = self.rope_tables(positions)?;
        let mut masks: Vec<(Option<usize>, Option<Tensor>)> = Vec::new();
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let window = cfg.windows.get(li).copied().flatten();
            let mask = match masks.iter().find(|(w, _)| *w == window) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = self.mask(past, positions, vis, window)?;
                    masks.push((window, m.clone()));
                    m
                }
            };
            x = self.layer(layer, &x, &cos, &sin, mask.as_ref(), &mut st.layers[li])?;
        }
        Ok(x)
    }

    /// cos and sin for each position, `(n, rot_dim/2)`.
    fn rope_tables(&self, positions: &[usize]) -> Result<(Tensor, Tensor), ModelError> {
        let cfg = &self.config;
        let long_from = cfg.long_rope_from();
        let half = cfg.rope.dim / 2;
        let (short, scale_s) = cfg.inv_freq(false);
        let long = (positions.iter().any(|&p| p >= long_from)).then(|| cfg.inv_freq(true));
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            let (freqs, scale) = match &long {
                Some((l, s)) if p >= long_from => (l, *s),
                _ => (&short, scale_s),
            };
            for f in freqs {
                // Angles in f32 as the reference implementations compute them.
                let a = p as f32 * f;
                cos.push(a.cos() * scale);
                sin.push(a.sin() * scale);
            }
        }
        let shape = (positions.len(), half);
        let cos = Tensor::from_vec(cos, shape, &self.device)?.to_dtype(self.dtype)?;
        let sin = Tensor::from_vec(sin, shape, &self.device)?.to_dtype(self.dtype)?;
        Ok((cos, sin))
    }

    /// The additive mask `(n, past + n)`, or `None` when every token may see
    /// everything before it (a single token with no window in reach).
    fn mask(&self, past: usize, positions: &[usize], vis: &Visibility<'_>, window: Option<usize>) -> Result<Option<Tensor>, ModelError> {
        let n = positions.len();
        let total = past + n;
        let window_bites = window.is_some_and(|w| positions.iter().max().copied().unwrap_or(0) >= w);
        if n == 1 && !window_bites {
            return Ok(None);
        }
        let mut m = vec![0f32; n * total];
        for i in 0..n {
            let pi = positions[i];
            for j in 0..total {
                let visible = if j < past {
                    true
                } else {
                    let jj = j - past;
                    jj <= i
                        && match vis {
                            Visibility::Causal => true,
                            Visibility::Groups(g) => g[jj] == g[i],
                        }
                };
                let pj = if j < past { j } else { positions[j - past] };
                let in_window = window.is_none_or(|w| pi.saturating_sub(pj) < w);
                if !(visible && in_window) {
                    m[i * total + j] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Some(Tensor::from_vec(m, (n, total), &self.device)?.to_dtype(self.dtype)?))
    }

    /// One decoder layer.
    fn layer(
        &self,
        l: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor, ModelError> {
        let cfg = &self.config;
        let eps = cfg.rms_norm_eps as f32;
        let (_, n, _) = x.dims3()?;
        let (nh, nkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let h = candle_nn::ops::rms_norm(x, &l.attn_norm, eps)?;
        let qkv = l.qkv.forward(&h)?;
        let heads = |t: &Tensor, count: usize| t.reshape((1, n, count, d))?.transpose(1, 2)?.contiguous();
        let mut q = heads(&qkv[0], nh)?;
        let mut k = heads(&qkv[1], nkv)?;
        let v = heads(&qkv[2], nkv)?;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            q = candle_nn::ops::rms_norm(&q, qn, eps)?;
            k = candle_nn::ops::rms_norm(&k, kn, eps)?;
        }
        let q = self.rotate(&q, cos, sin)?;
        let k = self.rotate(&k, cos, sin)?;
        let (k, v) = match cache.take() {
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
            None => (k, v),
        };
        *cache = Some((k.clone(), v.clone()));
        let total = k.dim(2)?;
        // Grouped-query attention without copying K/V per query head: the
        // heads sharing a K/V head are adjacent, so fold them into rows.
        let rep = nh / nkv;
        let q = q.reshape((1, nkv, rep * n, d))?;
        let att = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
        let att = match mask {
            Some(m) => att.reshape((1, nkv, rep, n, total))?.broadcast_add(m)?.reshape((1, nkv, rep * n, total))?,
            None => att,
        };
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v.contiguous()?)?; // (1, nkv, rep*n, d)
        let y = y.reshape((1, nh, n, d))?.transpose(1, 2)?.reshape((1, n, nh * d))?;
        let x = (x + l.o.forward(&y)?)?;
        let h = candle_nn::ops::rms_norm(&x, &l.mlp_norm, eps)?;
        let gu = l.gate_up.forward(&h)?;
        let act = (candle_nn::ops::silu(&gu[0])? * &gu[1])?;
        Ok((x + l.down.forward(&act)?)?)
    }

    /// Rotary embedding on the first `rope.dim` dimensions of each head.
    fn rotate(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, ModelError> {
        let rope = &self.config.rope;
        let d = self.config.head_dim;
        let apply = |t: &Tensor| {
            if rope.interleaved {
                candle_nn::rotary_emb::rope_i(t, cos, sin)
            } else {
                candle_nn::rotary_emb::rope(t, cos, sin)
            }
        };
        if rope.dim == d {
            return Ok(apply(x)?);
        }
        let rot = apply(&x.narrow(D::Minus1, 0, rope.dim)?.contiguous()?)?;
        let pass = x.narrow(D::Minus1, rope.dim, d - rope.dim)?;
        Ok(Tensor::cat(&[&rot, &pass], D::Minus1)?)
    }
}

/// `log(softmax(x))`, computed stably in f64 for the sum.
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let lse = log_sum_exp(x);
    x.iter().map(|&v| v - lse).collect()
}

/// `log(Σ exp(x))`, stably.
fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    max + sum.ln() as f32
}
