//! The runtime's own matrix kernels: weight matrices kept as the file
//! stores them (GGUF blocks, or 16-bit floats), multiplied by f32
//! activations that are first quantized to the 8-bit format each block type
//! pairs with, as llama.cpp does (`Q8_0`, `Q8_1`, `Q8_K`; dense types take
//! f32). SIMD kernels (`x86*.rs`, `arm*.rs`) are chosen at run time; `scalar.rs` is the
//! portable fallback and their specification. `Q4_0`, `Q4_1`, `Q5_0`, `Q8_0` and `Q4_K` rows are
//! stored eight at a time interleaved (`interleave.rs`), which their group
//! kernels read.

mod act;
mod arena;
mod exp;
mod interleave;
mod pool;
mod scalar;
mod vec_ops;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_group;
#[cfg(target_arch = "x86_64")]
mod x86_vec;
#[cfg(target_arch = "x86_64")]
mod x86_pair;
#[cfg(target_arch = "x86_64")]
mod x86_low;
#[cfg(target_arch = "aarch64")]
mod arm_group;
#[cfg(target_arch = "aarch64")]
mod arm;

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;

use act::Act;
pub use arena::{release_free_memory, Arena, Region};

pub use pool::{physical_cores, Pool};
pub(crate) use vec_ops::check_strided;
pub use vec_ops::{exps, HeadDots, HeadWeights, VecOps};

/// A weight type the kernels multiply directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    /// 32-bit floats.
    F32,
    /// IEEE half floats.
    F16,
    /// bfloat16.
    BF16,
    /// 4-bit, one scale per 32 values.
    Q4_0,
    /// 4-bit, scale and min per 32 values.
    Q4_1,
    /// 5-bit, one scale per 32 values.
    Q5_0,
    /// 5-bit, scale and min per 32 values.
    Q5_1,
    /// 8-bit, one scale per 32 values.
    Q8_0,
    /// k-quant 2-bit (256-value super-blocks, 4-bit scales and mins).
    Q2K,
    /// k-quant 3-bit (6-bit scales).
    Q3K,
    /// k-quant 4-bit.
    Q4K,
    /// k-quant 5-bit.
    Q5K,
    /// k-quant 6-bit.
    Q6K,
}

impl QType {
    /// Every type, as GGUF files are listed (dense, then the blocks).
    pub const ALL: [QType; 13] = [
        QType::F32,
        QType::F16,
        QType::BF16,
        QType::Q8_0,
        QType::Q4_0,
        QType::Q4_1,
        QType::Q5_0,
        QType::Q5_1,
        QType::Q2K,
        QType::Q3K,
        QType::Q4K,
        QType::Q5K,
        QType::Q6K,
    ];

    /// The name llama.cpp and the Hugging Face hub give the type.
    pub fn name(self) -> &'static str {
        match self {
            QType::F32 => "F32",
            QType::F16 => "F16",
            QType::BF16 => "BF16",
            QType::Q4_0 => "Q4_0",
            QType::Q4_1 => "Q4_1",
            QType::Q5_0 => "Q5_0",
            QType::Q5_1 => "Q5_1",
            QType::Q8_0 => "Q8_0",
            QType::Q2K => "Q2_K",
            QType::Q3K => "Q3_K",
            QType::Q4K => "Q4_K",
            QType::Q5K => "Q5_K",
            QType::Q6K => "Q6_K",
        }
    }

    /// The type of a GGUF tensor, when the kernels take it as it is.
    pub fn from_ggml(t: GgmlDType) -> Option<QType> {
        QType::ALL.into_iter().find(|q| q.ggml() == t)
    }

    /// The same type in candle's terms.
    pub fn ggml(self) -> GgmlDType {
        match self {
            QType::F32 => GgmlDType::F32,
            QType::F16 => GgmlDType::F16,
            QType::BF16 => GgmlDType::BF16,
            QType::Q4_0 => GgmlDType::Q4_0,
            QType::Q4_1 => GgmlDType::Q4_1,
            QType::Q5_0 => GgmlDType::Q5_0,
            QType::Q5_1 => GgmlDType::Q5_1,
            QType::Q8_0 => GgmlDType::Q8_0,
            QType::Q2K => GgmlDType::Q2K,
            QType::Q3K => GgmlDType::Q3K,
            QType::Q4K => GgmlDType::Q4K,
            QType::Q5K => GgmlDType::Q5K,
            QType::Q6K => GgmlDType::Q6K,
        }
    }

    /// Values and bytes per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            QType::F32 => (1, 4),
            QType::F16 | QType::BF16 => (1, 2),
            QType::Q4_0 => (32, 18),
            QType::Q4_1 => (32, 20),
            QType::Q5_0 => (32, 22),
            QType::Q5_1 => (32, 24),
            QType::Q8_0 => (32, 34),
            QType::Q2K => (256, 84),
            QType::Q3K => (256, 110),
            QType::Q4K => (256, 144),
            QType::Q5K => (256, 176),
            QType::Q6K => (256, 210),
        }
    }

    fn act(self) -> Act {
        match self {
            QType::F32 | QType::F16 | QType::BF16 => Act::F32,
            QType::Q4_0 => Act::Q8_0O(8),
            QType::Q5_0 => Act::Q8_0O(16),
            QType::Q8_0 => Act::Q8_0O(128),
            QType::Q4_1 | QType::Q5_1 => Act::Q8_1,
            QType::Q2K | QType::Q3K | QType::Q4K | QType::Q5K | QType::Q6K => Act::Q8K,
        }
    }

    /// Bytes of a row of `cols` values (`None` unless whole blocks).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        let (v, b) = self.block();
        cols.is_multiple_of(v).then(|| cols / v * b)
    }
}

/// A kernel call: weights, a size (row bytes, or blocks for a group), `T`
/// activation rows, and `out[r·T + t]`.
type TileFn<const T: usize> = fn(&[u8], usize, [&[u8]; T], &mut [f32]);

/// Dot products of whole weight rows (`w`, rows of `row_bytes`) with 1 or
/// 4 activation rows: `out[r·T + t]`.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    rows1: TileFn<1>,
    rows4: TileFn<4>,
}

/// Kernels of eight interleaved rows against 1 to 4 or 8 activation rows:
/// `(group, blocks, activations, out[t·8 + r])`.
#[derive(Clone, Copy)]
struct GroupKernel {
    g1: TileFn<1>,
    /// Two and three rows: what a pass has left past its fours takes one
    /// product, not one for each row (a row alone unpacks the weights
    /// for itself: on AVX2 a third of its work).
    g2: TileFn<2>,
    g3: TileFn<3>,
    g4: TileFn<4>,
    /// Where a build has the registers to keep eight rows' sums.
    g8: Option<TileFn<8>>,
    /// Where a build has 512-bit registers: two adjacent groups at once.
    pairs: Option<PairKernel>,
}

/// A pair kernel of any number of activation rows (1 to its widest).
type AnyTileFn = fn(&[u8], usize, &[&[u8]], &mut [f32]);

/// Kernels of two adjacent groups (sixteen rows, stored one group after
/// the other) against `T` activation rows, `T - 1` the index: `(groups,
/// blocks per group, activations, out[t·16 + r])`. Every `T` up to the
/// widest has its own: a pass of 15 tokens takes one product of 8 and one
/// of 7, where tiles of 8, 4 and 1 would read the weights five times.
/// `from`: the fewest activation rows the pairs take (fewer go through
/// the eight-row build, the same bits).
#[derive(Clone, Copy)]
struct PairKernel {
    tiles: &'static [AnyTileFn],
    from: usize,
}

/// Most activation rows a pair kernel takes at once. The 4-, 5- and 8-bit
/// kernels keep ten rows' sums and accumulators in the 32 registers at
/// the rate of eight (Zen 5, `Q4_1` from L2: 8 rows 323–332, 10 rows
/// 332–342 G multiply-adds/s; `Q5_0` and `Q8_0` slow down from 11), so a
/// pass of nine or ten tokens (a dataset's rows decoding together, their
/// forced tokens beside) is one product, not one of eight and a slow one
/// of one or two.
const WIDEST_PAIR: usize = 10;

/// A [`GroupKernel`] of every tile of the group kernel `$f` (a path, with
/// the const parameters after `T` in `$more`), its eight-row tile through
/// `$g8` (`Some`, or a function giving `None` where a build has none).
macro_rules! group_kernel {
    ($g8:expr, $($f:ident)::+ $(, $more:tt)?) => {
        Some(GroupKernel {
            g1: $($f)::+::<1 $(, $more)?>,
            g2: $($f)::+::<2 $(, $more)?>,
            g3: $($f)::+::<3 $(, $more)?>,
            g4: $($f)::+::<4 $(, $more)?>,
            g8: $g8($($f)::+::<8 $(, $more)?>),
            pairs: None,
        })
    };
}

/// One `T` of a [`PairKernel`]: `x86_pair::$k::<T>` (with `$more` after
/// `T`) taking its rows as a slice.
#[cfg(target_arch = "x86_64")]
macro_rules! pair_tile {
    ($k:ident, $t:literal $(, $more:tt)?) => {
        pair_tile!(@ $k, $t, [$($more)?])
    };
    (@ $k:ident, $t:literal, [$($more:tt)?]) => {
        |g: &[u8], nb: usize, a: &[&[u8]], o: &mut [f32]| x86_pair::$k::<$t $(, $more)?>(g, nb, std::array::from_fn(|i| a[i]), o)
    };
}

/// The [`PairKernel`] of `x86_pair::$k` (with `$more` after `T`) for each
/// `T` listed, 1 up.
#[cfg(target_arch = "x86_64")]
macro_rules! pair_kernel {
    ($k:ident $(, $more:tt)?; $($t:literal)+) => {
        pair_kernel!(@ $k, [$($more)?]; $($t)+)
    };
    (@ $k:ident, $more:tt; $($t:literal)+) => {{
        const _: () = assert!([$($t),+].len() <= WIDEST_PAIR, "`QMatrix::multiply` holds at most WIDEST_PAIR rows a tile");
        static TILES: &[AnyTileFn] = &[$(pair_tile!(@ $k, $t, $more)),+];
        PairKernel { from: 1, tiles: TILES }
    }};
}

/// The [`PairKernel`] of `Q4_K` (`Q5_K` when `$five`, through
/// `x86_pair::$k`): one to four activation rows in one product, five to
/// eight in two of at most four (`q4_kx16_halves`: eight in one spill
/// registers); on AMD one row through the eight-row build.
#[cfg(target_arch = "x86_64")]
macro_rules! k_pairs {
    ($k:ident, $five:literal) => {{
        static TILES: &[AnyTileFn] = &[
            pair_tile!($k, 1),
            pair_tile!($k, 2),
            pair_tile!($k, 3),
            pair_tile!($k, 4),
            x86_pair::q4_kx16_halves::<$five>,
            x86_pair::q4_kx16_halves::<$five>,
            x86_pair::q4_kx16_halves::<$five>,
            x86_pair::q4_kx16_halves::<$five>,
        ];
        PairKernel { from: if x86_group::is_amd() { 2 } else { 1 }, tiles: TILES }
    }};
}

/// The builds of the group kernels: what a matrix multiplies with (the
/// fastest this CPU runs, or one that a test pins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    /// `interleave.rs`: plain loops, the specification of the others.
    Portable,
    /// AVX2, FMA, F16C.
    Avx2,
    /// AVX-VNNI (without AVX-512).
    AvxVnni,
    /// AVX-512 VNNI (with VL): 8-row tiles.
    Avx512Vnni,
    /// AVX-512 VNNI and BW, 512-bit registers: pairs of groups.
    Avx512Pairs,
    /// aarch64 NEON with the dot-product extension (`sdot`).
    NeonDot,
}

impl Simd {
    /// The builds this CPU runs, the portable one first, the fastest last.
    pub(crate) fn available() -> Vec<Simd> {
        let mut all = vec![Simd::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if x86_group::has_avx2() {
                all.push(Simd::Avx2);
            }
            if x86_group::has_avx_vnni() {
                all.push(Simd::AvxVnni);
            }
            if x86_group::has_vnni() {
                all.push(Simd::Avx512Vnni);
            }
            if x86_pair::has_avx512_pairs() {
                all.push(Simd::Avx512Pairs);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if arm_group::has_dotprod() {
            all.push(Simd::NeonDot);
        }
        all
    }

    /// The fastest build this CPU runs, or the one `LMT_SIMD` names
    /// (`portable`, `avx2`, `avx-vnni`, `avx512-vnni`, `avx512`, `neon-dotprod`) when the CPU runs
    /// it: to compare builds on one machine.
    fn best() -> Simd {
        static BEST: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let all = Simd::available();
            let named = std::env::var("LMT_SIMD").ok().and_then(|v| Simd::NAMES.iter().find(|(n, _)| *n == v).map(|(_, s)| *s));
            named.filter(|s| all.contains(s)).unwrap_or(*all.last().expect("the portable build"))
        })
    }

    /// The builds' names for `LMT_SIMD`.
    const NAMES: [(&'static str, Simd); 6] = [
        ("portable", Simd::Portable),
        ("avx2", Simd::Avx2),
        ("avx-vnni", Simd::AvxVnni),
        ("avx512-vnni", Simd::Avx512Vnni),
        ("avx512", Simd::Avx512Pairs),
        ("neon-dotprod", Simd::NeonDot),
    ];

    /// Whether this build stores `ty`'s rows in groups (where it has
    /// group kernels for them). `Q6_K`: only the build with 512-bit pair
    /// kernels was measured faster than the row kernels; elsewhere its
    /// rows stay plain (the AVX2 row kernel also differs from the group
    /// kernels in the last bits). `Q2_K`, `Q3_K` and `Q5_K`: not on NEON,
    /// whose group kernels of them are the portable ones (its row kernels serve).
    pub(crate) fn stores_groups(self, ty: QType) -> bool {
        match ty {
            QType::Q6K => self == Simd::Avx512Pairs,
            QType::Q2K | QType::Q3K | QType::Q5K => self != Simd::NeonDot,
            _ => true,
        }
    }

    /// The group kernels of `ty` (the types stored interleaved) in this build.
    fn group_kernel(self, ty: QType) -> Option<GroupKernel> {
        macro_rules! build {
            ($m:path, $g8:expr) => {{
                use $m as m;
                match ty {
                    QType::Q4_0 => group_kernel!($g8, m::q4x8, false),
                    QType::Q4_1 => group_kernel!($g8, m::q4x8, true),
                    QType::Q5_0 => group_kernel!($g8, m::q5_0x8),
                    QType::Q8_0 => group_kernel!($g8, m::q8_0x8),
                    QType::Q4K => group_kernel!($g8, m::q4_kx8),
                    QType::Q5K => group_kernel!($g8, m::q5_kx8),
                    QType::Q2K => group_kernel!($g8, m::q2_kx8),
                    QType::Q3K => group_kernel!($g8, m::q3_kx8),
                    // `QMatrix::new` interleaves `Q6_K` for the pair build
                    // alone (`stores_groups`), which runs these on AMD and
                    // for lone groups; the others' serve tests that switch
                    // builds.
                    QType::Q6K => group_kernel!($g8, m::q6_kx8),
                    _ => None,
                }
            }};
        }
        // Eight-row tiles only where 32 registers hold their sums.
        let none = |_: TileFn<8>| None;
        match self {
            Simd::Portable => build!(interleave, none),
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => build!(x86_group::avx2, none),
            #[cfg(target_arch = "x86_64")]
            Simd::AvxVnni => build!(x86_group::avx_vnni, none),
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512Vnni => build!(x86_group::vnni, Some),
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512Pairs => {
                let pairs = match ty {
                    QType::Q4_0 => Some(pair_kernel!(q4x16, false; 1 2 3 4 5 6 7 8 9 10)),
                    QType::Q4_1 => Some(pair_kernel!(q4x16, true; 1 2 3 4 5 6 7 8 9 10)),
                    QType::Q5_0 => Some(pair_kernel!(q5_0x16; 1 2 3 4 5 6 7 8 9 10)),
                    // One activation row (a decoded token) on AMD's cores
                    // runs faster through the eight-row build (Zen 5, a
                    // sequence's decode: the TinyLlama-shaped Q4_K_M file
                    // 41–44 → 47–51 tok/s, Q8_0 files +5–10 %); Intel's Xeon
                    // runs the two alike.
                    QType::Q8_0 => Some(PairKernel { from: if x86_group::is_amd() { 2 } else { 1 }, ..pair_kernel!(q8_0x16; 1 2 3 4 5 6 7 8 9 10) }),
                    QType::Q4K => Some(k_pairs!(q4_kx16, false)),
                    QType::Q5K => Some(k_pairs!(q5_kx16, true)),
                    QType::Q2K => Some(pair_kernel!(q2_kx16; 1 2 3 4 5 6 7 8)),
                    QType::Q3K => Some(pair_kernel!(q3_kx16; 1 2 3 4 5 6 7 8)),
                    // On AMD's cores `Q6_K` goes through the eight-row
                    // build at every batch: the pair kernel, reading two
                    // groups' scattered `ql` and `qh` at once, streams its
                    // weights from memory at a third to a half of the
                    // group kernel's rate (Zen 5, one thread: 12–16 against
                    // 31–37 GB/s for one activation row; 8 rows 81 against
                    // 136 G multiply-adds/s). Intel's Xeon is unmeasured.
                    QType::Q6K if x86_group::is_amd() => None,
                    QType::Q6K => Some(pair_kernel!(q6_kx16; 1 2 3 4 5 6 7 8)),
                    _ => None,
                };
                // A lone group (an odd one at the end of a chunk) takes the eight-row build.
                build!(x86_group::vnni, Some).map(|g| GroupKernel { pairs, ..g })
            }
            #[cfg(target_arch = "aarch64")]
            Simd::NeonDot => build!(arm_group, none),
            // Builds of another architecture (never available here).
            _ => build!(interleave, none),
        }
    }
}

/// Rows against `T` activation rows with a one-row dot product.
fn rows_with<const T: usize>(dot: fn(&[u8], &[u8]) -> f32, w: &[u8], row_bytes: usize, a: [&[u8]; T], out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(T)) {
        for t in 0..T {
            o[t] = dot(row, a[t]);
        }
    }
}

macro_rules! portable {
    ($f:path) => {
        Kernel { rows1: |w, rb, a, o| rows_with::<1>($f, w, rb, a, o), rows4: |w, rb, a, o| rows_with::<4>($f, w, rb, a, o) }
    };
}

impl Kernel {
    /// The fastest kernel this CPU runs for `ty`.
    fn best(ty: QType) -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = x86::table(ty) {
            return k;
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(k) = arm::table(ty) {
            return k;
        }
        Kernel::portable(ty)
    }

    /// The portable kernel for `ty`.
    fn portable(ty: QType) -> Kernel {
        match ty {
            QType::F32 => portable!(scalar::dot_f32),
            QType::F16 => portable!(scalar::dot_f16),
            QType::BF16 => portable!(scalar::dot_bf16),
            QType::Q4_0 => portable!(scalar::dot_q4_0),
            QType::Q4_1 => portable!(scalar::dot_q4_1),
            QType::Q5_0 => portable!(scalar::dot_q5_0),
            QType::Q5_1 => portable!(scalar::dot_q5_1),
            QType::Q8_0 => portable!(scalar::dot_q8_0),
            QType::Q2K => portable!(scalar::dot_q2_k),
            QType::Q3K => portable!(scalar::dot_q3_k),
            QType::Q4K => portable!(scalar::dot_q4_k),
            QType::Q5K => portable!(scalar::dot_q5_k),
            QType::Q6K => portable!(scalar::dot_q6_k),
        }
    }
}

/// Asks for the cache line at `p` to be brought into cache (a hint: any
/// address is fine, nothing is read).
#[inline]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `Σ term(x[i])` in f64, in eight running sums (the compiler vectorises
/// them, where one running sum waits on each add), joined pairwise: the
/// total can differ from a sequential sum's in its last bits, far below
/// an f32 result's. Always this order, so a row's sum is the same bits
/// wherever it is taken.
pub fn sum_f64(x: &[f32], term: impl Fn(f32) -> f64) -> f64 {
    let whole = x.len() / 8 * 8;
    let mut sums = LaneSums::default();
    sums.add(&x[..whole], &term);
    sums.total(&x[whole..], term)
}

/// [`sum_f64`] fed in pieces: the same running sums, so the same bits, for
/// values that are made a piece at a time (in a buffer that stays small).
#[derive(Debug, Default, Clone, Copy)]
pub struct LaneSums([f64; 8]);

impl LaneSums {
    /// Adds the next values, a whole number of eights (so each value
    /// joins the lane it would in one call).
    pub fn add(&mut self, x: &[f32], term: impl Fn(f32) -> f64) {
        debug_assert!(x.len().is_multiple_of(8), "whole eights");
        for c in x.chunks_exact(8) {
            self.0.iter_mut().zip(c).for_each(|(l, &v)| *l += term(v));
        }
    }

    /// The total, with `rest` (fewer than eight values, the last).
    pub fn total(self, rest: &[f32], term: impl Fn(f32) -> f64) -> f64 {
        let l = self.0;
        let rest: f64 = rest.iter().map(|&v| term(v)).sum();
        ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7])) + rest
    }
}

/// A weight matrix as stored: `rows` rows of `cols` values, each row whole
/// blocks of its type, rows one after another (for the interleaved types,
/// the first `8·groups` rows eight at a time, then the rest).
#[derive(Clone)]
pub struct QMatrix {
    ty: QType,
    rows: usize,
    cols: usize,
    data: Bytes,
    kernel: Kernel,
    /// Groups of eight rows stored interleaved, and their kernels.
    groups: usize,
    group_kernel: Option<GroupKernel>,
}

/// A matrix's bytes: its own, or placed in an [`Arena`].
#[derive(Clone)]
enum Bytes {
    Own(Vec<u8>),
    Placed(Region),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Own(v) => v,
            Bytes::Placed(r) => r,
        }
    }
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({:?}, {}×{})", self.ty, self.rows, self.cols)
    }
}

/// Bytes for quantized activations, reused across calls.
#[derive(Debug, Default)]
pub struct Scratch {
    acts: Vec<u8>,
    /// Input rows made by [`Input::Made`].
    rows: Vec<f32>,
}

impl QMatrix {
    /// A matrix over `data`, which must hold exactly `rows` rows. Borrowed
    /// bytes are copied once, into the layout the kernels read (a loaded
    /// tensor is not first copied whole: loading peaks lower).
    pub fn new<'a>(ty: QType, rows: usize, cols: usize, data: impl Into<Cow<'a, [u8]>>) -> Result<QMatrix, String> {
        QMatrix::build(ty, rows, cols, data.into(), None)
    }

    /// [`QMatrix::new`] with the bytes written straight into `arena` (see
    /// [`Arena`]).
    pub fn new_in(arena: &mut Arena, ty: QType, rows: usize, cols: usize, data: &[u8]) -> Result<QMatrix, String> {
        QMatrix::build(ty, rows, cols, Cow::Borrowed(data), Some(arena))
    }

    fn build(ty: QType, rows: usize, cols: usize, data: Cow<'_, [u8]>, arena: Option<&mut Arena>) -> Result<QMatrix, String> {
        let rb = ty
            .row_bytes(cols)
            .ok_or_else(|| format!("{cols} columns are not whole {ty:?} blocks of {} values", ty.block().0))?;
        if data.len() != rb * rows {
            return Err(format!("{} bytes for {rows}×{cols} {ty:?} (expected {})", data.len(), rb * rows));
        }
        let best = Simd::best();
        let group_kernel = best.group_kernel(ty).filter(|_| best.stores_groups(ty));
        let interleaved = group_kernel.is_some() && rows >= 8;
        let fill = |src: &[u8], dst: &mut [u8]| {
            if interleaved {
                interleave::interleave_into(ty, src, rb, dst)
            } else {
                dst.copy_from_slice(src);
                0
            }
        };
        let (bytes, groups) = match (arena, data) {
            (Some(arena), data) => {
                let mut groups = 0;
                let region = arena.place_with(data.len(), |dst| groups = fill(&data, dst));
                (Bytes::Placed(region), groups)
            }
            (None, Cow::Owned(v)) if !interleaved => (Bytes::Own(v), 0),
            (None, data) => {
                let mut v = vec![0u8; data.len()];
                let groups = fill(&data, &mut v);
                (Bytes::Own(v), groups)
            }
        };
        Ok(QMatrix { ty, rows, cols, data: bytes, kernel: Kernel::best(ty), groups, group_kernel })
    }

    /// The rows of `parts` one after another, as one matrix written into
    /// `arena` (`None` unless they share a type and a width): one pass over
    /// the input multiplies them all, and each row keeps its kernel.
    pub fn concat_in(arena: &mut Arena, parts: &[QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts.iter().any(|m| m.ty != first.ty || m.cols != first.cols) {
            return None;
        }
        let rows = parts.iter().map(|m| m.rows).sum();
        if parts.iter().all(|m| 8 * m.groups == m.rows) {
            // Groups stay groups: the interleaved bytes carry over.
            let len = parts.iter().map(|m| m.data.len()).sum();
            let data = Bytes::Placed(arena.place_with(len, |dst| {
                let mut at = 0;
                for m in parts {
                    dst[at..at + m.data.len()].copy_from_slice(&m.data);
                    at += m.data.len();
                }
            }));
            let groups = parts.iter().map(|m| m.groups).sum();
            let (ty, cols, kernel, group_kernel) = (first.ty, first.cols, first.kernel, first.group_kernel);
            return Some(QMatrix { ty, rows, cols, data, kernel, groups, group_kernel });
        }
        let mut data = Vec::with_capacity(parts.iter().map(|m| m.data.len()).sum());
        for m in parts {
            (0..m.rows).for_each(|r| data.extend_from_slice(&m.row(r)));
        }
        QMatrix::new_in(arena, first.ty, rows, first.cols, &data).ok()
    }

    /// This matrix with its bytes moved into `arena` (memory the kernels
    /// stream faster: see [`Arena`]).
    pub fn place(mut self, arena: &mut Arena) -> QMatrix {
        self.data = Bytes::Placed(arena.place(&self.data));
        self
    }

    /// Uses the kernels of `simd` (for tests that compare the builds; the
    /// row kernels are the best or the portable ones).
    pub(crate) fn with_simd(mut self, simd: Simd) -> QMatrix {
        self.kernel = if simd == Simd::Portable { Kernel::portable(self.ty) } else { Kernel::best(self.ty) };
        self.group_kernel = simd.group_kernel(self.ty);
        self
    }

    /// Uses the portable kernels (for tests that compare them with the others).
    pub fn portable(self) -> QMatrix {
        self.with_simd(Simd::Portable)
    }

    /// The stored type.
    pub fn qtype(&self) -> QType {
        self.ty
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes stored.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    fn row(&self, r: usize) -> Cow<'_, [u8]> {
        let rb = self.data.len() / self.rows.max(1);
        if r < 8 * self.groups {
            return Cow::Owned(interleave::row_of(self.ty, &self.data, rb, r));
        }
        Cow::Borrowed(&self.data[r * rb..(r + 1) * rb])
    }

    /// Row `r` as f32 values (an embedding lookup).
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let row = self.row(r);
        let bytes = &row[..];
        match self.ty {
            QType::F32 => bytes.chunks_exact(4).map(|b| scalar::f32_at(b, 0)).collect(),
            QType::F16 => bytes.chunks_exact(2).map(|b| scalar::f16_at(b, 0)).collect(),
            QType::BF16 => {
                bytes.chunks_exact(2).map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect()
            }
            _ => {
                // Blocks are dequantized by candle, one row at a time.
                let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, self.ty.ggml());
                let t = storage.and_then(|s| QTensor::new(s, (1, self.cols))).and_then(|q| q.dequantize(&Device::Cpu));
                t.and_then(|t| t.flatten_all()?.to_vec1::<f32>()).expect("a whole row of blocks dequantizes")
            }
        }
    }

    /// `out[t·rows + r] = Σ_c x[t·cols + c] · W[r, c]` for the `n` rows of
    /// `x`, on the pool's threads.
    pub fn matmul(&self, pool: &Pool, x: &[f32], n: usize, out: &mut [f32], scratch: &mut Scratch) {
        assert!(x.len() == n * self.cols, "matmul shapes");
        self.matmul_from(pool, Input::Rows(x), n, out, scratch);
    }

    /// [`QMatrix::matmul`] of `n` input rows given by `input`; the rows are
    /// made (when [`Input::Made`]) and quantized on the pool's threads, each
    /// row once, before any thread multiplies.
    pub fn matmul_from(&self, pool: &Pool, input: Input<'_>, n: usize, out: &mut [f32], scratch: &mut Scratch) {
        assert!(out.len() == n * self.rows, "matmul shapes");
        self.multiply(pool, input, n, Out::Flat(Disjoint::new(out), self.rows, Write::Set), scratch);
    }

    /// [`QMatrix::matmul_from`] added to `out` (`out[t·rows + r] +=`): a
    /// residual connection, with no buffer of products between.
    pub fn matmul_add(&self, pool: &Pool, input: Input<'_>, n: usize, out: &mut [f32], scratch: &mut Scratch) {
        assert!(out.len() == n * self.rows, "matmul shapes");
        self.multiply(pool, input, n, Out::Flat(Disjoint::new(out), self.rows, Write::Add), scratch);
    }

    /// [`QMatrix::matmul`] into one output row of its own per input row
    /// (`outs[t]`, each `rows` long): a model's logits, handed out without
    /// a copy.
    pub fn matmul_rows(&self, pool: &Pool, x: &[f32], outs: &mut [Vec<f32>], scratch: &mut Scratch) {
        let n = outs.len();
        assert!(x.len() == n * self.cols && outs.iter().all(|o| o.len() == self.rows), "matmul shapes");
        let rows: Vec<Disjoint<'_>> = outs.iter_mut().map(|o| Disjoint::new(o)).collect();
        self.multiply(pool, Input::Rows(x), n, Out::Rows(&rows), scratch);
    }

    /// The multiplication behind both, into `dst`.
    fn multiply(&self, pool: &Pool, input: Input<'_>, n: usize, dst: Out<'_, '_>, scratch: &mut Scratch) {
        let act = self.ty.act();
        let (av, ab) = act.block();
        let (cols, arow) = (self.cols, self.cols / av * ab);
        scratch.acts.resize(n * arow, 0);
        if let Input::Made(_) = input {
            scratch.rows.resize(n * cols, 0.0);
        }
        let acts_out = Disjoint::new(&mut scratch.acts);
        let made = Disjoint::new(&mut scratch.rows);
        let (claimed, ready) = (Counter::default(), Counter::default());
        let (claimed, ready) = (&claimed.0, &ready.0);
        let rows = self.rows;
        let rb = self.data.len() / rows.max(1);
        let threads = pool.threads();
        let chunk = n.div_ceil(2 * threads).max(1);
        // Rows are handed out in chunks from a counter, so a thread slowed
        // by other work takes fewer. Chunks shrink as the rows run out
        // (guided scheduling): few claims on the shared counter, and the
        // threads finish close together. Chunks are whole groups of eight
        // (pairs of groups where a build multiplies two at once), and at
        // most 64 rows when the rows are plain (`local` below).
        let unit = if self.group_kernel.is_some_and(|g| g.pairs.is_some()) { 16 } else { 8 };
        let most = if self.groups > 0 { 256 } else { 64 };
        let grouped = 8 * self.groups;
        let next = Counter::default();
        let next = &next.0;
        let add = dst.write() == Write::Add;
        pool.run(&|_| {
            // Input rows first, taken from a counter in chunks (each claim
            // and report is a cache line passed between the threads); a
            // chunk counts as ready even if making it panicked, so no
            // thread waits forever (the pool raises the panic after the run).
            loop {
                let t0 = claimed.fetch_add(chunk, Ordering::Relaxed);
                if t0 >= n {
                    break;
                }
                let t1 = (t0 + chunk).min(n);
                let _ready = Ready(ready, t1 - t0);
                for t in t0..t1 {
                    // SAFETY: row `t` was claimed by this thread alone.
                    let a = unsafe { acts_out.slice(t * arow, arow) };
                    match input {
                        Input::Rows(x) => act.quantize(&x[t * cols..(t + 1) * cols], a),
                        Input::Made(make) => {
                            // SAFETY: as above.
                            let row = unsafe { made.slice(t * cols, cols) };
                            make(t, row);
                            act.quantize(row, a);
                        }
                    }
                }
            }
            let mut spins = 0u32;
            while ready.load(Ordering::Acquire) < n {
                spins += 1;
                if spins < 1 << 12 { std::hint::spin_loop() } else { std::thread::yield_now() }
            }
            // SAFETY: every row has been written (the Acquire above pairs
            // with each row's Release) and none is written again in this run.
            let acts = unsafe { acts_out.shared() };
            let a = |t: usize| &acts[t * arow..(t + 1) * arow];
            let mut local = [0f32; 64 * 4];
            while let Some((r0, end)) = claim_rows(next, rows, threads, unit, most) {
                // Interleaved groups first, then plain rows: a row always
                // goes through the same kernel, whatever the batch.
                let split = grouped.clamp(r0, end);
                if split > r0 {
                    let gk = self.group_kernel.expect("interleaved rows have group kernels");
                    let nb = rb / self.ty.block().1;
                    let widest = gk.pairs.map_or(8, |p| p.tiles.len());
                    let mut t = 0;
                    while t < n {
                        // Up to `widest` activation rows at once: a pair
                        // kernel takes them all, a lone group's tiles of
                        // 8, 4 and 1 (`group_tiles`) split them. Pairs
                        // wider than eight get tiles as even as that
                        // allows (twelve rows as six and six, not ten and
                        // a slow two); eight-row ones keep whole eights
                        // (`Q4_K`'s split halves run fastest as fours).
                        let left = n - t;
                        let tile = if widest > 8 { left.div_ceil(left.div_ceil(widest)) } else { left.min(8) };
                        let acts: [&[u8]; WIDEST_PAIR] = std::array::from_fn(|i| a((t + i).min(n - 1)));
                        let acts = &acts[..tile];
                        let mut sums = [0f32; 16 * WIDEST_PAIR];
                        let mut g0 = r0;
                        while g0 < split {
                            // Two groups at once where the build can, else one.
                            let pair = gk.pairs.filter(|p| g0 + 16 <= split && tile >= p.from);
                            let width = if pair.is_some() { 16 } else { 8 };
                            let sums = &mut sums[..width * tile];
                            let rows_of = &self.data[g0 * rb..(g0 + width) * rb];
                            match pair {
                                Some(p) => (p.tiles[tile - 1])(rows_of, nb, acts, sums),
                                None => group_tiles(&gk, rows_of, nb, acts, sums),
                            }
                            put_rows(&dst, sums, width, t, g0);
                            g0 += width;
                        }
                        t += tile;
                    }
                }
                if end > split {
                    let w = &self.data[split * rb..end * rb];
                    let mut t = 0;
                    while t < n {
                        let tile = if n - t >= 4 { 4 } else { 1 };
                        let out = &mut local[..(end - split) * tile];
                        if tile == 4 {
                            (self.kernel.rows4)(w, rb, [a(t), a(t + 1), a(t + 2), a(t + 3)], out);
                        } else {
                            (self.kernel.rows1)(w, rb, [a(t)], out);
                        }
                        for i in 0..tile {
                            // SAFETY: rows r0..end are this thread's chunk alone.
                            let o = unsafe { dst.slice(t + i, split, end - split) };
                            for (r, o) in o.iter_mut().enumerate() {
                                let v = local[r * tile + i];
                                *o = if add { *o + v } else { v };
                            }
                        }
                        t += tile;
                    }
                }
            }
        });
    }
}

/// One group of eight rows against the activation rows `a` in tiles of
/// 8 (where the build has them), 4, then the 1 to 3 left: `sums[t·8 + r]`.
fn group_tiles(gk: &GroupKernel, rows: &[u8], nb: usize, a: &[&[u8]], sums: &mut [f32]) {
    let mut t = 0;
    while t < a.len() {
        let left = a.len() - t;
        let tile = match gk.g8 {
            Some(_) if left >= 8 => 8,
            _ => left.min(4),
        };
        let s = &mut sums[8 * t..8 * (t + tile)];
        let a = |i: usize| a[t + i];
        match (tile, gk.g8) {
            (8, Some(g8)) => g8(rows, nb, std::array::from_fn(a), s),
            (4, _) => (gk.g4)(rows, nb, std::array::from_fn(a), s),
            (3, _) => (gk.g3)(rows, nb, std::array::from_fn(a), s),
            (2, _) => (gk.g2)(rows, nb, std::array::from_fn(a), s),
            _ => (gk.g1)(rows, nb, [a(0)], s),
        }
        t += tile;
    }
}

/// Claims the next rows `r0..end` of `rows` from `next`: a share of those
/// left for `threads`, `unit` rows at least (a multiple of it) and `most`
/// at most; `None` once every row is taken.
fn claim_rows(next: &AtomicUsize, rows: usize, threads: usize, unit: usize, most: usize) -> Option<(usize, usize)> {
    let mut r0 = next.load(Ordering::Relaxed);
    loop {
        if r0 >= rows {
            return None;
        }
        let size = ((rows - r0) / (2 * threads)).clamp(unit, most) / unit * unit;
        let end = (r0 + size).min(rows);
        match next.compare_exchange_weak(r0, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((r0, end)),
            Err(now) => r0 = now,
        }
    }
}

/// A group or pair kernel's sums (`sums[i·width + r]`) into output rows
/// `t + i`, columns `g0..g0 + width`.
fn put_rows(dst: &Out<'_, '_>, sums: &[f32], width: usize, t: usize, g0: usize) {
    // Widths known when compiled: a copy of 8 or 16 values is then a few
    // moves, not a call to `memcpy` after every kernel call.
    match width {
        16 => put_rows_of::<16>(dst, sums, t, g0),
        8 => put_rows_of::<8>(dst, sums, t, g0),
        _ => unreachable!("groups are eight or sixteen rows"),
    }
}

fn put_rows_of<const W: usize>(dst: &Out<'_, '_>, sums: &[f32], t: usize, g0: usize) {
    for (i, s) in sums.chunks_exact(W).enumerate() {
        // SAFETY: columns `g0..g0 + W` are the group's rows, in the chunk
        // this thread claimed alone (`claim_rows`), so no other thread
        // touches them in this job; `slice` checks the bounds.
        let o = &mut unsafe { dst.slice(t + i, g0, W) }[..W];
        match dst.write() {
            Write::Set => o.copy_from_slice(&s[..W]),
            Write::Add => o.iter_mut().zip(&s[..W]).for_each(|(o, s)| *o += s),
        }
    }
}

/// The output rows of [`QMatrix::multiply`]: one buffer of `rows`-long rows
/// one after another, or a buffer per row.
enum Out<'a, 'b> {
    Flat(Disjoint<'a>, usize, Write),
    Rows(&'b [Disjoint<'a>]),
}

/// How products reach the output: stored, or added to what is there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Write {
    Set,
    Add,
}

impl Out<'_, '_> {
    fn write(&self) -> Write {
        match self {
            Out::Flat(_, _, w) => *w,
            Out::Rows(_) => Write::Set,
        }
    }

    /// Columns `start..start + len` of output row `t`.
    ///
    /// # Safety
    /// As [`Disjoint::slice`]: no other thread touches them meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, t: usize, start: usize, len: usize) -> &mut [f32] {
        // SAFETY: the caller's promise, passed on (bounds are checked there).
        unsafe {
            match self {
                Out::Flat(d, rows, _) => d.slice(t * rows + start, len),
                Out::Rows(r) => r[t].slice(start, len),
            }
        }
    }
}

/// The input rows of [`QMatrix::matmul_from`].
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// `n` rows of `cols` values, one after another.
    Rows(&'a [f32]),
    /// `make(t, row)` writes input row `t` (a norm or an activation
    /// function of something else), on whichever thread takes the row.
    Made(&'a (dyn Fn(usize, &mut [f32]) + Sync)),
}

/// A counter the threads of a job share, alone in its cache lines (128
/// bytes: adjacent-line prefetch pairs them): counters side by side on
/// the stack would pass one line between the cores at every claim.
#[derive(Default)]
#[repr(align(128))]
struct Counter(AtomicUsize);

/// Counts a chunk of input rows (its length) ready when dropped (also
/// when unwinding).
struct Ready<'a>(&'a AtomicUsize, usize);

impl Drop for Ready<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(self.1, Ordering::Release);
    }
}

/// A slice that several threads write at once, each at indices no other
/// thread writes (the caller's partition guarantees it).
pub(crate) struct Disjoint<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: sharing it lets threads write `T`s they own into the slice
// (`T: Send`) through `slice`, each range by one thread alone, and read it
// through `shared` only once no thread writes (both `unsafe`, their callers
// uphold it); nothing else reads the slice until the borrow ends.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Disjoint<'a, T> {
        Disjoint { ptr: s.as_mut_ptr(), len: s.len(), _borrow: std::marker::PhantomData }
    }

    /// The sub-slice `start..start + len` (bounds checked).
    ///
    /// # Safety
    /// No other thread touches that range while the returned slice lives.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start + len <= self.len);
        // SAFETY: in bounds (checked); the caller owns the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// The whole slice, to read.
    ///
    /// # Safety
    /// No thread writes any of it while the returned slice lives.
    #[inline]
    pub(crate) unsafe fn shared(&self) -> &[T] {
        // SAFETY: the borrowed slice; the caller rules out writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests;
