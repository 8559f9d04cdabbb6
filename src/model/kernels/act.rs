//! The activation formats the weight types' dot products read, and the
//! quantizers that write them: the portable ones (`scalar.rs`, the
//! specification) or SIMD ones that write the same bytes.

use super::scalar::{self, Q8Layout};
#[cfg(target_arch = "aarch64")]
use super::arm;
#[cfg(target_arch = "x86_64")]
use super::x86;

/// The activation format a weight type's dot product reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Act {
    F32,
    /// 8-bit values with −k·Σq beside the scale (`Q4_0`: k = 8, `Q5_0`:
    /// 16, `Q8_0`: 128).
    Q8_0O(i32),
    Q8_1,
    Q8K,
}

impl Act {
    /// Values and bytes per block.
    pub(super) fn block(self) -> (usize, usize) {
        match self {
            Act::F32 => (1, 4),
            Act::Q8_0O(_) => (32, 40),
            Act::Q8_1 => (32, 40),
            Act::Q8K => (256, 292),
        }
    }

    pub(super) fn quantize(self, x: &[f32], out: &mut [u8]) {
        match self {
            Act::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            Act::Q8_0O(k) => best_quantize_q8()(Q8Layout::Offset(k), x, out),
            Act::Q8_1 => best_quantize_q8()(Q8Layout::Sum16, x, out),
            Act::Q8K => best_quantize_q8_k()(x, out),
        }
    }
}

/// The fastest `Q8_K` activation quantizer this CPU runs: the portable
/// one or a SIMD one that writes its bytes.
pub(super) fn best_quantize_q8_k() -> scalar::QuantizeQ8K {
    static BEST: std::sync::OnceLock<scalar::QuantizeQ8K> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if let Some(q) = x86::quantize_q8_k() {
            return q;
        }
        scalar::quantize_q8_k
    })
}

/// The fastest [`scalar::QuantizeQ8`] this CPU runs.
pub(super) fn best_quantize_q8() -> scalar::QuantizeQ8 {
    static BEST: std::sync::OnceLock<scalar::QuantizeQ8> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if let Some(q) = x86::quantize_q8() {
            return q;
        }
        // Every aarch64 CPU has NEON.
        #[cfg(target_arch = "aarch64")]
        let q: scalar::QuantizeQ8 = arm::quantize_q8;
        #[cfg(not(target_arch = "aarch64"))]
        let q: scalar::QuantizeQ8 = scalar::quantize_q8;
        q
    })
}
