//! x86-64 builds of attention's f32 vector operations ([`VecOps`]): the
//! keys' dots and the weighted values on AVX2 and FMA, and in 512-bit
//! registers where the CPU has AVX-512F (each value the same FMAs in the
//! same order, so every build gives the same bits), and `exp`.

use std::arch::x86_64::*;

use super::vec_ops::{by_chunks, each_head, each_head_dots, softmax_with};
use super::x86::{hsum, prefetch};
use super::{exp, HeadDots, HeadWeights, VecOps};

/// f32 vector operations for attention, when this CPU runs them; in
/// 512-bit registers where it has AVX-512F and `wide` allows them.
pub(super) fn vec_ops(wide: bool) -> Option<VecOps> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    // 512-bit keys' dots and weighted values where the CPU has them: the
    // same FMAs per value as the 256-bit loops (so the same bits), half
    // the instructions; several heads' keys and values in one pass over
    // the rows.
    Some(if wide && is_x86_feature_detected!("avx512f") {
        VecOps {
            dots: vdots512,
            dots_heads: vdots_heads512,
            axpys: vaxpys512,
            axpys_heads: vaxpys_heads512,
            exps: exps512,
            softmax: softmax512,
        }
    } else {
        VecOps {
            dots: vdots,
            dots_heads: vdots_heads,
            axpys: vaxpys,
            axpys_heads: vaxpys_heads,
            exps,
            softmax,
        }
    })
}

/// The 256-bit build of an attention op, then the 512-bit one, as far as
/// this CPU runs them (tests compare them).
#[cfg(test)]
fn builds<T>(avx2: T, avx512: T) -> Vec<T> {
    let mut all = Vec::new();
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        all.push(avx2);
        if is_x86_feature_detected!("avx512f") {
            all.push(avx512);
        }
    }
    all
}

/// Every build of [`VecOps::dots`] this CPU runs.
#[cfg(test)]
pub(super) fn dots_builds() -> Vec<fn(&[f32], &[f32], usize, &mut [f32])> {
    builds(vdots, vdots512)
}

/// Every build of [`VecOps::axpys`] this CPU runs.
#[cfg(test)]
pub(super) fn axpys_builds() -> Vec<fn(&mut [f32], &[f32], &[f32], usize)> {
    builds(vaxpys, vaxpys512)
}

/// Every build of [`VecOps::exps`] this CPU runs.
#[cfg(test)]
pub(super) fn exps_builds() -> Vec<fn(&mut [f32])> {
    builds(exps, exps512)
}

/// Every x86 build of [`VecOps::dots_heads`] this CPU runs.
#[cfg(test)]
pub(super) fn dots_heads_builds() -> Vec<fn(&[f32], &[f32], usize, HeadDots<'_>)> {
    builds(vdots_heads, vdots_heads512)
}

/// Every x86 build of [`VecOps::axpys_heads`] this CPU runs.
#[cfg(test)]
pub(super) fn axpys_heads_builds() -> Vec<fn(&mut [f32], HeadWeights<'_>, &[f32], usize)> {
    builds(vaxpys_heads, vaxpys_heads512)
}

fn exps(x: &mut [f32]) {
    // SAFETY: `vec_ops` hands this out only after detecting AVX2 and FMA;
    // the body reads and writes `x` through whole chunks of eight and a
    // stack copy of the rest.
    unsafe { exps_avx2(x) }
}

// SAFETY (callers): The CPU has AVX2 and FMA (`vec_ops` checked).
#[target_feature(enable = "avx2,fma")]
unsafe fn exps_avx2(x: &mut [f32]) {
    by_chunks::<8>(x, |c| _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))));
}

/// [`exp::expf`] of eight values: its operations lane by lane, in f64
/// four lanes at a time; lanes in its edge range take [`exp::edge`]'s
/// result where it has one.
// SAFETY (callers): The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let lo = exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let hi = exp4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
    let y = _mm256_set_m128(hi, lo);
    let top = _mm256_and_si256(_mm256_srli_epi32::<20>(_mm256_castps_si256(x)), _mm256_set1_epi32(0x7ff));
    let edge = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(exp::EDGE_TOP as i32 - 1))));
    if edge == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(xs.as_mut_ptr(), x);
    _mm256_storeu_ps(ys.as_mut_ptr(), y);
    edges(&xs, &mut ys, edge as u32);
    _mm256_loadu_ps(ys.as_ptr())
}

/// `ys[l] = exp::edge(xs[l])` for the lanes `l` set in `lanes` where it
/// has a value (the rest keep the table-and-cubic result).
fn edges(xs: &[f32], ys: &mut [f32], lanes: u32) {
    for (l, (x, y)) in xs.iter().zip(ys.iter_mut()).enumerate() {
        if lanes >> l & 1 == 1 {
            if let Some(v) = exp::edge(*x) {
                *y = v;
            }
        }
    }
}

/// The table-and-cubic part of [`exp::expf`] for four values (as f64).
// SAFETY (callers): The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp4(xd: __m256d) -> __m128 {
    let c = _mm256_set1_pd;
    let kd = _mm256_fmadd_pd(c(exp::INV_LN2_32), xd, c(exp::SHIFT));
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, c(exp::SHIFT));
    let r = _mm256_fmsub_pd(c(exp::INV_LN2_32), xd, kd);
    // Indices masked to 0..32: the gather stays inside the table.
    let t = _mm256_i64gather_epi64::<8>(exp::EXP2_TABLE.as_ptr() as *const i64, _mm256_and_si256(ki, _mm256_set1_epi64x(31)));
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(c(exp::C0), r, c(exp::C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(c(exp::C2), r, c(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

fn exps512(x: &mut [f32]) {
    // SAFETY: `vec_ops` hands this out only after detecting AVX-512F (and
    // AVX2 and FMA); the body reads and writes whole chunks of `x`, and its
    // remainder through a buffer.
    unsafe { exps_avx512(x) }
}

// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exps_avx512(x: &mut [f32]) {
    // The table in four registers: a lane's entry is two permutes and a
    // blend away, where the 256-bit build gathers it from memory.
    let table: [__m512i; 4] = std::array::from_fn(|i| _mm512_loadu_si512(exp::EXP2_TABLE.as_ptr().add(8 * i) as *const _));
    by_chunks::<16>(x, |c| _mm512_storeu_ps(c.as_mut_ptr(), exp16(_mm512_loadu_ps(c.as_ptr()), &table)));
}

/// Every x86 build of [`VecOps::softmax`] this CPU runs.
#[cfg(test)]
pub(super) fn softmax_builds() -> Vec<fn(&mut [f32], f32)> {
    builds(softmax, softmax512)
}

fn softmax(x: &mut [f32], scale: f32) {
    softmax_with(exps, x, scale)
}

fn softmax512(x: &mut [f32], scale: f32) {
    // SAFETY: `vec_ops` hands this out only after detecting AVX-512F (and
    // AVX2 and FMA); the body reads and writes whole chunks of `x`, and its
    // remainder through `by_chunks`' buffer or one value at a time.
    unsafe { softmax_avx512(x, scale) }
}

/// [`softmax_with`] in 512-bit registers: the scaled values and their
/// running maxima sixteen at a time (`vmaxps` returns its second operand
/// where either is NaN, so a NaN value is passed over as `f32::max`
/// does), then `exp16` of each value less the largest, the subtraction
/// and `exp` the same operations as the plain loops'.
// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn softmax_avx512(x: &mut [f32], scale: f32) {
    let s = _mm512_set1_ps(scale);
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut chunks = x.chunks_exact_mut(16);
    for c in chunks.by_ref() {
        let v = _mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), s);
        _mm512_storeu_ps(c.as_mut_ptr(), v);
        m = _mm512_max_ps(v, m);
    }
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), m);
    let mut max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in chunks.into_remainder() {
        *v *= scale;
        max = f32::max(max, *v);
    }
    let table: [__m512i; 4] = std::array::from_fn(|i| _mm512_loadu_si512(exp::EXP2_TABLE.as_ptr().add(8 * i) as *const _));
    let shift = _mm512_set1_ps(max);
    by_chunks::<16>(x, |c| _mm512_storeu_ps(c.as_mut_ptr(), exp16(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), shift), &table)));
}

/// [`exp8`] for sixteen values, eight f64 lanes at a time.
// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp16(x: __m512, table: &[__m512i; 4]) -> __m512 {
    let halves = [_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))];
    let [lo, hi] = halves.map(|h| _mm256_castps_pd(exp8d(_mm512_cvtps_pd(h), table)));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(lo), hi));
    let top = _mm512_and_si512(_mm512_srli_epi32::<20>(_mm512_castps_si512(x)), _mm512_set1_epi32(0x7ff));
    let edge = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(exp::EDGE_TOP as i32 - 1));
    if edge == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 16], [0f32; 16]);
    _mm512_storeu_ps(xs.as_mut_ptr(), x);
    _mm512_storeu_ps(ys.as_mut_ptr(), y);
    edges(&xs, &mut ys, u32::from(edge));
    _mm512_loadu_ps(ys.as_ptr())
}

/// [`exp4`] for eight values.
// SAFETY (callers): The CPU has AVX-512F and FMA.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn exp8d(xd: __m512d, table: &[__m512i; 4]) -> __m256 {
    let c = _mm512_set1_pd;
    let kd = _mm512_fmadd_pd(c(exp::INV_LN2_32), xd, c(exp::SHIFT));
    let ki = _mm512_castpd_si512(kd);
    let kd = _mm512_sub_pd(kd, c(exp::SHIFT));
    let r = _mm512_fmsub_pd(c(exp::INV_LN2_32), xd, kd);
    // Entry `ki & 31`: bits 0..4 pick within a pair of registers, bit 4 the pair.
    let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    let low = _mm512_permutex2var_epi64(table[0], idx, table[1]);
    let high = _mm512_permutex2var_epi64(table[2], idx, table[3]);
    let t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), low, high);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let z = _mm512_fmadd_pd(c(exp::C0), r, c(exp::C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(c(exp::C2), r, c(1.0));
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

fn vdots(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    super::check_strided(q.len(), keys.len(), stride, out.len());
    // SAFETY: `vec_ops` hands this out only after detecting AVX2 and FMA;
    // the body slices with bounds checks.
    unsafe { vdots_avx2(q, keys, stride, out) }
}

fn vaxpys(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize) {
    super::check_strided(y.len(), vals.len(), stride, p.len());
    // SAFETY: as in `vdots`.
    unsafe { vaxpys_avx2(y, p, vals, stride) }
}

fn vdots512(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    super::check_strided(q.len(), keys.len(), stride, out.len());
    // SAFETY: `vec_ops` hands this out only after detecting AVX-512F (and
    // AVX2 and FMA); the body slices with bounds checks.
    unsafe { vdots_avx512(q, keys, stride, out) }
}

fn vaxpys512(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize) {
    super::check_strided(y.len(), vals.len(), stride, p.len());
    // SAFETY: `vec_ops` hands this out only after detecting AVX-512F (and
    // AVX2 and FMA); the body slices with bounds checks.
    unsafe { vaxpys_avx512(y, p, vals, stride) }
}

fn vdots_heads(qs: &[f32], keys: &[f32], stride: usize, out: HeadDots<'_>) {
    each_head_dots(vdots, qs, keys, stride, out)
}

fn vdots_heads512(qs: &[f32], keys: &[f32], stride: usize, out: HeadDots<'_>) {
    if out.heads == 0 {
        return;
    }
    let d = qs.len() / out.heads;
    super::check_strided(d, keys.len(), stride, out.n);
    assert!((out.heads - 1) * out.stride + out.n <= out.out.len(), "heads' dots out of bounds");
    if d != 64 && d != 128 {
        return each_head_dots(vdots512, qs, keys, stride, out);
    }
    // Heads in groups of up to four (seven heads to a KV head, as in
    // Qwen2.5-0.5B, go as four and three).
    let (heads, stride_out, n) = (out.heads, out.stride, out.n);
    for first in (0..heads).step_by(4) {
        let group = (heads - first).min(4);
        let q = &qs[d * first..d * (first + group)];
        let mut o = HeadDots { out: &mut out.out[first * stride_out..], heads: group, stride: stride_out, n };
        // SAFETY: `vec_ops` hands this out only after detecting AVX-512F
        // (and AVX2 and FMA); the kernels slice with bounds checks.
        unsafe {
            match (d, group) {
                (_, 1) => vdots_avx512(q, keys, stride, o.head(0)),
                (64, 2) => vdots_heads_64_zmm::<2>(q, keys, stride, &mut o),
                (64, 3) => vdots_heads_64_zmm::<3>(q, keys, stride, &mut o),
                (64, _) => vdots_heads_64_zmm::<4>(q, keys, stride, &mut o),
                (_, 2) => vdots_heads_128_zmm::<2>(q, keys, stride, &mut o),
                (_, 3) => vdots_heads_128_zmm::<3>(q, keys, stride, &mut o),
                _ => vdots_heads_128_zmm::<4>(q, keys, stride, &mut o),
            }
        }
    }
}

/// `vdot_avx2` of `H` heads' 128-value queries against the same keys, a
/// key at a time: the key's row is loaded once for all the heads, and
/// each (head, key) dot keeps the 256-bit loop's two sums in one
/// register's halves (its FMAs in its order), then adds them and
/// reduces as `hsum` does, so the same bits.
// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA. The body asserts
// `qs.len() ≥ 128·H` before its query loads, each key's loads stay inside
// its bounds-checked row slice, and dots are stored through bounds-checked
// slices.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn vdots_heads_128_zmm<const H: usize>(qs: &[f32], keys: &[f32], stride: usize, out: &mut HeadDots<'_>) {
    assert!(qs.len() >= 128 * H);
    for j in 0..out.n {
        let row = keys[j * stride..j * stride + 128].as_ptr();
        let mut s = [_mm512_setzero_ps(); H];
        for c in 0..8 {
            let kv = _mm512_loadu_ps(row.add(16 * c));
            for h in 0..H {
                s[h] = _mm512_fmadd_ps(_mm512_loadu_ps(qs.as_ptr().add(128 * h + 16 * c)), kv, s[h]);
            }
        }
        for h in 0..H {
            let halves = _mm256_add_ps(_mm512_castps512_ps256(s[h]), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s[h]))));
            out.head(h)[j] = hsum(halves);
        }
    }
}

/// [`vdots_64_zmm`] of `H` heads' queries against the same keys, four keys
/// at a time: each key's rows are loaded once for all the heads (a lane's
/// keys outgrow the L1 cache at a couple of hundred positions, and were
/// read from L2 once a head), and each (head, key) dot is the same chain
/// of FMAs and the same reduction as the one-head loop's, so the same
/// bits. The keys past a multiple of four go through the one-head loop.
// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA. The body asserts
// `qs.len() ≥ 64·H` before its query loads, each four keys' loads stay
// inside their bounds-checked slice `keys[j·stride..(j + 3)·stride + 64]`
// (key `k`'s chunk `c` ends at `k·stride + 16c + 16`), and dots are
// stored through bounds-checked slices.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn vdots_heads_64_zmm<const H: usize>(qs: &[f32], keys: &[f32], stride: usize, out: &mut HeadDots<'_>) {
    // Plain loops over arrays: closures and `array::from_fn` here were
    // left as calls outside this function's target features.
    assert!(qs.len() >= 64 * H);
    let mut q = [[_mm512_setzero_ps(); 4]; H];
    for h in 0..H {
        for c in 0..4 {
            q[h][c] = _mm512_loadu_ps(qs.as_ptr().add(64 * h + 16 * c));
        }
    }
    let n = out.n;
    let full = n / 4 * 4;
    let mut j = 0;
    while j < full {
        let row = keys[j * stride..(j + 3) * stride + 64].as_ptr();
        // The four keys `AHEAD_POSITIONS` on (a prefetch never faults:
        // any address, past the keys too, is sound).
        for k in 0..4 {
            prefetch(row.wrapping_add((AHEAD_POSITIONS + k) * stride) as *const u8, 64 * 4);
        }
        let mut s = [[_mm512_setzero_ps(); 4]; H];
        for c in 0..4 {
            let mut kv = [_mm512_setzero_ps(); 4];
            for k in 0..4 {
                kv[k] = _mm512_loadu_ps(row.add(k * stride + 16 * c));
            }
            for h in 0..H {
                for k in 0..4 {
                    s[h][k] = _mm512_fmadd_ps(q[h][c], kv[k], s[h][k]);
                }
            }
        }
        for h in 0..H {
            let mut r = [_mm256_setzero_ps(); 4];
            for k in 0..4 {
                r[k] = _mm256_add_ps(_mm512_castps512_ps256(s[h][k]), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s[h][k]))));
            }
            _mm_storeu_ps(out.head(h)[j..j + 4].as_mut_ptr(), four(r[0], r[1], r[2], r[3]));
        }
        j += 4;
    }
    let rest = &keys[(full * stride).min(keys.len())..];
    for h in 0..H {
        vdots_64(&qs[64 * h..64 * h + 64], rest, stride, &mut out.head(h)[full..]);
    }
}

/// Positions ahead that attention's 512-bit key dots and weighted values
/// ask for. A lane's keys and values come from memory at every layer (a
/// pass's weights evict them), and the hardware's stream prefetchers,
/// which stop at each 4 KB page, left the dots waiting: 16 positions (4 KB
/// of 64-value keys) ahead cut the dots' time an item by a fifth to a
/// third in a dataset run (8 and 32 did less).
const AHEAD_POSITIONS: usize = 16;

fn vaxpys_heads(ys: &mut [f32], w: HeadWeights<'_>, vals: &[f32], stride: usize) {
    each_head(vaxpys, ys, w, vals, stride)
}

fn vaxpys_heads512(ys: &mut [f32], w: HeadWeights<'_>, vals: &[f32], stride: usize) {
    if w.heads == 0 {
        return;
    }
    let d = ys.len() / w.heads;
    super::check_strided(d, vals.len(), stride, w.n);
    // SAFETY: `vec_ops` hands this out only after detecting AVX-512F (and
    // AVX2 and FMA); the body slices with bounds checks.
    unsafe { vaxpys_heads_avx512(ys, d, w, vals, stride) }
}

/// The heads in groups that fit the 32 registers with their
/// accumulators, each group one pass over the rows.
// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA; `vals` holds
// `w.n` rows of `d` values at `stride` (`check_strided` asserted it).
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn vaxpys_heads_avx512(ys: &mut [f32], d: usize, w: HeadWeights<'_>, vals: &[f32], stride: usize) {
    let group = match d {
        64 => 4,
        128 => 2,
        _ => return each_head(vaxpys512, ys, w, vals, stride),
    };
    for (g, y) in ys.chunks_mut(group * d).enumerate() {
        let h0 = g * group;
        match (d, y.len() / d) {
            (64, 4) => vaxpys_heads_in_zmm::<4, 4>(y, std::array::from_fn(|h| w.head(h0 + h)), vals, stride),
            (64, 3) => vaxpys_heads_in_zmm::<4, 3>(y, std::array::from_fn(|h| w.head(h0 + h)), vals, stride),
            (64, 2) => vaxpys_heads_in_zmm::<4, 2>(y, std::array::from_fn(|h| w.head(h0 + h)), vals, stride),
            (128, 2) => vaxpys_heads_in_zmm::<8, 2>(y, std::array::from_fn(|h| w.head(h0 + h)), vals, stride),
            _ => vaxpys_avx512(y, w.head(h0), vals, stride),
        }
    }
}

/// [`vaxpys_in_registers`] in 512-bit registers for `H` heads at once:
/// each value the same FMA in the same row order as the 256-bit loop, so
/// the same bits; each row's values are loaded once for all the heads,
/// whose sums are independent chains of FMAs (one head's four chains wait
/// on the FMA latency, with both FMA units of a full-width 512-bit CPU
/// half idle).
// SAFETY (callers): The CPU has AVX-512F; `y.len()` is `16·N·H`; `vals`
// holds each `p[h].len()` rows of `16·N` values at `stride` (rows are
// sliced with bounds checks).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn vaxpys_heads_in_zmm<const N: usize, const H: usize>(y: &mut [f32], p: [&[f32]; H], vals: &[f32], stride: usize) {
    let mut acc = [[_mm512_setzero_ps(); N]; H];
    for (h, a) in acc.iter_mut().enumerate() {
        for (k, a) in a.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(y[16 * (N * h + k)..16 * (N * h + k) + 16].as_ptr());
        }
    }
    let n = p.iter().map(|p| p.len()).min().unwrap_or(0);
    for j in 0..n {
        let row = &vals[j * stride..j * stride + 16 * N];
        // The row `AHEAD_POSITIONS` on (a prefetch never faults).
        prefetch(row.as_ptr().wrapping_add(AHEAD_POSITIONS * stride) as *const u8, 64 * N);
        let v: [__m512; N] = std::array::from_fn(|k| _mm512_loadu_ps(row.as_ptr().add(16 * k)));
        for (a, p) in acc.iter_mut().zip(&p) {
            let pj = p[j];
            if pj != 0.0 {
                let pv = _mm512_set1_ps(pj);
                for (a, v) in a.iter_mut().zip(&v) {
                    *a = _mm512_fmadd_ps(pv, *v, *a);
                }
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (k, a) in a.iter().enumerate() {
            _mm512_storeu_ps(y[16 * (N * h + k)..16 * (N * h + k) + 16].as_mut_ptr(), *a);
        }
    }
}

// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA (`vec_ops` checked); slices are indexed with bounds checks.
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn vaxpys_avx512(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize) {
    match y.len() {
        // One head of the heads' loop: 512-bit registers take half the
        // instructions of the 256-bit loop, which is what bounds it once
        // a lane's values sit in L2 (≈ 20 % faster at 190 positions).
        64 => vaxpys_heads_in_zmm::<4, 1>(y, [p], vals, stride),
        128 => vaxpys_heads_in_zmm::<8, 1>(y, [p], vals, stride),
        _ => vaxpys_avx2(y, p, vals, stride),
    }
}

// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA (`vec_ops` checked); slices are indexed with bounds checks.
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn vdots_avx512(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    if q.len() == 64 {
        return vdots_64_zmm(q, keys, stride, out);
    }
    vdots_avx2(q, keys, stride, out)
}

/// [`vdots_64`] in 512-bit registers, eight keys at a time: a register's
/// low half runs the 256-bit loop's first sum and its high half the
/// second, the same FMAs in the same order, so the same bits. Eight keys
/// are eight independent chains of four FMAs, enough to keep both FMA
/// units busy on CPUs with full-width 512-bit units (AMD Zen 5).
// SAFETY (callers): The CPU has AVX-512F, AVX2 and FMA; `q.len()` is 64
// and `keys` holds `out.len()` rows at `stride` (`check_strided` asserted
// it; rows are sliced with bounds checks).
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn vdots_64_zmm(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    let qv: [__m512; 4] = std::array::from_fn(|k| _mm512_loadu_ps(q[16 * k..16 * k + 16].as_ptr()));
    let sums = |j: usize| {
        let row = &keys[j * stride..j * stride + 64];
        let mut s = _mm512_setzero_ps();
        for (k, qk) in qv.iter().enumerate() {
            s = _mm512_fmadd_ps(*qk, _mm512_loadu_ps(row[16 * k..16 * k + 16].as_ptr()), s);
        }
        s
    };
    let halves = |s: __m512| _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s))));
    let done = out.len() / 8 * 8;
    let mut eights = out.chunks_exact_mut(8);
    for (i, o) in eights.by_ref().enumerate() {
        let s: [__m512; 8] = std::array::from_fn(|k| sums(8 * i + k));
        let h: [__m256; 8] = std::array::from_fn(|k| halves(s[k]));
        _mm_storeu_ps(o.as_mut_ptr(), four(h[0], h[1], h[2], h[3]));
        _mm_storeu_ps(o.as_mut_ptr().add(4), four(h[4], h[5], h[6], h[7]));
    }
    vdots_64(q, &keys[(done * stride).min(keys.len())..], stride, eights.into_remainder());
}

// SAFETY (callers): The CPU has AVX2 and FMA (`vec_ops` checked); slices are indexed with bounds checks.
#[target_feature(enable = "avx2,fma")]
unsafe fn vdots_avx2(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    let d = q.len();
    if d == 64 {
        return vdots_64(q, keys, stride, out);
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = vdot_avx2(q, &keys[j * stride..j * stride + d]);
    }
}

// SAFETY (callers): The CPU has AVX2 and FMA (`vec_ops` checked); slices are indexed with bounds checks.
#[target_feature(enable = "avx2,fma")]
unsafe fn vaxpys_avx2(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize) {
    let d = y.len();
    match d {
        64 => return vaxpys_in_registers::<8>(y, p, vals, stride),
        128 => return vaxpys_in_registers::<16>(y, p, vals, stride),
        _ => {}
    }
    for (j, &pj) in p.iter().enumerate() {
        if pj != 0.0 {
            vaxpy_avx2(y, pj, &vals[j * stride..j * stride + d]);
        }
    }
}

/// `vdots` for 64-value heads: the query in registers, four rows at a
/// time reduced together (one horizontal reduction for four dots); the
/// rows past a multiple of four one by one.
// SAFETY (callers): The CPU has AVX2 and FMA; `q.len()` is 64 and `keys`
// holds `out.len()` rows at `stride` (`check_strided` asserted it; rows
// are sliced with bounds checks).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn vdots_64(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    let qv: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(q[8 * k..8 * k + 8].as_ptr()));
    let dot = |j: usize| {
        let row = &keys[j * stride..j * stride + 64];
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for k in (0..8).step_by(2) {
            s0 = _mm256_fmadd_ps(qv[k], _mm256_loadu_ps(row.as_ptr().add(8 * k)), s0);
            s1 = _mm256_fmadd_ps(qv[k + 1], _mm256_loadu_ps(row.as_ptr().add(8 * k + 8)), s1);
        }
        _mm256_add_ps(s0, s1)
    };
    let full = out.len() / 4 * 4;
    let mut fours = out.chunks_exact_mut(4);
    for (i, o) in fours.by_ref().enumerate() {
        let j = 4 * i;
        _mm_storeu_ps(o.as_mut_ptr(), four(dot(j), dot(j + 1), dot(j + 2), dot(j + 3)));
    }
    let zero = _mm256_setzero_ps();
    for (j, o) in fours.into_remainder().iter_mut().enumerate() {
        *o = _mm_cvtss_f32(four(dot(full + j), zero, zero, zero));
    }
}

/// `vaxpys` for a head of `8·N` values: `y` stays in registers across the
/// rows (the same operations in the same order as one row at a time,
/// without a store and reload of `y` per row).
// SAFETY (callers): The CPU has AVX2 and FMA; `y.len()` is `8·N`; `vals`
// holds `p.len()` rows of `y.len()` values at `stride` (`check_strided`
// asserted it; rows are sliced with bounds checks).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn vaxpys_in_registers<const N: usize>(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize) {
    let mut acc = [_mm256_setzero_ps(); N];
    for (k, a) in acc.iter_mut().enumerate() {
        *a = _mm256_loadu_ps(y[8 * k..8 * k + 8].as_ptr());
    }
    for (j, &pj) in p.iter().enumerate() {
        if pj != 0.0 {
            let pv = _mm256_set1_ps(pj);
            let row = &vals[j * stride..j * stride + 8 * N];
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pv, _mm256_loadu_ps(row.as_ptr().add(8 * k)), *a);
            }
        }
    }
    for (k, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(y[8 * k..8 * k + 8].as_mut_ptr(), *a);
    }
}

/// Four dots' eight-lane sums reduced together. Each dot's lanes meet
/// only each other, so the rows past a multiple of four go through the
/// same additions beside zeros and a key's dot does not depend on how
/// many keys there are (a sequence's numbers stay the same whatever else
/// shares its pass).
// SAFETY (callers): The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn four(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))
}

// SAFETY (callers): The CPU has AVX2 and FMA; `b` holds at least `a.len()` values (callers slice it so).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn vdot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), _mm256_loadu_ps(b.as_ptr().add(i + 8)), s1);
        i += 16;
    }
    if i + 8 <= n {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(s0, s1));
    while i < n {
        sum += a[i] * b[i];
        i += 1;
    }
    sum
}

// SAFETY (callers): The CPU has AVX2 and FMA; `x` holds at least `y.len()` values (callers slice it so).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn vaxpy_avx2(y: &mut [f32], p: f32, x: &[f32]) {
    let n = y.len();
    let pv = _mm256_set1_ps(p);
    let mut i = 0;
    while i + 8 <= n {
        let yp = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(yp, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(yp)));
        i += 8;
    }
    while i < n {
        y[i] += p * x[i];
        i += 1;
    }
}
