//! NEON group kernels for aarch64 CPUs with the dot-product extension
//! (`sdot`: Apple M-series, Graviton 2 and later, Cortex-A76 and later):
//! eight interleaved rows (`interleave.rs`) against `T` activation rows,
//! `out[t·8 + r]`. A 16-byte register holds four weights of each of four
//! rows (one group is two such halves), and `sdot` by element multiplies
//! them with four activation values taken from a lane of another register,
//! so one load of 16 activation bytes serves four chunks. Every lane
//! computes the same exact integer sum and the same float operations in
//! the same order as the portable kernels (`interleave.rs`), so the
//! results are theirs bit for bit.
//!
//! `sdot` and the f16 widening are written as `asm!`: their intrinsics are
//! not stable in Rust (`stdarch_neon_dotprod`, `stdarch_neon_f16`).

use std::arch::aarch64::*;
use std::arch::asm;

/// `Q2_K`, `Q3_K`, `Q5_K` and `Q6_K` rows stay plain on aarch64
/// (`Simd::stores_groups`): tests that switch builds run the portable
/// group kernels.
pub(crate) use super::interleave::{q2_kx8, q3_kx8, q5_kx8, q6_kx8};

/// Whether this CPU runs these kernels.
pub(super) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// `acc + Σ w·a` per 32-bit lane, `a` the four bytes of lane `$l` of its register.
macro_rules! sdot {
    ($acc:expr, $w:expr, $a:expr, $l:literal) => {{
        let mut acc: int32x4_t = $acc;
        // SAFETY (of the enclosing kernel): the CPU has the dot-product
        // extension (`has_dotprod`); the instruction reads and writes
        // registers only.
        asm!(
            concat!("sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[", $l, "]"),
            acc = inout(vreg) acc,
            w = in(vreg) $w,
            a = in(vreg) $a,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }};
}

/// [`sdot!`] by lane `c` (0..4), a run-time value the unrolled loops make constant.
// SAFETY (callers): the CPU has the dot-product extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot_lane(acc: int32x4_t, w: int8x16_t, a: int8x16_t, c: usize) -> int32x4_t {
    match c {
        0 => sdot!(acc, w, a, "0"),
        1 => sdot!(acc, w, a, "1"),
        2 => sdot!(acc, w, a, "2"),
        _ => sdot!(acc, w, a, "3"),
    }
}

/// The eight f16 fields at `p` as two registers of four f32 (exact).
// SAFETY (callers): `p..p+16` is readable.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn halves(p: *const u8) -> [float32x4_t; 2] {
    let h = vld1q_u16(p as *const u16);
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: `fcvtl`/`fcvtl2` (base ARMv8 SIMD) widen registers only.
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags)
    );
    [lo, hi]
}

/// The f32 at `p`.
// SAFETY (callers): `p..p+4` is readable.
#[inline]
unsafe fn f32_at(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p as *const f32)
}

/// Stores the eight rows' sums of each activation row into `out[t·8 + r]`.
// SAFETY (callers): `out` holds `8·T` values.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn put<const T: usize>(acc: [[float32x4_t; 2]; T], out: &mut [f32]) {
    for (o, a) in out.chunks_exact_mut(8).zip(acc) {
        vst1q_f32(o.as_mut_ptr(), a[0]);
        vst1q_f32(o.as_mut_ptr().add(4), a[1]);
    }
}

/// The 4- and 5-bit types of [`nibbles_k`].
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;

/// Eight interleaved `Q4_1` rows (`Q4_0` when not `MIN`) against `T`
/// activation rows with sums.
pub(crate) fn q4x8<const T: usize, const MIN: bool>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    if MIN {
        nibbles::<T, Q4_1>(group, nb, a, out)
    } else {
        nibbles::<T, Q4_0>(group, nb, a, out)
    }
}

/// Eight interleaved `Q5_0` rows against `T` activation rows with sums.
pub(crate) fn q5_0x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    nibbles::<T, Q5_0>(group, nb, a, out)
}

fn nibbles<const T: usize, const KIND: u8>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let gbytes = [144, 160, 176][KIND as usize];
    assert!(group.len() == nb * gbytes && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 40), "group kernel shapes");
    assert!(has_dotprod(), "the NEON group kernels need the dot-product extension");
    // SAFETY: the CPU has the dot-product extension (asserted); the body
    // reads the group's `nb` blocks and `nb` 40-byte blocks of each
    // activation row, which the assertion guarantees are there, and
    // writes `out`'s 8·T values.
    unsafe { nibbles_k::<T, KIND>(group, nb, a, out) }
}

/// Which bytes of the four rows' fifth bits `qh` (a row's 32 bits a lane)
/// are set for values `from..from+4` (`from` a multiple of 4) of each row,
/// as 0x10 in those bytes: byte `i` of lane `r` takes bit `from + i` of
/// row `r`'s bits. One table lookup puts the byte holding those bits in all
/// four bytes of its lane, one test picks a bit for each.
// SAFETY (callers): the CPU has NEON (every aarch64 CPU).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fifth_bits(qh: uint8x16_t, from: usize) -> uint8x16_t {
    let at = (from / 8) as u8;
    let pick: [u8; 16] = std::array::from_fn(|i| (i / 4 * 4) as u8 + at);
    let spread = vqtbl1q_u8(qh, vld1q_u8(pick.as_ptr()));
    let bits: [u8; 16] = std::array::from_fn(|i| 1u8 << (from % 8 + i % 4));
    vandq_u8(vtstq_u8(spread, vld1q_u8(bits.as_ptr())), vdupq_n_u8(0x10))
}

/// Eight rows of unsigned 4- or 5-bit weights (`KIND`): per row and block
/// the exact integer sum against the activations (for `Q4_0`/`Q5_0` from
/// −k·Σa, so `Σ(q − k)·a`), then `acc = fma(d_w·d_a, Σ, acc)`, and for
/// `Q4_1` `acc = fma(m_w, s_a, acc)`.
// SAFETY (callers): see `nibbles`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn nibbles_k<const T: usize, const KIND: u8>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (gbytes, qs) = [(144, 16), (160, 32), (176, 48)][KIND as usize];
    let mask = vdupq_n_u8(0xF);
    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
    for b in 0..nb {
        let gb = g.as_ptr().add(b * gbytes);
        // Values 0..16 of each activation row (low nibbles) and 16..32 (high).
        let lo_a: [int8x16_t; T] = std::array::from_fn(|t| vld1q_s8(a[t].as_ptr().add(b * 40 + 8) as *const i8));
        let hi_a: [int8x16_t; T] = std::array::from_fn(|t| vld1q_s8(a[t].as_ptr().add(b * 40 + 24) as *const i8));
        // The four-row halves' sums, `s[h][t]`; the offset types start
        // from the activations' −k·Σa, so theirs are `Σ(q − k)·a`.
        let start: [int32x4_t; T] = std::array::from_fn(|t| {
            if KIND == Q4_1 {
                vdupq_n_s32(0)
            } else {
                vld1q_dup_s32(a[t].as_ptr().add(b * 40 + 4) as *const i32)
            }
        });
        let mut s = [start; 2];
        for (h, sh) in s.iter_mut().enumerate() {
            let qh = if KIND == Q5_0 { vld1q_u8(gb.add(16 + 16 * h)) } else { vdupq_n_u8(0) };
            for c in 0..4 {
                let x = vld1q_u8(gb.add(qs + 32 * c + 16 * h));
                let mut lo = vandq_u8(x, mask);
                let mut hi = vshrq_n_u8::<4>(x);
                if KIND == Q5_0 {
                    // Nibbles are below 16: adding 16 where the fifth bit is set is or-ing it in.
                    lo = vorrq_u8(lo, fifth_bits(qh, 4 * c));
                    hi = vorrq_u8(hi, fifth_bits(qh, 16 + 4 * c));
                }
                let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
                for t in 0..T {
                    sh[t] = sdot_lane(sh[t], lo, lo_a[t], c);
                    sh[t] = sdot_lane(sh[t], hi, hi_a[t], c);
                }
            }
        }
        let d = halves(gb);
        // `Q4_1`'s mins (the offset types have none).
        let m = if KIND == Q4_1 { halves(gb.add(16)) } else { [vdupq_n_f32(0.0); 2] };
        for t in 0..T {
            let ab = a[t].as_ptr().add(b * 40);
            let da = f32_at(ab);
            for h in 0..2 {
                acc[t][h] = vfmaq_f32(acc[t][h], vmulq_n_f32(d[h], da), vcvtq_f32_s32(s[h][t]));
                if KIND == Q4_1 {
                    acc[t][h] = vfmaq_n_f32(acc[t][h], m[h], f32_at(ab.add(4)));
                }
            }
        }
    }
    put(acc, out);
}

/// Eight interleaved `Q8_0` rows against `T` `Q8_0O` activation rows.
pub(crate) fn q8_0x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(group.len() == nb * 272 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 40), "group kernel shapes");
    assert!(has_dotprod(), "the NEON group kernels need the dot-product extension");
    // SAFETY: as for `nibbles`.
    unsafe { q8_0x8_k::<T>(group, nb, a, out) }
}

/// Per row and block the exact integer sum of the signed weights (`sdot`
/// multiplies signed bytes: the stored `q + 128` less its 128, so the
/// activations' −128·Σa is not needed) and the activations, then
/// `acc = fma(d_w·d_a, Σ, acc)`.
// SAFETY (callers): see `q8_0x8`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q8_0x8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
    for b in 0..nb {
        let gb = g.as_ptr().add(b * 272);
        // Values 0..16 and 16..32 of each activation row: chunks 0..4 and 4..8.
        let qa: [[int8x16_t; 2]; T] = std::array::from_fn(|t| {
            let p = a[t].as_ptr().add(b * 40 + 8) as *const i8;
            [vld1q_s8(p), vld1q_s8(p.add(16))]
        });
        let mut s = [[vdupq_n_s32(0); T]; 2];
        for (h, sh) in s.iter_mut().enumerate() {
            for c in 0..8 {
                let w = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(gb.add(16 + 32 * c + 16 * h)), vdupq_n_u8(0x80)));
                for t in 0..T {
                    sh[t] = sdot_lane(sh[t], w, qa[t][c / 4], c % 4);
                }
            }
        }
        let d = halves(gb);
        for t in 0..T {
            let da = f32_at(a[t].as_ptr().add(b * 40));
            for h in 0..2 {
                acc[t][h] = vfmaq_f32(acc[t][h], vmulq_n_f32(d[h], da), vcvtq_f32_s32(s[h][t]));
            }
        }
    }
    put(acc, out);
}

/// Eight interleaved `Q4_K` rows against `T` `Q8_K` activation rows.
pub(crate) fn q4_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(group.len() == nb * 1152 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 292), "group kernel shapes");
    assert!(has_dotprod(), "the NEON group kernels need the dot-product extension");
    // SAFETY: as for `nibbles`, with 1,152-byte group blocks and 292-byte
    // activation blocks.
    unsafe { q4_kx8_k::<T>(group, nb, a, out) }
}

/// Sub-block `j`'s 6-bit scale and min of four rows (`scalar::scale_min_k4`
/// lane by lane), from their packed scale bytes 0..4, 4..8 and 8..12 (`c`,
/// one row a 32-bit lane).
// SAFETY (callers): the CPU has NEON (every aarch64 CPU).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn scale_min(c: [uint32x4_t; 3], j: usize) -> (int32x4_t, int32x4_t) {
    let byte = |v: uint32x4_t, k: usize| vandq_u32(vshlq_u32(v, vdupq_n_s32(-8 * k as i32)), vdupq_n_u32(0xFF));
    let six = vdupq_n_u32(63);
    let (sc, m) = if j < 4 {
        (vandq_u32(byte(c[0], j), six), vandq_u32(byte(c[1], j), six))
    } else {
        let (k, top) = (j - 4, |v: uint32x4_t| vshlq_n_u32::<4>(vshrq_n_u32::<6>(v)));
        let low = byte(c[2], k);
        (vorrq_u32(vandq_u32(low, vdupq_n_u32(0xF)), top(byte(c[0], k))), vorrq_u32(vshrq_n_u32::<4>(low), top(byte(c[1], k))))
    };
    (vreinterpretq_s32_u32(sc), vreinterpretq_s32_u32(m))
}

/// Per row and super-block the exact integer sums `Σ_j sc_j·Σ(q·a)` and
/// `Σ_j m_j·Σa` over the eight sub-blocks `j`, then `acc = fma(d·d_a,
/// sums, acc)` and `mins = fma(dmin·d_a, msums, mins)`; `acc − mins`.
// SAFETY (callers): see `q4_kx8`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q4_kx8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let mask = vdupq_n_u8(0xF);
    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
    let mut mins = [[vdupq_n_f32(0.0); 2]; T];
    for b in 0..nb {
        let gb = g.as_ptr().add(b * 1152);
        let ab: [*const u8; T] = std::array::from_fn(|t| a[t].as_ptr().add(b * 292));
        // Σa of each sub-block: the sums of its two 16-value halves (i16 at 260..292).
        let bsum = |t: usize, j: usize| {
            let p = ab[t].add(260 + 4 * j) as *const i16;
            i32::from(std::ptr::read_unaligned(p)) + i32::from(std::ptr::read_unaligned(p.add(1)))
        };
        for h in 0..2 {
            let c: [uint32x4_t; 3] = std::array::from_fn(|i| vld1q_u32(gb.add(32 + 32 * i + 16 * h) as *const u32));
            let mut sums = [vdupq_n_s32(0); T];
            let mut msums = [vdupq_n_s32(0); T];
            for p in 0..4 {
                // Sub-blocks 2p (low nibbles) and 2p + 1 (high).
                let mut lo_s = [vdupq_n_s32(0); T];
                let mut hi_s = [vdupq_n_s32(0); T];
                for q in 0..2 {
                    let lo_a: [int8x16_t; T] = std::array::from_fn(|t| vld1q_s8(ab[t].add(4 + 64 * p + 16 * q) as *const i8));
                    let hi_a: [int8x16_t; T] = std::array::from_fn(|t| vld1q_s8(ab[t].add(36 + 64 * p + 16 * q) as *const i8));
                    for l in 0..4 {
                        let x = vld1q_u8(gb.add(128 + 32 * (8 * p + 4 * q + l) + 16 * h));
                        let lo = vreinterpretq_s8_u8(vandq_u8(x, mask));
                        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(x));
                        for t in 0..T {
                            lo_s[t] = sdot_lane(lo_s[t], lo, lo_a[t], l);
                            hi_s[t] = sdot_lane(hi_s[t], hi, hi_a[t], l);
                        }
                    }
                }
                let (sc0, m0) = scale_min(c, 2 * p);
                let (sc1, m1) = scale_min(c, 2 * p + 1);
                for t in 0..T {
                    sums[t] = vmlaq_s32(vmlaq_s32(sums[t], sc0, lo_s[t]), sc1, hi_s[t]);
                    msums[t] = vmlaq_n_s32(vmlaq_n_s32(msums[t], m0, bsum(t, 2 * p)), m1, bsum(t, 2 * p + 1));
                }
            }
            let (d, dmin) = (halves(gb)[h], halves(gb.add(16))[h]);
            for t in 0..T {
                let da = f32_at(ab[t]);
                acc[t][h] = vfmaq_f32(acc[t][h], vmulq_n_f32(d, da), vcvtq_f32_s32(sums[t]));
                mins[t][h] = vfmaq_f32(mins[t][h], vmulq_n_f32(dmin, da), vcvtq_f32_s32(msums[t]));
            }
        }
    }
    let diff: [[float32x4_t; 2]; T] = std::array::from_fn(|t| [vsubq_f32(acc[t][0], mins[t][0]), vsubq_f32(acc[t][1], mins[t][1])]);
    put(diff, out);
}
