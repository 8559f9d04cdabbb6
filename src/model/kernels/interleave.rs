//! Weights of eight rows interleaved block by block, so that one SIMD
//! multiply serves all eight rows: each 32-bit lane of a register holds
//! four weights of one row, the activations' four matching values are
//! broadcast to every lane, and the eight rows' sums come out side by side,
//! scaled by the eight rows' scales in one vector (no horizontal sums, one
//! conversion per block for eight rows). llama.cpp repacks `Q4_0` and
//! `Q4_K` this way at load; lmt does it for `Q4_1`, the type SmolLM2 ships
//! in.
//!
//! `Q4_1` group block (160 bytes, the eight rows' block `b`): the eight
//! `d` (f16), the eight `m` (f16), then four chunks of 32 bytes; in chunk
//! `c`, bytes `4r..4r+4` are row `r`'s `qs[4c..4c+4]`: low nibbles are
//! values `4c..4c+4`, high nibbles values `16+4c..16+4c+4`.
//!
//! A matrix keeps its first `8·⌊rows/8⌋` rows as groups and the rest as
//! plain rows after them.

use super::scalar;

/// Bytes of a `Q4_1` block.
const Q4_1_BLOCK: usize = 20;
/// Bytes of a group block: eight `Q4_1` blocks.
pub(crate) const GROUP_BLOCK: usize = 8 * Q4_1_BLOCK;

/// `data` (whole rows of `row_bytes`) with its first `8·⌊rows/8⌋` rows
/// interleaved; returns the data and the number of groups.
pub(crate) fn interleave_q4_1(data: &[u8], row_bytes: usize) -> (Vec<u8>, usize) {
    let rows = data.len() / row_bytes.max(1);
    let groups = rows / 8;
    let nb = row_bytes / Q4_1_BLOCK;
    let mut out = vec![0u8; data.len()];
    for g in 0..groups {
        let dst = &mut out[g * 8 * row_bytes..(g + 1) * 8 * row_bytes];
        for r in 0..8 {
            let row = &data[(8 * g + r) * row_bytes..(8 * g + r + 1) * row_bytes];
            for b in 0..nb {
                let (src, gb) = (&row[b * Q4_1_BLOCK..], &mut dst[b * GROUP_BLOCK..]);
                gb[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
                gb[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
                for c in 0..4 {
                    gb[32 + 32 * c + 4 * r..32 + 32 * c + 4 * r + 4].copy_from_slice(&src[4 + 4 * c..8 + 4 * c]);
                }
            }
        }
    }
    let done = groups * 8 * row_bytes;
    out[done..].copy_from_slice(&data[done..]);
    (out, groups)
}

/// Row `r` (`< 8·groups`) of interleaved data, as plain `Q4_1` blocks.
pub(crate) fn q4_1_row(data: &[u8], row_bytes: usize, r: usize) -> Vec<u8> {
    let nb = row_bytes / Q4_1_BLOCK;
    let (g, i) = (r / 8, r % 8);
    let group = &data[g * 8 * row_bytes..(g + 1) * 8 * row_bytes];
    let mut row = vec![0u8; row_bytes];
    for b in 0..nb {
        let (gb, dst) = (&group[b * GROUP_BLOCK..], &mut row[b * Q4_1_BLOCK..]);
        dst[0..2].copy_from_slice(&gb[2 * i..2 * i + 2]);
        dst[2..4].copy_from_slice(&gb[16 + 2 * i..16 + 2 * i + 2]);
        for c in 0..4 {
            dst[4 + 4 * c..8 + 4 * c].copy_from_slice(&gb[32 + 32 * c + 4 * i..32 + 32 * c + 4 * i + 4]);
        }
    }
    row
}

/// The portable group kernel and the specification of the SIMD one: the
/// eight rows of `group` (`nb` group blocks) against `T` `Q8_1` activation
/// rows; `out[r·T + t]`. Per row and block: the exact integer sum, then
/// `acc = fma(d_w·d_a, Σ, acc)` and `acc = fma(m_w, s_a, acc)`, in block
/// order — bit for bit what the SIMD kernel computes, for any `T`.
pub(crate) fn q4_1x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    assert!(group.len() == nb * GROUP_BLOCK && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * 40), "group kernel shapes");
    for t in 0..T {
        for r in 0..8 {
            let mut acc = 0f32;
            for b in 0..nb {
                let gb = &group[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
                let ab = &a[t][b * 40..(b + 1) * 40];
                let mut sum = 0i32;
                for c in 0..4 {
                    for k in 0..4 {
                        let q = gb[32 + 32 * c + 4 * r + k];
                        let j = 4 * c + k;
                        sum += i32::from(q & 0xF) * i32::from(ab[8 + j] as i8);
                        sum += i32::from(q >> 4) * i32::from(ab[8 + 16 + j] as i8);
                    }
                }
                let (d, m) = (scalar::f16_at(gb, 2 * r), scalar::f16_at(gb, 16 + 2 * r));
                let (da, sa) = (scalar::f32_at(ab, 0), scalar::f32_at(ab, 4));
                acc = (d * da).mul_add(sum as f32, acc);
                acc = m.mul_add(sa, acc);
            }
            out[r * T + t] = acc;
        }
    }
}
