//! x86-64 kernels on AVX2, FMA and F16C: one weight row against `T`
//! activation rows at a time (`T` = 1 for a decoded token, 4 for tiles of
//! prefill and batched rows), so a row's blocks are unpacked once per `T`
//! rows. Integer products as llama.cpp computes them: `maddubs` of unsigned
//! weights (or |weights| with the sign moved onto the activations) with
//! signed 8-bit activations, pairs summed in 32 bits, scaled in f32.
//!
//! The kernels are reachable only through [`table`], which returns `None`
//! unless the CPU has the three features (and hands out `Q2_K`'s VNNI
//! build only where the CPU has AVX-512 VNNI). The 2- and 3-bit k-quants'
//! bodies are in `x86_low.rs`.

use std::arch::x86_64::*;

use super::x86_low::{q2_k_avx2, q2_k_vnni, q3_k_avx2};

use super::scalar::Q8Layout;
use super::{scalar, Kernel, QType};

/// The kernels for `ty`, when this CPU runs them.
pub(super) fn table(ty: QType) -> Option<Kernel> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        return None;
    }
    Some(match ty {
        QType::Q4_0 => Kernel { rows1: q4_0::<1>, rows4: q4_0::<4> },
        QType::Q4_1 => Kernel { rows1: q4_1::<1>, rows4: q4_1::<4> },
        QType::Q5_0 => Kernel { rows1: q5_0::<1>, rows4: q5_0::<4> },
        QType::Q5_1 => Kernel { rows1: q5_1::<1>, rows4: q5_1::<4> },
        QType::Q8_0 => Kernel { rows1: q8_0::<1>, rows4: q8_0::<4> },
        // With VNNI, one `vpdpbusd` a chunk (scales folded into the weights).
        QType::Q2K if super::x86_group::has_vnni() => Kernel { rows1: q2_k_v::<1>, rows4: q2_k_v::<4> },
        QType::Q2K => Kernel { rows1: q2_k::<1>, rows4: q2_k::<4> },
        QType::Q3K => Kernel { rows1: q3_k::<1>, rows4: q3_k::<4> },
        QType::Q4K => Kernel { rows1: q4_k::<1>, rows4: q4_k::<4> },
        QType::Q5K => Kernel { rows1: q5_k::<1>, rows4: q5_k::<4> },
        QType::Q6K => Kernel { rows1: q6_k::<1>, rows4: q6_k::<4> },
        QType::F32 => Kernel { rows1: f32s::<1>, rows4: f32s::<4> },
        QType::F16 => Kernel { rows1: f16s::<1>, rows4: f16s::<4> },
        QType::BF16 => Kernel { rows1: bf16s::<1>, rows4: bf16s::<4> },
    })
}

/// Every build of the `Q2_K` row kernels this CPU runs (tests compare them).
#[cfg(test)]
pub(super) fn q2_k_builds() -> Vec<Kernel> {
    let mut all = Vec::new();
    if table(QType::Q4_0).is_some() {
        all.push(Kernel { rows1: q2_k::<1>, rows4: q2_k::<4> });
        if super::x86_group::has_vnni() {
            all.push(Kernel { rows1: q2_k_v::<1>, rows4: q2_k_v::<4> });
        }
    }
    all
}

/// The AVX2 [`scalar::QuantizeQ8`], when this CPU runs it.
pub(super) fn quantize_q8() -> Option<scalar::QuantizeQ8> {
    (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"))
        .then_some(quantize_q8_safe as scalar::QuantizeQ8)
}

fn quantize_q8_safe(layout: Q8Layout, x: &[f32], out: &mut [u8]) {
    assert!(x.len().is_multiple_of(32) && out.len() >= x.len() / 32 * scalar::Q8_BLOCK_BYTES, "whole blocks, and room for them");
    // SAFETY: `quantize_q8` hands this out only after detecting AVX2, FMA
    // and F16C; the body reads whole blocks of `x` and writes whole blocks
    // of `out`, which the assertion guarantees are there.
    unsafe { quantize_q8_avx2(layout, x, out) }
}

/// A row's blocks in one call, the AVX2 block quantizer inlined.
// SAFETY (callers): The CPU has AVX2, FMA and F16C; `x` is whole blocks of
// 32 and `out` holds as many blocks of `layout`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_avx2(layout: Q8Layout, x: &[f32], out: &mut [u8]) {
    // SAFETY: this function's features are the block quantizer's; each
    // block handed to it is 32 floats and 32 bytes (`chunks_exact`).
    scalar::quantize_q8_with(layout, x, out, |xb, q| unsafe { block_q8_avx2(xb, q) });
}

// SAFETY (callers): The CPU has AVX2 and FMA; `xb` holds 32 floats and `q`
// at least 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_q8_avx2(xb: &[f32], q: &mut [u8]) -> (f32, i32) {
    let p = xb.as_ptr();
    let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let abs = |x: __m256| _mm256_andnot_ps(sign, x);
    let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2))).max(0.0);
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    // Round half to even (the rounding mode), as `round_even` does for
    // these magnitudes (|v·id| ≤ 127).
    let r = |x: __m256| _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, id)));
    let i = [r(v[0]), r(v[1]), r(v[2]), r(v[3])];
    let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01)));
    // Packing works within 128-bit halves; the permutation puts the four
    // groups of four back in order.
    let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered);
    (amax / 127.0, sum)
}

/// The AVX2 `Q8_K` activation quantizer, when this CPU runs it.
pub(super) fn quantize_q8_k() -> Option<scalar::QuantizeQ8K> {
    is_x86_feature_detected!("avx2").then_some(quantize_q8_k_safe as scalar::QuantizeQ8K)
}

fn quantize_q8_k_safe(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        // SAFETY: `quantize_q8_k` hands this out only after detecting AVX2;
        // `chunks_exact` gives the body 256 floats and 292 bytes.
        if !unsafe { block_q8_k_avx2(xb, ob) } {
            scalar::quantize_q8_k(xb, ob);
        }
    }
}

/// One block of 256 values as [`scalar::quantize_q8_k`] writes it, or
/// false with nothing written where its scale is not a finite nonzero
/// number (a block of zeros, an infinity, a largest magnitude whose
/// reciprocal overflows): the portable rule handles those.
// SAFETY (callers): The CPU has AVX2; `xb` holds 256 floats, `ob` 292 bytes.
#[target_feature(enable = "avx2")]
unsafe fn block_q8_k_avx2(xb: &[f32], ob: &mut [u8]) -> bool {
    let p = xb.as_ptr();
    let sign = _mm256_set1_ps(-0.0);
    let abs = |i: usize| _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i)));
    // The largest magnitude; `max_ps` returns its second operand where the
    // first is NaN, so NaNs are passed over as the portable `>` does.
    let mut m = _mm256_setzero_ps();
    for i in 0..32 {
        m = _mm256_max_ps(abs(i), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    // The first value of that magnitude gives the scale its sign.
    let Some(first) = (0..32).find_map(|i| {
        let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(i), _mm256_set1_ps(amax)));
        (hits != 0).then(|| 8 * i + hits.trailing_zeros() as usize)
    }) else {
        return false;
    };
    let iscale = -127.0 / xb[first];
    if !iscale.is_finite() || iscale == 0.0 {
        return false;
    }
    let is = _mm256_set1_ps(iscale);
    // |iscale·v| ≤ 127 for every finite v; a NaN's product becomes 0, as
    // the portable cast makes it.
    let q = |i: usize| {
        let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * i)), is);
        let r = _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v));
        _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)), r)
    };
    let mut sums = [0u64; 4];
    for c in 0..8 {
        let i = [q(4 * c), q(4 * c + 1), q(4 * c + 2), q(4 * c + 3)];
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        let bytes = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(ob.as_mut_ptr().add(4 + 32 * c) as *mut __m256i, bytes);
        // Sums of 16: the bytes made unsigned (+128) summed in fours of eight.
        let sad = _mm256_sad_epu8(_mm256_xor_si256(bytes, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, sad);
        for h in 0..2 {
            let (j, sum) = (2 * c + h, (sums[2 * h] + sums[2 * h + 1]) as i32 - 16 * 128);
            ob[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
    ob[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    true
}

/// Asks for the `bytes` at [`AHEAD`] bytes after `p` to be brought into
/// cache. The kernels read weights once per pass, front to back; the
/// hardware prefetchers alone left them waiting on weight loads (on a
/// 1.1B model, whose weights stream from memory, 16 KB ahead read 6 %
/// faster than 1 KB).
// SAFETY (callers): The CPU has AVX2 (every build that calls this). A
// prefetch never faults, and the address is computed with `wrapping_add`,
// without `add`'s in-bounds requirement, so any `p` is sound.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn ahead(p: *const u8, bytes: usize) {
    prefetch(p.wrapping_add(AHEAD), bytes);
}

/// Asks for the `bytes` at `p` to be brought into cache.
// SAFETY (callers): as for [`ahead`].
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn prefetch(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// How far ahead [`ahead`] asks for weights.
const AHEAD: usize = 16 << 10;

/// Safe entry points: rows of `row_bytes` (whole blocks) one after another
/// in `w` against `T` activation rows; `out[r·T + t]`. Each checks the
/// shapes, then runs its body on every row inside one loop compiled for
/// the body's features (AVX2, FMA and F16C unless named; the body inlines,
/// no call per row).
macro_rules! entry {
    ($name:ident, $body:ident, $wb:expr, $ab:expr) => {
        entry!($name, $body, $wb, $ab, "avx2,fma,f16c");
    };
    ($name:ident, $body:ident, $wb:expr, $ab:expr, $features:literal) => {
        fn $name<const T: usize>(w: &[u8], row_bytes: usize, a: [&[u8]; T], out: &mut [f32]) {
            let nb = row_bytes / $wb;
            let rows = if row_bytes == 0 { 0 } else { w.len() / row_bytes };
            assert!(
                row_bytes == nb * $wb
                    && w.len() == rows * row_bytes
                    && out.len() == rows * T
                    && a.iter().all(|r| r.len() == nb * $ab),
                "kernel shapes"
            );
            // SAFETY (callers): As for the body: the CPU has the features and the shapes were asserted.
            #[target_feature(enable = $features)]
            unsafe fn each_row<const T: usize>(w: &[u8], row_bytes: usize, a: [&[u8]; T], nb: usize, out: &mut [f32]) {
                for (row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(T)) {
                    ahead(row.as_ptr(), row_bytes);
                    o.copy_from_slice(&$body::<T>(row, a, nb));
                }
            }
            // SAFETY: `table` hands these functions out only after detecting
            // `$features`; the body reads `nb` blocks of `$wb` bytes
            // from each row and of `$ab` bytes from each row of `a`, which
            // the assertion above guarantees are there.
            unsafe { each_row::<T>(w, row_bytes, a, nb, out) }
        }
    };
}

entry!(q4_0, q4_0_avx2, 18, 40);
entry!(q4_1, q4_1_avx2, 20, 40);
entry!(q5_0, q5_0_avx2, 22, 40);
entry!(q5_1, q5_1_avx2, 24, 40);
entry!(q8_0, q8_0_avx2, 34, 40);
entry!(q2_k, q2_k_avx2, 84, 292);
entry!(q2_k_v, q2_k_vnni, 84, 292, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni");
entry!(q3_k, q3_k_avx2, 110, 292);
entry!(q4_k, q4_k_avx2, 144, 292);
entry!(q5_k, q5_k_avx2, 176, 292);
entry!(q6_k, q6_k_avx2, 210, 292);
// Dense rows: a "block" is 8 values (the tail is handled in the body).
entry!(f32s, f32_avx2, 4, 4);
entry!(f16s, f16_avx2, 2, 4);
entry!(bf16s, bf16_avx2, 2, 4);

/// The sum of `v`'s eight lanes.
// SAFETY (callers): The CPU has AVX2 and FMA (registers only; no memory is read).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The two f16 at `p` (4 bytes), widened into lanes 0 and 1. A 32-bit
/// load: a 16-bit one compiles to an insert into a live register, a false
/// dependency that serialized whole loops.
// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16x2(p: *const u8) -> __m128 {
    let bits = std::ptr::read_unaligned(p as *const u32);
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 16 bytes of nibbles as 32 bytes: low nibbles first, then high nibbles.
// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let lo = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_srli_epi16(lo, 4);
    _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0xF))
}

/// The 32 bits at `p` as 32 bytes: 0xFF where the bit is set.
// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_bytes(p: *const u8) -> __m256i {
    let x = std::ptr::read_unaligned(p as *const u32);
    // Byte j takes byte j/8 of the word, then tests bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x as i32),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
    );
    let probe = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, probe), probe)
}

/// Σ over 8 lanes of `u · s` pairs (unsigned `u`, signed `s`), as floats.
// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_u8_i8(u: __m256i, s: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
}

macro_rules! finish {
    ($acc:expr, $T:expr) => {{
        let mut out = [0f32; $T];
        for t in 0..$T {
            out[t] = hsum($acc[t]);
        }
        out
    }};
}

/// Blocks `0..nb` of 32 values, two at a time into two sets of
/// accumulators (one chain of dependent adds would bound the loop by the
/// add's latency), then the odd block; `$step!(b, k)` adds block `b` into
/// set `k`.
macro_rules! pairs {
    ($nb:expr, $step:ident) => {{
        for i in 0..$nb / 2 {
            $step!(2 * i, 0);
            $step!(2 * i + 1, 1);
        }
        if $nb % 2 == 1 {
            $step!($nb - 1, 0);
        }
    }};
}

/// The f16 at `p` in all eight lanes. Broadcast as 16 bits first: a
/// scale converted in one lane compiles to a 16-bit insert into whatever
/// register is at hand, a false dependency that chained every block of a
/// row to the accumulators.
// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_all(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(p as *const i16)))
}

/// Signed 4-, 5- or 8-bit weights (`qx` per block) against 8-bit
/// activation blocks of `$ab` bytes (the scale, then at `$ab − 32` the
/// values; a `Q8_0O` block's sum field is left unread, the weights being
/// signed here).
macro_rules! signed_32 {
    ($w:expr, $a:expr, $nb:expr, $T:ident, $wb:expr, $ab:expr, |$p:ident| $qx:expr) => {{
        let mut acc = [[_mm256_setzero_ps(); $T]; 2];
        macro_rules! step {
            ($b:expr, $k:expr) => {{
                let b = $b;
                let $p = $w.as_ptr().add(b * $wb);
                let wd = f16_all($p);
                let qx: __m256i = $qx;
                // |qx| with the sign moved onto the activations: maddubs
                // wants one unsigned operand.
                let ax = _mm256_sign_epi8(qx, qx);
                for t in 0..$T {
                    let ab = $a[t].as_ptr().add(b * $ab);
                    let sy = _mm256_sign_epi8(load(ab.add($ab - 32)), qx);
                    let d = _mm256_mul_ps(wd, _mm256_broadcast_ss(&*(ab as *const f32)));
                    acc[$k][t] = _mm256_fmadd_ps(d, sum_u8_i8(ax, sy), acc[$k][t]);
                }
            }};
        }
        pairs!($nb, step);
        let mut both = [_mm256_setzero_ps(); $T];
        for t in 0..$T {
            both[t] = _mm256_add_ps(acc[0][t], acc[1][t]);
        }
        finish!(both, $T)
    }};
}

/// Unsigned weights `q` with a min against activations that carry d·Σa:
/// `Q4_1`/`Q5_1` (d, m) against `Q8_1`. `$dm` gives (d, min) in lanes 0
/// and 1.
macro_rules! unsigned_32 {
    ($w:expr, $a:expr, $nb:expr, $T:ident, $wb:expr, |$p:ident| ($dm:expr, $qx:expr)) => {{
        let mut acc = [[_mm256_setzero_ps(); $T]; 2];
        // Lane 1: Σ m_w·s_a (lane 0 is unused). One chain per row is
        // enough (its adds are far apart); a second would spill registers.
        let mut mins = [_mm_setzero_ps(); $T];
        macro_rules! step {
            ($b:expr, $k:expr) => {{
                let b = $b;
                let $p = $w.as_ptr().add(b * $wb);
                let dm: __m128 = $dm;
                let wd = _mm256_broadcastss_ps(dm);
                let qx: __m256i = $qx;
                for t in 0..$T {
                    let ab = $a[t].as_ptr().add(b * 40);
                    // (d_a, s_a) in lanes 0 and 1.
                    let ds = _mm_castsi128_ps(_mm_loadl_epi64(ab as *const __m128i));
                    let d = _mm256_mul_ps(wd, _mm256_broadcastss_ps(ds));
                    acc[$k][t] = _mm256_fmadd_ps(d, sum_u8_i8(qx, load(ab.add(8))), acc[$k][t]);
                    mins[t] = _mm_fmadd_ps(dm, ds, mins[t]);
                }
            }};
        }
        pairs!($nb, step);
        let mut both = [_mm256_setzero_ps(); $T];
        for t in 0..$T {
            both[t] = _mm256_add_ps(acc[0][t], acc[1][t]);
        }
        let mut out = finish!(both, $T);
        for t in 0..$T {
            out[t] += _mm_cvtss_f32(_mm_shuffle_ps(mins[t], mins[t], 1));
        }
        out
    }};
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    // `q − 8` in −8..8: |q − 8|·|a| pairs stay far inside maddubs' 16 bits.
    signed_32!(w, a, nb, T, 18, 40, |p| _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    signed_32!(w, a, nb, T, 22, 40, |p| {
        let hi = _mm256_and_si256(bit_bytes(p.add(2)), _mm256_set1_epi8(0x10));
        _mm256_sub_epi8(_mm256_or_si256(nibbles(p.add(6)), hi), _mm256_set1_epi8(16))
    })
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    signed_32!(w, a, nb, T, 34, 40, |p| load(p.add(2)))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    unsigned_32!(w, a, nb, T, 20, |p| (f16x2(p), nibbles(p.add(4))))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    unsigned_32!(w, a, nb, T, 24, |p| (f16x2(p), {
        let hi = _mm256_and_si256(bit_bytes(p.add(4)), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(p.add(8)), hi)
    }))
}

/// `Q4_K`/`Q5_K` against `Q8_K`: `lo(g)`/`hi(g)` give the unsigned values of
/// sub-blocks 2g and 2g+1 of group g (64 values); the mins are subtracted
/// with the activations' 16-value sums.
macro_rules! k_scaled {
    ($w:expr, $a:expr, $nb:expr, $T:ident, $wb:expr, |$p:ident, $g:ident| ($setup:stmt; $lo:expr, $hi:expr)) => {{
        let mut acc = [_mm256_setzero_ps(); $T];
        let mut mins = [_mm256_setzero_ps(); $T];
        for b in 0..$nb {
            let $p = $w.as_ptr().add(b * $wb);
            let dm = f16x2($p);
            let d = _mm256_broadcastss_ps(dm);
            let dmin = _mm256_broadcastss_ps(_mm_shuffle_ps(dm, dm, 1));
            // The 8 scales and mins, unpacked once per block; each min
            // twice, to pair with the activations' 16-value sums.
            let packed = &$w[b * $wb + 4..b * $wb + 16];
            let mut sc = [0i16; 8];
            let mut mn = [0i16; 16];
            for j in 0..8 {
                let (s, m) = scalar::scale_min_k4(packed, j);
                sc[j] = s as i16;
                mn[2 * j] = m as i16;
                mn[2 * j + 1] = m as i16;
            }
            let mn = _mm256_loadu_si256(mn.as_ptr() as *const __m256i);
            let mut sumi = [_mm256_setzero_si256(); $T];
            $setup
            for $g in 0..4 {
                let (lo, hi): (__m256i, __m256i) = ($lo, $hi);
                let sl = _mm256_set1_epi16(sc[2 * $g]);
                let sh = _mm256_set1_epi16(sc[2 * $g + 1]);
                for t in 0..$T {
                    let y = $a[t].as_ptr().add(b * 292 + 4 + 64 * $g);
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(y)), sl);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(y.add(32))), sh);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
                }
            }
            for t in 0..$T {
                let ab = $a[t].as_ptr().add(b * 292);
                let ad = _mm256_broadcast_ss(&*(ab as *const f32));
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, ad), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                // Σ m_j·(bsum_2j + bsum_2j+1), eight lanes.
                let m = _mm256_madd_epi16(load(ab.add(260)), mn);
                mins[t] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, ad), _mm256_cvtepi32_ps(m), mins[t]);
            }
        }
        let mut both = [_mm256_setzero_ps(); $T];
        for t in 0..$T {
            both[t] = _mm256_sub_ps(acc[t], mins[t]);
        }
        finish!(both, $T)
    }};
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0xF);
    k_scaled!(w, a, nb, T, 144, |p, g| ((); {
        let q = load(p.add(16 + 32 * g));
        _mm256_and_si256(q, m4)
    }, _mm256_and_si256(_mm256_srli_epi16(load(p.add(16 + 32 * g)), 4), m4)))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let (m4, one) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(1));
    k_scaled!(w, a, nb, T, 176, |p, g| (let hb = load(p.add(16)); {
        // Fifth bits: bit 2g of each qh byte for sub-block 2g, 2g+1 for the next.
        let shift = _mm_cvtsi32_si128(2 * g as i32);
        let h = _mm256_and_si256(_mm256_srl_epi16(hb, shift), one);
        _mm256_or_si256(_mm256_and_si256(load(p.add(48 + 32 * g)), m4), _mm256_slli_epi16(h, 4))
    }, {
        let shift = _mm_cvtsi32_si128(2 * g as i32 + 1);
        let h = _mm256_and_si256(_mm256_srl_epi16(hb, shift), one);
        let q = _mm256_and_si256(_mm256_srli_epi16(load(p.add(48 + 32 * g)), 4), m4);
        _mm256_or_si256(q, _mm256_slli_epi16(h, 4))
    }))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let (m4, m3, m32) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let p = w.as_ptr().add(b * 210);
        // d is the block's last two bytes: read 206..210, take lane 1.
        let d2 = f16x2(p.add(206));
        let d = _mm_cvtss_f32(_mm_shuffle_ps(d2, d2, 1));
        let mut sumi = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            let (ql0, ql1, qh) = (load(p.add(64 * h)), load(p.add(64 * h + 32)), load(p.add(128 + 32 * h)));
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), two_bits(qh, m3)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), two_bits(_mm256_srli_epi16(qh, 2), m3)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), two_bits(_mm256_srli_epi16(qh, 4), m3)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), two_bits(_mm256_srli_epi16(qh, 6), m3)),
            ];
            let sc = &w[b * 210 + 192 + 8 * h..b * 210 + 200 + 8 * h];
            // Each 32 values have two scales: the first 16 values' and the next 16's.
            let mut s = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                s[k] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1] as i8 as i16), _mm_set1_epi16(sc[2 * k] as i8 as i16));
            }
            for t in 0..T {
                let y = a[t].as_ptr().add(b * 292 + 4 + 128 * h);
                for k in 0..4 {
                    let yk = load(y.add(32 * k));
                    let prod = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], yk), _mm256_maddubs_epi16(m32, yk));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(prod, s[k]));
                }
            }
        }
        for t in 0..T {
            let ad = scalar::f32_at(a[t], b * 292);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * ad), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    finish!(acc, T)
}

/// Bits 0..2 of each byte of `q`, moved to bits 4..6.
// SAFETY (callers): The CPU has AVX2, FMA and F16C, and `p` points at the bytes this reads inside the
// caller's block (each caller passes a block pointer of its row slice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_bits(q: __m256i, m3: __m256i) -> __m256i {
    _mm256_slli_epi16(_mm256_and_si256(q, m3), 4)
}

/// Dense weights: `n` values, `widen(i)` loads values 8i..8i+8 as f32.
macro_rules! dense {
    ($a:expr, $n:expr, $T:ident, |$i:ident| $widen:expr, |$j:ident| $scalar:expr) => {{
        let mut acc = [_mm256_setzero_ps(); $T];
        let whole = $n / 8;
        for $i in 0..whole {
            let wv: __m256 = $widen;
            for t in 0..$T {
                let av = _mm256_loadu_ps($a[t].as_ptr().add(32 * $i) as *const f32);
                acc[t] = _mm256_fmadd_ps(wv, av, acc[t]);
            }
        }
        let mut out = finish!(acc, $T);
        for $j in 8 * whole..$n {
            let wj: f32 = $scalar;
            for t in 0..$T {
                out[t] += wj * scalar::f32_at($a[t], 4 * $j);
            }
        }
        out
    }};
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], n: usize) -> [f32; T] {
    dense!(a, n, T, |i| _mm256_loadu_ps(w.as_ptr().add(32 * i) as *const f32), |j| scalar::f32_at(w, 4 * j))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], n: usize) -> [f32; T] {
    dense!(a, n, T, |i| _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(16 * i) as *const __m128i)), |j| scalar::f16_at(
        w,
        2 * j
    ))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], n: usize) -> [f32; T] {
    dense!(
        a,
        n,
        T,
        |i| {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.as_ptr().add(16 * i) as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
        },
        |j| half::bf16::from_bits(u16::from_le_bytes([w[2 * j], w[2 * j + 1]])).to_f32()
    )
}
