//! Portable kernels: activation quantizers and dot products of one weight
//! row with one activation row, for every [`QType`](super::QType), written
//! for clarity. They are the fallback on CPUs without AVX2 and the
//! specification the SIMD kernels are tested against.
//!
//! Byte layouts are GGUF's (ggml's `block_*` structs, little-endian):
//! `Q4_0` d·f16 qs[16] · `Q4_1` d m qs[16] · `Q5_0` d qh[4] qs[16] ·
//! `Q5_1` d m qh[4] qs[16] · `Q8_0` d qs[32]·i8 (32 values a block);
//! `Q2_K` scales[16] qs[64] d dmin · `Q3_K` hmask[32] qs[64] scales[12] d ·
//! `Q4_K` d dmin scales[12] qs[128] · `Q5_K` d dmin scales[12] qh[32]
//! qs[128] · `Q6_K` ql[128] qh[64] scales[16]·i8 d (256 values a block).
//! Activations are lmt's own (never stored): `Q8_0O` d·f32 (−k·Σq)·i32
//! qs[32] for `Q4_0` (k = 8), `Q5_0` (k = 16) and `Q8_0` (k = 128, for its
//! interleaved rows, stored unsigned: `interleave.rs`), whose weights'
//! offset k then folds into exact integer sums, and
//! `Q8_1` d·f32 s·f32 qs[32] with s = d·Σq, whose d and s are rounded to
//! f16 as llama.cpp's are but kept as f32, so no kernel converts them;
//! `Q8_K` d·f32 qs[256] bsums[16]·i16 as in ggml.

use half::{bf16, f16};

/// The f16 at `b[off..off + 2]`, widened.
#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// The f32 at `b[off..off + 4]`.
#[inline]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The i32 at `b[off..off + 4]`.
#[inline]
pub(crate) fn i32_at(b: &[u8], off: usize) -> i32 {
    i32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// `v` rounded to f16 precision, stored as f32.
fn put_f16_as_f32(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 4].copy_from_slice(&f16::from_f32(v).to_f32().to_le_bytes());
}

/// The 8-bit activation layouts of 32-value blocks (see the module
/// comment): each block is its scale, a second field about the sum of its
/// values, then the 32 values (40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Q8Layout {
    /// `Q8_0O`: d, −k·Σq as an i32, qs: the start of an exact
    /// `Σ(q_w − k)·q_a` over unsigned weights stored `k` above their value
    /// (kernels of signed weights skip it).
    Offset(i32),
    /// `Q8_1`: d, d·Σq rounded to f16 from the unrounded d (40 bytes), as
    /// llama.cpp's.
    Sum16,
}

/// Bytes of a block in either [`Q8Layout`].
pub(crate) const Q8_BLOCK_BYTES: usize = 40;

impl Q8Layout {
    /// The second field of a block whose values sum to `sum`, from its
    /// unrounded scale `d`.
    #[inline]
    pub(crate) fn second(self, d: f32, sum: i32) -> [u8; 4] {
        match self {
            Q8Layout::Offset(k) => (-k * sum).to_le_bytes(),
            Q8Layout::Sum16 => f16::from_f32(d * sum as f32).to_f32().to_le_bytes(),
        }
    }
}

/// Whole rows of values as 8-bit blocks in a layout. The activation
/// quantizer is this portable one or a SIMD one that writes the same bytes.
pub(crate) type QuantizeQ8 = fn(layout: Q8Layout, x: &[f32], out: &mut [u8]);

/// Whole rows of values as `Q8_K` blocks ([`quantize_q8_k`], or a SIMD
/// quantizer that writes the same bytes).
pub(crate) type QuantizeQ8K = fn(x: &[f32], out: &mut [u8]);

/// One block of 32 values as 8-bit values `q` (as bytes) with scale
/// `d = amax/127`, rounding half to even as llama.cpp's AVX2 quantizer
/// does: returns (d, Σq).
// On aarch64 the NEON quantizer always runs; this one is its test's spec.
#[cfg_attr(all(target_arch = "aarch64", not(test)), allow(dead_code))]
pub(crate) fn block_q8(xb: &[f32], q: &mut [u8]) -> (f32, i32) {
    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(xb) {
        let q = round_even(v * id) as i8;
        sum += q as i32;
        *o = q as u8;
    }
    (amax / 127.0, sum)
}

/// `x` (whole blocks of 32) as 8-bit activation blocks in `layout`; the
/// scale is rounded to f16 as llama.cpp's is, but kept as f32.
// On aarch64 the NEON quantizer always runs; this one is its test's spec.
#[cfg_attr(all(target_arch = "aarch64", not(test)), allow(dead_code))]
pub(crate) fn quantize_q8(layout: Q8Layout, x: &[f32], out: &mut [u8]) {
    quantize_q8_with(layout, x, out, block_q8);
}

/// [`quantize_q8`] with `block` quantizing each block (this module's
/// [`block_q8`], or a SIMD one that computes the same bits, inlined into
/// its caller's loop).
#[inline(always)]
pub(crate) fn quantize_q8_with(layout: Q8Layout, x: &[f32], out: &mut [u8], block: impl Fn(&[f32], &mut [u8]) -> (f32, i32)) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_BLOCK_BYTES)) {
        let (d, sum) = block(xb, &mut ob[Q8_BLOCK_BYTES - 32..]);
        put_f16_as_f32(ob, 0, d);
        ob[4..8].copy_from_slice(&layout.second(d, sum));
    }
}

/// `x` as `Q8_K` blocks (292 bytes per 256 values), llama.cpp's reference
/// rule: the scale maps the value of largest magnitude to -127.
pub(crate) fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, &v) in ob[4..260].iter_mut().zip(xb) {
            *o = (round_even(iscale * v) as i32).min(127) as i8 as u8;
        }
        for j in 0..16 {
            let s: i32 = ob[4 + 16 * j..4 + 16 * (j + 1)].iter().map(|&q| q as i8 as i32).sum();
            ob[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
        }
        ob[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// The 4-bit value `j` (0..32) of a 32-value nibble block: low nibbles are
/// values 0..16, high nibbles 16..32.
#[inline]
fn nibble(qs: &[u8], j: usize) -> i32 {
    if j < 16 { (qs[j] & 0xF) as i32 } else { (qs[j - 16] >> 4) as i32 }
}

/// Fifth bit `j` of a `Q5_*` block's `qh`.
#[inline]
fn bit5(qh: &[u8], j: usize) -> i32 {
    (((qh[j / 8] >> (j % 8)) & 1) as i32) << 4
}

fn act_i8(a: &[u8], off: usize, j: usize) -> i32 {
    a[off + j] as i8 as i32
}

pub(crate) fn dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(40)) {
        let s: i32 = (0..32).map(|j| (nibble(&wb[2..], j) - 8) * act_i8(ab, 8, j)).sum();
        acc += f16_at(wb, 0) * f32_at(ab, 0) * s as f32;
    }
    acc
}

pub(crate) fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(40)) {
        let s: i32 = (0..32).map(|j| nibble(&wb[4..], j) * act_i8(ab, 8, j)).sum();
        acc += f16_at(wb, 0) * f32_at(ab, 0) * s as f32 + f16_at(wb, 2) * f32_at(ab, 4);
    }
    acc
}

pub(crate) fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(40)) {
        let s: i32 = (0..32).map(|j| ((nibble(&wb[6..], j) | bit5(&wb[2..6], j)) - 16) * act_i8(ab, 8, j)).sum();
        acc += f16_at(wb, 0) * f32_at(ab, 0) * s as f32;
    }
    acc
}

pub(crate) fn dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(24).zip(a.chunks_exact(40)) {
        let s: i32 = (0..32).map(|j| (nibble(&wb[8..], j) | bit5(&wb[4..8], j)) * act_i8(ab, 8, j)).sum();
        acc += f16_at(wb, 0) * f32_at(ab, 0) * s as f32 + f16_at(wb, 2) * f32_at(ab, 4);
    }
    acc
}

pub(crate) fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    // The activations' −128·Σq is for the interleaved (unsigned) rows; plain rows are signed.
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(40)) {
        let s: i32 = (0..32).map(|j| act_i8(wb, 2, j) * act_i8(ab, 8, j)).sum();
        acc += f16_at(wb, 0) * f32_at(ab, 0) * s as f32;
    }
    acc
}

/// Scale and min `j` (0..8) of a `Q4_K`/`Q5_K` block's 12 packed bytes
/// (6 bits each).
#[inline]
pub(crate) fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// `Σ m_j · (bsum of sub-block j)` over a `Q8_K` block: the part of a
/// `Q4_K`/`Q5_K` dot product that the mins contribute.
pub(crate) fn k_mins(scales: &[u8], ab: &[u8]) -> i32 {
    (0..8)
        .map(|j| {
            scale_min_k4(scales, j).1 as i32 * (bsum(ab, 2 * j) + bsum(ab, 2 * j + 1))
        })
        .sum()
}

/// A `Q4_K`/`Q5_K` dot product: blocks of `wb` bytes, `value(block, g, l)`
/// the unsigned values of sub-blocks 2g and 2g+1 at position `l`.
fn dot_k(w: &[u8], a: &[u8], wb: usize, value: impl Fn(&[u8], usize, usize) -> (i32, i32)) -> f32 {
    let mut acc = 0f32;
    for (blk, ab) in w.chunks_exact(wb).zip(a.chunks_exact(292)) {
        let scales = &blk[4..16];
        let mut s = 0i32;
        for g in 0..4 {
            let (sl, sh) = (scale_min_k4(scales, 2 * g).0 as i32, scale_min_k4(scales, 2 * g + 1).0 as i32);
            for l in 0..32 {
                let (lo, hi) = value(blk, g, l);
                s += sl * lo * act_i8(ab, 4, 64 * g + l) + sh * hi * act_i8(ab, 4, 64 * g + 32 + l);
            }
        }
        let ad = f32_at(ab, 0);
        acc += f16_at(blk, 0) * ad * s as f32 - f16_at(blk, 2) * ad * k_mins(scales, ab) as f32;
    }
    acc
}

/// The 16-bit signed sum of sub-block `j` (16 values) of a `Q8_K` block.
fn bsum(ab: &[u8], j: usize) -> i32 {
    i16::from_le_bytes([ab[260 + 2 * j], ab[261 + 2 * j]]) as i32
}

/// Where value `v` (0..256) of a `Q2_K`/`Q3_K` block sits: the byte of
/// its 2-bit field among the 64 `qs` bytes, the field's shift, and the
/// index of its byte among 32 (`Q3_K`'s high-bit mask).
#[inline]
fn crumb_at(v: usize) -> (usize, usize, usize) {
    let (h, k, i) = (v / 128, v % 128 / 32, v % 32);
    (32 * h + i, 2 * k, i)
}

/// Scale `j` (0..16) of a `Q3_K` block's 12 packed bytes (6 bits each,
/// stored with 32 added): low nibbles from bytes 0..8, high bits from
/// bytes 8..12.
#[inline]
fn scale_k3(s: &[u8], j: usize) -> i32 {
    let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | high << 4) as i32 - 32
}

/// `Q2_K`: 16 sub-blocks of 16 values, each `d·sc·q − dmin·m` with 4-bit
/// `sc` and `m`; llama.cpp's sum: exact integers ([`q2_k_sums`]), then
/// `d·d_a` and `dmin·d_a` once a block.
pub(crate) fn dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (blk, ab) in w.chunks_exact(84).zip(a.chunks_exact(292)) {
        let (s, mins) = q2_k_sums(blk, ab);
        let ad = f32_at(ab, 0);
        acc += f16_at(blk, 80) * ad * s as f32 - f16_at(blk, 82) * ad * mins as f32;
    }
    acc
}

/// A `Q2_K` block's exact integer sums against a `Q8_K` block:
/// `Σ_j sc_j·Σ q·a` and `Σ_j m_j·bsum_j` (the mins' term).
pub(crate) fn q2_k_sums(blk: &[u8], ab: &[u8]) -> (i32, i32) {
    let (sc, qs) = (&blk[..16], &blk[16..80]);
    let mut s = 0i32;
    for (v, y) in (0..256).zip(4..) {
        let (byte, shift, _) = crumb_at(v);
        s += (sc[v / 16] & 0xF) as i32 * ((qs[byte] >> shift) & 3) as i32 * act_i8(ab, y, 0);
    }
    let mins = (0..16).map(|j| (sc[j] >> 4) as i32 * bsum(ab, j)).sum();
    (s, mins)
}

/// `Q3_K`: 16 sub-blocks of 16 values, each `d·sc·(q − 4·!h)` with a
/// 2-bit `q`, its high bit `h` and a 6-bit signed `sc`.
pub(crate) fn dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (blk, ab) in w.chunks_exact(110).zip(a.chunks_exact(292)) {
        acc += f16_at(blk, 108) * f32_at(ab, 0) * q3_k_sum(blk, ab) as f32;
    }
    acc
}

/// A `Q3_K` block's exact integer sum against a `Q8_K` block: `Σ_j sc_j·Σ q·a`.
pub(crate) fn q3_k_sum(blk: &[u8], ab: &[u8]) -> i32 {
    let (hm, qs, sc) = (&blk[..32], &blk[32..96], &blk[96..108]);
    let mut s = 0i32;
    for (v, y) in (0..256).zip(4..) {
        let (byte, shift, i) = crumb_at(v);
        let high = (hm[i] >> (v / 32)) & 1;
        let q = ((qs[byte] >> shift) & 3) as i32 - if high == 1 { 0 } else { 4 };
        s += scale_k3(sc, v / 16) * q * act_i8(ab, y, 0);
    }
    s
}

pub(crate) fn dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    dot_k(w, a, 144, |b, g, l| {
        let q = b[16 + 32 * g + l];
        ((q & 0xF) as i32, (q >> 4) as i32)
    })
}

pub(crate) fn dot_q5_k(w: &[u8], a: &[u8]) -> f32 {
    dot_k(w, a, 176, |b, g, l| {
        let (q, h) = (b[48 + 32 * g + l], b[16 + l]);
        let bit = |k: usize| (((h >> k) & 1) as i32) << 4;
        ((q & 0xF) as i32 | bit(2 * g), (q >> 4) as i32 | bit(2 * g + 1))
    })
}

pub(crate) fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let mut s = 0i32;
        for h in 0..2 {
            let (ql, qh, sc) = (&wb[64 * h..64 * h + 64], &wb[128 + 32 * h..160 + 32 * h], &wb[192 + 8 * h..200 + 8 * h]);
            let y = 4 + 128 * h;
            for l in 0..32 {
                let is = l / 16;
                let q = [
                    (ql[l] & 0xF) as i32 | (((qh[l] & 3) as i32) << 4),
                    (ql[l + 32] & 0xF) as i32 | ((((qh[l] >> 2) & 3) as i32) << 4),
                    (ql[l] >> 4) as i32 | ((((qh[l] >> 4) & 3) as i32) << 4),
                    (ql[l + 32] >> 4) as i32 | ((((qh[l] >> 6) & 3) as i32) << 4),
                ];
                for (k, qk) in q.into_iter().enumerate() {
                    s += sc[is + 2 * k] as i8 as i32 * (qk - 32) * act_i8(ab, y, 32 * k + l);
                }
            }
        }
        acc += f16_at(wb, 208) * f32_at(ab, 0) * s as f32;
    }
    acc
}

/// Dense rows against f32 activations.
pub(crate) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(4).zip(a.chunks_exact(4)).map(|(x, y)| f32_at(x, 0) * f32_at(y, 0)).sum()
}

pub(crate) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(2).zip(a.chunks_exact(4)).map(|(x, y)| f16_at(x, 0) * f32_at(y, 0)).sum()
}

pub(crate) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(2)
        .zip(a.chunks_exact(4))
        .map(|(x, y)| bf16::from_bits(u16::from_le_bytes([x[0], x[1]])).to_f32() * f32_at(y, 0))
        .sum()
}

/// `out[j] = q · keys[j·stride..j·stride + q.len()]`.
pub(crate) fn dots(q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
    super::check_strided(q.len(), keys.len(), stride, out.len());
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_lanes(q, &keys[j * stride..j * stride + q.len()]);
    }
}

/// [`dots`] of each head in turn.
pub(crate) fn dots_heads(qs: &[f32], keys: &[f32], stride: usize, out: super::HeadDots<'_>) {
    super::vec_ops::each_head_dots(dots, qs, keys, stride, out)
}

/// `y += Σ_j p[j] · vals[j·stride..j·stride + y.len()]`.
pub(crate) fn axpys(y: &mut [f32], p: &[f32], vals: &[f32], stride: usize) {
    super::check_strided(y.len(), vals.len(), stride, p.len());
    for (j, &pj) in p.iter().enumerate() {
        if pj != 0.0 {
            axpy(y, pj, &vals[j * stride..j * stride + y.len()]);
        }
    }
}

/// [`axpys`] of each head in turn.
pub(crate) fn axpys_heads(ys: &mut [f32], w: super::HeadWeights<'_>, vals: &[f32], stride: usize) {
    super::vec_ops::each_head(axpys, ys, w, vals, stride)
}

/// Σ a·b in eight independent lanes.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += p·x`.
fn axpy(y: &mut [f32], p: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    for (y, &x) in y.iter_mut().zip(x) {
        *y += p * x;
    }
}

/// `v` rounded to the nearest integer, ties to even (the FPU's default
/// rounding): adding and removing 1.5·2²³ leaves no fraction bits. Exact
/// for |v| < 2²², which quantized values (|v| ≤ 127.5) are; unlike
/// `round_ties_even` it needs no SSE4.1 instruction or libm call.
#[inline]
pub(crate) fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}
