//! The decoder's forward pass as a graph of candle ops: the path for GPUs
//! (the `cuda` feature), and a second implementation the CPU runtime is
//! checked against. The cache never writes in place: an append builds new
//! K/V tensors from the old ones, so a clone is an independent fork and a
//! truncation is a narrow (a view, O(1)).

use candle_core::{DType, Device, Tensor, D};

use super::config::{ModelConfig, RopeTable};
use super::decoder::Visibility;
use super::weights::{Embed, Layer, Weights};
use super::ModelError;

/// Per layer: K and V, `(1, kv_heads, len, head_dim)`.
pub(crate) type Cache = Vec<Option<(Tensor, Tensor)>>;

/// Bytes of K/V the cache holds.
pub(crate) fn bytes(cache: &Cache) -> usize {
    cache.iter().flatten().map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes()).sum()
}

/// Keeps the first `len` positions of `cache` (a narrow, O(1)).
pub(crate) fn truncate(cache: &mut Cache, len: usize) -> Result<(), ModelError> {
    for l in cache.iter_mut() {
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

/// Weights on a candle device.
#[derive(Debug)]
pub(crate) struct Model {
    weights: Weights,
    /// The embedding table, dense.
    embed: Tensor,
    rope: RopeTable,
    device: Device,
    dtype: DType,
}

impl Model {
    pub fn new(cfg: &ModelConfig, weights: Weights, device: &Device, dtype: DType) -> Result<Model, ModelError> {
        let embed = match &weights.embed {
            Embed::Dense(t) => t.clone(),
            Embed::Quantized(q) => q.dequantize(device)?,
        };
        Ok(Model { weights, embed, rope: cfg.rope_table(), device: device.clone(), dtype })
    }

    /// Bytes of weights a decoded token reads.
    pub fn bytes(&self) -> usize {
        self.weights.bytes
    }

    #[allow(clippy::too_many_arguments)]
    /// One forward pass over `tokens` at `positions` (the cache holding
    /// `past` positions), appending their K/V to the cache; the logits of
    /// `rows`. Arguments were checked by the caller.
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        cache: &mut Cache,
        past: usize,
        tokens: &[u32],
        positions: &[usize],
        vis: &Visibility<'_>,
        rows: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let dev = &self.device;
        // A failed pass must leave the cache as it was (cheap: tensors are
        // reference-counted).
        let saved = cache.clone();
        let x = match self.run_layers(cfg, cache, past, tokens, positions, vis) {
            Ok(x) => x,
            Err(e) => {
                *cache = saved;
                return Err(e);
            }
        };
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
    fn run_layers(
        &self,
        cfg: &ModelConfig,
        cache: &mut Cache,
        past: usize,
        tokens: &[u32],
        positions: &[usize],
        vis: &Visibility<'_>,
    ) -> Result<Tensor, ModelError> {
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?.unsqueeze(0)?;
        let (cos, sin) = self.rope_tables(cfg, positions)?;
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
            x = self.layer(cfg, layer, &x, &cos, &sin, mask.as_ref(), &mut cache[li])?;
        }
        Ok(x)
    }

    /// cos and sin for each position, `(n, rot_dim/2)`.
    fn rope_tables(&self, cfg: &ModelConfig, positions: &[usize]) -> Result<(Tensor, Tensor), ModelError> {
        let half = cfg.rope.dim / 2;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        self.rope.fill(positions.iter().copied(), &mut cos, &mut sin);
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
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        cfg: &ModelConfig,
        l: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor, ModelError> {
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
        let q = rotate(cfg, &q, cos, sin)?;
        let k = rotate(cfg, &k, cos, sin)?;
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
}

/// Rotary embedding on the first `rope.dim` dimensions of each head.
fn rotate(cfg: &ModelConfig, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, ModelError> {
    let rope = &cfg.rope;
    let d = cfg.head_dim;
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

