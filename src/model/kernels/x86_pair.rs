//! AVX-512 kernels over pairs of groups: the sixteen interleaved rows of
//! two adjacent groups (`interleave.rs`) in one 512-bit register, against
//! `T` activation rows, `out[t·16 + r]` (rows 0..8 the first group's, 8..16
//! the second's). Where [`super::x86_group`]'s AVX-512 VNNI build keeps
//! eight rows in a 256-bit register, these take sixteen: each unpacking
//! step, `vpdpbusd`, conversion and FMA serves twice the rows, and the
//! activations are broadcast to all sixteen lanes straight from memory.
//! Every lane computes the same exact integer sum and the same float
//! operations in the same order as the portable kernels (`interleave.rs`),
//! so the results are theirs bit for bit.

use std::arch::x86_64::*;

use super::x86::{load, prefetch};
use super::TileFn;

/// Whether this CPU runs the pair kernels.
pub(super) fn has_avx512_pairs() -> bool {
    super::x86_group::has_vnni() && is_x86_feature_detected!("avx512bw")
}

/// The two groups' 32-byte chunks at offset `off` of their blocks `pa`,
/// `pb` as one register (`pa`'s in the low half).
// SAFETY (callers): the CPU has AVX-512F; both chunks lie in the caller's group blocks.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn pair(pa: *const u8, pb: *const u8, off: usize) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(load(pa.add(off))), load(pb.add(off)), 1)
}

/// The two groups' eight f16 fields at offset `off` of their blocks, as sixteen f32 lanes.
// SAFETY (callers): as for [`pair`], with 16 bytes at each offset.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f")]
unsafe fn halves(pa: *const u8, pb: *const u8, off: usize) -> __m512 {
    let lo = _mm_loadu_si128(pa.add(off) as *const __m128i);
    let hi = _mm_loadu_si128(pb.add(off) as *const __m128i);
    _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1))
}

/// The four activation bytes at `p` in every 32-bit lane.
// SAFETY (callers): the CPU has AVX-512F; `p..p+4` lies in an activation row.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn four(p: *const u8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// The f32 at `p` in every lane.
// SAFETY (callers): the CPU has AVX-512F; `p..p+4` lies in an activation row.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scalar(p: *const u8) -> __m512 {
    _mm512_set1_ps(std::ptr::read_unaligned(p as *const f32))
}

/// Which bytes of `qh`'s 32-bit lanes have their fifth bit set: byte `i`
/// of a lane takes bit `from + i` of that lane's `qh` (`from` a multiple
/// of 4). One shuffle puts the byte holding bits `from..from+4` in all
/// four bytes of its lane, and one test picks a bit for each: no shift
/// (`x86_group::fifth_bits` shifts; the bits are the same).
// SAFETY (callers): the CPU has AVX-512F and BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fifth_bits(qh: __m512i, from: u32) -> __mmask64 {
    let at = (from / 8) as i8;
    // Indices within each 128-bit quarter: its four lanes' byte `at`.
    let pick = _mm_set_epi8(12 + at, 12 + at, 12 + at, 12 + at, 8 + at, 8 + at, 8 + at, 8 + at, 4 + at, 4 + at, 4 + at, 4 + at, at, at, at, at);
    let spread = _mm512_shuffle_epi8(qh, _mm512_broadcast_i32x4(pick));
    _mm512_test_epi8_mask(spread, _mm512_set1_epi32(0x0804_0201 << (from % 8)))
}

/// Asks for the blocks `blocks` blocks after block `b` of the pair at `g`
/// (`nb` blocks of `bytes` a group) to be brought into cache: the same
/// block of both groups, or past their end, of a later pair (a thread's
/// chunk holds pairs one after another). The hardware prefetchers alone
/// left the kernels waiting on weight loads; a plain distance in bytes
/// would ask for the second group's blocks long after their first use.
// SAFETY (callers): the CPU has AVX2, and `nb > 0` (callers run it inside
// their loop over the `nb` blocks). A prefetch never faults and the
// addresses are computed with `wrapping_add`, so any pointer and any
// distance `blocks` are sound.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn ahead(g: *const u8, nb: usize, b: usize, bytes: usize, blocks: usize) {
    let k = b + blocks;
    let (pair, block) = (g.wrapping_add(k / nb * 2 * nb * bytes), k % nb);
    let first = pair.wrapping_add(block * bytes);
    prefetch(first, bytes);
    prefetch(first.wrapping_add(nb * bytes), bytes);
}

/// How many blocks ahead [`ahead`] asks for: ≈ 9 KB of `Q4_0` weights, far
/// enough for one activation row (a block's products take a few cycles,
/// and the weights come from L3 or memory); 8 blocks left one sequence's
/// decode ≈ 6 % slower on SmolLM2, 64 or 128 gained nothing more.
const AHEAD: usize = 32;

/// [`AHEAD`] for the 256-value super-blocks of the K types: ≈ 18 KB of
/// `Q4_K` weights a group (32 blocks, four times as far in bytes as
/// `Q4_0`'s distance, left eight activation rows ≈ 10 % slower from
/// memory with both threads streaming; 4, 8 and 64 blocks were no better).
const AHEAD_K: usize = 16;

/// Stores the sixteen rows' sums of each activation row into `out[t·16 + r]`.
// SAFETY (callers): the CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn put<const T: usize>(acc: [__m512; T], out: &mut [f32]) {
    for (o, a) in out.chunks_exact_mut(16).zip(acc) {
        _mm512_storeu_ps(o.as_mut_ptr(), a);
    }
}

/// The 4- and 5-bit types of [`nibbles16_k`]: `Q4_0`, `Q4_1`, `Q5_0`.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;

/// Sixteen interleaved `Q4_1` rows (`Q4_0` when not `MIN`), two groups of
/// `nb` blocks one after the other, against `T` activation rows with sums.
pub(crate) fn q4x16<const T: usize, const MIN: bool>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    if MIN {
        nibbles16::<T, Q4_1>(groups, nb, a, out)
    } else {
        nibbles16::<T, Q4_0>(groups, nb, a, out)
    }
}

/// Sixteen interleaved `Q5_0` rows against `T` activation rows with sums.
pub(crate) fn q5_0x16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    nibbles16::<T, Q5_0>(groups, nb, a, out)
}

fn nibbles16<const T: usize, const KIND: u8>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let gbytes = [144, 160, 176][KIND as usize];
    assert!(groups.len() == 2 * nb * gbytes && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 40), "pair kernel shapes");
    // SAFETY: `Simd::group_kernel` hands these kernels out only after
    // `has_avx512_pairs`; the body reads the two groups' `nb` blocks and
    // `nb` 40-byte blocks of each activation row, which the assertion
    // guarantees are there, and writes `out`'s 16·T values.
    unsafe { nibbles16_k::<T, KIND>(groups, nb, a, out) }
}

/// Sixteen rows of unsigned 4- or 5-bit weights with a min (`KIND`): per
/// row and block the exact integer sum against the activations (for
/// `Q4_0`/`Q5_0` started at the activations' −k·Σa, so it is `Σ(q − k)·a`),
/// then `acc = fma(d_w·d_a, Σ, acc)`, and for `Q4_1` `acc = fma(m_w, s_a, acc)`.
// SAFETY (callers): see `nibbles16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn nibbles16_k<const T: usize, const KIND: u8>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (gbytes, qs) = [(144, 16), (160, 32), (176, 48)][KIND as usize];
    let mask = _mm512_set1_epi8(0xF);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let pa = g.as_ptr().add(b * gbytes);
        let pb = pa.add(nb * gbytes);
        ahead(g.as_ptr(), nb, b, gbytes, AHEAD);
        let qh = if KIND == Q5_0 { pair(pa, pb, 16) } else { _mm512_setzero_si512() };
        // The offset types start from −k·Σa (a broadcast load, no vector
        // work: one float op less a block and token than a min's FMA).
        let mut s: [__m512i; T] = std::array::from_fn(|t| {
            if KIND == Q4_1 {
                _mm512_setzero_si512()
            } else {
                four(a[t].as_ptr().add(b * 40 + 4))
            }
        });
        for c in 0..4 {
            let x = pair(pa, pb, qs + 32 * c);
            let mut lo = _mm512_and_si512(x, mask);
            // A 32-bit shift moves each byte's high nibble down; the mask drops what crossed from its neighbour.
            let mut hi = _mm512_and_si512(_mm512_srli_epi32(x, 4), mask);
            if KIND == Q5_0 {
                // Nibbles are below 16: adding 16 where the fifth bit is set is or-ing it in.
                let sixteen = _mm512_set1_epi8(0x10);
                lo = _mm512_mask_add_epi8(lo, fifth_bits(qh, 4 * c as u32), lo, sixteen);
                hi = _mm512_mask_add_epi8(hi, fifth_bits(qh, 16 + 4 * c as u32), hi, sixteen);
            }
            for t in 0..T {
                let qa = a[t].as_ptr().add(b * 40 + 8);
                s[t] = _mm512_dpbusd_epi32(s[t], lo, four(qa.add(4 * c)));
                s[t] = _mm512_dpbusd_epi32(s[t], hi, four(qa.add(16 + 4 * c)));
            }
        }
        let d = halves(pa, pb, 0);
        // `Q4_1`'s mins (the offset types have none).
        let m = if KIND == Q4_1 { halves(pa, pb, 16) } else { _mm512_setzero_ps() };
        for t in 0..T {
            let ab = a[t].as_ptr().add(b * 40);
            let dd = _mm512_mul_ps(d, scalar(ab));
            acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s[t]), acc[t]);
            if KIND == Q4_1 {
                acc[t] = _mm512_fmadd_ps(m, scalar(ab.add(4)), acc[t]);
            }
        }
    }
    put(acc, out);
}

/// Sixteen interleaved `Q8_0` rows (stored `q + 128`) against `T` `Q8_0O`
/// activation rows.
pub(crate) fn q8_0x16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(groups.len() == 2 * nb * 272 && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 40), "pair kernel shapes");
    // SAFETY: as for `nibbles16`.
    unsafe { q8_0x16_k::<T>(groups, nb, a, out) }
}

/// Per row and block the exact `Σ(q + 128)·a` started at the activations'
/// −128·Σa (so `Σ q·a`), then `acc = fma(d_w·d_a, Σ, acc)`: one
/// `vpdpbusd` per chunk and token, the weights as stored.
// SAFETY (callers): see `q8_0x16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q8_0x16_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let pa = g.as_ptr().add(b * 272);
        let pb = pa.add(nb * 272);
        ahead(g.as_ptr(), nb, b, 272, AHEAD);
        let mut s: [__m512i; T] = std::array::from_fn(|t| four(a[t].as_ptr().add(b * 40 + 4)));
        for c in 0..8 {
            let x = pair(pa, pb, 16 + 32 * c);
            for t in 0..T {
                s[t] = _mm512_dpbusd_epi32(s[t], x, four(a[t].as_ptr().add(b * 40 + 8 + 4 * c)));
            }
        }
        let d = halves(pa, pb, 0);
        for t in 0..T {
            let dd = _mm512_mul_ps(d, scalar(a[t].as_ptr().add(b * 40)));
            acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s[t]), acc[t]);
        }
    }
    put(acc, out);
}

/// The sixteen rows' scale and min of sub-block `j` (as 32-bit lanes) from
/// the three chunks of packed scale bytes (`x86_group::scale_min_x8`, 16 lanes).
// SAFETY (callers): the CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scale_min_x16(c: [__m512i; 3], j: usize) -> (__m512i, __m512i) {
    let m6 = _mm512_set1_epi32(63);
    let m4 = _mm512_set1_epi32(0xF);
    // Byte k of each lane of a chunk, as a 32-bit lane.
    let byte = |x: __m512i, k: usize| _mm512_and_si512(_mm512_srlv_epi32(x, _mm512_set1_epi32(8 * k as i32)), _mm512_set1_epi32(0xFF));
    if j < 4 {
        (_mm512_and_si512(byte(c[0], j), m6), _mm512_and_si512(byte(c[1], j), m6))
    } else {
        let k = j - 4;
        let (b8, b0, b4) = (byte(c[2], k), byte(c[0], k), byte(c[1], k));
        let sc = _mm512_or_si512(_mm512_and_si512(b8, m4), _mm512_slli_epi32(_mm512_srli_epi32(b0, 6), 4));
        let mn = _mm512_or_si512(_mm512_srli_epi32(b8, 4), _mm512_slli_epi32(_mm512_srli_epi32(b4, 6), 4));
        (sc, mn)
    }
}

/// Sixteen interleaved `Q4_K` rows against `T` `Q8_K` activation rows.
pub(crate) fn q4_kx16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(groups.len() == 2 * nb * 1152 && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 292), "pair kernel shapes");
    // SAFETY: as for `nibbles16`.
    unsafe { q4_kx16_k::<T, false>(groups, nb, a, out) }
}

/// Sixteen interleaved `Q5_K` rows against `T` `Q8_K` activation rows.
pub(crate) fn q5_kx16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(groups.len() == 2 * nb * 1408 && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 292), "pair kernel shapes");
    // SAFETY: as for `nibbles16`.
    unsafe { q4_kx16_k::<T, true>(groups, nb, a, out) }
}

/// [`q4_kx16`] (`q5_kx16` if `FIVE`) of five to eight activation rows
/// (`a`) as two products of at most four rows, one after the other, the
/// second reading the weights from cache: each row's sums are the ones a
/// single product gives it. Eight rows in one product keep 48 sums and
/// accumulators for 32 registers; two of four ran faster from memory
/// with both threads streaming (Zen 5, `Q4_K`, 16 rows × 2048: 8 rows
/// 200–224 → 258–266 G MAC/s a thread, 7 rows 211 → 251, 6 rows 216 →
/// 242, 5 rows 166 → 219).
pub(crate) fn q4_kx16_halves<const FIVE: bool>(groups: &[u8], nb: usize, a: &[&[u8]], out: &mut [f32]) {
    let (first, second) = a.split_at(a.len().div_ceil(2));
    let (o1, o2) = out.split_at_mut(16 * first.len());
    let (one, two, three, four): (TileFn<1>, TileFn<2>, TileFn<3>, TileFn<4>) =
        if FIVE { (q5_kx16, q5_kx16, q5_kx16, q5_kx16) } else { (q4_kx16, q4_kx16, q4_kx16, q4_kx16) };
    for (a, out) in [(first, o1), (second, o2)] {
        match *a {
            [a0] => one(groups, nb, [a0], out),
            [a0, a1] => two(groups, nb, [a0, a1], out),
            [a0, a1, a2] => three(groups, nb, [a0, a1, a2], out),
            [a0, a1, a2, a3] => four(groups, nb, [a0, a1, a2, a3], out),
            _ => unreachable!("five to eight activation rows in two halves"),
        }
    }
}

/// Per row and super-block the exact integer sums `Σ_j sc_j·Σ(q·a)` and
/// `Σ_j m_j·Σa`, then `acc = fma(d·d_a, sums, acc)` and `mins =
/// fma(dmin·d_a, msums, mins)`; the result is `acc − mins`
/// (`interleave::q4_kx8`; `Q5_K` when `FIVE`, its fifth bits from `qh`).
// SAFETY (callers): see `q4_kx16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_kx16_k<const T: usize, const FIVE: bool>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let mask = _mm512_set1_epi8(0xF);
    let (bytes, qs) = if FIVE { (1408, 384) } else { (1152, 128) };
    let mut acc = [_mm512_setzero_ps(); T];
    let mut mins = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let pa = g.as_ptr().add(b * bytes);
        let pb = pa.add(nb * bytes);
        ahead(g.as_ptr(), nb, b, bytes, AHEAD_K);
        let chunks = [pair(pa, pb, 32), pair(pa, pb, 64), pair(pa, pb, 96)];
        let mut sums = [_mm512_setzero_si512(); T];
        let mut msums = [_mm512_setzero_si512(); T];
        for gi in 0..4 {
            let (sl, ml) = scale_min_x16(chunks, 2 * gi);
            let (sh, mh) = scale_min_x16(chunks, 2 * gi + 1);
            // Per token: sub-blocks 2g (low nibbles) and 2g+1 (high).
            let mut lo_s = [_mm512_setzero_si512(); T];
            let mut hi_s = [_mm512_setzero_si512(); T];
            for k in 0..8 {
                let x = pair(pa, pb, qs + 32 * (8 * gi + k));
                let mut lo = _mm512_and_si512(x, mask);
                let mut hi = _mm512_and_si512(_mm512_srli_epi32(x, 4), mask);
                if FIVE {
                    // 16 added to the values whose `qh` byte has bit 2g (2g+1) set.
                    let qh = pair(pa, pb, 128 + 32 * k);
                    let set = |j: usize| _mm512_test_epi8_mask(qh, _mm512_set1_epi8(1 << j));
                    let sixteen = _mm512_set1_epi8(16);
                    lo = _mm512_mask_add_epi8(lo, set(2 * gi), lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, set(2 * gi + 1), hi, sixteen);
                }
                for t in 0..T {
                    let y = a[t].as_ptr().add(b * 292 + 4 + 64 * gi + 4 * k);
                    lo_s[t] = _mm512_dpbusd_epi32(lo_s[t], lo, four(y));
                    hi_s[t] = _mm512_dpbusd_epi32(hi_s[t], hi, four(y.add(32)));
                }
            }
            // Each min twice in its lane (two i16), against the pair of
            // 16-value sums that make its sub-block's: one `vpdpwssd` adds
            // m·(bsum₀ + bsum₁), the same integer as m·bl (|bsum| ≤ 2,032).
            let (ml, mh) = (_mm512_or_si512(ml, _mm512_slli_epi32(ml, 16)), _mm512_or_si512(mh, _mm512_slli_epi32(mh, 16)));
            for t in 0..T {
                let l = _mm512_mullo_epi32(lo_s[t], sl);
                let h = _mm512_mullo_epi32(hi_s[t], sh);
                sums[t] = _mm512_add_epi32(sums[t], _mm512_add_epi32(l, h));
                let bs = a[t].as_ptr().add(b * 292 + 260 + 8 * gi);
                let pair_at = |off: usize| _mm512_set1_epi32(std::ptr::read_unaligned(bs.add(off) as *const i32));
                msums[t] = _mm512_dpwssd_epi32(msums[t], ml, pair_at(0));
                msums[t] = _mm512_dpwssd_epi32(msums[t], mh, pair_at(4));
            }
        }
        let d = halves(pa, pb, 0);
        let dmin = halves(pa, pb, 16);
        for t in 0..T {
            let da = scalar(a[t].as_ptr().add(b * 292));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(sums[t]), acc[t]);
            mins[t] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(msums[t]), mins[t]);
        }
    }
    for t in 0..T {
        acc[t] = _mm512_sub_ps(acc[t], mins[t]);
    }
    put(acc, out);
}

/// Sixteen interleaved `Q6_K` rows against `T` `Q8_K` activation rows.
pub(crate) fn q6_kx16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(groups.len() == 2 * nb * 1680 && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 292), "pair kernel shapes");
    // SAFETY: `Simd::group_kernel` hands this out only after
    // `has_avx512_pairs`; the body reads the two groups' `nb` 1,680-byte
    // blocks (at offsets below 1,680: scales to 144, `ql` to 1,168, `qh` to
    // 1,680) and each activation row's `nb` 292-byte blocks, which the
    // assertion guarantees, and writes `out`'s 16·T values.
    unsafe { q6_kx16_k::<T>(groups, nb, a, out) }
}

/// Per row and super-block the exact integer sum `Σ_j sc_j·Σ(q−32)·a`
/// over the sixteen sub-blocks of 16 values, then `acc += (d·d_a)·sum`
/// (`interleave::q6_kx8`), computed as `Σ_j sc_j·Σ q·a − Σ_j 32·sc_j·Σa`:
/// `vpdpbusd` takes the 6-bit `q` as they are (unsigned) against the
/// activations as they are (signed), and the `Q8_K` blocks' sums of 16
/// (`bsums`) give the second term, two sub-blocks per `vpdpwssd`.
// SAFETY (callers): see `q6_kx16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q6_kx16_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (nib, two) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(0x30));
    // Bytes 0, 1 (`first`) or 2, 3 of each 32-bit lane into the high bytes
    // of its two 16-bit halves (index −1 writes a zero byte).
    let spread = |b: i8| _mm512_broadcast_i32x4(_mm_setr_epi8(-1, b, -1, b + 1, -1, b + 4, -1, b + 5, -1, b + 8, -1, b + 9, -1, b + 12, -1, b + 13));
    let (first, second) = (spread(0), spread(2));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let pa = g.as_ptr().add(b * 1680);
        let pb = pa.add(nb * 1680);
        ahead(g.as_ptr(), nb, b, 1680, AHEAD_K);
        // Each sum starts at −Σ_j 32·sc_j·bsum_j.
        let mut s = [_mm512_setzero_si512(); T];
        for c in 0..4 {
            // Scales 4c..4c+4 of each row (one byte each in its lane).
            let scales = pair(pa, pb, 16 + 32 * c);
            // −32·sc of sub-blocks (4c, 4c+1) and (4c+2, 4c+3) as pairs of
            // i16 (a byte in a half's high byte, shifted down 3: sign-extended,
            // times 32; |32·sc| ≤ 4,096, |bsum| ≤ 2,032).
            let neg = |x: __m512i| _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_srai_epi16(x, 3));
            let pairs = [neg(_mm512_shuffle_epi8(scales, first)), neg(_mm512_shuffle_epi8(scales, second))];
            for t in 0..T {
                let bs = a[t].as_ptr().add(b * 292 + 260 + 8 * c);
                for (h, p) in pairs.iter().enumerate() {
                    s[t] = _mm512_dpwssd_epi32(s[t], *p, four(bs.add(4 * h)));
                }
            }
        }
        for j in 0..16 {
            // Sub-block j: half h, quarter k of the half, run `is` of 16.
            let (h, k, is) = (j / 8, j % 8 / 2, j % 2);
            // Scale j of each row, sign-extended from byte j % 4 of its lane.
            let up = _mm512_set1_epi32(24 - 8 * (j as i32 % 4));
            let sc = _mm512_srai_epi32(_mm512_sllv_epi32(pair(pa, pb, 16 + 32 * (j / 4)), up), 24);
            let mut d = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let l = 16 * is + 4 * c;
                let ql = pair(pa, pb, 144 + 8 * (64 * h + 32 * (k % 2) + l));
                let qh = pair(pa, pb, 1168 + 8 * (32 * h + l));
                let low = if k >= 2 { _mm512_and_si512(_mm512_srli_epi32(ql, 4), nib) } else { _mm512_and_si512(ql, nib) };
                // Bits 2k, 2k+1 of each qh byte at bits 4, 5 (a 32-bit shift; the mask drops what crossed bytes).
                let high = _mm512_and_si512(
                    if k >= 2 {
                        _mm512_srlv_epi32(qh, _mm512_set1_epi32(2 * k as i32 - 4))
                    } else {
                        _mm512_sllv_epi32(qh, _mm512_set1_epi32(4 - 2 * k as i32))
                    },
                    two,
                );
                let w = _mm512_or_si512(low, high);
                let v = 128 * h + 32 * k + l;
                for t in 0..T {
                    d[t] = _mm512_dpbusd_epi32(d[t], w, four(a[t].as_ptr().add(b * 292 + 4 + v)));
                }
            }
            for t in 0..T {
                s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(d[t], sc));
            }
        }
        let dw = halves(pa, pb, 0);
        for t in 0..T {
            let dd = _mm512_mul_ps(dw, scalar(a[t].as_ptr().add(b * 292)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(s[t])));
        }
    }
    put(acc, out);
}

/// Bytes 0, 1 and bytes 2, 3 of each 32-bit lane of `x` as the two 16-bit
/// halves of a lane (zero-extended): pairs that `vpdpwssd` multiplies with
/// two adjacent 16-bit values.
// SAFETY (callers): the CPU has AVX-512F and BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pairs16(x: __m512i) -> (__m512i, __m512i) {
    let lo = _mm_set_epi8(-1, 13, -1, 12, -1, 9, -1, 8, -1, 5, -1, 4, -1, 1, -1, 0);
    let hi = _mm_set_epi8(-1, 15, -1, 14, -1, 11, -1, 10, -1, 7, -1, 6, -1, 3, -1, 2);
    (_mm512_shuffle_epi8(x, _mm512_broadcast_i32x4(lo)), _mm512_shuffle_epi8(x, _mm512_broadcast_i32x4(hi)))
}

/// Byte `j % 4` of each 32-bit lane of `x`, as the lane, masked to `mask`.
// SAFETY (callers): the CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn byte_of(x: __m512i, j: usize, mask: i32) -> __m512i {
    _mm512_and_si512(_mm512_srlv_epi32(x, _mm512_set1_epi32(8 * (j as i32 % 4))), _mm512_set1_epi32(mask))
}

/// `Σ_j v_j·bsum_j` over the four sub-blocks `4k..4k+4` of an activation
/// block `ab` (its `Q8_K` sums of 16), `v` given as [`pairs16`] of their
/// lane bytes, added to `acc`.
// SAFETY (callers): the CPU has AVX-512F, BW and VNNI; `ab` is a `Q8_K` block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn with_bsums(acc: __m512i, (lo, hi): (__m512i, __m512i), ab: *const u8, k: usize) -> __m512i {
    let bs = ab.add(260 + 8 * k);
    _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(acc, lo, four(bs)), hi, four(bs.add(4)))
}

/// Sixteen interleaved `Q2_K` rows against `T` `Q8_K` activation rows.
pub(crate) fn q2_kx16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(groups.len() == 2 * nb * 672 && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 292), "pair kernel shapes");
    // SAFETY: `Simd::group_kernel` hands this out only after
    // `has_avx512_pairs`; the body reads the two groups' `nb` 672-byte
    // blocks (at offsets below 672) and each activation row's `nb`
    // 292-byte blocks, which the assertion guarantees, and writes `out`'s
    // 16·T values.
    unsafe { q2_kx16_k::<T>(groups, nb, a, out) }
}

/// `interleave::q2_kx8`'s sums and float steps on sixteen rows: the mins'
/// term as 16-bit pairs against the activations' sums of 16, then the
/// weights with their scales folded in (`sc·q` ≤ 45: a byte), looked up
/// by crumb in each lane's table 0, sc, 2·sc, 3·sc.
// SAFETY (callers): see `q2_kx16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q2_kx16_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (m3, nib) = (_mm512_set1_epi8(3), _mm512_set1_epi8(0xF));
    let lane = _mm512_broadcast_i32x4(_mm_set_epi32(0x0C0C_0C0C, 0x0808_0808, 0x0404_0404, 0));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let pa = g.as_ptr().add(b * 672);
        let pb = pa.add(nb * 672);
        ahead(g.as_ptr(), nb, b, 672, AHEAD_K);
        let sc = [pair(pa, pb, 32), pair(pa, pb, 64), pair(pa, pb, 96), pair(pa, pb, 128)];
        // The mins as 16-bit pairs, once for every activation row.
        let mut mn = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 4];
        for (pairs, &x) in mn.iter_mut().zip(&sc) {
            *pairs = pairs16(_mm512_and_si512(_mm512_srli_epi16(x, 4), nib));
        }
        let dmin = halves(pa, pb, 16);
        for t in 0..T {
            let ab = a[t].as_ptr().add(b * 292);
            let mut m = _mm512_setzero_si512();
            for (k, &pairs) in mn.iter().enumerate() {
                m = with_bsums(m, pairs, ab, k);
            }
            acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, scalar(ab)), _mm512_cvtepi32_ps(m), acc[t]);
        }
        let mut s = [_mm512_setzero_si512(); T];
        // Sub-block 8h + 2c + second: half h, crumb c of its `qs` bytes, their first or second 16.
        for (h, second) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let mut tables = [_mm512_setzero_si512(); 4];
            for (c, table) in tables.iter_mut().enumerate() {
                let j = 8 * h + 2 * c + second;
                *table = _mm512_mullo_epi32(byte_of(sc[j / 4], j, 0xF), _mm512_set1_epi32(0x0302_0100));
            }
            for k in 4 * second..4 * second + 4 {
                let x = pair(pa, pb, 160 + 32 * (8 * h + k));
                let q = [
                    _mm512_and_si512(x, m3),
                    _mm512_and_si512(_mm512_srli_epi32(x, 2), m3),
                    _mm512_and_si512(_mm512_srli_epi32(x, 4), m3),
                    _mm512_and_si512(_mm512_srli_epi32(x, 6), m3),
                ];
                for c in 0..4 {
                    let w = _mm512_shuffle_epi8(tables[c], _mm512_or_si512(q[c], lane));
                    for t in 0..T {
                        s[t] = _mm512_dpbusd_epi32(s[t], w, four(a[t].as_ptr().add(b * 292 + 4 + 128 * h + 32 * c + 4 * k)));
                    }
                }
            }
        }
        let d = halves(pa, pb, 0);
        for t in 0..T {
            let da = scalar(a[t].as_ptr().add(b * 292));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s[t]), acc[t]);
        }
    }
    put(acc, out);
}

/// Sixteen interleaved `Q3_K` rows against `T` `Q8_K` activation rows.
pub(crate) fn q3_kx16<const T: usize>(groups: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(groups.len() == 2 * nb * 880 && out.len() == 16 * T && a.iter().all(|r| r.len() == nb * 292), "pair kernel shapes");
    // SAFETY: as for `q2_kx16`, with 880-byte blocks.
    unsafe { q3_kx16_k::<T>(groups, nb, a, out) }
}

/// `interleave::q3_kx8`'s sum on sixteen rows, as `x86_group`'s:
/// `Σ_j sc_j·Σ u·a − 4·Σ_j sc_j·bsum_j` with the unsigned `u = q + 4·h`;
/// each sub-block's `Σ u·a` (below 2¹⁵) times its signed scale by one
/// `vpdpwssd` whose second half is 0.
// SAFETY (callers): see `q3_kx16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q3_kx16_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (m3, four_bit) = (_mm512_set1_epi8(3), _mm512_set1_epi8(4));
    let (k1, k2) = (_mm512_set1_epi32(0x0303_0303), _mm512_set1_epi32(0x0F0F_0F0F));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let pa = g.as_ptr().add(b * 880);
        let pb = pa.add(nb * 880);
        ahead(g.as_ptr(), nb, b, 880, AHEAD_K);
        let (w0, w1, hi) = (pair(pa, pb, 16), pair(pa, pb, 48), pair(pa, pb, 80));
        let scales = [
            _mm512_or_si512(_mm512_and_si512(w0, k2), _mm512_slli_epi32(_mm512_and_si512(hi, k1), 4)),
            _mm512_or_si512(_mm512_and_si512(w1, k2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2), k1), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w0, 4), k2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 4), k1), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w1, 4), k2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 6), k1), 4)),
        ];
        let mut s = [_mm512_setzero_si512(); T];
        for (k, &x) in scales.iter().enumerate() {
            let (lo, hi) = pairs16(x);
            let signed = (_mm512_sub_epi16(lo, _mm512_set1_epi16(32)), _mm512_sub_epi16(hi, _mm512_set1_epi16(32)));
            for t in 0..T {
                let c = with_bsums(_mm512_setzero_si512(), signed, a[t].as_ptr().add(b * 292), k);
                s[t] = _mm512_sub_epi32(s[t], _mm512_slli_epi32(c, 2));
            }
        }
        for j in 0..16 {
            let (h, c, second) = (j / 8, j % 8 / 2, j % 2);
            // The signed scale in each lane's low 16 bits, 0 in the high ones.
            let scale = _mm512_and_si512(_mm512_sub_epi32(byte_of(scales[j / 4], j, 0x3F), _mm512_set1_epi32(32)), _mm512_set1_epi32(0xFFFF));
            let mut d = [_mm512_setzero_si512(); T];
            // The high bits of values 32·bit.. (`hmask` bit `bit`) moved to bit 2 of their bytes.
            let bit = 4 * h + c;
            for k in 4 * second..4 * second + 4 {
                let q = _mm512_and_si512(_mm512_srlv_epi32(pair(pa, pb, 368 + 32 * (8 * h + k)), _mm512_set1_epi32(2 * c as i32)), m3);
                let hm = pair(pa, pb, 112 + 32 * k);
                let hm = if bit >= 2 {
                    _mm512_srlv_epi32(hm, _mm512_set1_epi32(bit as i32 - 2))
                } else {
                    _mm512_sllv_epi32(hm, _mm512_set1_epi32(2 - bit as i32))
                };
                let u = _mm512_or_si512(q, _mm512_and_si512(hm, four_bit));
                for t in 0..T {
                    d[t] = _mm512_dpbusd_epi32(d[t], u, four(a[t].as_ptr().add(b * 292 + 4 + 128 * h + 32 * c + 4 * k)));
                }
            }
            for t in 0..T {
                s[t] = _mm512_dpwssd_epi32(s[t], d[t], scale);
            }
        }
        let d = halves(pa, pb, 0);
        for t in 0..T {
            let da = scalar(a[t].as_ptr().add(b * 292));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s[t]), acc[t]);
        }
    }
    put(acc, out);
}
