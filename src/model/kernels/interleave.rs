//! Weights of eight rows interleaved block by block, so that one SIMD
//! multiply serves all eight rows: each 32-bit lane of a register holds
//! four weights of one row, the activations' four matching values are
//! broadcast to every lane, and the eight rows' sums come out side by side,
//! scaled by the eight rows' scales in one vector (no horizontal sums, one
//! conversion per block for eight rows). llama.cpp repacks `Q4_0` and
//! `Q4_K` this way at load; lmt does it for `Q4_0`, `Q4_1` (the type
//! SmolLM2 ships in), `Q5_0` (most of llama.cpp's `Q4_K_M` for widths
//! that are not multiples of 256), `Q8_0`, `Q4_K`, `Q5_K`, and the 2- and
//! 3-bit k-quants `Q2_K` and `Q3_K` (most of llama.cpp's `Q2_K` files).
//!
//! A group block holds the eight rows' block `b`: first their scale
//! fields (each 2-byte field of the block, eight rows side by side: for
//! `Q4_1` the eight `d` then the eight `m`; for `Q8_0` the eight `d`), then
//! the quantized bytes in chunks of 32: in chunk `c`, bytes `4r..4r+4` are
//! row `r`'s `qs[4c..4c+4]`. (`Q4_0`, `Q4_1`: 4 chunks, low nibbles values
//! `4c..4c+4`, high nibbles `16+4c..16+4c+4`; `Q8_0`: 8 chunks, each value
//! stored unsigned, 128 above itself (`q ^ 0x80`), so that `vpdpbusd`
//! takes the weights as they are and the activations' −128·Σa makes the
//! sum exact; `Q6_K`: the eight `d`, then scales, `ql` and `qh` as 4, 32
//! and 16 chunks; `Q2_K`: the eight `d`, the eight `dmin`, then scales and
//! `qs` as 4 and 16 chunks; `Q3_K`: the eight `d`, then scales, `hmask` and
//! `qs` as 3, 8 and 16 chunks; `Q5_K`: the eight `d`, the eight `dmin`,
//! then scales, `qh` and `qs` as 3, 8 and 32 chunks.)
//!
//! A matrix keeps its first `8·⌊rows/8⌋` rows as groups and the rest as
//! plain rows after them.

use super::{scalar, QType};

/// (bytes of a block, 2-byte scale fields at its start) of an interleaved type.
pub(crate) fn shape(ty: QType) -> Option<(usize, usize)> {
    match ty {
        QType::Q4_0 => Some((18, 1)),
        QType::Q4_1 => Some((20, 2)),
        QType::Q5_0 => Some((22, 1)),
        QType::Q8_0 => Some((34, 1)),
        QType::Q2K => Some((84, 2)),
        QType::Q3K => Some((110, 1)),
        QType::Q4K => Some((144, 2)),
        QType::Q5K => Some((176, 2)),
        QType::Q6K => Some((210, 1)),
        _ => None,
    }
}

/// Byte `i` of a block of `ty` in field-first order: `Q2_K`, `Q3_K` and
/// `Q6_K` keep their `d` (and `Q2_K` its `dmin`) last; their group blocks
/// put them first like every other type's, then the rest in its order
/// (`Q2_K`: scales, `qs`; `Q3_K`: scales, `hmask`, `qs`; `Q6_K`: scales,
/// `ql`, `qh`). Other types are in that order already.
fn ordered(ty: QType, i: usize) -> usize {
    match (ty, i) {
        (QType::Q2K, 80..) => i - 80,
        (QType::Q2K, _) => i + 4,
        (QType::Q3K, 108..) => i - 108,
        (QType::Q3K, 96..) => i - 94,
        (QType::Q3K, _) => i + 14,
        (QType::Q6K, 208..) => i - 208,
        (QType::Q6K, 192..) => i - 190,
        (QType::Q6K, _) => i + 18,
        _ => i,
    }
}

/// Byte `i` of a block of `ty` as its group block stores it, or back:
/// `Q8_0`'s values move 128 up (an involution).
fn stored(ty: QType, i: usize, byte: u8) -> u8 {
    if ty == QType::Q8_0 && i >= 2 { byte ^ 0x80 } else { byte }
}

/// Where byte `i` of row `r`'s block of `ty` goes in its group block.
fn place(ty: QType, fields: usize, r: usize, i: usize) -> usize {
    let i = ordered(ty, i);
    if i < 2 * fields {
        16 * (i / 2) + 2 * r + i % 2
    } else {
        let q = i - 2 * fields;
        16 * fields + 32 * (q / 4) + 4 * r + q % 4
    }
}

/// `data` (whole rows of `row_bytes`) of type `ty` with its first
/// `8·⌊rows/8⌋` rows interleaved; returns the data and the number of groups.
#[cfg(test)]
pub(crate) fn interleave(ty: QType, data: &[u8], row_bytes: usize) -> (Vec<u8>, usize) {
    let mut out = vec![0u8; data.len()];
    let groups = interleave_into(ty, data, row_bytes, &mut out);
    (out, groups)
}

/// [`interleave`] into `out` (as long as `data`); the number of groups.
pub(crate) fn interleave_into(ty: QType, data: &[u8], row_bytes: usize, out: &mut [u8]) -> usize {
    let Some((block, _)) = shape(ty) else {
        out.copy_from_slice(data);
        return 0;
    };
    let groups = data.len() / row_bytes.max(1) / 8;
    let split = groups * 8 * row_bytes;
    out[split..].copy_from_slice(&data[split..]);
    if groups == 0 {
        return 0;
    }
    let runs = runs(ty);
    let flip = |to: &mut [u8], i: usize| {
        for (k, x) in to.iter_mut().enumerate() {
            *x = stored(ty, i + k, *x);
        }
    };
    for (src, dst) in data[..split].chunks_exact(8 * row_bytes).zip(out[..split].chunks_exact_mut(8 * row_bytes)) {
        for (r, row) in src.chunks_exact(row_bytes).enumerate() {
            for (plain, gb) in row.chunks_exact(block).zip(dst.chunks_exact_mut(8 * block)) {
                // Runs of two and four bytes, copied as such (a load is
                // converted as it is read, so this loop is its time).
                for &(i, at, len) in &runs {
                    let at = at + len * r;
                    if len == 2 {
                        gb[at..at + 2].copy_from_slice(&plain[i..i + 2]);
                    } else {
                        gb[at..at + 4].copy_from_slice(&plain[i..i + 4]);
                    }
                    if ty == QType::Q8_0 {
                        flip(&mut gb[at..at + len], i);
                    }
                }
            }
        }
    }
    groups
}

/// The runs a block of `ty` moves in when interleaved: (offset in the
/// block, offset of row 0's copy in the group block, length): each 2-byte
/// field and each 4 quantized bytes; row `r`'s copy lies `r·length` further.
fn runs(ty: QType) -> Vec<(usize, usize, usize)> {
    let (block, fields) = shape(ty).expect("an interleaved type");
    let mut runs = Vec::new();
    let mut i = 0;
    while i < block {
        let len = if ordered(ty, i) < 2 * fields { 2 } else { 4 };
        runs.push((i, place(ty, fields, 0, i), len));
        i += len;
    }
    runs
}

/// Row `r` (`< 8·groups`) of interleaved data, as plain blocks.
pub(crate) fn row_of(ty: QType, data: &[u8], row_bytes: usize, r: usize) -> Vec<u8> {
    let block = shape(ty).expect("an interleaved type").0;
    let group = &data[r / 8 * 8 * row_bytes..(r / 8 + 1) * 8 * row_bytes];
    let mut row = vec![0u8; row_bytes];
    for (gb, out) in group.chunks_exact(8 * block).zip(row.chunks_exact_mut(block)) {
        block_of(ty, gb, r % 8, out);
    }
    row
}

/// Row `r`'s block (`out`, a block long) from the group block `gb`.
fn block_of(ty: QType, gb: &[u8], r: usize, out: &mut [u8]) {
    let fields = shape(ty).expect("an interleaved type").1;
    for (i, o) in out.iter_mut().enumerate() {
        *o = stored(ty, i, gb[place(ty, fields, r, i)]);
    }
}

/// The loops every portable group kernel shares: for each of the eight
/// rows and `T` activation rows, `step(group block, activation block, row,
/// acc)` over the blocks in order, then `finish(acc)` into `out[t·8 + r]`.
#[allow(clippy::too_many_arguments)]
fn rows_x8<const T: usize, A: Default>(
    group: &[u8],
    gbytes: usize,
    nb: usize,
    a: [&[u8]; T],
    abytes: usize,
    out: &mut [f32],
    step: impl Fn(&[u8], &[u8], usize, A) -> A,
    finish: impl Fn(A) -> f32,
) {
    assert!(group.len() == nb * gbytes && out.len() == 8 * T && a.iter().all(|r| r.len() == nb * abytes), "group kernel shapes");
    for t in 0..T {
        for r in 0..8 {
            let acc = (0..nb).fold(A::default(), |acc, b| {
                step(&group[b * gbytes..(b + 1) * gbytes], &a[t][b * abytes..(b + 1) * abytes], r, acc)
            });
            out[t * 8 + r] = finish(acc);
        }
    }
}

/// The 4- and 5-bit types with unsigned weights, read against activations
/// that carry their sums.
#[derive(Clone, Copy, PartialEq)]
enum Nibbles {
    /// Values stored 8 above themselves.
    Q4_0,
    /// A min `m` stored.
    Q4_1,
    /// Fifth bits stored; values stored 16 above themselves.
    Q5_0,
}

/// The portable 4/5-bit group kernel and the specification of the SIMD
/// ones: eight rows of `kind` against `T` activation rows carrying their
/// sums (`Q8_1`: d, s = d·Σq; `Q8_0O`: d, −k·Σq; then 32 values);
/// `out[t·8 + r]`. Per row and block: the exact integer sum of the
/// unsigned weights and the activations; `Q4_1` then takes `acc =
/// fma(d_w·d_a, Σ, acc)` and `acc = fma(m_w, s_a, acc)`, `Q4_0` and `Q5_0`
/// add the activations' −k·Σq to Σ (exactly `Σ(q − k)·a`, as llama.cpp
/// computes them) and take `acc = fma(d_w·d_a, Σ, acc)`; in block order,
/// bit for bit what the SIMD kernels compute, for any `T`.
fn nibbles_x8<const T: usize>(kind: Nibbles, group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (gbytes, qs) = match kind {
        Nibbles::Q4_0 => (144, 16),
        Nibbles::Q4_1 => (160, 32),
        Nibbles::Q5_0 => (176, 48),
    };
    let step = |gb: &[u8], ab: &[u8], r: usize, acc: f32| {
        let qh = if kind == Nibbles::Q5_0 { u32::from_le_bytes([gb[16 + 4 * r], gb[17 + 4 * r], gb[18 + 4 * r], gb[19 + 4 * r]]) } else { 0 };
        let mut sum = 0i32;
        for j in 0..16 {
            let q = gb[qs + 32 * (j / 4) + 4 * r + j % 4];
            let lo = (q & 0xF) | (((qh >> j) & 1) as u8) << 4;
            let hi = (q >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
            sum += i32::from(lo) * i32::from(ab[8 + j] as i8) + i32::from(hi) * i32::from(ab[8 + 16 + j] as i8);
        }
        let (d, da) = (scalar::f16_at(gb, 2 * r), scalar::f32_at(ab, 0));
        match kind {
            Nibbles::Q4_1 => scalar::f16_at(gb, 16 + 2 * r).mul_add(scalar::f32_at(ab, 4), (d * da).mul_add(sum as f32, acc)),
            Nibbles::Q4_0 | Nibbles::Q5_0 => (d * da).mul_add((sum + scalar::i32_at(ab, 4)) as f32, acc),
        }
    };
    rows_x8(group, gbytes, nb, a, 40, out, step, |acc| acc);
}

/// [`nibbles_x8`] for `Q4_1` (`Q4_0` when not `MIN`).
pub(crate) fn q4x8<const T: usize, const MIN: bool>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    nibbles_x8(if MIN { Nibbles::Q4_1 } else { Nibbles::Q4_0 }, group, nb, a, out);
}

/// [`nibbles_x8`] for `Q5_0`.
pub(crate) fn q5_0x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    nibbles_x8(Nibbles::Q5_0, group, nb, a, out);
}

/// The portable `Q8_0` group kernel and the specification of the SIMD one:
/// eight rows (values stored 128 above themselves) against `T` `Q8_0O`
/// activation rows (d as f32, −128·Σq, 32 values); per row and block the
/// exact integer sum of the unsigned weights started at −128·Σq (exactly
/// `Σ(q − 128)·a`), then `acc = fma(d_w·d_a, Σ, acc)`.
pub(crate) fn q8_0x8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let step = |gb: &[u8], ab: &[u8], r: usize, acc: f32| {
        let sum: i32 = (0..32).map(|j| i32::from(gb[16 + 32 * (j / 4) + 4 * r + j % 4]) * i32::from(ab[8 + j] as i8)).sum();
        (scalar::f16_at(gb, 2 * r) * scalar::f32_at(ab, 0)).mul_add((sum + scalar::i32_at(ab, 4)) as f32, acc)
    };
    rows_x8(group, 272, nb, a, 40, out, step, |acc| acc);
}

/// The portable `Q6_K` group kernel and the specification of the SIMD one:
/// eight rows (`nb` group blocks of 1,680 bytes: `d` at 0, scales at 16,
/// `ql` at 144, `qh` at 1,168) against `T` `Q8_K` activation rows. Per row
/// and super-block the exact integer sum `Σ_j sc_j·Σ(q−32)·a` over the
/// sixteen sub-blocks of 16, then `acc += (d·d_a)·sum`: the portable row
/// kernel's arithmetic (`scalar::dot_q6_k`; the AVX2 row kernel adds eight
/// float partial sums, as llama.cpp does, and differs in the last bits).
pub(crate) fn q6_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let step = |gb: &[u8], ab: &[u8], r: usize, acc: f32| {
        let byte = |base: usize, k: usize| gb[base + 32 * (k / 4) + 4 * r + k % 4];
        let mut s = 0i32;
        for v in 0..256 {
            // Value v: half h, quarter k of the half, position l in it.
            let (h, k, l) = (v / 128, v % 128 / 32, v % 32);
            let ql = byte(144, 64 * h + 32 * (k % 2) + l);
            let low = if k >= 2 { ql >> 4 } else { ql & 0xF };
            let high = (byte(1168, 32 * h + l) >> (2 * k)) & 3;
            let q = i32::from(low | high << 4) - 32;
            let sc = i32::from(byte(16, 8 * h + 2 * k + l / 16) as i8);
            s += sc * q * i32::from(ab[4 + v] as i8);
        }
        acc + scalar::f16_at(gb, 2 * r) * scalar::f32_at(ab, 0) * s as f32
    };
    rows_x8(group, 1680, nb, a, 292, out, step, |acc| acc);
}

/// The portable `Q4_K` group kernel and the specification of the SIMD one:
/// eight rows (`nb` group blocks of 1,152 bytes) against `T` `Q8_K`
/// activation rows (d, 256 values, 16 sums of 16). Per row and super-block
/// the exact integer sums `Σ_j sc_j·Σ(q·a)` and `Σ_j m_j·Σa` over the eight
/// sub-blocks `j`, then `acc = fma(d·d_a, sums, acc)` and
/// `mins = fma(dmin·d_a, msums, mins)`; the result is `acc − mins`.
pub(crate) fn q4_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    k_x8::<T, false>(group, nb, a, out);
}

/// [`q4_kx8`] for `Q5_K` (group blocks of 1,408 bytes: `qh` at 128 and
/// `qs` at 384): value `l` of sub-block `j` takes bit `j` of its `qh`
/// byte `l` as its fifth bit.
pub(crate) fn q5_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    k_x8::<T, true>(group, nb, a, out);
}

/// [`q4_kx8`], and [`q5_kx8`] when `FIVE`.
fn k_x8<const T: usize, const FIVE: bool>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let (bytes, qs) = if FIVE { (1408, 384) } else { (1152, 128) };
    let step = |gb: &[u8], ab: &[u8], r: usize, (acc, mins): (f32, f32)| {
        let packed: Vec<u8> = (0..12).map(|i| gb[32 + 32 * (i / 4) + 4 * r + i % 4]).collect();
        let byte = |at: usize, k: usize| gb[at + 32 * (k / 4) + 4 * r + k % 4];
        let bsum = |k: usize| i32::from(i16::from_le_bytes([ab[260 + 2 * k], ab[261 + 2 * k]]));
        let (mut sums, mut msums) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scalar::scale_min_k4(&packed, j);
            let isum: i32 = (0..32)
                .map(|l| {
                    let q = byte(qs, 32 * (j / 2) + l);
                    let mut w = if j % 2 == 1 { q >> 4 } else { q & 0xF };
                    if FIVE {
                        w |= ((byte(128, l) >> j) & 1) << 4;
                    }
                    i32::from(w) * i32::from(ab[4 + 32 * j + l] as i8)
                })
                .sum();
            sums += i32::from(sc) * isum;
            msums += i32::from(m) * (bsum(2 * j) + bsum(2 * j + 1));
        }
        let da = scalar::f32_at(ab, 0);
        ((scalar::f16_at(gb, 2 * r) * da).mul_add(sums as f32, acc), (scalar::f16_at(gb, 16 + 2 * r) * da).mul_add(msums as f32, mins))
    };
    rows_x8(group, bytes, nb, a, 292, out, step, |(acc, mins)| acc - mins);
}

/// The portable `Q2_K` group kernel and the specification of the SIMD one:
/// eight rows (`nb` group blocks of 672 bytes: `d` at 0, `dmin` at 16,
/// scales at 32, `qs` at 160) against `T` `Q8_K` activation rows. Per row
/// and super-block the exact integer sums `Σ_j sc_j·Σ q·a` and
/// `Σ_j m_j·bsum_j` (`scalar::q2_k_sums`), then `acc = fma(−(dmin·d_a),
/// msums, acc)` and `acc = fma(d·d_a, sums, acc)`: one float accumulator
/// a row, so the SIMD kernels keep eight activation rows' in registers.
pub(crate) fn q2_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let step = |gb: &[u8], ab: &[u8], r: usize, acc: f32| {
        let mut blk = [0u8; 84];
        block_of(QType::Q2K, gb, r, &mut blk);
        let (sums, msums) = scalar::q2_k_sums(&blk, ab);
        let da = scalar::f32_at(ab, 0);
        let acc = (-(scalar::f16_at(gb, 16 + 2 * r) * da)).mul_add(msums as f32, acc);
        (scalar::f16_at(gb, 2 * r) * da).mul_add(sums as f32, acc)
    };
    rows_x8(group, 672, nb, a, 292, out, step, |acc| acc);
}

/// The portable `Q3_K` group kernel and the specification of the SIMD one:
/// eight rows (`nb` group blocks of 880 bytes: `d` at 0, scales at 16,
/// `hmask` at 112, `qs` at 368) against `T` `Q8_K` activation rows. Per
/// row and super-block the exact integer sum `Σ_j sc_j·Σ q·a`
/// (`scalar::q3_k_sum`), then `acc = fma(d·d_a, sum, acc)`.
pub(crate) fn q3_kx8<const T: usize>(group: &[u8], nb: usize, a: [&[u8]; T], out: &mut [f32]) {
    let step = |gb: &[u8], ab: &[u8], r: usize, acc: f32| {
        let mut blk = [0u8; 110];
        block_of(QType::Q3K, gb, r, &mut blk);
        (scalar::f16_at(gb, 2 * r) * scalar::f32_at(ab, 0)).mul_add(scalar::q3_k_sum(&blk, ab) as f32, acc)
    };
    rows_x8(group, 880, nb, a, 292, out, step, |acc| acc);
}
