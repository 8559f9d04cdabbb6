//! Attention's f32 vector operations over a KV head's cached rows (keys'
//! dots, weighted values) and `exp`, one table of builds per CPU.

#[cfg(target_arch = "aarch64")]
use super::arm;
#[cfg(target_arch = "x86_64")]
use super::x86_vec;
use super::{exp, scalar, Simd};

/// f32 vector operations: attention's over rows `j·stride..j·stride + d`
/// of a cache slice (one KV head's keys or values), and `exp`.
#[derive(Clone, Copy)]
pub struct VecOps {
    /// `out[j] = q · keys[row j]` for `j < out.len()`.
    pub dots: fn(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]),
    /// [`VecOps::dots`] of several heads' queries against the same keys:
    /// head `h`'s query is `qs[h·d..(h + 1)·d]` (`d = qs.len() /
    /// out.heads`) and its dots go to `out.head(h)`. Each head's dots are
    /// the bits `dots` gives it; a build may take the heads together,
    /// reading each key once.
    pub dots_heads: fn(qs: &[f32], keys: &[f32], stride: usize, out: HeadDots<'_>),
    /// `y += Σ_j p[j] · vals[row j]` (rows whose `p` is 0 are skipped).
    pub axpys: fn(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize),
    /// [`VecOps::axpys`] of several heads over the same rows: head `h`'s
    /// `y` is `ys[h·d..(h + 1)·d]` (`d = ys.len() / w.heads`) and its
    /// weights `w.head(h)`. Each head's values are the bits `axpys` gives
    /// it; a build may take the heads together, reading each row once.
    pub axpys_heads: fn(ys: &mut [f32], w: HeadWeights<'_>, vals: &[f32], stride: usize),
    /// `x[i] = exp(x[i])`, every build bit for bit the portable
    /// `exp::expf` (so also the same wherever a value sits in `x`).
    pub exps: fn(x: &mut [f32]),
    /// Attention's unnormalised softmax weights: `x[i] = exp(x[i]·scale −
    /// m)`, `m` the largest `x[i]·scale` (NaNs passed over), every build
    /// the bits of [`softmax_with`] and this table's `exps`.
    pub softmax: fn(x: &mut [f32], scale: f32),
}

/// [`VecOps::softmax`] as plain loops around `exps`.
pub(crate) fn softmax_with(exps: fn(&mut [f32]), x: &mut [f32], scale: f32) {
    x.iter_mut().for_each(|v| *v *= scale);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut().for_each(|v| *v -= max);
    exps(x);
}

/// Several heads' weights over the same `n` rows: head `h`'s are
/// `p[h·stride..h·stride + n]`.
#[derive(Clone, Copy, Debug)]
pub struct HeadWeights<'a> {
    /// The heads' weights, each head's `stride` after the last's.
    pub p: &'a [f32],
    /// How many heads.
    pub heads: usize,
    /// Where each head's weights start after the last's.
    pub stride: usize,
    /// Weights (rows) a head.
    pub n: usize,
}

impl<'a> HeadWeights<'a> {
    /// Head `h`'s weights.
    pub fn head(&self, h: usize) -> &'a [f32] {
        &self.p[h * self.stride..h * self.stride + self.n]
    }
}

/// Several heads' dots against the same `n` keys: head `h`'s are
/// `out[h·stride..h·stride + n]`.
#[derive(Debug)]
pub struct HeadDots<'a> {
    /// The heads' dots, each head's `stride` after the last's.
    pub out: &'a mut [f32],
    /// How many heads.
    pub heads: usize,
    /// Where each head's dots start after the last's.
    pub stride: usize,
    /// Dots (keys) a head.
    pub n: usize,
}

impl HeadDots<'_> {
    /// Head `h`'s dots.
    pub fn head(&mut self, h: usize) -> &mut [f32] {
        &mut self.out[h * self.stride..h * self.stride + self.n]
    }
}

/// [`VecOps::dots_heads`] as one `dots` call per head.
pub(crate) fn each_head_dots(dots: fn(&[f32], &[f32], usize, &mut [f32]), qs: &[f32], keys: &[f32], stride: usize, mut out: HeadDots<'_>) {
    if out.heads == 0 {
        return;
    }
    for (h, q) in qs.chunks_exact(qs.len() / out.heads).enumerate() {
        dots(q, keys, stride, out.head(h));
    }
}

/// [`VecOps::axpys_heads`] as one `axpys` call per head.
pub(crate) fn each_head(axpys: fn(&mut [f32], &[f32], &[f32], usize), ys: &mut [f32], w: HeadWeights<'_>, vals: &[f32], stride: usize) {
    if w.heads == 0 {
        return;
    }
    for (h, y) in ys.chunks_exact_mut(ys.len() / w.heads).enumerate() {
        axpys(y, w.head(h), vals, stride);
    }
}

/// `f` on each whole chunk of `N` values of `x`, then on the rest beside
/// zeros in a chunk of its own: for element-wise operations, whose value
/// at an index does not depend on where it sits (the SIMD `exps`).
#[inline(always)]
pub(crate) fn by_chunks<const N: usize>(x: &mut [f32], mut f: impl FnMut(&mut [f32; N])) {
    let mut chunks = x.chunks_exact_mut(N);
    for c in chunks.by_ref() {
        f(c.try_into().expect("chunks_exact gives N values"));
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut buf = [0f32; N];
        buf[..rest.len()].copy_from_slice(rest);
        f(&mut buf);
        rest.copy_from_slice(&buf[..rest.len()]);
    }
}

/// `x[i] = exp(x[i])` with the fastest [`VecOps::exps`] this CPU runs
/// (attention's weights, SiLU, the log-probabilities of a vocabulary's
/// logits).
pub fn exps(x: &mut [f32]) {
    static BEST: std::sync::OnceLock<fn(&mut [f32])> = std::sync::OnceLock::new();
    (BEST.get_or_init(|| VecOps::best().exps))(x)
}

/// Panics unless `n` rows of `d` values at `stride` fit in `len` values.
pub(crate) fn check_strided(d: usize, len: usize, stride: usize, n: usize) {
    assert!(n == 0 || (n - 1) * stride + d <= len, "strided rows out of bounds");
}

impl std::fmt::Debug for VecOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VecOps")
    }
}

impl VecOps {
    /// The fastest this CPU runs, within the products' build
    /// (`Simd::best`: `LMT_SIMD=avx2` also keeps attention to 256-bit
    /// registers, `portable` to plain loops).
    pub fn best() -> VecOps {
        let simd = Simd::best();
        if simd == Simd::Portable {
            return VecOps::portable();
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(v) = x86_vec::vec_ops(matches!(simd, Simd::Avx512Vnni | Simd::Avx512Pairs)) {
            return v;
        }
        // Every aarch64 CPU has NEON.
        #[cfg(target_arch = "aarch64")]
        return arm::vec_ops();
        #[cfg(not(target_arch = "aarch64"))]
        VecOps::portable()
    }

    /// Plain loops (eight independent lanes, which compilers vectorize).
    pub fn portable() -> VecOps {
        VecOps {
            dots: scalar::dots,
            dots_heads: scalar::dots_heads,
            axpys: scalar::axpys,
            axpys_heads: scalar::axpys_heads,
            exps: exp::exps,
            softmax: |x, scale| softmax_with(exp::exps, x, scale),
        }
    }
}
