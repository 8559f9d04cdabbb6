//! Row kernels of the 2- and 3-bit k-quants (`Q2_K`, `Q3_K`) against
//! `Q8_K` activations, one weight row against `T` activation rows, as
//! `x86.rs`'s others: for the rows past a matrix's last whole group of
//! eight (the groups run `x86_group.rs`'s and `x86_pair.rs`'s kernels). Each block's products are exact integer sums; then
//! `(d·d_a)·sum` per lane, as in llama.cpp. `Q2_K` has a second build for
//! CPUs with VNNI that computes the same lanes (so the same bits): its
//! 4-bit scales are folded into the 2-bit weights by a byte shuffle
//! (`scale·q` ≤ 45 fits a byte), so one `vpdpbusd` does a chunk's
//! products where AVX2 needs `maddubs`, `madd` and an add.

use std::arch::x86_64::*;

use super::scalar;
use super::x86::{f16x2, hsum, load};

/// The horizontal sums of `T` accumulators.
// SAFETY (callers): The CPU has AVX2 and FMA (registers only).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn totals<const T: usize>(acc: [__m256; T]) -> [f32; T] {
    std::array::from_fn(|t| hsum(acc[t]))
}

/// The integer sums of a `Q2_K`/`Q3_K` block against `T` activation
/// blocks (`y[t]`: their 256 quantized values): `q[h][k]` holds the
/// unsigned values of positions `128h + 32k ..+ 32` (sub-blocks `8h + 2k`
/// and `8h + 2k + 1`), `sc` the 16 sub-block scales. Eight exact i32 lanes
/// a row.
// SAFETY (callers): The CPU has AVX2, FMA and F16C; each `y[t]` points at 256 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_sums<const T: usize>(q: &[[__m256i; 4]; 2], sc: &[i16; 16], y: [*const u8; T]) -> [__m256i; T] {
    let mut sums = [_mm256_setzero_si256(); T];
    for h in 0..2 {
        for k in 0..4 {
            let j = 8 * h + 2 * k;
            // maddubs pairs bytes 0..16 into the low 128 bits: the first sub-block's scale there.
            let s = _mm256_set_m128i(_mm_set1_epi16(sc[j + 1]), _mm_set1_epi16(sc[j]));
            for t in 0..T {
                let yk = load(y[t].add(128 * h + 32 * k));
                sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[h][k], yk), s));
            }
        }
    }
    sums
}

/// The 2-bit fields of `x`'s bytes: bits 0..2, 2..4, 4..6, 6..8.
// SAFETY (callers): The CPU has AVX2, FMA and F16C (registers only).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn crumbs(x: __m256i) -> [__m256i; 4] {
    let m3 = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(x, m3),
        _mm256_and_si256(_mm256_srli_epi16(x, 2), m3),
        _mm256_and_si256(_mm256_srli_epi16(x, 4), m3),
        _mm256_and_si256(_mm256_srli_epi16(x, 6), m3),
    ]
}

/// `Q2_K` blocks: `$products(q, packed, y)` gives a block's exact integer
/// sums (eight lanes a row) from its values `q` (`crumbs` of the two
/// 32-byte halves), its 16 scale/min bytes `packed` and the activation
/// rows' values `y`; the mins are taken off with the activations'
/// 16-value sums.
macro_rules! q2_k_blocks {
    ($w:expr, $a:expr, $nb:expr, $T:ident, |$q:ident, $packed:ident, $y:ident| $products:expr) => {{
        let m4 = _mm_set1_epi8(0xF);
        let mut acc = [_mm256_setzero_ps(); $T];
        for b in 0..$nb {
            let p = $w.as_ptr().add(b * 84);
            // Scales in the low nibbles of the first 16 bytes, mins in the high ones.
            let $packed = _mm_loadu_si128(p as *const __m128i);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16($packed, 4), m4));
            let $q = [crumbs(load(p.add(16))), crumbs(load(p.add(48)))];
            let $y: [*const u8; $T] = std::array::from_fn(|t| $a[t].as_ptr().add(b * 292 + 4));
            let sums: [__m256i; $T] = $products;
            let dm = f16x2(p.add(80));
            let (d, dmin) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)));
            for t in 0..$T {
                let ab = $a[t].as_ptr().add(b * 292);
                let ad = scalar::f32_at($a[t], b * 292);
                // Σ m_j·bsum_j, eight lanes.
                let m = _mm256_madd_epi16(load(ab.add(260)), mins);
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * ad), _mm256_cvtepi32_ps(sums[t]), acc[t]);
                acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * ad), _mm256_cvtepi32_ps(m), acc[t]);
            }
        }
        totals(acc)
    }};
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    q2_k_blocks!(w, a, nb, T, |q, packed, y| {
        let mut sc = [0i16; 16];
        _mm256_storeu_si256(sc.as_mut_ptr() as *mut __m256i, _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(0xF))));
        scaled_sums::<T>(&q, &sc, y)
    })
}

/// [`q2_k_avx2`] with VNNI: each 32-value chunk's weights times their
/// scales, looked up in a per-half table, then one `vpdpbusd` per
/// activation row. The lanes hold the same integers as the AVX2 build's.
// SAFETY (callers): The CPU has AVX2, FMA, F16C, AVX-512F, VL and VNNI (`table` checked); `w` holds `nb`
// blocks of this type and each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn q2_k_vnni<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    // Table bytes 4i..4i+4 of a 128-bit half: 0, s, 2s, 3s for one scale s.
    let once = _mm256_set1_epi32(0xFF00_FF00u32 as i32);
    let twice = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    q2_k_blocks!(w, a, nb, T, |q, packed, y| {
        let sc = _mm256_broadcastsi128_si256(_mm_and_si128(packed, _mm_set1_epi8(0xF)));
        let mut sums = [_mm256_setzero_si256(); T];
        for (h, qh) in q.iter().enumerate() {
            // Half h's chunk k: sub-block 8h + 2k in the low 128 bits, 8h + 2k + 1 in the high
            // ones; a half's table holds those scales' multiples, group k for chunk k.
            let e = 8 * h as i8;
            let pick = _mm256_set_epi8(
                e + 7, e + 7, e + 7, e + 7, e + 5, e + 5, e + 5, e + 5, e + 3, e + 3, e + 3, e + 3, e + 1, e + 1, e + 1, e + 1,
                e + 6, e + 6, e + 6, e + 6, e + 4, e + 4, e + 4, e + 4, e + 2, e + 2, e + 2, e + 2, e, e, e, e,
            );
            let s = _mm256_shuffle_epi8(sc, pick);
            let table = _mm256_add_epi8(_mm256_and_si256(s, once), _mm256_and_si256(_mm256_add_epi8(s, s), twice));
            for (k, &qk) in qh.iter().enumerate() {
                let scaled = _mm256_shuffle_epi8(table, _mm256_or_si256(qk, _mm256_set1_epi8(4 * k as i8)));
                for t in 0..T {
                    sums[t] = _mm256_dpbusd_epi32(sums[t], scaled, load(y[t].add(128 * h + 32 * k)));
                }
            }
        }
        sums
    })
}

/// The 16 scales of the `Q3_K` block at `p` (`scalar::scale_k3`) as i16
/// lanes: low nibbles from bytes 96..104, two high bits each from bytes
/// 104..108.
// SAFETY (callers): The CPU has AVX2, FMA and F16C; `p` points at a whole block (110
// bytes; this reads bytes 94..110).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_k3(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p.add(94) as *const __m128i);
    let m4 = _mm_set1_epi8(0xF);
    // Bytes 96..104 sit at 2..10 of `x`, bytes 104..108 at 10..14.
    let v = _mm_srli_si128(x, 2);
    let low = _mm_unpacklo_epi64(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    // Each 32-bit lane i: bytes 104..108 shifted right by 2i, two bits a byte (scales 4i..4i+4).
    let tops = _mm_set1_epi32(std::ptr::read_unaligned(p.add(104) as *const i32));
    let high = _mm_and_si128(_mm_srlv_epi32(tops, _mm_set_epi32(6, 4, 2, 0)), _mm_set1_epi8(3));
    let bytes = _mm_or_si128(low, _mm_slli_epi16(high, 4));
    _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), _mm256_set1_epi16(32))
}

// SAFETY (callers): The CPU has AVX2, FMA and F16C (`table` checked); `w` holds `nb` blocks of this type and
// each row of `a` `nb` activation blocks (the `entry!` wrapper asserted both).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_avx2<const T: usize>(w: &[u8], a: [&[u8]; T], nb: usize) -> [f32; T] {
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let p = w.as_ptr().add(b * 110);
        let mut sc = [0i16; 16];
        _mm256_storeu_si256(sc.as_mut_ptr() as *mut __m256i, scales_k3(p));
        // Stored values are `q − 4` where the high bit is clear: the sums
        // take `q | 4·bit` (0..8) and then 4·Σ_j s_j·bsum_j off.
        let hm = load(p);
        let mut q = [crumbs(load(p.add(32))), crumbs(load(p.add(64)))];
        for (h, qh) in q.iter_mut().enumerate() {
            for (k, v) in qh.iter_mut().enumerate() {
                let bit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + k) as i32)), one);
                *v = _mm256_or_si256(*v, _mm256_slli_epi16(bit, 2));
            }
        }
        let sums = scaled_sums::<T>(&q, &sc, std::array::from_fn(|t| a[t].as_ptr().add(b * 292 + 4)));
        let scales = _mm256_loadu_si256(sc.as_ptr() as *const __m256i);
        let d = scalar::f16_at(&w[b * 110..], 108);
        for t in 0..T {
            let ab = a[t].as_ptr().add(b * 292);
            let off = _mm256_slli_epi32(_mm256_madd_epi16(load(ab.add(260)), scales), 2);
            let dd = _mm256_set1_ps(d * scalar::f32_at(a[t], b * 292));
            acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[t], off)), acc[t]);
        }
    }
    totals(acc)
}

