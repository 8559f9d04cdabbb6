//! x86-64 group kernels: eight interleaved rows (`interleave.rs`) against
//! `T` activation rows, `out[t·8 + r]`. The same kernels are built three
//! times: [`avx2`], where an unsigned × signed byte product goes through
//! `maddubs` (pairs summed in 16 bits) and `madd` (into 32 bits);
//! [`avx_vnni`] (AVX-VNNI: recent cores without AVX-512), where one
//! `vpdpbusd` multiplies and adds four products per 32-bit lane; and
//! [`vnni`] (AVX-512 VNNI with VL), the same instruction, with the 32
//! vector registers of AVX-512 holding the sums of eight activation rows
//! at once (`T` = 8: the weights of a group are unpacked once for eight
//! tokens).
//!
//! Both builds compute the same exact integer sums (no product or 16-bit
//! sum of the AVX2 build saturates: each kernel says why) and then the same
//! float operations in the same order, so they agree bit for bit with each
//! other and with the portable kernels in `interleave.rs`, which specify
//! them.

use std::arch::x86_64::*;

use super::x86::{ahead, load};
use super::x86_low::crumbs;

/// Whether this CPU runs the [`avx2`] build.
pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Whether this CPU runs the [`avx_vnni`] build.
pub(super) fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

/// Whether this CPU runs the [`vnni`] build.
pub(super) fn has_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether the CPU is AMD's (its vendor string), where some kernel
/// choices differ as measured.
pub(super) fn is_amd() -> bool {
    // Leaf 0 (the vendor) exists on every x86-64 CPU.
    let id = std::arch::x86_64::__cpuid(0);
    [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).eq(*b"AuthenticAMD")
}

/// The eight rows' sums of each activation row into `out[t·8 + r]`.
fn put<const T: usize>(sums: [[f32; 8]; T], out: &mut [f32]) {
    for (o, s) in out.chunks_exact_mut(8).zip(sums) {
        o.copy_from_slice(&s);
    }
}

/// The eight rows' sums of each activation row, as stored.
// SAFETY (callers): The CPU has AVX (registers and `out` only).
#[inline]
#[target_feature(enable = "avx")]
unsafe fn lanes<const T: usize>(acc: [__m256; T]) -> [[f32; 8]; T] {
    let mut out = [[0f32; 8]; T];
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
    out
}

/// `acc[t] = fma(d·d_a, s[t], acc[t])` for each activation row: `d` the
/// eight rows' f16 scales at `p` (a group block's start), `d_a` the f32 at
/// `ab[t]` (its activation block's start).
// SAFETY (callers): The CPU has AVX2, FMA and F16C; `p..p+16` and each `ab[t]..ab[t]+4` are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_scaled<const T: usize>(acc: &mut [__m256; T], p: *const u8, ab: [*const u8; T], s: [__m256i; T]) {
    let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    for t in 0..T {
        let da = _mm256_broadcast_ss(&*(ab[t] as *const f32));
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(s[t]), acc[t]);
    }
}

/// The eight rows' scale and min of sub-block `j` (as 32-bit lanes) from
/// the three chunks of packed scale bytes (`scale_min_k4`, lane-wise).
// SAFETY (callers): The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_min_x8(c: [__m256i; 3], j: usize) -> (__m256i, __m256i) {
    let m6 = _mm256_set1_epi32(63);
    let m4 = _mm256_set1_epi32(0xF);
    // Byte k of each lane of a chunk, as a 32-bit lane.
    let byte = |x: __m256i, k: usize| _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_set1_epi32(8 * k as i32)), _mm256_set1_epi32(0xFF));
    if j < 4 {
        (_mm256_and_si256(byte(c[0], j), m6), _mm256_and_si256(byte(c[1], j), m6))
    } else {
        let k = j - 4;
        let (b8, b0, b4) = (byte(c[2], k), byte(c[0], k), byte(c[1], k));
        let sc = _mm256_or_si256(_mm256_and_si256(b8, m4), _mm256_slli_epi32(_mm256_srli_epi32(b0, 6), 4));
        let mn = _mm256_or_si256(_mm256_srli_epi32(b8, 4), _mm256_slli_epi32(_mm256_srli_epi32(b4, 6), 4));
        (sc, mn)
    }
}

/// Bits `from..from+4` of each 32-bit lane of `qh` as bytes 0..4 of that
/// lane: 0x10 where the bit is set.
// SAFETY (callers): The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fifth_bits(qh: __m256i, from: i32) -> __m256i {
    let x = _mm256_srlv_epi32(qh, _mm256_set1_epi32(from));
    // The lane's low byte in all four of its bytes, then one bit per byte.
    let spread = _mm256_shuffle_epi8(x, _mm256_set_epi8(
        28, 28, 28, 28, 24, 24, 24, 24, 20, 20, 20, 20, 16, 16, 16, 16,
        12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0,
    ));
    // (`shuffle_epi8` indexes within each 128-bit half: 16..31 there read as 0..15.)
    let probe = _mm256_set1_epi32(0x0804_0201);
    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, probe), probe), _mm256_set1_epi8(0x10))
}

/// Bit `bit` (0..8) of each byte of `x` moved to bit `to` of that byte,
/// the rest 0: `Q5_K`'s fifth bits (to 4) and `Q3_K`'s high bits (to 2)
/// of the values of sub-block `bit`.
// SAFETY (callers): The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bit_to(x: __m256i, bit: usize, to: usize) -> __m256i {
    // Shifts of whole lanes move each byte's bit within the byte (both below 8).
    let moved = if bit <= to {
        _mm256_sllv_epi32(x, _mm256_set1_epi32((to - bit) as i32))
    } else {
        _mm256_srlv_epi32(x, _mm256_set1_epi32((bit - to) as i32))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(1 << to))
}

/// The −k·Σa field of the `Q8_0O` activation block at `ab` in every lane.
// SAFETY (callers): The CPU has AVX2; `ab..ab+8` is inside an activation row.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn offset(ab: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(ab.add(4) as *const i32))
}

/// The broadcast activation bytes `p..p+4` in every 32-bit lane.
// SAFETY (callers): The CPU has AVX2; `p..p+4` is inside an activation row.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn four(p: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// Bytes 0, 1 and bytes 2, 3 of each 32-bit lane of `x` as two 16-bit
/// halves of a lane (zero-extended): pairs that `madd_epi16` multiplies
/// with two adjacent 16-bit values.
// SAFETY (callers): The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pairs16(x: __m256i) -> (__m256i, __m256i) {
    let lo = _mm256_set_epi8(
        -1, 13, -1, 12, -1, 9, -1, 8, -1, 5, -1, 4, -1, 1, -1, 0,
        -1, 13, -1, 12, -1, 9, -1, 8, -1, 5, -1, 4, -1, 1, -1, 0,
    );
    let hi = _mm256_set_epi8(
        -1, 15, -1, 14, -1, 11, -1, 10, -1, 7, -1, 6, -1, 3, -1, 2,
        -1, 15, -1, 14, -1, 11, -1, 10, -1, 7, -1, 6, -1, 3, -1, 2,
    );
    (_mm256_shuffle_epi8(x, lo), _mm256_shuffle_epi8(x, hi))
}

/// The group kernels, built with `$features` and the module's byte-product
/// helpers: `dot_small(s, u, i)` adds the four products `u·i` of each
/// 32-bit lane into `s` where the block's sum stays exact in 16 bits
/// (AVX2 keeps pairs in 16-bit lanes; `small_sum` widens them), `dot` where
/// it needs 32 bits.
macro_rules! group_kernels {
    ($features:literal) => {
        use super::*;

        /// Eight interleaved `Q4_1` rows (`Q4_0` when not `MIN`) against
        /// `T` activation rows with sums: `out[t·8 + r]`.
        pub(crate) fn q4x8<const T: usize, const MIN: bool>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            let gbytes = if MIN { 160 } else { 144 };
            assert!(group.len() == nb * gbytes && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 40), "group kernel shapes");
            // SAFETY: `Simd::group_kernel` hands this build out only after
            // detecting its features; the body reads `nb` group blocks of
            // `group` and `nb` 40-byte blocks of each row of `a`, which the
            // assertion guarantees are there.
            put(unsafe { q4x8_k::<T, MIN>(group, nb, a) }, out);
        }

        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 40-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q4x8_k<const T: usize, const MIN: bool>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let (gbytes, qs) = if MIN { (160, 32) } else { (144, 16) };
            let mask = _mm256_set1_epi8(0xF);
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * gbytes);
                ahead(p, gbytes);
                // Per token, the eight rows' products: a pair is at most
                // 2·15·128 and eight pairs add up below 2¹⁵.
                let mut s = [_mm256_setzero_si256(); T];
                for c in 0..4 {
                    let x = load(p.add(qs + 32 * c));
                    let lo = _mm256_and_si256(x, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
                    for t in 0..T {
                        let qa = a[t].as_ptr().add(b * 40 + 8);
                        s[t] = dot_small(dot_small(s[t], lo, four(qa.add(4 * c))), hi, four(qa.add(16 + 4 * c)));
                    }
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                // `Q4_1`'s mins, once a block (`Q4_0` has none).
                let m = if MIN { _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)) } else { _mm256_setzero_ps() };
                for t in 0..T {
                    let ab = a[t].as_ptr().add(b * 40);
                    let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(&*(ab as *const f32)));
                    if MIN {
                        acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(small_sum(s[t])), acc[t]);
                        acc[t] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(&*(ab.add(4) as *const f32)), acc[t]);
                    } else {
                        // `Q4_0`: −8·Σa from the activations makes the sum `Σ(q − 8)·a`.
                        let sum = _mm256_add_epi32(small_sum(s[t]), offset(ab));
                        acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc[t]);
                    }
                }
            }
            lanes(acc)
        }

        /// Eight interleaved `Q8_0` rows against `T` `Q8_0O` activation
        /// rows: `out[t·8 + r]`.
        pub(crate) fn q8_0x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 272 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 40), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted.
            put(unsafe { q8_0x8_k::<T>(group, nb, a) }, out);
        }

        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 40-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q8_0x8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * 272);
                ahead(p, 272);
                let mut s: [__m256i; T] = std::array::from_fn(|t| q8_start(a[t].as_ptr().add(b * 40)));
                for c in 0..8 {
                    let w = q8_weights(load(p.add(16 + 32 * c)));
                    for t in 0..T {
                        s[t] = q8_dot(s[t], w, four(a[t].as_ptr().add(b * 40 + 8 + 4 * c)));
                    }
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                for t in 0..T {
                    let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(&*(a[t].as_ptr().add(b * 40) as *const f32)));
                    acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s[t]), acc[t]);
                }
            }
            lanes(acc)
        }

        /// Eight interleaved `Q4_K` rows against `T` `Q8_K` activation
        /// rows: `out[t·8 + r]`.
        pub(crate) fn q4_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 1152 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 292), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted.
            put(unsafe { q4_kx8_k::<T, false>(group, nb, a) }, out);
        }

        /// Eight interleaved `Q5_K` rows against `T` `Q8_K` activation
        /// rows: `out[t·8 + r]`.
        pub(crate) fn q5_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 1408 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 292), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted.
            put(unsafe { q4_kx8_k::<T, true>(group, nb, a) }, out);
        }

        /// `Q4_K`, or `Q5_K` (`FIVE`: its fifth bits from `qh`, 32 bytes
        /// a row before `qs`).
        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 292-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q4_kx8_k<const T: usize, const FIVE: bool>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let mask = _mm256_set1_epi8(0xF);
            let (bytes, qs) = if FIVE { (1408, 384) } else { (1152, 128) };
            let mut acc = [_mm256_setzero_ps(); T];
            let mut mins = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * bytes);
                ahead(p, bytes);
                let chunks = [load(p.add(32)), load(p.add(64)), load(p.add(96))];
                let mut sums = [_mm256_setzero_si256(); T];
                let mut msums = [_mm256_setzero_si256(); T];
                for gi in 0..4 {
                    let (sl, ml) = scale_min_x8(chunks, 2 * gi);
                    let (sh, mh) = scale_min_x8(chunks, 2 * gi + 1);
                    // Per token: sub-blocks 2g (low nibbles) and 2g+1
                    // (high): eight pairs of at most 2·15·128 stay below
                    // 2¹⁵; with fifth bits (2·31·128) they take 32-bit sums.
                    let mut lo_s = [_mm256_setzero_si256(); T];
                    let mut hi_s = [_mm256_setzero_si256(); T];
                    for k in 0..8 {
                        let x = load(p.add(qs + 32 * (8 * gi + k)));
                        let mut lo = _mm256_and_si256(x, mask);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
                        if FIVE {
                            let qh = load(p.add(128 + 32 * k));
                            lo = _mm256_or_si256(lo, bit_to(qh, 2 * gi, 4));
                            hi = _mm256_or_si256(hi, bit_to(qh, 2 * gi + 1, 4));
                        }
                        for t in 0..T {
                            let y = a[t].as_ptr().add(b * 292 + 4 + 64 * gi + 4 * k);
                            if FIVE {
                                lo_s[t] = dot(lo_s[t], lo, four(y));
                                hi_s[t] = dot(hi_s[t], hi, four(y.add(32)));
                            } else {
                                lo_s[t] = dot_small(lo_s[t], lo, four(y));
                                hi_s[t] = dot_small(hi_s[t], hi, four(y.add(32)));
                            }
                        }
                    }
                    for t in 0..T {
                        let (lo_sum, hi_sum) = if FIVE { (lo_s[t], hi_s[t]) } else { (small_sum(lo_s[t]), small_sum(hi_s[t])) };
                        let l = _mm256_mullo_epi32(lo_sum, sl);
                        let h = _mm256_mullo_epi32(hi_sum, sh);
                        sums[t] = _mm256_add_epi32(sums[t], _mm256_add_epi32(l, h));
                        let bs = a[t].as_ptr().add(b * 292 + 260 + 8 * gi) as *const i16;
                        let bsum = |k: usize| i32::from(std::ptr::read_unaligned(bs.add(k)));
                        let (bl, bh) = (bsum(0) + bsum(1), bsum(2) + bsum(3));
                        let m = _mm256_add_epi32(
                            _mm256_mullo_epi32(ml, _mm256_set1_epi32(bl)),
                            _mm256_mullo_epi32(mh, _mm256_set1_epi32(bh)),
                        );
                        msums[t] = _mm256_add_epi32(msums[t], m);
                    }
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
                for t in 0..T {
                    let da = _mm256_broadcast_ss(&*(a[t].as_ptr().add(b * 292) as *const f32));
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sums[t]), acc[t]);
                    mins[t] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msums[t]), mins[t]);
                }
            }
            let mut out = [[0f32; 8]; T];
            for t in 0..T {
                _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(acc[t], mins[t]));
            }
            out
        }

        /// Eight interleaved `Q6_K` rows against `T` `Q8_K` activation
        /// rows: `out[t·8 + r]`.
        pub(crate) fn q6_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 1680 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 292), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted
            // (the body reads a group block below 1,680: scales to 144,
            // `ql` to 1,168, `qh` to 1,680).
            put(unsafe { q6_kx8_k::<T>(group, nb, a) }, out);
        }

        /// Per row and super-block the exact integer sum
        /// `Σ_j sc_j·Σ(q−32)·a` of `interleave::q6_kx8`, computed as
        /// `Σ_j sc_j·Σ q·a − 32·Σ_j sc_j·bsum_j`: the 6-bit `q` are
        /// unsigned bytes against the signed activations, and the `Q8_K`
        /// blocks' sums of 16 give the second term. Each pass reads one
        /// `ql` chunk for two quarters of a half (its low and high nibbles)
        /// and the `qh` chunk that completes them.
        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 292-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q6_kx8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let (nib, two) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * 1680);
                ahead(p, 1680);
                let mut s = [_mm256_setzero_si256(); T];
                for c in 0..4 {
                    // Scales 4c..4c+4 of each row as 16-bit pairs (4c, 4c+2)
                    // and (4c+1, 4c+3), sign-extended; |sc·bsum| ≤ 128·2,032.
                    let x = load(p.add(16 + 32 * c));
                    let (even, odd) = (_mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8), _mm256_srai_epi16(x, 8));
                    for t in 0..T {
                        let bs = a[t].as_ptr().add(b * 292 + 260 + 8 * c) as *const u16;
                        let bsum = |k: usize| i32::from(std::ptr::read_unaligned(bs.add(k)));
                        let m = _mm256_add_epi32(
                            _mm256_madd_epi16(even, _mm256_set1_epi32(bsum(0) | bsum(2) << 16)),
                            _mm256_madd_epi16(odd, _mm256_set1_epi32(bsum(1) | bsum(3) << 16)),
                        );
                        s[t] = _mm256_sub_epi32(s[t], _mm256_slli_epi32(m, 5));
                    }
                }
                for h in 0..2 {
                    for is in 0..2 {
                        // Quarters k and k + 2 of half h, run `is` of 16.
                        for k in 0..2 {
                            let mut d = [[_mm256_setzero_si256(); 2]; T];
                            for c in 0..4 {
                                let l = 16 * is + 4 * c;
                                let ql = load(p.add(144 + 8 * (64 * h + 32 * k + l)));
                                let qh = load(p.add(1168 + 8 * (32 * h + l)));
                                // Bits 2k, 2k+1 (and 2k+4, 2k+5) of each `qh` byte at bits 4, 5.
                                let (up, down) = if k == 0 {
                                    (_mm256_slli_epi32(qh, 4), qh)
                                } else {
                                    (_mm256_slli_epi32(qh, 2), _mm256_srli_epi32(qh, 2))
                                };
                                let w = [
                                    _mm256_or_si256(_mm256_and_si256(ql, nib), _mm256_and_si256(up, two)),
                                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(ql, 4), nib), _mm256_and_si256(down, two)),
                                ];
                                for t in 0..T {
                                    let y = a[t].as_ptr().add(b * 292 + 4 + 128 * h + 32 * k + l);
                                    d[t][0] = dot(d[t][0], w[0], four(y));
                                    d[t][1] = dot(d[t][1], w[1], four(y.add(64)));
                                }
                            }
                            for (q, kq) in [k, k + 2].into_iter().enumerate() {
                                // Scale j of each row, sign-extended from byte j % 4 of its lane.
                                let j = 8 * h + 2 * kq + is;
                                let chunk = load(p.add(16 + 32 * (j / 4)));
                                let sc = _mm256_srai_epi32(_mm256_sllv_epi32(chunk, _mm256_set1_epi32(24 - 8 * (j as i32 % 4))), 24);
                                for t in 0..T {
                                    s[t] = _mm256_add_epi32(s[t], _mm256_mullo_epi32(d[t][q], sc));
                                }
                            }
                        }
                    }
                }
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                for t in 0..T {
                    let dd = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*(a[t].as_ptr().add(b * 292) as *const f32)));
                    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s[t])));
                }
            }
            lanes(acc)
        }

        /// Eight interleaved `Q2_K` rows against `T` `Q8_K` activation
        /// rows: `out[t·8 + r]`.
        pub(crate) fn q2_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 672 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 292), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted.
            put(unsafe { q2_kx8_k::<T>(group, nb, a) }, out);
        }

        /// `interleave::q2_kx8`'s sums. Where one instruction multiplies
        /// and adds four bytes (`Q2_K_SCALED`), the weights carry their
        /// scales (`sc·q` ≤ 45); else each sub-block's products (16 values
        /// of at most 3·128: 6,144 fits 16 bits) are multiplied by its
        /// scale with one `madd`. The mins' term: 16-bit pairs against
        /// the activations' sums of 16.
        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 292-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q2_kx8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let (m3, nib) = (_mm256_set1_epi8(3), _mm256_set1_epi8(0xF));
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * 672);
                ahead(p, 672);
                // Each lane: a row's scale bytes 4k..4k+4 (scale low, min high).
                let sc: [__m256i; 4] = std::array::from_fn(|k| load(p.add(32 + 32 * k)));
                let mut m = [_mm256_setzero_si256(); T];
                for (k, &x) in sc.iter().enumerate() {
                    // Mins 4k..4k+4 as 16-bit pairs (4k, 4k+1) and (4k+2, 4k+3),
                    // against the activations' sums of 16 as they lie.
                    let (lo, hi) = pairs16(_mm256_and_si256(_mm256_srli_epi16(x, 4), nib));
                    for t in 0..T {
                        let bs = a[t].as_ptr().add(b * 292 + 260 + 8 * k);
                        let pairs = _mm256_add_epi32(_mm256_madd_epi16(lo, four(bs)), _mm256_madd_epi16(hi, four(bs.add(4))));
                        m[t] = _mm256_add_epi32(m[t], pairs);
                    }
                }
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
                for t in 0..T {
                    let da = _mm256_broadcast_ss(&*(a[t].as_ptr().add(b * 292) as *const f32));
                    acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(m[t]), acc[t]);
                }
                let mut s = [_mm256_setzero_si256(); T];
                let scale_of = |j: usize| _mm256_and_si256(_mm256_srlv_epi32(sc[j / 4], _mm256_set1_epi32(8 * (j as i32 % 4))), _mm256_set1_epi32(0xF));
                let y = |t: usize, h: usize, c: usize, k: usize| four(a[t].as_ptr().add(b * 292 + 4 + 128 * h + 32 * c + 4 * k));
                // Sub-block j: half h, crumb c of its `qs` bytes, their first or second 16.
                for (h, second) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    if Q2_K_SCALED {
                        // Each lane's bytes 0, sc, 2·sc, 3·sc (3·15 fits a
                        // byte) for the four crumbs' sub-blocks, looked up
                        // by crumb within the lane.
                        let lane = _mm256_set_epi32(0x0C0C_0C0C, 0x0808_0808, 0x0404_0404, 0, 0x0C0C_0C0C, 0x0808_0808, 0x0404_0404, 0);
                        let mut tables = [_mm256_setzero_si256(); 4];
                        for (c, table) in tables.iter_mut().enumerate() {
                            *table = _mm256_mullo_epi32(scale_of(8 * h + 2 * c + second), _mm256_set1_epi32(0x0302_0100));
                        }
                        for k in 4 * second..4 * second + 4 {
                            let q = crumbs(load(p.add(160 + 32 * (8 * h + k))));
                            for c in 0..4 {
                                let w = _mm256_shuffle_epi8(tables[c], _mm256_or_si256(q[c], lane));
                                for t in 0..T {
                                    s[t] = dot(s[t], w, y(t, h, c, k));
                                }
                            }
                        }
                    } else {
                        for c in 0..4 {
                            let mut d = [_mm256_setzero_si256(); T];
                            for k in 4 * second..4 * second + 4 {
                                let q = _mm256_and_si256(_mm256_srlv_epi32(load(p.add(160 + 32 * (8 * h + k))), _mm256_set1_epi32(2 * c as i32)), m3);
                                for t in 0..T {
                                    d[t] = dot_small(d[t], q, y(t, h, c, k));
                                }
                            }
                            let scale = small_scale(scale_of(8 * h + 2 * c + second));
                            for t in 0..T {
                                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(d[t], scale));
                            }
                        }
                    }
                }
                add_scaled(&mut acc, p, a.map(|r| r.as_ptr().add(b * 292)), s);
            }
            lanes(acc)
        }

        /// Eight interleaved `Q3_K` rows against `T` `Q8_K` activation
        /// rows: `out[t·8 + r]`.
        pub(crate) fn q3_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 880 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 292), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted.
            put(unsafe { q3_kx8_k::<T>(group, nb, a) }, out);
        }

        /// `interleave::q3_kx8`'s sum: the weights unsigned (`u = q + 4·h`
        /// in 0..8, `q − 4·!h = u − 4`), so the sum is `Σ_j sc_j·Σ u·a −
        /// 4·Σ_j sc_j·bsum_j`. A sub-block's `Σ u·a` is at most 16·7·128,
        /// below 2¹⁵, and one `madd` multiplies it by the signed scale.
        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 292-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q3_kx8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let m3 = _mm256_set1_epi8(3);
            let (k1, k2) = (_mm256_set1_epi32(0x0303_0303), _mm256_set1_epi32(0x0F0F_0F0F));
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * 880);
                ahead(p, 880);
                // Each lane: a row's packed scale words; `scales[k]` holds
                // its 6-bit scales 4k..4k+4 (as `scalar::scale_k3` reads them).
                let (w0, w1, hi) = (load(p.add(16)), load(p.add(48)), load(p.add(80)));
                let top = |sh: i32| _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(hi, _mm256_set1_epi32(sh)), k1), 4);
                let scales = [
                    _mm256_or_si256(_mm256_and_si256(w0, k2), top(0)),
                    _mm256_or_si256(_mm256_and_si256(w1, k2), top(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w0, 4), k2), top(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w1, 4), k2), top(6)),
                ];
                // −4·Σ_j sc_j·bsum_j: the scales as 16-bit pairs (4k, 4k+1)
                // and (4k+2, 4k+3) against the activations' sums of 16.
                let mut s = [_mm256_setzero_si256(); T];
                for (k, &x) in scales.iter().enumerate() {
                    let (lo, hi) = pairs16(x);
                    let (lo, hi) = (_mm256_sub_epi16(lo, _mm256_set1_epi16(32)), _mm256_sub_epi16(hi, _mm256_set1_epi16(32)));
                    for t in 0..T {
                        let bs = a[t].as_ptr().add(b * 292 + 260 + 8 * k);
                        let pairs = _mm256_add_epi32(_mm256_madd_epi16(lo, four(bs)), _mm256_madd_epi16(hi, four(bs.add(4))));
                        s[t] = _mm256_sub_epi32(s[t], _mm256_slli_epi32(pairs, 2));
                    }
                }
                for j in 0..16 {
                    let (h, c, second) = (j / 8, j % 8 / 2, j % 2);
                    let byte = _mm256_and_si256(_mm256_srlv_epi32(scales[j / 4], _mm256_set1_epi32(8 * (j as i32 % 4))), _mm256_set1_epi32(0x3F));
                    let scale = small_scale(_mm256_sub_epi32(byte, _mm256_set1_epi32(32)));
                    let mut d = [_mm256_setzero_si256(); T];
                    // The high bits of values 32·bit.. (`hmask` bit `bit`) moved to bit 2 of their bytes.
                    let bit = 4 * h + c;
                    for k in 4 * second..4 * second + 4 {
                        let q = _mm256_and_si256(_mm256_srlv_epi32(load(p.add(368 + 32 * (8 * h + k))), _mm256_set1_epi32(2 * c as i32)), m3);
                        let u = _mm256_or_si256(q, bit_to(load(p.add(112 + 32 * k)), bit, 2));
                        for t in 0..T {
                            d[t] = dot_small(d[t], u, four(a[t].as_ptr().add(b * 292 + 4 + 128 * h + 32 * c + 4 * k)));
                        }
                    }
                    for t in 0..T {
                        s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(d[t], scale));
                    }
                }
                add_scaled(&mut acc, p, a.map(|r| r.as_ptr().add(b * 292)), s);
            }
            lanes(acc)
        }

        /// Eight interleaved `Q5_0` rows against `T` activation rows with
        /// sums: `out[t·8 + r]`.
        pub(crate) fn q5_0x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
            assert!(group.len() == nb * 176 && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 40), "group kernel shapes");
            // SAFETY: as for `q4x8`: features detected, sizes asserted.
            put(unsafe { q5_0x8_k::<T>(group, nb, a) }, out);
        }

        // SAFETY (callers): the CPU has the build's features; `g` holds
        // `nb` group blocks and each row of `a` `nb` 40-byte blocks.
        #[target_feature(enable = $features)]
        unsafe fn q5_0x8_k<const T: usize>(g: &[u8], nb: usize, a: [&[u8]; T]) -> [[f32; 8]; T] {
            let mask = _mm256_set1_epi8(0xF);
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.as_ptr().add(b * 176);
                ahead(p, 176);
                let qh = load(p.add(16));
                // Per token, low and high halves apart: four pairs of at
                // most 2·31·128 each stay below 2¹⁵, eight would not.
                let mut sl = [_mm256_setzero_si256(); T];
                let mut sh = [_mm256_setzero_si256(); T];
                for c in 0..4 {
                    let x = load(p.add(48 + 32 * c));
                    let lo = _mm256_or_si256(_mm256_and_si256(x, mask), fifth_bits(qh, 4 * c as i32));
                    let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), mask), fifth_bits(qh, 16 + 4 * c as i32));
                    for t in 0..T {
                        let qa = a[t].as_ptr().add(b * 40 + 8);
                        sl[t] = dot_small(sl[t], lo, four(qa.add(4 * c)));
                        sh[t] = dot_small(sh[t], hi, four(qa.add(16 + 4 * c)));
                    }
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                for t in 0..T {
                    let ab = a[t].as_ptr().add(b * 40);
                    // −16·Σa from the activations makes the sum `Σ(q − 16)·a`.
                    let isum = _mm256_add_epi32(_mm256_add_epi32(small_sum(sl[t]), small_sum(sh[t])), offset(ab));
                    let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(&*(ab as *const f32)));
                    acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc[t]);
                }
            }
            lanes(acc)
        }
    };
}

/// The kernels on AVX2, FMA and F16C.
pub(super) mod avx2 {
    /// `s + u·i` with pairs summed in 16-bit lanes.
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot_small(s: __m256i, u: __m256i, i: __m256i) -> __m256i {
        _mm256_add_epi16(s, _mm256_maddubs_epi16(u, i))
    }

    /// 16-bit lane sums of [`dot_small`] added pairwise into 32 bits.
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn small_sum(s: __m256i) -> __m256i {
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }

    /// `s + u·i`, four products per 32-bit lane.
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot(s: __m256i, u: __m256i, i: __m256i) -> __m256i {
        _mm256_add_epi32(s, small_sum(_mm256_maddubs_epi16(u, i)))
    }

    /// Whether `Q2_K`'s weights carry their scales: not here, where a
    /// product of four bytes into 32 bits takes three instructions and
    /// scaled weights would overflow [`dot_small`]'s 16-bit sums.
    const Q2_K_SCALED: bool = false;

    /// What `madd_epi16` multiplies a [`dot_small`] sum by to get it
    /// times `sc` (lane-wise, |sc| < 2¹⁵) as 32-bit lanes: `sc` in both
    /// 16-bit halves, so that the two halves' sums add.
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn small_scale(sc: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc, 16))
    }

    /// `Q8_0`'s stored weights (`q + 128`, `interleave.rs`) as this build
    /// multiplies them: `|q|`, and `q` for the signs. `maddubs` would
    /// saturate on the unsigned values (255·127·2 > 2¹⁵), so the 128 comes
    /// off here, and a block's sum starts at 0 ([`q8_start`]).
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q8_weights(x: __m256i) -> [__m256i; 2] {
        let q = _mm256_xor_si256(x, _mm256_set1_epi8(-128));
        [_mm256_sign_epi8(q, q), q]
    }

    /// `s + q·i` for [`q8_weights`]' `w` (a pair of products fits 16
    /// bits: |q| ≤ 128, |i| ≤ 127; eight pairs do not, so 32-bit sums).
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q8_dot(s: __m256i, w: [__m256i; 2], i: __m256i) -> __m256i {
        dot(s, w[0], _mm256_sign_epi8(i, w[1]))
    }

    /// Where a `Q8_0` block's sum starts: 0 ([`q8_weights`] took the offset off).
    // SAFETY (callers): The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q8_start(_ab: *const u8) -> __m256i {
        _mm256_setzero_si256()
    }

    group_kernels!("avx2,fma,f16c");
}

/// The helpers of a VNNI build, `vpdpbusd` being `$dp` (needing
/// `$dot_features`), then its kernels (`$features`): the instruction adds
/// four byte products per 32-bit lane into 32-bit sums, so `dot_small` is
/// `dot` and its sums need no widening.
macro_rules! vnni_kernels {
    ($dot_features:literal, $dp:ident, $features:literal) => {
        /// `s + u·i`, four products per 32-bit lane, in one instruction.
        // SAFETY (callers): The CPU has `$dot_features`.
        #[inline]
        #[target_feature(enable = $dot_features)]
        unsafe fn dot(s: __m256i, u: __m256i, i: __m256i) -> __m256i {
            $dp(s, u, i)
        }

        /// [`dot`]: its sums are 32-bit already.
        // SAFETY (callers): The CPU has `$dot_features`.
        #[inline]
        #[target_feature(enable = $dot_features)]
        unsafe fn dot_small(s: __m256i, u: __m256i, i: __m256i) -> __m256i {
            dot(s, u, i)
        }

        /// The sums of [`dot_small`], as they are.
        #[inline]
        fn small_sum(s: __m256i) -> __m256i {
            s
        }

        /// Whether `Q2_K`'s weights carry their scales: one lookup per
        /// chunk of weights spares a `madd` and an add per sub-block and
        /// activation row.
        const Q2_K_SCALED: bool = true;

        /// What `madd_epi16` multiplies a [`dot_small`] sum by to get it
        /// times `sc` (lane-wise): `sc` in the low 16-bit half, 0 in the
        /// high one, which holds the sum's sign bits. Exact where the sum
        /// fits 16 bits (each kernel says why it does).
        // SAFETY (callers): The CPU has AVX2.
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn small_scale(sc: __m256i) -> __m256i {
            _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF))
        }

        /// `Q8_0`'s stored weights (`q + 128`) as they are: `vpdpbusd`
        /// takes them unsigned.
        #[inline]
        fn q8_weights(x: __m256i) -> __m256i {
            x
        }

        /// `s + (q + 128)·i`.
        // SAFETY (callers): The CPU has `$dot_features`.
        #[inline]
        #[target_feature(enable = $dot_features)]
        unsafe fn q8_dot(s: __m256i, w: __m256i, i: __m256i) -> __m256i {
            dot(s, w, i)
        }

        /// Where a `Q8_0` block's sum starts: the activations' −128·Σa,
        /// which makes it `Σ q·a` exactly.
        // SAFETY (callers): The CPU has AVX2; `ab..ab+8` is inside an activation row.
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn q8_start(ab: *const u8) -> __m256i {
            offset(ab)
        }

        group_kernels!($features);
    };
}

/// The kernels on AVX-512 VNNI (with VL, on 256-bit registers).
pub(super) mod vnni {
    vnni_kernels!("avx512f,avx512vl,avx512vnni", _mm256_dpbusd_epi32, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni");
}

/// The kernels on AVX-VNNI (the VEX form of `vpdpbusd`, 16 registers).
pub(super) mod avx_vnni {
    vnni_kernels!("avx2,avxvnni", _mm256_dpbusd_avx_epi32, "avx2,fma,f16c,avxvnni");
}
