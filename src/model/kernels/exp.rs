//! `exp` of f32 values, one algorithm for every build: `x/ln 2` split into
//! `k/32 + r/32`, then `2^(k/32)` from a table times a cubic in `r`, in
//! f64 with fused multiply-adds. It is the method of glibc's `expf`
//! (since 2.27), and this spec repeats its FMA build's operations one for
//! one: the model's numbers are those `f32::exp` gives on such a system,
//! and the same on every other (at most 0.502 ulp from exact).
//!
//! [`expf`] is the spec; the SIMD builds (`x86_vec::exps`, `arm::exps`) compute the same
//! operations lane by lane and are tested against it bit for bit.

/// `2^(i/32)` as f64 bits, less `i·2⁴⁷`: adding `k·2⁴⁷` for `k = 32·e + i`
/// gives the bits of `2^(e + i/32)` (`e` lands in the exponent field).
pub(super) const EXP2_TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2`.
pub(super) const INV_LN2_32: f64 = f64::from_bits(0x40471547652b82fe);
/// `1.5·2⁵²`: added to a value below 2⁵¹ in magnitude, the sum's low
/// mantissa bits are that value rounded to an integer.
pub(super) const SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// The cubic `2^(r/32) ≈ 1 + C2·r + C1·r² + C0·r³` for `|r| ≤ 1/2`.
pub(super) const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
pub(super) const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
pub(super) const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);

/// The top 12 bits of `|x|` at and above which [`expf`] takes [`edge`]:
/// those of 88.0 (`|x| ≥ 88`, infinities and NaN).
pub(super) const EDGE_TOP: u32 = 0x42b;

/// `exp(x)`.
#[inline]
pub(crate) fn expf(x: f32) -> f32 {
    if (x.to_bits() >> 20) & 0x7ff >= EDGE_TOP {
        if let Some(y) = edge(x) {
            return y;
        }
    }
    core(x)
}

/// The table-and-cubic part of [`expf`], for `|x| < 88` (and the part of
/// the edge range that [`edge`] leaves to it).
#[inline]
fn core(x: f32) -> f32 {
    let xd = f64::from(x);
    let kd = INV_LN2_32.mul_add(xd, SHIFT);
    let ki = kd.to_bits();
    let kd = kd - SHIFT;
    let r = INV_LN2_32.mul_add(xd, -kd);
    let s = f64::from_bits(EXP2_TABLE[(ki & 31) as usize].wrapping_add(ki << 47));
    let z = C0.mul_add(r, C1);
    let r2 = r * r;
    let y = C2.mul_add(r, 1.0);
    let y = z.mul_add(r2, y);
    (y * s) as f32
}

/// `exp(x)` for `|x| ≥ 88`, infinities and NaN, where it is not [`core`]'s:
/// 0 for -∞ and below `ln 2⁻¹⁵⁰`, the least subnormal just above that (as
/// glibc rounds there), ∞ above `ln 2¹²⁸`, NaN for NaN.
pub(super) fn edge(x: f32) -> Option<f32> {
    if x == f32::NEG_INFINITY {
        Some(0.0)
    } else if (x.to_bits() >> 20) & 0x7ff >= 0x7f8 {
        Some(x + x)
    } else if x > f32::from_bits(0x42b17217) {
        Some(f32::INFINITY)
    } else if x < f32::from_bits(0xc2cff1b4) {
        Some(0.0)
    } else if x < f32::from_bits(0xc2ce8ecf) {
        Some(f32::from_bits(1))
    } else {
        None
    }
}

/// `x[i] = exp(x[i])`, one value at a time.
pub(crate) fn exps(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = expf(*v));
}
