//! The decoder's forward pass on the CPU, on lmt's own kernels: weights as
//! the file stores them ([`QMatrix`]), f32 activations in buffers reused
//! from pass to pass, a KV cache per sequence written in place, fused
//! norm/rope/attention/SiLU loops, and one persistent thread pool.
//!
//! A pass takes several sequences at once ([`Seg`]): their tokens go
//! through every matrix together (one read of the weights for all), and
//! attention reads each sequence's own cache.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Tensor};

use super::config::{ModelConfig, RopeTable};
use super::kv::Cache;
use super::kernels::{release_free_memory, sum_f64, Arena, Disjoint, Input, Pool, QMatrix, QType, Scratch, VecOps};
use super::weights::{self, Embed, Linear, Proj, Weights};
use super::ModelError;

/// Matrices that read the same input, as one (fused) or several whose
/// outputs are laid side by side.
#[derive(Debug)]
enum Projection {
    Fused(QMatrix),
    Split(Vec<QMatrix>),
}

impl Projection {
    fn rows(&self) -> usize {
        match self {
            Projection::Fused(m) => m.rows(),
            Projection::Split(ms) => ms.iter().map(QMatrix::rows).sum(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Projection::Fused(m) => m.bytes(),
            Projection::Split(ms) => ms.iter().map(QMatrix::bytes).sum(),
        }
    }

    fn matmul(&self, pool: &Pool, x: Input<'_>, n: usize, out: &mut [f32], part: &mut Vec<f32>, scratch: &mut Scratch) {
        match self {
            Projection::Fused(m) => m.matmul_from(pool, x, n, out, scratch),
            Projection::Split(ms) => {
                let width = self.rows();
                let mut start = 0;
                for m in ms {
                    part.resize(n * m.rows(), 0.0);
                    m.matmul_from(pool, x, n, part, scratch);
                    for t in 0..n {
                        out[t * width + start..t * width + start + m.rows()]
                            .copy_from_slice(&part[t * m.rows()..(t + 1) * m.rows()]);
                    }
                    start += m.rows();
                }
            }
        }
    }
}

/// One decoder layer, its matrices in the kernels' layout.
#[derive(Debug)]
pub(crate) struct Layer {
    attn_norm: Vec<f32>,
    qkv: Projection,
    qkv_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: QMatrix,
    mlp_norm: Vec<f32>,
    gate_up: Projection,
    down: QMatrix,
}

/// Activation buffers, reused by every pass.
#[derive(Debug, Default)]
struct Bufs {
    x: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    gu: Vec<f32>,
    part: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Per token of the pass (its row): (segment, index in segment).
    tokens: Vec<(usize, usize)>,
    scratch: Scratch,
    /// Per thread: attention scores.
    scores: Vec<Mutex<Vec<f32>>>,
}

/// A model ready to run on the CPU.
#[derive(Debug)]
pub(crate) struct Model {
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None`: tied to the embedding table.
    lm_head: Option<QMatrix>,
    pool: Pool,
    ops: VecOps,
    bufs: Mutex<Bufs>,
    rope: RopeTable,
    /// Weight bytes read per decoded token.
    pub bytes: usize,
}

/// One sequence's part of a pass.
pub(crate) struct Seg<'a> {
    pub cache: &'a mut Cache,
    /// Positions already in the cache.
    pub past: usize,
    pub tokens: &'a [u32],
    pub positions: &'a [usize],
    /// Scored options: each token sees the earlier tokens of its own group.
    pub groups: Option<&'a [u32]>,
    /// Tokens (indices in `tokens`) whose logits are wanted.
    pub rows: &'a [usize],
}

/// A matrix of the model, its bytes written into `arena` (or its own,
/// for a part that is joined to others later).
fn matrix(m: &QMatMul, name: &str, arena: Option<&mut Arena>) -> Result<QMatrix, ModelError> {
    let bad = |e: String| ModelError::Weights(format!("tensor `{name}`: {e}"));
    match m {
        QMatMul::QTensor(q) => qtensor(q, name, arena),
        QMatMul::Tensor(t) | QMatMul::TensorF16(t) => dense(t, arena).map_err(bad),
    }
}

fn qtensor(q: &QTensor, name: &str, arena: Option<&mut Arena>) -> Result<QMatrix, ModelError> {
    let bad = |e: String| ModelError::Weights(format!("tensor `{name}`: {e}"));
    let (rows, cols) = q.shape().dims2()?;
    match QType::from_ggml(q.dtype()) {
        Some(ty) => new_matrix(arena, ty, rows, cols, q.data()?).map_err(bad),
        // Types without kernels of ours (Q8_1, Q8_K: activation formats,
        // which llama.cpp's quantizer never writes as weights) run as f16.
        None => dense(&q.dequantize(&candle_core::Device::Cpu)?.to_dtype(DType::F16)?, arena).map_err(bad),
    }
}

/// A 2-D candle tensor as a dense matrix of its own 16- or 32-bit type.
fn dense(t: &Tensor, arena: Option<&mut Arena>) -> Result<QMatrix, String> {
    let (rows, cols) = t.dims2().map_err(|e| e.to_string())?;
    let flat = t.flatten_all().map_err(|e| e.to_string())?;
    let (ty, data): (QType, Vec<u8>) = match t.dtype() {
        DType::F16 => {
            (QType::F16, flat.to_vec1::<half::f16>().map_err(|e| e.to_string())?.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
        DType::BF16 => (
            QType::BF16,
            flat.to_vec1::<half::bf16>().map_err(|e| e.to_string())?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        _ => (
            QType::F32,
            flat.to_dtype(DType::F32)
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(|e| e.to_string())?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
    };
    new_matrix(arena, ty, rows, cols, data)
}

/// [`QMatrix::new_in`] `arena`, or [`QMatrix::new`] without one.
fn new_matrix<'a>(
    arena: Option<&mut Arena>,
    ty: QType,
    rows: usize,
    cols: usize,
    data: impl Into<std::borrow::Cow<'a, [u8]>>,
) -> Result<QMatrix, String> {
    match arena {
        Some(arena) => QMatrix::new_in(arena, ty, rows, cols, &data.into()),
        None => QMatrix::new(ty, rows, cols, data),
    }
}

/// The output rows of a loaded matrix (without converting it).
fn rows(m: &QMatMul) -> Result<usize, ModelError> {
    Ok(match m {
        QMatMul::QTensor(q) => q.shape().dims2()?.0,
        QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims2()?.0,
    })
}

fn vector(t: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

fn proj(p: &Proj, name: &str, arena: &mut Arena) -> Result<(Projection, Option<Vec<f32>>), ModelError> {
    let bias = |ls: &[&Linear]| -> Result<Option<Vec<f32>>, ModelError> {
        if ls.iter().all(|l| l.b.is_none()) {
            return Ok(None);
        }
        let mut out = Vec::new();
        for l in ls {
            match &l.b {
                Some(b) => out.extend(vector(b)?),
                None => out.extend(std::iter::repeat_n(0.0, rows(&l.w)?)),
            }
        }
        Ok(Some(out))
    };
    Ok(match p {
        Proj::Fused(l, _) => (Projection::Fused(matrix(&l.w, name, Some(arena))?), bias(&[l])?),
        Proj::Split(ls) => {
            let parts: Vec<QMatrix> = ls.iter().map(|l| matrix(&l.w, name, None)).collect::<Result<_, _>>()?;
            // One matrix when the parts allow it (GGUF stores q, k, v apart):
            // one pass of the pool instead of one per part, and no copies.
            let proj = match QMatrix::concat_in(arena, &parts) {
                Some(m) => Projection::Fused(m),
                None => Projection::Split(parts.into_iter().map(|m| m.place(arena)).collect()),
            };
            (proj, bias(&ls.iter().collect::<Vec<_>>())?)
        }
    })
}

impl Layer {
    /// Layer `i` of loaded weights, its matrices written into `arena`.
    pub(crate) fn convert(i: usize, l: &weights::Layer, arena: &mut Arena) -> Result<Layer, ModelError> {
        let (qkv, qkv_bias) = proj(&l.qkv, &format!("layer {i} q/k/v"), arena)?;
        let (gate_up, _) = proj(&l.gate_up, &format!("layer {i} gate/up"), arena)?;
        Ok(Layer {
            attn_norm: vector(&l.attn_norm)?,
            qkv,
            qkv_bias,
            q_norm: l.q_norm.as_ref().map(vector).transpose()?,
            k_norm: l.k_norm.as_ref().map(vector).transpose()?,
            o: matrix(&l.o.w, &format!("layer {i} attention output"), Some(&mut *arena))?,
            mlp_norm: vector(&l.mlp_norm)?,
            gate_up,
            down: matrix(&l.down.w, &format!("layer {i} down"), Some(arena))?,
        })
    }
}

impl Model {
    /// The CPU model of loaded weights, converted one layer at a time and
    /// each layer's loaded tensors freed once copied, so loading peaks near
    /// the size of the weights plus one layer, not twice the weights.
    pub fn new(cfg: &ModelConfig, mut w: Weights, threads: usize) -> Result<Model, ModelError> {
        // Every matrix's bytes go into one arena, backed by huge pages
        // where the system gives them.
        let mut arena = Arena::new();
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in std::mem::take(&mut w.layers).into_iter().enumerate() {
            layers.push(Layer::convert(i, &l, &mut arena)?);
            // The freed tensors sit in holes of the heap that later
            // allocations may not fill: handed back to the system.
            drop(l);
            release_free_memory();
        }
        Model::assemble(cfg, w, layers, arena, threads)
    }

    /// The CPU model of converted `layers` and the other loaded weights
    /// (whose `layers` it ignores), their matrices written into `arena`.
    pub fn assemble(cfg: &ModelConfig, w: Weights, layers: Vec<Layer>, mut arena: Arena, threads: usize) -> Result<Model, ModelError> {
        let Weights { embed, norm, lm_head, .. } = w;
        let embed = match embed {
            Embed::Quantized(q) => qtensor(&q, "token_embd.weight", Some(&mut arena))?,
            Embed::Dense(t) => dense(&t, Some(&mut arena)).map_err(|e| ModelError::Weights(format!("embedding table: {e}")))?,
        };
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(matrix(&lm_head, "lm_head", Some(&mut arena))?) };
        let bytes = layers.iter().map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes()).sum::<usize>()
            + lm_head.as_ref().unwrap_or(&embed).bytes();
        release_free_memory();
        let pool = Pool::new(threads);
        let bufs = Bufs { scores: (0..pool.threads()).map(|_| Mutex::new(Vec::new())).collect(), ..Bufs::default() };
        Ok(Model {
            embed,
            layers,
            norm: vector(&norm)?,
            lm_head,
            pool,
            ops: VecOps::best(),
            bufs: Mutex::new(bufs),
            rope: cfg.rope_table(),
            bytes,
        })
    }

    /// Threads a pass runs on.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// The pool's workers sleep until the next pass (see [`Pool::rest`]).
    pub fn rest(&self) {
        self.pool.rest();
    }

    /// The pool's workers spin for a pass that comes soon (see [`Pool::ready`]).
    pub fn ready(&self) {
        self.pool.ready();
    }

    /// Runs the segments' tokens through the model, appending their K/V to
    /// their caches; the logits of each segment's `rows`.
    pub fn forward(&self, cfg: &ModelConfig, segs: &mut [Seg<'_>]) -> Vec<Vec<Vec<f32>>> {
        let mut guard = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let b = &mut *guard;
        let h = cfg.hidden_size;
        let n: usize = segs.iter().map(|s| s.tokens.len()).sum();
        b.x.clear();
        for s in segs.iter() {
            for &t in s.tokens {
                b.x.extend(self.embed.row_f32(t as usize));
            }
        }
        self.rope.fill(segs.iter().flat_map(|s| s.positions.iter().copied()), &mut b.cos, &mut b.sin);
        b.tokens.clear();
        for (si, s) in segs.iter().enumerate() {
            b.tokens.extend((0..s.tokens.len()).map(|i| (si, i)));
        }
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention_block(cfg, li, layer, segs, n, b);
            self.mlp_block(cfg, layer, n, b);
        }
        // Final norm and logits for the wanted rows only.
        let mut picked = Vec::new();
        let mut base = 0;
        for s in segs.iter() {
            for &r in s.rows {
                picked.extend_from_slice(&b.x[(base + r) * h..(base + r + 1) * h]);
            }
            base += s.tokens.len();
        }
        let nr = picked.len() / h;
        let mut normed = vec![0f32; picked.len()];
        rms_norm(&picked, &self.norm, cfg.rms_norm_eps, &mut normed, h);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits: Vec<Vec<f32>> = (0..nr).map(|_| vec![0f32; head.rows()]).collect();
        head.matmul_rows(&self.pool, &normed, &mut logits, &mut b.scratch);
        let mut rows = logits.into_iter();
        segs.iter().map(|s| s.rows.iter().map(|_| rows.next().unwrap_or_default()).collect()).collect()
    }

    fn attention_block(&self, cfg: &ModelConfig, li: usize, l: &Layer, segs: &mut [Seg<'_>], n: usize, b: &mut Bufs) {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let (qn, kvn) = (nh * d, nkv * d);
        let width = qn + 2 * kvn;
        b.qkv.resize(n * width, 0.0);
        let (x, eps) = (&b.x, cfg.rms_norm_eps);
        let normed = |t: usize, row: &mut [f32]| rms_norm(&x[t * h..(t + 1) * h], &l.attn_norm, eps, row, h);
        // The caches' next positions arrive while the projection runs.
        for s in segs.iter() {
            s.cache.prefetch_push(li, nkv);
        }
        l.qkv.matmul(&self.pool, Input::Made(&normed), n, &mut b.qkv, &mut b.part, &mut b.scratch);
        let half = cfg.rope.dim / 2;
        let (cos, sin) = (&b.cos, &b.sin);
        for i in 0..n {
            let row = &mut b.qkv[i * width..(i + 1) * width];
            if let Some(bias) = &l.qkv_bias {
                row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
            }
            let (q, kv) = row.split_at_mut(qn);
            let k = &mut kv[..kvn];
            for (heads, norm) in [(&mut *q, &l.q_norm), (&mut *k, &l.k_norm)] {
                for head in heads.chunks_exact_mut(d) {
                    if let Some(w) = norm {
                        rms_norm_in_place(head, w, cfg.rms_norm_eps);
                    }
                    rotate(head, &cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half], cfg.rope.interleaved);
                }
            }
        }
        // The new K/V join each sequence's cache before attention reads it.
        let mut base = 0;
        for s in segs.iter_mut() {
            for i in 0..s.tokens.len() {
                let row = &b.qkv[(base + i) * width..(base + i + 1) * width];
                s.cache.push(li, &row[qn..qn + kvn], &row[qn + kvn..]);
            }
            base += s.tokens.len();
        }
        b.att.resize(n * qn, 0.0);
        self.attend(cfg, li, segs, &b.tokens, &b.qkv, &mut b.att, &b.scores);
        l.o.matmul_add(&self.pool, Input::Rows(&b.att), n, &mut b.x, &mut b.scratch);
    }

    /// Attention of every (token, head) of the pass, spread over the pool.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        cfg: &ModelConfig,
        li: usize,
        segs: &[Seg<'_>],
        items: &[(usize, usize)],
        qkv: &[f32],
        out: &mut [f32],
        scores: &[Mutex<Vec<f32>>],
    ) {
        let d = cfg.head_dim;
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let (qn, kvn, rep) = (nh * d, nkv * d, nh / nkv);
        let width = qn + 2 * kvn;
        let window = cfg.windows.get(li).copied().flatten();
        let scale = 1.0 / (d as f32).sqrt();
        // Work items: token × a run of query heads. A run is all the heads
        // that read one KV head (its keys and values come from memory
        // once), unless that leaves a thread without an item (a single
        // token's three KV heads on two threads, one taking two, beat its
        // nine query heads shared out, each thread then reading the lanes
        // of the heads it took: BENCHMARKS.md). Items of one run are taken
        // token after token, so tokens whose sequences share a frozen
        // prefix (a dataset's rows) read its keys and values while they
        // are still in cache.
        let per = if items.len() * nkv >= self.pool.threads() { rep } else { 1 };
        let runs = nh / per;
        let next = AtomicUsize::new(0);
        let total_items = items.len() * runs;
        let dst = Disjoint::new(out);
        self.pool.run(&|thread| {
            let mut sc = scores[thread].lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let w = next.fetch_add(1, Ordering::Relaxed);
                if w >= total_items {
                    break;
                }
                let row = w % items.len();
                let (si, i) = items[row];
                let first = w / items.len() * per;
                let s = &segs[si];
                let kv = s.cache.lane(li * nkv + first / rep);
                // Every head's dots, then its weights, then every head's
                // values: the lane's keys, then its values, are read from
                // memory once for all its heads (one head's keys alone
                // outgrow the L1 cache at a couple of hundred positions).
                let hi = s.past + i + 1;
                kv.prefetch_own(hi);
                // The dots overwrite every score: no clearing first.
                sc.resize(per * hi, 0.0);
                let qs = &qkv[row * width + first * d..row * width + (first + per) * d];
                kv.dots_heads(&self.ops, qs, per, &mut sc);
                for p in sc.chunks_exact_mut(hi) {
                    self.weights(s, i, scale, window, p);
                }
                // SAFETY: work item `w` alone writes its heads' slices of
                // this token's output row.
                let ys = unsafe { dst.slice(row * qn + first * d, per * d) };
                ys.fill(0.0);
                kv.axpys_heads(&self.ops, ys, per, &sc);
                for (ys, p) in ys.chunks_mut(4 * d).zip(sc.chunks(4 * hi)) {
                    for (y, sum) in ys.chunks_exact_mut(d).zip(weight_sums(p, hi)) {
                        let inv = 1.0 / sum;
                        y.iter_mut().for_each(|v| *v *= inv);
                    }
                }
            }
        });
    }

    /// One head of token `i` of `s`: its dots with the keys in `sc` (one
    /// per position) become the unnormalised softmax weights of its scaled
    /// scores against the visible positions.
    fn weights(&self, s: &Seg<'_>, i: usize, scale: f32, window: Option<usize>, sc: &mut [f32]) {
        // Later tokens of the chunk are never visible.
        let pi = s.positions[i];
        let (cached, chunk) = sc.split_at_mut(s.past);
        if let Some(w) = window {
            for (j, v) in cached.iter_mut().enumerate() {
                if pi.saturating_sub(j) >= w {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        for (jj, v) in chunk.iter_mut().enumerate() {
            let visible = s.groups.is_none_or(|g| g[jj] == g[i])
                && window.is_none_or(|w| pi.saturating_sub(s.positions[jj]) < w);
            if !visible {
                *v = f32::NEG_INFINITY;
            }
        }
        // The scale is positive, so hidden positions stay at -inf, and
        // exp(-inf) = 0: they weigh nothing.
        (self.ops.softmax)(sc, scale);
    }

    fn mlp_block(&self, cfg: &ModelConfig, l: &Layer, n: usize, b: &mut Bufs) {
        let (h, m) = (cfg.hidden_size, cfg.intermediate_size);
        b.gu.resize(n * 2 * m, 0.0);
        let (x, eps) = (&b.x, cfg.rms_norm_eps);
        let normed = |t: usize, row: &mut [f32]| rms_norm(&x[t * h..(t + 1) * h], &l.mlp_norm, eps, row, h);
        l.gate_up.matmul(&self.pool, Input::Made(&normed), n, &mut b.gu, &mut b.part, &mut b.scratch);
        let gu = &b.gu;
        let ops = &self.ops;
        let act = |t: usize, row: &mut [f32]| {
            let (g, u) = gu[t * 2 * m..(t + 1) * 2 * m].split_at(m);
            // SiLU(g)·u = g / (1 + exp(-g)) · u.
            row.iter_mut().zip(g).for_each(|(a, &g)| *a = -g);
            (ops.exps)(row);
            for ((a, &g), &u) in row.iter_mut().zip(g).zip(u) {
                *a = g / (1.0 + *a) * u;
            }
        };
        l.down.matmul_add(&self.pool, Input::Made(&act), n, &mut b.x, &mut b.scratch);
    }
}

/// Each of up to four heads' weights summed (`hi` a head, one after the
/// other in `p`), every head's sum in position order as one loop would
/// add them: the heads' chains side by side, so that their adds do not
/// wait on each other's latency. Lanes past the heads are 0.
fn weight_sums(p: &[f32], hi: usize) -> [f32; 4] {
    fn side<const H: usize>(p: &[f32], hi: usize) -> [f32; 4] {
        let heads: [&[f32]; H] = std::array::from_fn(|h| &p[h * hi..(h + 1) * hi]);
        let mut sums = [0f32; 4];
        for j in 0..hi {
            for h in 0..H {
                sums[h] += heads[h][j];
            }
        }
        sums
    }
    match p.len() / hi.max(1) {
        0 => [0.0; 4],
        1 => side::<1>(p, hi),
        2 => side::<2>(p, hi),
        3 => side::<3>(p, hi),
        _ => side::<4>(p, hi),
    }
}

/// RMSNorm of each `dim`-row of `x` into `out` (sums of squares in f64).
fn rms_norm(x: &[f32], w: &[f32], eps: f64, out: &mut [f32], dim: usize) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let inv = rms_scale(xr, eps);
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// RMSNorm of one row in place (q/k norms of a head).
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f64) {
    let inv = rms_scale(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= inv * g;
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the sum in f64 ([`sum_f64`]; each square
/// is exact in f64).
fn rms_scale(x: &[f32], eps: f64) -> f32 {
    let ss = sum_f64(x, |v| f64::from(v) * f64::from(v));
    (1.0 / (ss / x.len() as f64 + eps).sqrt()) as f32
}

/// Rotary embedding of one head on its first `2·cos.len()` values:
/// adjacent pairs (interleaved, llama.cpp's GGUF layout) or halves (NeoX).
// Written as zipped slices, one loop per layout: no bounds checks or
// branch in the loop, so the compiler vectorises it.
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = cos.len();
    let turn = |x0: f32, x1: f32, c: f32, s: f32| (x0 * c - x1 * s, x0 * s + x1 * c);
    if interleaved {
        for ((p, &c), &s) in x[..2 * half].chunks_exact_mut(2).zip(cos).zip(sin) {
            (p[0], p[1]) = turn(p[0], p[1], c, s);
        }
    } else {
        let (lo, hi) = x[..2 * half].split_at_mut(half);
        for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
            (*a, *b) = turn(*a, *b, c, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::weight_sums;

    /// The heads' sums side by side are each head's own sum in position
    /// order, bit for bit, for one to four heads.
    #[test]
    fn weight_sums_are_each_heads_sum_in_order() {
        for hi in [1, 2, 7, 190] {
            for heads in 1..=4 {
                let p: Vec<f32> = (0..heads * hi).map(|i| ((i * 7919 % 1013) as f32 * 0.37).sin().abs() * 10f32.powi((i % 7) as i32 - 3)).collect();
                let got = weight_sums(&p, hi);
                for (h, sum) in got.iter().enumerate() {
                    let want = if h < heads { p[h * hi..(h + 1) * hi].iter().fold(0f32, |s, &v| s + v) } else { 0.0 };
                    assert_eq!(sum.to_bits(), want.to_bits(), "hi={hi} heads={heads} head {h}");
                }
            }
        }
    }
}
