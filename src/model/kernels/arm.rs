//! NEON kernels for aarch64 (every aarch64 CPU has NEON): the activation
//! quantizer, `exp` (attention, SiLU, log-probabilities), 32- and 16-bit
//! weight rows (`F32`, `F16`, `BF16`: the default model's bf16
//! safetensors) against 1 or 4 f32 activation rows in sixteen running sums
//! a row (the portable loop waits on one add after another), and, with the
//! dot-product extension, rows of the 32-value block types (`Q4_0` …
//! `Q8_0`: lone rows past a matrix's groups, and `Q5_1`) and of `Q5_K` and
//! `Q6_K` (`sdot`, the portable kernels' exact integer sums and float
//! steps, so the same bits). The group kernels are in `arm_group.rs`.

use std::arch::aarch64::*;

use super::scalar::{self, Q8Layout};
use super::vec_ops::by_chunks;
use super::{exp, Kernel, QType, VecOps};

/// f32 vector operations: the portable attention loops (which compilers
/// vectorise) and this module's `exps`.
pub(super) fn vec_ops() -> VecOps {
    VecOps { exps, softmax: |x, scale| super::vec_ops::softmax_with(exps, x, scale), ..VecOps::portable() }
}

fn exps(x: &mut [f32]) {
    // SAFETY: NEON is part of aarch64; the body stays inside `x`.
    unsafe { exps_neon(x) }
}

// SAFETY (callers): none beyond NEON, which every aarch64 CPU has.
#[target_feature(enable = "neon")]
unsafe fn exps_neon(x: &mut [f32]) {
    by_chunks::<4>(x, |c| vst1q_f32(c.as_mut_ptr(), exp4(vld1q_f32(c.as_ptr()))));
}

/// [`exp::expf`] of four values: its operations lane by lane, in f64 two
/// lanes at a time; lanes in its edge range take [`exp::edge`]'s result
/// where it has one.
// SAFETY (callers): none beyond NEON.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    let lo = exp2_lanes(vcvt_f64_f32(vget_low_f32(x)));
    let hi = exp2_lanes(vcvt_high_f64_f32(x));
    let y = vcvt_high_f32_f64(vcvt_f32_f64(lo), hi);
    let top = vandq_u32(vshrq_n_u32::<20>(vreinterpretq_u32_f32(x)), vdupq_n_u32(0x7ff));
    if vmaxvq_u32(vcgeq_u32(top, vdupq_n_u32(exp::EDGE_TOP))) == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 4], [0f32; 4]);
    vst1q_f32(xs.as_mut_ptr(), x);
    vst1q_f32(ys.as_mut_ptr(), y);
    for (x, y) in xs.iter().zip(ys.iter_mut()) {
        if (x.to_bits() >> 20) & 0x7ff >= exp::EDGE_TOP {
            if let Some(v) = exp::edge(*x) {
                *y = v;
            }
        }
    }
    vld1q_f32(ys.as_ptr())
}

/// The table-and-cubic part of [`exp::expf`] for two values (as f64),
/// before the narrowing to f32.
// SAFETY (callers): none beyond NEON.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn exp2_lanes(xd: float64x2_t) -> float64x2_t {
    let c = vdupq_n_f64;
    let kd = vfmaq_f64(c(exp::SHIFT), c(exp::INV_LN2_32), xd);
    let ki = vreinterpretq_u64_f64(kd);
    let kd = vsubq_f64(kd, c(exp::SHIFT));
    let r = vfmaq_f64(vnegq_f64(kd), c(exp::INV_LN2_32), xd);
    // Indices masked to 0..32: the lookups stay inside the table.
    let i = vandq_u64(ki, vdupq_n_u64(31));
    let t = [exp::EXP2_TABLE[vgetq_lane_u64::<0>(i) as usize], exp::EXP2_TABLE[vgetq_lane_u64::<1>(i) as usize]];
    let s = vreinterpretq_f64_u64(vaddq_u64(vld1q_u64(t.as_ptr()), vshlq_n_u64::<47>(ki)));
    let z = vfmaq_f64(c(exp::C1), c(exp::C0), r);
    let r2 = vmulq_f64(r, r);
    let y = vfmaq_f64(c(1.0), c(exp::C2), r);
    let y = vfmaq_f64(y, z, r2);
    vmulq_f64(y, s)
}

/// The NEON activation quantizer: the portable one's bytes.
pub(super) fn quantize_q8(layout: Q8Layout, x: &[f32], out: &mut [u8]) {
    assert!(x.len().is_multiple_of(32) && out.len() >= x.len() / 32 * scalar::Q8_BLOCK_BYTES, "whole blocks, and room for them");
    // SAFETY: NEON is part of aarch64; each block handed to the block
    // quantizer is 32 floats and 32 bytes (`chunks_exact`).
    scalar::quantize_q8_with(layout, x, out, |xb, q| unsafe { block_q8(xb, q) });
}

/// [`scalar::block_q8`] in NEON: the same scale, the same rounding (half
/// to even, the default mode of `fcvtns`), the same values and sum.
// SAFETY (callers): `xb` holds 32 floats and `q` at least 32 bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn block_q8(xb: &[f32], q: &mut [u8]) -> (f32, i32) {
    let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(xb.as_ptr().add(4 * i)));
    // `fmaxnm` ignores a NaN as `f32::max` does.
    let m = v.iter().fold(vdupq_n_f32(0.0), |m, &x| vmaxnmq_f32(m, vabsq_f32(x)));
    let amax = vmaxnmvq_f32(m);
    let id = vdupq_n_f32(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let i: [int32x4_t; 8] = std::array::from_fn(|k| vcvtnq_s32_f32(vmulq_f32(v[k], id)));
    let sum = i.iter().fold(vdupq_n_s32(0), |s, &x| vaddq_s32(s, x));
    for k in 0..2 {
        let h = |j: usize| vcombine_s16(vmovn_s32(i[4 * k + j]), vmovn_s32(i[4 * k + j + 1]));
        let bytes = vcombine_s8(vmovn_s16(h(0)), vmovn_s16(h(2)));
        vst1q_s8(q.as_mut_ptr().add(16 * k) as *mut i8, bytes);
    }
    (amax / 127.0, vaddvq_s32(sum))
}

/// A [`Kernel`] of `$body::<T[, $kind]>` (one row against `T` activation
/// rows) over rows of `$wb`-byte blocks and activation rows of `$ab`-byte
/// blocks, through [`each_row`].
macro_rules! rows {
    // A 32-value block type: its sizes from `BLOCKS32`.
    ($body:ident, $kind:ident) => {
        rows!($body, $kind; BLOCKS32[$kind as usize].0, BLOCKS32[$kind as usize].1)
    };
    ($body:ident $(, $kind:ident)?; $wb:expr, $ab:expr) => {
        Kernel {
            rows1: |w, rb, a, o| each_row(w, rb, a, o, ($wb, $ab), $body::<1 $(, $kind)?>),
            rows4: |w, rb, a, o| each_row(w, rb, a, o, ($wb, $ab), $body::<4 $(, $kind)?>),
        }
    };
}

/// The NEON row kernels of `ty`, where there are some (all but the dense
/// ones need the dot-product extension).
pub(super) fn table(ty: QType) -> Option<Kernel> {
    let dot = super::arm_group::has_dotprod();
    Some(match ty {
        QType::F32 => rows!(dense_row, F32; 4, 4),
        QType::F16 => rows!(dense_row, F16; 2, 4),
        QType::BF16 => rows!(dense_row, BF16; 2, 4),
        QType::Q4_0 if dot => rows!(blocks32_row, Q4_0),
        QType::Q4_1 if dot => rows!(blocks32_row, Q4_1),
        QType::Q5_0 if dot => rows!(blocks32_row, Q5_0),
        QType::Q5_1 if dot => rows!(blocks32_row, Q5_1),
        QType::Q8_0 if dot => rows!(blocks32_row, Q8_0),
        QType::Q5K if dot => rows!(q5_k_row; 176, 292),
        QType::Q6K if dot => rows!(q6_k_row; 210, 292),
        _ => return None,
    })
}

/// One row against `T` activation rows, given its number of blocks.
type RowFn<const T: usize> = unsafe fn(&[u8], [&[u8]; T], usize) -> [f32; T];

/// Each whole row of `w` (`row_bytes`, blocks of `wb` bytes; a dense
/// type's "block" is one value) against `T` activation rows of `ab`-byte
/// blocks, by `body(row, a, blocks)`: `out[r·T + t]`.
fn each_row<const T: usize>(
    w: &[u8],
    row_bytes: usize,
    a: [&[u8]; T],
    out: &mut [f32],
    (wb, ab): (usize, usize),
    body: RowFn<T>,
) {
    let nb = row_bytes / wb;
    assert!(
        row_bytes == nb * wb && w.len().is_multiple_of(row_bytes.max(1)) && out.len() == w.len() / row_bytes.max(1) * T && a.iter().all(|r| r.len() == nb * ab),
        "row kernel shapes"
    );
    for (row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(T)) {
        // SAFETY: `table` hands out the bodies that need the dot-product
        // extension only after detecting it (NEON is part of aarch64); each
        // body reads `nb` blocks of `row` and of each activation row, which
        // the assertion guarantees are there.
        o.copy_from_slice(&unsafe { body(row, a, nb) });
    }
}

/// The dense types of [`dense_row`].
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// Sixteen weights from value `16·i` of `row`, as f32.
// SAFETY (callers): `row` holds values `16·i..16·i + 16` of `KIND`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn widen16<const KIND: u8>(row: &[u8], i: usize) -> [float32x4_t; 4] {
    match KIND {
        F32 => {
            let p = row.as_ptr().add(64 * i) as *const f32;
            [vld1q_f32(p), vld1q_f32(p.add(4)), vld1q_f32(p.add(8)), vld1q_f32(p.add(12))]
        }
        BF16 => {
            // A bf16 is the high half of its f32.
            let p = row.as_ptr().add(32 * i) as *const u16;
            let (x, y) = (vld1q_u16(p), vld1q_u16(p.add(8)));
            let f = |v: uint32x4_t| vreinterpretq_f32_u32(v);
            [
                f(vshll_n_u16::<16>(vget_low_u16(x))),
                f(vshll_high_n_u16::<16>(x)),
                f(vshll_n_u16::<16>(vget_low_u16(y))),
                f(vshll_high_n_u16::<16>(y)),
            ]
        }
        _ => {
            let p = row.as_ptr().add(32 * i);
            let ([w0, w1], [w2, w3]) = (super::arm_group::halves(p), super::arm_group::halves(p.add(16)));
            [w0, w1, w2, w3]
        }
    }
}

/// One row against `T` activation rows: sixteen running sums each, then
/// the values past the last sixteen one by one.
// SAFETY (callers): `row` holds `n` values of `KIND`, each row of `a` `n` f32.
#[target_feature(enable = "neon")]
unsafe fn dense_row<const T: usize, const KIND: u8>(row: &[u8], a: [&[u8]; T], n: usize) -> [f32; T] {
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    for i in 0..n / 16 {
        let wv = widen16::<KIND>(row, i);
        for t in 0..T {
            let p = a[t].as_ptr().add(64 * i) as *const f32;
            for k in 0..4 {
                acc[t][k] = vfmaq_f32(acc[t][k], wv[k], vld1q_f32(p.add(4 * k)));
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let [s0, s1, s2, s3] = acc[t];
        out[t] = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    }
    for j in n / 16 * 16..n {
        let wj = match KIND {
            F32 => scalar::f32_at(row, 4 * j),
            F16 => scalar::f16_at(row, 2 * j),
            _ => half::bf16::from_bits(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])).to_f32(),
        };
        for t in 0..T {
            out[t] += wj * scalar::f32_at(a[t], 4 * j);
        }
    }
    out
}

/// `acc + Σ w·a` per 32-bit lane (four products each).
// SAFETY (callers): the CPU has the dot-product extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only.
    std::arch::asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {a:v}.16b",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// One `Q6_K` row: per super-block the exact integer sum `Σ sc·(q−32)·a`
/// of `scalar::dot_q6_k`, then `acc += d·d_a·Σ`, its float steps too.
// SAFETY (callers): the CPU has the dot-product extension; `row` holds
// `nb` blocks of 210 bytes and each row of `a` `nb` blocks of 292.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q6_k_row<const T: usize>(row: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let (low, two) = (vdupq_n_u8(0xF), vdupq_n_u8(3));
    let mut acc = [0f32; T];
    for b in 0..nb {
        let wb = row.as_ptr().add(b * 210);
        let mut s = [vdupq_n_s32(0); T];
        for h in 0..2 {
            let (ql, qh, sc) = (wb.add(64 * h), wb.add(128 + 32 * h), wb.add(192 + 8 * h));
            for half in 0..2 {
                let l = 16 * half;
                let (x, y, hb) = (vld1q_u8(ql.add(l)), vld1q_u8(ql.add(l + 32)), vld1q_u8(qh.add(l)));
                let high = |k: i8| vshlq_n_u8::<4>(vandq_u8(vshlq_u8(hb, vdupq_n_s8(-2 * k)), two));
                // Values 32k + l.. of this half, as q − 32.
                let q = [
                    vorrq_u8(vandq_u8(x, low), high(0)),
                    vorrq_u8(vandq_u8(y, low), high(1)),
                    vorrq_u8(vshrq_n_u8::<4>(x), high(2)),
                    vorrq_u8(vshrq_n_u8::<4>(y), high(3)),
                ]
                .map(|v| vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(32)));
                for (k, qk) in q.into_iter().enumerate() {
                    let scale = i32::from(*sc.add(half + 2 * k) as i8);
                    for t in 0..T {
                        let av = vld1q_s8(a[t].as_ptr().add(b * 292 + 4 + 128 * h + 32 * k + l) as *const i8);
                        s[t] = vmlaq_n_s32(s[t], sdot(vdupq_n_s32(0), qk, av), scale);
                    }
                }
            }
        }
        let d = scalar::f16_at(&row[b * 210..], 208);
        for t in 0..T {
            acc[t] += d * scalar::f32_at(&a[t][b * 292..], 0) * vaddvq_s32(s[t]) as f32;
        }
    }
    acc
}

/// One `Q5_K` row: per super-block the exact integer sums of
/// `scalar::dot_q5_k` (`Σ sc·q·a` and the mins' `Σ m·Σa`), then its float
/// steps, `acc += d·d_a·Σ − dmin·d_a·mins`.
// SAFETY (callers): the CPU has the dot-product extension; `row` holds
// `nb` blocks of 176 bytes and each row of `a` `nb` blocks of 292.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q5_k_row<const T: usize>(row: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let (low, one) = (vdupq_n_u8(0xF), vdupq_n_u8(1));
    let mut acc = [0f32; T];
    for b in 0..nb {
        let blk = &row[b * 176..(b + 1) * 176];
        let scales = &blk[4..16];
        let mut s = [vdupq_n_s32(0); T];
        for g in 0..4 {
            let (sl, sh) = (scalar::scale_min_k4(scales, 2 * g).0, scalar::scale_min_k4(scales, 2 * g + 1).0);
            for l in [0, 16] {
                let (q, hb) = (vld1q_u8(blk.as_ptr().add(48 + 32 * g + l)), vld1q_u8(blk.as_ptr().add(16 + l)));
                let fifth = |k: usize| vshlq_n_u8::<4>(vandq_u8(vshlq_u8(hb, vdupq_n_s8(-(k as i8))), one));
                let lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, low), fifth(2 * g)));
                let hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(q), fifth(2 * g + 1)));
                for t in 0..T {
                    let ap = a[t].as_ptr().add(b * 292 + 4 + 64 * g + l) as *const i8;
                    let (lo_s, hi_s) = (sdot(vdupq_n_s32(0), lo, vld1q_s8(ap)), sdot(vdupq_n_s32(0), hi, vld1q_s8(ap.add(32))));
                    s[t] = vmlaq_n_s32(vmlaq_n_s32(s[t], lo_s, i32::from(sl)), hi_s, i32::from(sh));
                }
            }
        }
        let (d, dmin) = (scalar::f16_at(blk, 0), scalar::f16_at(blk, 2));
        for t in 0..T {
            let ab = &a[t][b * 292..(b + 1) * 292];
            let ad = scalar::f32_at(ab, 0);
            acc[t] += d * ad * vaddvq_s32(s[t]) as f32 - dmin * ad * scalar::k_mins(scales, ab) as f32;
        }
    }
    acc
}

/// The 32-value block types of [`blocks32_row`].
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

/// Bytes of a block of each of them, and of a block of its activations.
const BLOCKS32: [(usize, usize); 5] = [(18, 40), (20, 40), (22, 40), (24, 40), (34, 40)];

/// The fifth bits `from..from+16` of the 32 at `qh` (a `Q5_*` block's), as
/// 0x10 in the sixteen bytes where they are set.
// SAFETY (callers): `qh..qh+4` is readable.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fifth16(qh: *const u8, from: usize) -> uint8x16_t {
    let bits = vreinterpretq_u8_u32(vdupq_n_u32(std::ptr::read_unaligned(qh as *const u32)));
    let at = (from / 8) as u8;
    let pick: [u8; 16] = std::array::from_fn(|i| at + (i / 8) as u8);
    let probe: [u8; 16] = std::array::from_fn(|i| 1 << (i % 8));
    vandq_u8(vtstq_u8(vqtbl1q_u8(bits, vld1q_u8(pick.as_ptr())), vld1q_u8(probe.as_ptr())), vdupq_n_u8(0x10))
}

/// One row of `KIND` blocks: per block the exact integer sum of the
/// portable kernel (`scalar::dot_q4_0` …), then its float steps in its
/// order, so the same bits.
// SAFETY (callers): the CPU has the dot-product extension; `row` holds `nb`
// blocks of `KIND` and each row of `a` `nb` blocks of its activation format.
#[target_feature(enable = "neon,dotprod")]
unsafe fn blocks32_row<const T: usize, const KIND: u8>(row: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let (wb, ab) = BLOCKS32[KIND as usize];
    let mut acc = [0f32; T];
    for b in 0..nb {
        let blk = &row[b * wb..(b + 1) * wb];
        let p = blk.as_ptr();
        // Values 0..16 and 16..32 as signed bytes (`Q4_0`/`Q5_0` less their offset).
        let (lo, hi) = match KIND {
            Q8_0 => (vld1q_s8(p.add(2) as *const i8), vld1q_s8(p.add(18) as *const i8)),
            _ => {
                let qs = vld1q_u8(p.add(wb - 16));
                let (mut lo, mut hi) = (vandq_u8(qs, vdupq_n_u8(0xF)), vshrq_n_u8::<4>(qs));
                if KIND == Q5_0 || KIND == Q5_1 {
                    let qh = p.add(if KIND == Q5_0 { 2 } else { 4 });
                    lo = vorrq_u8(lo, fifth16(qh, 0));
                    hi = vorrq_u8(hi, fifth16(qh, 16));
                }
                let offset = vdupq_n_u8(match KIND {
                    Q4_0 => 8,
                    Q5_0 => 16,
                    _ => 0,
                });
                (vreinterpretq_s8_u8(vsubq_u8(lo, offset)), vreinterpretq_s8_u8(vsubq_u8(hi, offset)))
            }
        };
        let d = scalar::f16_at(blk, 0);
        for t in 0..T {
            let ablk = &a[t][b * ab..(b + 1) * ab];
            let q = ablk.as_ptr().add(ab - 32) as *const i8;
            let s = vaddvq_s32(sdot(sdot(vdupq_n_s32(0), lo, vld1q_s8(q)), hi, vld1q_s8(q.add(16))));
            let da = scalar::f32_at(ablk, 0);
            acc[t] += match KIND {
                Q4_1 | Q5_1 => d * da * s as f32 + scalar::f16_at(blk, 2) * scalar::f32_at(ablk, 4),
                _ => d * da * s as f32,
            };
        }
    }
    acc
}
