//! The kernels against an independent reference: weights quantized by
//! candle, dequantized by candle and multiplied in f32; the SIMD kernels
//! against the portable ones (every build this CPU runs); odd shapes, token
//! counts around the 4- and 8-row tiles, one and several threads.

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use super::act::{best_quantize_q8, best_quantize_q8_k};
use super::scalar::Q8Layout;
use super::*;

const ALL: [QType; 13] = QType::ALL;

/// SplitMix64 floats in [-1, 1).
fn randoms(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A random matrix stored as `ty` (quantized by candle) and its values as
/// candle dequantizes them.
fn matrix(ty: QType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Vec<f32>) {
    let values = randoms(rows * cols, seed);
    let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, ty.ggml()).unwrap();
    let data = q.data().unwrap().into_owned();
    let dense = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (QMatrix::new(ty, rows, cols, data).unwrap(), dense)
}

fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * rows];
    for t in 0..n {
        for r in 0..rows {
            out[t * rows + r] = (0..cols).map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64).sum::<f64>() as f32;
        }
    }
    out
}

fn run(m: &QMatrix, pool: &Pool, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n * m.rows()];
    m.matmul(pool, x, n, &mut out, &mut Scratch::default());
    out
}

#[test]
fn every_type_matches_dequantize_then_f32_matmul() {
    let pools = [Pool::new(1), Pool::new(3)];
    let mut seed = 1;
    for ty in ALL {
        let unit = ty.block().0.max(32);
        for (rows, cols) in [(1, unit), (7, 2 * unit), (37, 3 * unit), (64, unit)] {
            for n in [1, 3, 4, 5, 9, 13] {
                seed += 1;
                let (m, dense) = matrix(ty, rows, cols, seed);
                let x = randoms(n * cols, seed * 7919);
                let want = reference(&dense, &x, rows, cols, n);
                // Activations are quantized to 8 bits: the error is a small
                // share of the typical magnitude of a product sum.
                let scale = (cols as f32).sqrt() * 0.35;
                let tol = if matches!(ty, QType::F32 | QType::F16 | QType::BF16) { 1e-4 } else { 0.02 } * scale;
                let pool = &pools[(seed % 2) as usize];
                let fast = run(&m, pool, &x, n);
                let slow = run(&m.clone().portable(), pool, &x, n);
                for i in 0..want.len() {
                    assert!(
                        (fast[i] - want[i]).abs() <= tol,
                        "{ty:?} {rows}×{cols} n={n} [{i}]: kernel {} reference {} (tol {tol})",
                        fast[i],
                        want[i]
                    );
                    assert!(
                        (fast[i] - slow[i]).abs() <= 1e-5 * scale.max(1.0) * 4.0,
                        "{ty:?} {rows}×{cols} n={n} [{i}]: SIMD {} portable {}",
                        fast[i],
                        slow[i]
                    );
                }
            }
        }
    }
}

#[test]
fn rows_dequantize_as_candle_does() {
    for ty in ALL {
        let cols = ty.block().0.max(32) * 2;
        let (m, dense) = matrix(ty, 5, cols, 99);
        for r in 0..5 {
            assert_eq!(m.row_f32(r), dense[r * cols..(r + 1) * cols].to_vec(), "{ty:?} row {r}");
        }
    }
}

#[test]
fn activation_quantizers_round_trip_within_half_a_step() {
    let x = randoms(512, 5);
    for act in [Act::Q8_0O(8), Act::Q8_0O(16), Act::Q8_0O(128), Act::Q8_1, Act::Q8K] {
        let (v, b) = act.block();
        let mut out = vec![0u8; x.len() / v * b];
        act.quantize(&x, &mut out);
        for (blk, xb) in out.chunks_exact(b).zip(x.chunks_exact(v)) {
            let (d, qs) = match act {
                Act::Q8K => (scalar::f32_at(blk, 0), &blk[4..260]),
                _ => (scalar::f32_at(blk, 0), &blk[8..]),
            };
            for (q, &xv) in qs.iter().zip(xb) {
                assert!((*q as i8 as f32 * d - xv).abs() <= d.abs() * 0.51 + 1e-3, "{act:?}: {q} × {d} vs {xv}");
            }
            let sum: i32 = qs.iter().map(|&q| q as i8 as i32).sum();
            match act {
                Act::Q8_1 => assert!((scalar::f32_at(blk, 4) - d * sum as f32).abs() <= 1e-2 * (d * sum as f32).abs().max(1.0)),
                Act::Q8_0O(k) => assert_eq!(scalar::i32_at(blk, 4), -k * sum, "{act:?}"),
                _ => {}
            }
        }
    }
}

/// The SIMD activation quantizer writes the portable one's bytes in every
/// layout, on random blocks, blocks of zeros, ties (x.5 steps), one large
/// value and scales that round to f16 subnormals.
#[test]
fn the_activation_quantizers_agree_bit_for_bit() {
    let best = best_quantize_q8();
    let mut blocks: Vec<Vec<f32>> = (0..200).map(|i| randoms(32, 900 + i).iter().map(|v| v * (i as f32 + 0.5)).collect()).collect();
    blocks.push(vec![0.0; 32]);
    blocks.push((0..32).map(|i| (i as f32 - 16.0) * 0.5).collect());
    // 127 sets the scale to 1, so the others (x.5) are exact ties.
    blocks.push((0..32).map(|i| if i == 0 { 127.0 } else { i as f32 - 15.5 }).collect());
    blocks.push((0..32).map(|i| if i == 7 { -1e30 } else { i as f32 }).collect());
    blocks.push(randoms(32, 77).iter().map(|v| v * 1e-4).collect());
    let row: Vec<f32> = blocks.concat();
    for layout in [Q8Layout::Offset(8), Q8Layout::Offset(16), Q8Layout::Offset(128), Q8Layout::Sum16] {
        let mut a = vec![0u8; blocks.len() * scalar::Q8_BLOCK_BYTES];
        let mut b = a.clone();
        scalar::quantize_q8(layout, &row, &mut a);
        best(layout, &row, &mut b);
        for (i, (x, y)) in a.chunks(scalar::Q8_BLOCK_BYTES).zip(b.chunks(scalar::Q8_BLOCK_BYTES)).enumerate() {
            assert_eq!(x, y, "{layout:?}, block {i}: {:?}", blocks[i]);
        }
    }
}

/// The SIMD `Q8_K` quantizer writes the portable one's bytes: random
/// blocks at many scales, zeros, ties, a largest magnitude met twice with
/// both signs (the first sets the sign), NaNs, infinities and a largest
/// magnitude so small that its reciprocal overflows.
#[test]
fn the_q8_k_quantizers_agree_bit_for_bit() {
    let mut blocks: Vec<Vec<f32>> = (0..100).map(|i| randoms(256, 300 + i).iter().map(|v| v * (i as f32 * 0.37 + 1e-3)).collect()).collect();
    blocks.push(vec![0.0; 256]);
    blocks.push((0..256).map(|i| if i == 0 { -127.0 } else { (i % 64) as f32 - 31.5 }).collect());
    blocks.push((0..256).map(|i| if i == 40 { 3.0 } else if i == 9 { -3.0 } else { (i % 7) as f32 * 0.1 }).collect());
    blocks.push((0..256).map(|i| if i % 50 == 3 { f32::NAN } else { i as f32 }).collect());
    blocks.push((0..256).map(|i| if i == 100 { f32::INFINITY } else { i as f32 }).collect());
    blocks.push((0..256).map(|i| if i == 5 { f32::NEG_INFINITY } else { i as f32 }).collect());
    blocks.push(vec![f32::NAN; 256]);
    blocks.push((0..256).map(|i| if i == 17 { 1e-45 } else { 0.0 }).collect());
    blocks.push((0..256).map(|i| (i as f32 - 128.0) * 1e-39).collect());
    let row: Vec<f32> = blocks.concat();
    let (mut a, mut b) = (vec![0u8; blocks.len() * 292], vec![1u8; blocks.len() * 292]);
    scalar::quantize_q8_k(&row, &mut a);
    best_quantize_q8_k()(&row, &mut b);
    for (i, (x, y)) in a.chunks(292).zip(b.chunks(292)).enumerate() {
        assert_eq!(x, y, "block {i}: {:?}", &blocks[i][..8]);
    }
}

/// Yields until `done` holds, for at most 10 s (a broken pool then fails
/// the test's assertion instead of hanging it).
fn wait_for(done: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !done() && t.elapsed().as_secs() < 10 {
        std::thread::yield_now();
    }
}

/// Runs a job whose caller waits (bounded) for every worker to take part;
/// returns how many did. When it returns, every worker has finished the job.
fn run_with_every_worker(pool: &Pool) -> usize {
    let joined = AtomicUsize::new(0);
    pool.run(&|i| {
        if i == 0 {
            wait_for(|| joined.load(Ordering::SeqCst) == pool.threads() - 1);
        } else {
            joined.fetch_add(1, Ordering::SeqCst);
        }
    });
    joined.load(Ordering::SeqCst)
}

#[test]
fn a_pools_jobs_do_all_their_work_once_and_report_panics() {
    // More threads than this machine's cores too: workers that yield, sleep
    // and wake between jobs (the job is handed out without a lock), and
    // that the caller may leave out of a job they start late.
    for threads in [2, 3, 9] {
        let pool = Pool::new(threads);
        for job in 0..if threads > 3 { 300 } else { 2000 } {
            let hits: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
            let items: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            let next = AtomicUsize::new(0);
            pool.run(&|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
                // Work shared out by a counter, as the pool's jobs must.
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(k) else { break };
                    item.fetch_add(1 + job % 3, Ordering::Relaxed);
                }
            });
            assert_eq!(hits[0].load(Ordering::Relaxed), 1, "job {job}: the caller takes part");
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) <= 1), "job {job} on {threads} threads: an index ran twice");
            assert!(items.iter().all(|x| x.load(Ordering::Relaxed) == 1 + job % 3), "job {job} on {threads} threads: work lost or done twice");
            // Every other job after the workers were told to rest: they go
            // to sleep at once and the next job must still wake them (a
            // lost wake-up leaves them out of every job after).
            if job % 2 == 1 {
                pool.rest();
            }
        }
        // Workers still take part: a job whose caller waits for them
        // (bounded, so a broken pool fails here instead of hanging).
        assert_eq!(run_with_every_worker(&pool), threads - 1, "every worker took part in a job that waited for it");
    }
    let pool = Pool::new(3);
    // Told to rest, the workers sleep; told a job comes soon, they wake
    // before it (a lost nudge leaves them asleep), and take part in it.
    for _ in 0..50 {
        // Both workers have finished a job (none is still on its way out of
        // a sleep the job's wake-up ended), then rest.
        assert_eq!(run_with_every_worker(&pool), 2);
        pool.rest();
        wait_for(|| pool.sleeps().0 == 2);
        let (asleep, woken) = pool.sleeps();
        assert_eq!(asleep, 2, "rested workers sleep");
        pool.ready();
        wait_for(|| pool.sleeps().1 == woken + 2);
        assert_eq!(pool.sleeps().1, woken + 2, "a nudge wakes every sleeping worker, once");
        assert_eq!(run_with_every_worker(&pool), 2, "nudged workers take part in the next job");
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.run(&|i| assert!(i != 0, "boom"))));
    assert!(r.is_err(), "the caller's panic");
    // A worker's panic, in a job whose caller waits for a worker to start.
    let started = AtomicUsize::new(0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(&|i| {
            if i == 0 {
                wait_for(|| started.load(Ordering::SeqCst) > 0);
            } else {
                started.fetch_add(1, Ordering::SeqCst);
                panic!("boom");
            }
        })
    }));
    assert!(r.is_err(), "a worker's panic is raised by the caller");
    // The pool still works after a panic.
    let count = AtomicUsize::new(0);
    pool.run(&|_| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    assert!((1..=3).contains(&count.load(Ordering::Relaxed)));
}

#[test]
fn strided_vector_ops_match_the_portable_ones_and_f64() {
    let (best, port) = (VecOps::best(), VecOps::portable());
    for d in [1, 7, 8, 9, 16, 64, 65, 128] {
        for (n, stride) in [(0, d), (1, d), (5, d), (9, 3 * d + 2)] {
            let q = randoms(d, d as u64);
            let rows = randoms((n.max(1) - 1) * stride + d, n as u64 + 7);
            let p: Vec<f32> = randoms(n, 3).into_iter().enumerate().map(|(j, v)| if j == 2 { 0.0 } else { v }).collect();
            for ops in [best, port] {
                let mut out = vec![f32::NAN; n];
                (ops.dots)(&q, &rows, stride, &mut out);
                let mut y = q.clone();
                (ops.axpys)(&mut y, &p, &rows, stride);
                for j in 0..n {
                    let exact: f64 = (0..d).map(|c| q[c] as f64 * rows[j * stride + c] as f64).sum();
                    assert!((out[j] as f64 - exact).abs() < 1e-4, "dots d={d} n={n} [{j}]");
                }
                for c in 0..d {
                    let exact: f64 = q[c] as f64 + (0..n).map(|j| p[j] as f64 * rows[j * stride + c] as f64).sum::<f64>();
                    assert!((y[c] as f64 - exact).abs() < 1e-4, "axpys d={d} n={n} [{c}]");
                }
            }
        }
    }
}

/// Every x86 build of the weighted values gives the same bits (the 512-bit
/// one takes each value's FMA in the order the 256-bit one does), also
/// with zero weights (skipped) and head sizes without a build of their own.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_weighted_value_builds_agree_bit_for_bit() {
    let builds = super::x86_vec::axpys_builds();
    for d in [8, 64, 65, 128] {
        for (n, stride) in [(0, d), (1, d), (37, d), (9, 3 * d + 2)] {
            let rows = randoms((n.max(1) - 1) * stride + d, n as u64 + 3);
            let p: Vec<f32> = randoms(n, 5).into_iter().enumerate().map(|(j, v)| if j % 4 == 1 { 0.0 } else { v }).collect();
            let outs: Vec<Vec<u32>> = builds
                .iter()
                .map(|axpys| {
                    let mut y = randoms(d, 9);
                    axpys(&mut y, &p, &rows, stride);
                    y.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            assert!(outs.windows(2).all(|w| w[0] == w[1]), "d={d} n={n} stride={stride}");
        }
    }
}

/// Every x86 build of the keys' dots gives the same bits (the 512-bit one
/// runs the 256-bit one's two sums in one register's halves), for every
/// count of keys past a multiple of eight and head sizes without a build
/// of their own.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_dot_builds_agree_bit_for_bit() {
    let builds = super::x86_vec::dots_builds();
    for d in [8, 64, 65, 128] {
        for (n, stride) in [(0, d), (1, d), (7, d), (8, d), (21, d), (9, 3 * d + 2)] {
            let q = randoms(d, 4);
            let rows = randoms((n.max(1) - 1) * stride + d, n as u64 + 3);
            let outs: Vec<Vec<u32>> = builds
                .iter()
                .map(|dots| {
                    let mut out = vec![f32::NAN; n];
                    dots(&q, &rows, stride, &mut out);
                    out.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            assert!(outs.windows(2).all(|w| w[0] == w[1]), "d={d} n={n} stride={stride}");
        }
    }
}

/// Several heads' weighted values over one lane's rows, taken together,
/// are each head's bits from a call of its own, for every number of heads
/// (the 512-bit build groups them by four or two) and with zero weights.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_heads_weighted_values_are_each_heads_own() {
    let Some(&alone) = super::x86_vec::axpys_builds().first() else { return };
    for build in super::x86_vec::axpys_heads_builds() {
        for d in [8, 64, 65, 128] {
            for heads in 1..=6 {
                for (n, stride) in [(0, d), (1, d), (37, d), (9, 3 * d + 2)] {
                    let rows = randoms((n.max(1) - 1) * stride + d, n as u64 + 3);
                    let p: Vec<f32> = randoms(heads * (n + 1), 5).into_iter().enumerate().map(|(j, v)| if j % 5 == 1 { 0.0 } else { v }).collect();
                    let w = HeadWeights { p: &p, heads, stride: n + 1, n };
                    let y0 = randoms(heads * d, 9);
                    let mut got = y0.clone();
                    build(&mut got, w, &rows, stride);
                    let mut want = y0.clone();
                    for (h, y) in want.chunks_exact_mut(d).enumerate() {
                        alone(y, w.head(h), &rows, stride);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "d={d} heads={heads} n={n} stride={stride}");
                }
            }
        }
    }
}

/// Several heads' dots against one lane's keys, taken together, are each
/// head's bits from a call of its own, for every number of heads (the
/// 512-bit build takes them in groups of up to four) and key counts past
/// a multiple of four.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_heads_dots_are_each_heads_own() {
    let Some(&alone) = super::x86_vec::dots_builds().last() else { return };
    for build in super::x86_vec::dots_heads_builds() {
        for d in [8, 64, 65, 128] {
            for heads in 1..=9 {
                for (n, stride) in [(0, d), (1, d), (6, d), (37, d), (9, 3 * d + 2)] {
                    let rows = randoms((n.max(1) - 1) * stride + d, n as u64 + 3);
                    let qs = randoms(heads * d, heads as u64);
                    let mut got = vec![f32::NAN; heads * (n + 1)];
                    build(&qs, &rows, stride, HeadDots { out: &mut got, heads, stride: n + 1, n });
                    let mut want = vec![f32::NAN; heads * (n + 1)];
                    for (q, w) in qs.chunks_exact(d).zip(want.chunks_exact_mut(n + 1)) {
                        alone(q, &rows, stride, &mut w[..n]);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "d={d} heads={heads} n={n} stride={stride}");
                }
            }
        }
    }
}

/// Every x86 build of attention's softmax weights gives the plain loops'
/// bits, for lengths past a multiple of sixteen, with -∞ (hidden
/// positions), NaN and ±0 among the scores.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_softmax_builds_agree_bit_for_bit() {
    let plain = |x: &mut [f32], scale: f32| super::vec_ops::softmax_with(super::exp::exps, x, scale);
    for build in super::x86_vec::softmax_builds() {
        for n in [0, 1, 5, 16, 17, 37, 190] {
            for seed in 0..3u64 {
                let mut x: Vec<f32> = randoms(n, seed + n as u64).iter().map(|v| v * 40.0).collect();
                for (k, special) in [f32::NEG_INFINITY, f32::NAN, 0.0, -0.0].into_iter().enumerate() {
                    if n > 3 * k + 1 && seed > 0 {
                        x[3 * k + 1] = special;
                    }
                }
                let (mut got, mut want) = (x.clone(), x.clone());
                build(&mut got, 0.125);
                plain(&mut want, 0.125);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n={n} seed={seed}");
            }
        }
    }
}

/// A key's dot and a value's share do not depend on how many keys there
/// are: a sequence's attention is the same whatever else shares its pass
/// (options scored together, a beam's forks).
#[test]
fn a_keys_dot_does_not_depend_on_the_number_of_keys() {
    for ops in [VecOps::best(), VecOps::portable()] {
        for d in [8, 64, 128] {
            let q = randoms(d, 11);
            let rows = randoms(13 * d, 12);
            let mut all = vec![0.0; 13];
            (ops.dots)(&q, &rows, d, &mut all);
            for n in 0..13 {
                let mut some = vec![0.0; n];
                (ops.dots)(&q, &rows[..n * d], d, &mut some);
                assert_eq!(some.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), all[..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "d={d} n={n}");
            }
        }
    }
}

/// `exps` against f64 `exp`: within 3e-7 relative where the result is a
/// normal float, 0 for -∞ and below, and a value's result is the same
/// wherever it sits in the slice.
#[test]
fn exps_match_f64_and_do_not_depend_on_position() {
    let mut xs: Vec<f32> = (0..20_000).map(|i| -88.0 + i as f32 * 0.0088).collect();
    xs.extend([f32::NEG_INFINITY, -1e30, -100.0, -87.0, -1e-8, 0.0, 1e-8, 1.0, 88.0]);
    for ops in [VecOps::best(), VecOps::portable()] {
        let mut ys = xs.clone();
        (ops.exps)(&mut ys);
        for (&x, &y) in xs.iter().zip(&ys) {
            let want = (x as f64).exp();
            if want < 1.2e-38 {
                assert!(y.abs() < 1.2e-38, "exp({x}) = {y}");
            } else {
                assert!(((y as f64 - want) / want).abs() < 3e-7, "exp({x}) = {y}, not {want}");
            }
        }
        for (start, len) in [(0, 13), (5, 3), (19_990, 10)] {
            for k in 0..len {
                let mut alone = [xs[start + k]];
                (ops.exps)(&mut alone);
                assert_eq!(alone[0].to_bits(), ys[start + k].to_bits(), "exp({}) alone", xs[start + k]);
            }
        }
    }
}

/// Every 97th f32 bit pattern (all exponents, both signs, subnormals,
/// infinities and NaNs) plus the edges of `exp::expf`'s ranges.
fn exp_inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..u32::MAX / 97).map(|i| f32::from_bits(i * 97)).collect();
    for b in [0x42b0_0000u32, 0x42b1_7217, 0x42b1_7218, 0xc2cf_f1b4, 0xc2cf_f1b5, 0xc2ce_8ecf, 0xc2ce_8ed0, 0xc2b0_0000] {
        xs.extend([b - 1, b, b + 1].map(f32::from_bits));
    }
    xs.extend([f32::NEG_INFINITY, f32::INFINITY, f32::NAN, 0.0, -0.0]);
    xs
}

/// The SIMD `exps` is bit for bit the portable spec, wherever a value sits
/// in a slice (odd lengths leave a part-filled last vector).
#[test]
fn exps_every_build_equals_the_spec() {
    let xs = exp_inputs();
    let mut want = xs.clone();
    exp::exps(&mut want);
    #[cfg(target_arch = "x86_64")]
    let builds = super::x86_vec::exps_builds();
    #[cfg(not(target_arch = "x86_64"))]
    let builds = vec![VecOps::best().exps];
    for exps in builds {
        for len in [xs.len(), 13, 7, 29] {
            let mut got = xs[..len].to_vec();
            exps(&mut got);
            for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "exp({x:e}) = {g:e}, spec {w:e}");
            }
        }
    }
}

/// The spec is glibc's `expf` (its FMA build, which glibc picks on CPUs
/// with AVX2 and FMA): the model's numbers did not move when attention and
/// SiLU left `f32::exp` for it. Checked where `f32::exp` is that function.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#[test]
fn expf_equals_glibc_expf() {
    if !x86_group::has_avx2() {
        eprintln!("expf_equals_glibc_expf: no AVX2 and FMA here, so glibc runs its other build; nothing to compare");
        return;
    }
    for x in exp_inputs() {
        let (got, want) = (exp::expf(x), x.exp());
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "exp({x:e}) = {got:e}, glibc {want:e}");
    }
}

/// The table is `2^(i/32)` (within an ulp of f64 `powf`), less `i·2⁴⁷`.
#[test]
fn exp_table_holds_powers_of_two() {
    for (i, &t) in exp::EXP2_TABLE.iter().enumerate() {
        let v = f64::from_bits(t + ((i as u64) << 47));
        let want = 2f64.powf(i as f64 / 32.0);
        assert!((v - want).abs() <= f64::EPSILON * want, "2^({i}/32) = {v}, not {want}");
    }
}

#[test]
fn magic_rounding_is_round_half_to_even() {
    for i in -1300..=1300 {
        let v = i as f32 / 10.0;
        for x in [v, v + 0.05, v - 0.05] {
            assert_eq!(scalar::round_even(x), x.round_ties_even(), "{x}");
        }
    }
}

/// A row's outputs do not depend on the rows beside it in a pass (4-row
/// tiles or not): sequences decoded together give the logits each gives
/// alone, so a dataset run's outputs are the same at any `--parallel`.
#[test]
fn a_rows_result_is_the_same_alone_and_in_any_batch() {
    let pool = Pool::new(2);
    for (i, ty) in ALL.into_iter().enumerate() {
        let unit = ty.block().0.max(32);
        let (rows, cols, n) = (19, 4 * unit, 9);
        let (m, _) = matrix(ty, rows, cols, 100 + i as u64);
        let x = randoms(n * cols, 7 + i as u64);
        let together = run(&m, &pool, &x, n);
        for t in 0..n {
            let alone = run(&m, &pool, &x[t * cols..(t + 1) * cols], 1);
            let same = alone.iter().zip(&together[t * rows..(t + 1) * rows]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{ty:?}: row {t} of {n} differs from the row alone");
        }
    }
}

/// `matmul_add` adds to each output what `matmul` stores, bit for bit,
/// through group, pair and plain rows alike (29 rows: a pair, a lone
/// group and five plain rows where the type interleaves).
#[test]
fn matmul_add_is_matmul_then_add() {
    let pool = Pool::new(2);
    for (i, ty) in ALL.into_iter().enumerate() {
        let cols = ty.block().0.max(32) * 2;
        let (rows, n) = (8 * 3 + 5, 9);
        let (m, _) = matrix(ty, rows, cols, 300 + i as u64);
        let x = randoms(n * cols, 31 + i as u64);
        let base = randoms(n * rows, 57 + i as u64);
        let want: Vec<f32> = run(&m, &pool, &x, n).iter().zip(&base).map(|(p, b)| b + p).collect();
        let mut got = base.clone();
        m.matmul_add(&pool, Input::Rows(&x), n, &mut got, &mut Scratch::default());
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{ty:?}: matmul_add differs from matmul then add");
    }
}

/// Interleaved rows read back as they were stored, and the SIMD group
/// kernels compute bit for bit what the portable ones specify.
#[test]
fn interleaved_rows_round_trip_and_kernels_agree_exactly() {
    for ty in [QType::Q4_0, QType::Q4_1, QType::Q5_0, QType::Q8_0, QType::Q2K, QType::Q3K, QType::Q4K, QType::Q5K, QType::Q6K] {
        interleaved_type_round_trips(ty);
    }
}

/// The portable `Q6_K` group kernel computes each row's bits as the
/// portable row kernel does (checked on every CPU, whether or not its best
/// build stores `Q6_K` in groups).
#[test]
fn q6_k_groups_compute_the_row_kernels_bits() {
    let (rows, cols) = (16, 512);
    let values = randoms(rows * cols, 91);
    let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
    let plain = QTensor::quantize(&t, QType::Q6K.ggml()).unwrap().data().unwrap().into_owned();
    let rb = QType::Q6K.row_bytes(cols).unwrap();
    let (grouped, groups) = interleave::interleave(QType::Q6K, &plain, rb);
    assert_eq!(groups, 2);
    let acts: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let mut a = vec![0u8; cols / 256 * 292];
            scalar::quantize_q8_k(&randoms(cols, 7 + i), &mut a);
            a
        })
        .collect();
    for g in 0..groups {
        let mut out = [0f32; 8 * 3];
        interleave::q6_kx8::<3>(&grouped[g * 8 * rb..(g + 1) * 8 * rb], cols / 256, [&acts[0], &acts[1], &acts[2]], &mut out);
        for (t, a) in acts.iter().enumerate() {
            for r in 0..8 {
                let row = &plain[(8 * g + r) * rb..(8 * g + r + 1) * rb];
                assert_eq!(out[t * 8 + r].to_bits(), scalar::dot_q6_k(row, a).to_bits(), "group {g} row {r} token {t}");
            }
        }
    }
}

/// Matrices tall enough that a thread's chunk holds several groups and
/// the widest tiles run, each build bit for bit the portable one.
#[test]
fn every_build_agrees_on_tall_matrices() {
    let pool = Pool::new(2);
    for ty in [QType::Q4_0, QType::Q4_1, QType::Q8_0, QType::Q5_0, QType::Q2K, QType::Q3K, QType::Q4K, QType::Q5K, QType::Q6K] {
        let (rows, cols) = (272, ty.block().0.max(32) * 3);
        let (m, _) = matrix(ty, rows, cols, 77);
        if m.groups == 0 {
            // A type the best build keeps plain (`Q6_K` on most, the
            // low-bit k-quants on NEON): their row kernels differ from the
            // portable group kernels in the last bits.
            assert!(!Simd::best().stores_groups(ty), "{ty:?} is stored in groups");
            continue;
        }
        let portable = m.clone().portable();
        for simd in Simd::available() {
            let m = m.clone().with_simd(simd);
            for n in [2, 3, 9, 10, 11, 15, 16, 20] {
                let x = randoms(n * cols, 3 + n as u64);
                let (fast, slow) = (run(&m, &pool, &x, n), run(&portable, &pool, &x, n));
                let same = fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty:?} {simd:?}, {n} rows differ from the portable kernels");
            }
        }
    }
}

fn interleaved_type_round_trips(ty: QType) {
    let (rows, cols) = (21, ty.block().0.max(32) * 3);
    let (m, _) = matrix(ty, rows, cols, 41);
    let grouped = Simd::best().stores_groups(ty);
    assert_eq!(m.groups, if grouped { 2 } else { 0 }, "two groups of eight, five plain rows");
    let rb = ty.row_bytes(cols).unwrap();
    let plain = {
        let values = randoms(rows * cols, 41);
        let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&t, ty.ggml()).unwrap().data().unwrap().into_owned()
    };
    for r in 0..rows {
        assert_eq!(&m.row(r)[..], &plain[r * rb..(r + 1) * rb], "{ty:?} row {r}");
    }
    let pool = Pool::new(2);
    let portable = m.clone().portable();
    for simd in Simd::available() {
        let m = m.clone().with_simd(simd);
        for n in [1, 4, 6, 8, 13, 16] {
            let x = randoms(n * cols, 5 + n as u64);
            let (fast, slow) = (run(&m, &pool, &x, n), run(&portable, &pool, &x, n));
            // The interleaved rows (the plain ones' kernels differ in order;
            // a build that keeps `Q6_K` plain has none).
            let same = fast.iter().zip(&slow).enumerate().all(|(i, (a, b))| i % rows >= 8 * m.groups || a.to_bits() == b.to_bits());
            assert!(same, "{ty:?} {simd:?}, {n} rows: {fast:?} vs {slow:?}");
        }
    }
}

/// Every block type against candle's own quantized matmul (its kernels
/// quantize the activations to the same 8-bit formats): the sums differ
/// only in float rounding, except where candle rounds `Q8_1`'s `d·Σq`
/// differently (`Q4_1`, `Q5_1`: see tests/model.rs).
#[test]
fn every_block_type_matches_candles_quantized_matmul() {
    use candle_core::Module;
    let pool = Pool::new(2);
    for (i, ty) in ALL.into_iter().filter(|t| !matches!(t, QType::F32 | QType::F16 | QType::BF16)).enumerate() {
        let (rows, cols, n) = (48, 512, 3);
        let values = randoms(rows * cols, 5 + i as u64);
        let q = QTensor::quantize(&Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap(), ty.ggml()).unwrap();
        let m = QMatrix::new(ty, rows, cols, q.data().unwrap().into_owned()).unwrap();
        let x = randoms(n * cols, 77 + i as u64);
        let xt = Tensor::from_vec(x.clone(), (n, cols), &Device::Cpu).unwrap();
        let mm = candle_core::quantized::QMatMul::from_qtensor(q).unwrap();
        let want = mm.forward(&xt).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let tol = if matches!(ty, QType::Q4_1 | QType::Q5_1) { 2e-3 } else { 1e-5 } * (cols as f32).sqrt();
        for (k, (got, want)) in run(&m, &pool, &x, n).iter().zip(&want).enumerate() {
            assert!((got - want).abs() <= tol, "{ty:?} [{k}]: lmt {got}, candle {want} (tol {tol})");
        }
    }
}

/// The `Q2_K` row kernels' builds (AVX2; VNNI, whose weights carry their
/// scales) compute the same bits, one and four activation rows at a time.
#[cfg(target_arch = "x86_64")]
#[test]
fn q2_k_builds_agree_bit_for_bit() {
    let builds = x86::q2_k_builds();
    let (rows, cols) = (5, 768);
    let (m, _) = matrix(QType::Q2K, rows, cols, 41);
    let x = randoms(4 * cols, 43);
    let rb = QType::Q2K.row_bytes(cols).unwrap();
    let mut acts = vec![0u8; 4 * cols / 256 * 292];
    Act::Q8K.quantize(&x, &mut acts);
    let a: Vec<&[u8]> = acts.chunks_exact(cols / 256 * 292).collect();
    let run = |k: &Kernel| {
        let (mut one, mut four) = (vec![0f32; rows], vec![0f32; 4 * rows]);
        (k.rows1)(&m.data, rb, [a[1]], &mut one);
        (k.rows4)(&m.data, rb, [a[0], a[1], a[2], a[3]], &mut four);
        (one, four)
    };
    let want = run(&Kernel::portable(QType::Q2K));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let first = builds.first().map(run);
    for k in &builds {
        let (one, four) = run(k);
        // The same bits as each other, and close to the portable spec (whose sums are in one lane).
        let (one0, four0) = first.as_ref().expect("a build");
        assert_eq!(bits(one0), bits(&one));
        assert_eq!(bits(four0), bits(&four));
        for (r, v) in one.iter().enumerate() {
            assert_eq!(v.to_bits(), four[r * 4 + 1].to_bits(), "row {r}: alone and in a tile of four");
            assert!((v - want.0[r]).abs() < 1e-3, "row {r}: {v} vs portable {}", want.0[r]);
        }
    }
}

/// The NEON row kernels of the block types compute the portable kernels'
/// exact integer sums and then their float steps in their order: the same
/// bits (five rows: no groups, every row on the row kernels).
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_block_rows_are_the_portable_bits() {
    let pool = Pool::new(2);
    for ty in [QType::Q4_0, QType::Q4_1, QType::Q5_0, QType::Q5_1, QType::Q8_0, QType::Q5K, QType::Q6K] {
        assert!(arm::table(ty).is_some() || !arm_group::has_dotprod(), "{ty:?} has a NEON row kernel");
        let cols = ty.block().0.max(32) * 3;
        let (m, _) = matrix(ty, 5, cols, 91);
        for n in [1, 4, 5] {
            let x = randoms(n * cols, 17 + n as u64);
            let (fast, slow) = (run(&m, &pool, &x, n), run(&m.clone().portable(), &pool, &x, n));
            assert_eq!(fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), slow.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{ty:?}, {n} rows");
        }
    }
}
