//! The CPU runtime's KV cache: one sequence's keys and values, per layer
//! and KV head, in frozen blocks shared between the caches forked from
//! one prefix, then the cache's own positions, written in place.

use std::sync::Arc;

use super::kernels::{prefetch_line, HeadDots, HeadWeights, VecOps};

/// Frozen blocks a cache may chain before a new freeze merges all but the
/// first into one (a bound on attention's calls per head).
const MAX_BLOCKS: usize = 8;

/// Fewest positions of a frozen block that a prefix reads in place (see
/// [`Cache::own_short_tail`]).
const SHORT_PART: usize = 32;

/// Fewest own positions [`Cache::freeze_unless_short`] freezes.
const SHARE_FROM: usize = 64;

/// Positions of each part [`LaneKv::prefetch_own`] asks for: past them
/// the hardware prefetchers have caught on.
const OWN_AHEAD: usize = 64;

/// One sequence's K and V, per lane (layer × KV head, `li·kv_heads + h`):
/// `head_dim` values a position, so the keys one attention head reads lie
/// one after the other. The first positions sit in frozen blocks
/// that other caches forked from the same prefix read too (the rows of a
/// dataset that fork one few-shot prefix keep, and their attention reads,
/// one copy of it, which stays in the CPU's caches from row to row); the
/// positions after them are the cache's own.
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    /// Values a position, per lane.
    head_dim: usize,
    /// Frozen blocks in position order, each with how many of its
    /// positions this cache reads (all but, after a truncation, the last).
    shared: Vec<(Arc<Frozen>, usize)>,
    /// Own positions after the shared ones, per lane.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Positions of K and V, per lane, that no cache writes again.
#[derive(Debug)]
struct Frozen {
    positions: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// One lane of a cache as attention reads it: its blocks' keys and
/// values, then its own ones, in position order.
pub(crate) struct LaneKv<'a> {
    cache: &'a Cache,
    lane: usize,
}

impl LaneKv<'_> {
    /// Keys and values of each part, in position order: (keys, values,
    /// positions).
    fn parts(&self) -> impl Iterator<Item = (&[f32], &[f32], usize)> {
        let (lane, d) = (self.lane, self.cache.head_dim);
        let frozen = self.cache.shared.iter().map(move |(f, n)| (&f.k[lane][..n * d], &f.v[lane][..n * d], *n));
        let own = (&self.cache.k[lane][..], &self.cache.v[lane][..], self.cache.k[lane].len() / d.max(1));
        frozen.chain(std::iter::once(own))
    }

    /// Each part's keys and values with the positions it holds among the
    /// first `len` (parts past them left out).
    fn upto(&self, len: usize) -> impl Iterator<Item = (&[f32], &[f32], std::ops::Range<usize>)> {
        self.parts()
            .scan(0, move |at, (k, v, n)| {
                let from = *at;
                *at += n;
                Some((k, v, from..(from + n).min(len)))
            })
            .filter(|(_, _, r)| !r.is_empty())
    }

    /// Asks for the keys and values of the lane's parts after its first,
    /// among its first `len` positions (at most [`OWN_AHEAD`] of each), to
    /// be brought into cache. Those parts are a sequence's own positions,
    /// each short and in memory of its own: read cold, each line of them
    /// waits on memory, where the hardware prefetchers keep ahead of the
    /// long first part. Asked before the first part's dots, they arrive
    /// while those run.
    pub fn prefetch_own(&self, len: usize) {
        let d = self.cache.head_dim;
        for (k, v, r) in self.upto(len).skip(1) {
            let bytes = r.len().min(OWN_AHEAD) * d * 4;
            for part in [k, v] {
                let p = part.as_ptr() as *const u8;
                for off in (0..bytes).step_by(64) {
                    prefetch_line(p.wrapping_add(off));
                }
            }
        }
    }

    /// For each of `heads` heads reading this lane, `out[h·n + j] = q_h ·
    /// key j` over the first `n = out.len() / heads` positions, part by
    /// part (a key's dot does not depend on the keys beside it in a call):
    /// head `h`'s query is `qs[h·d..(h + 1)·d]`.
    pub fn dots_heads(&self, ops: &VecOps, qs: &[f32], heads: usize, out: &mut [f32]) {
        let n = out.len() / heads.max(1);
        for (keys, _, r) in self.upto(n) {
            let out = HeadDots { out: &mut out[r.start..], heads, stride: n, n: r.len() };
            (ops.dots_heads)(qs, keys, self.cache.head_dim, out);
        }
    }

    /// For each of `heads` heads reading this lane, `y += Σ_j p[j] ·
    /// value j` over the first `n` positions, in position order as one
    /// call would add: head `h`'s `y` is `ys[h·d..(h + 1)·d]`, its `p` is
    /// `p[h·n..(h + 1)·n]`.
    pub fn axpys_heads(&self, ops: &VecOps, ys: &mut [f32], heads: usize, p: &[f32]) {
        let n = p.len() / heads.max(1);
        for (_, vals, r) in self.upto(n) {
            let w = HeadWeights { p: &p[r.start..], heads, stride: n, n: r.len() };
            (ops.axpys_heads)(ys, w, vals, self.cache.head_dim);
        }
    }
}

impl Cache {
    /// An empty cache of `lanes` (layers × KV heads) lanes of `head_dim`
    /// values a position.
    pub fn new(lanes: usize, head_dim: usize) -> Cache {
        Cache { head_dim, shared: Vec::new(), k: vec![Vec::new(); lanes], v: vec![Vec::new(); lanes] }
    }

    /// Positions read from the frozen blocks.
    fn base(&self) -> usize {
        self.shared.iter().map(|(_, n)| n).sum()
    }

    /// Own positions.
    fn own(&self) -> usize {
        self.k.first().map_or(0, |k| k.len() / self.head_dim.max(1))
    }

    /// Moves the own positions into a frozen block (no copy), so that the
    /// caches cloned from this one read them from the same memory. A chain
    /// at [`MAX_BLOCKS`] first has its blocks after the first (the prefix
    /// most often shared: a dataset's few-shot examples) copied into the
    /// new one.
    pub fn freeze(&mut self) {
        if self.own() == 0 {
            return;
        }
        let (lanes, d) = (self.k.len(), self.head_dim);
        let (mut k, mut v) =
            (std::mem::replace(&mut self.k, vec![Vec::new(); lanes]), std::mem::replace(&mut self.v, vec![Vec::new(); lanes]));
        if self.shared.len() >= MAX_BLOCKS {
            let merged = self.shared.split_off(1);
            let join = |own: &mut Vec<f32>, part: fn(&Frozen) -> &Vec<Vec<f32>>, lane: usize| {
                let mut all: Vec<f32> = merged.iter().flat_map(|(f, n)| part(f)[lane][..n * d].iter().copied()).collect();
                all.append(own);
                all
            };
            k = k.iter_mut().enumerate().map(|(l, own)| join(own, |f| &f.k, l)).collect();
            v = v.iter_mut().enumerate().map(|(l, own)| join(own, |f| &f.v, l)).collect();
        }
        let n = k.first().map_or(0, |k| k.len() / d.max(1));
        self.shared.push((Arc::new(Frozen { positions: n, k, v }), n));
    }

    /// [`Cache::freeze`] when the cache has [`SHARE_FROM`] own positions
    /// or more (see [`super::KvState::copy_to_keep`]).
    pub fn freeze_unless_short(&mut self) {
        if self.own() >= SHARE_FROM {
            self.freeze();
        }
    }

    /// The first `len` positions, reading this cache's frozen blocks; its
    /// own positions among them are frozen (copied once), so every cache
    /// forked from the result shares them, unless they are fewer than
    /// [`SHORT_PART`] after a frozen block: those, and a short tail of
    /// frozen blocks before them, are copied into the result's own
    /// positions ([`Cache::own_short_tail`]).
    pub fn prefix(&self, len: usize) -> Cache {
        let base = self.base();
        let mut c = Cache { shared: self.shared.clone(), ..Cache::new(self.k.len(), self.head_dim) };
        c.truncate(len.min(base));
        let own = len.saturating_sub(base).min(self.own());
        let keep_shared = own >= SHORT_PART || c.shared.is_empty();
        if !keep_shared {
            c.own_short_tail();
        }
        let d = self.head_dim;
        for (to, from) in c.k.iter_mut().zip(&self.k).chain(c.v.iter_mut().zip(&self.v)) {
            to.extend_from_slice(&from[..own * d]);
        }
        if keep_shared {
            c.freeze();
        }
        c
    }

    /// Copies the frozen blocks at the end of the chain (never the first)
    /// that this cache reads fewer than [`SHORT_PART`] positions of into
    /// its own positions, which must be none yet. A prefix cut just past
    /// where two cached sequences part (a dataset row's first words shared
    /// with an earlier row's) would otherwise read a block of a position
    /// or two: each part costs attention a call per head, and its lines
    /// come from memory cold.
    fn own_short_tail(&mut self) {
        debug_assert_eq!(self.own(), 0);
        let d = self.head_dim;
        let mut tail = Vec::new();
        while self.shared.len() > 1 && self.shared.last().is_some_and(|(_, n)| *n < SHORT_PART) {
            tail.extend(self.shared.pop());
        }
        for (f, n) in tail.iter().rev() {
            for (own, part) in self.k.iter_mut().zip(&f.k).chain(self.v.iter_mut().zip(&f.v)) {
                own.extend_from_slice(&part[..n * d]);
            }
        }
    }

    /// Bytes of the positions the cache holds (shared ones included).
    pub fn bytes(&self) -> usize {
        let own: usize = self.k.iter().chain(&self.v).map(|l| l.len() * 4).sum();
        let per_position = self
            .shared
            .first()
            .map_or(0, |(f, _)| f.k.iter().chain(&f.v).map(|l| l.len() * 4).sum::<usize>() / f.positions.max(1));
        own + per_position * self.base()
    }

    /// Keeps the first `len` positions (O(1) for own positions: no copy,
    /// capacity kept; a cut among the frozen blocks drops the later ones).
    pub fn truncate(&mut self, len: usize) {
        let mut kept = 0;
        let mut keep = 0;
        for (_, n) in self.shared.iter_mut() {
            if kept >= len {
                break;
            }
            *n = (*n).min(len - kept);
            kept += *n;
            keep += 1;
        }
        self.shared.truncate(keep);
        let own = (len - kept) * self.head_dim;
        for l in self.k.iter_mut().chain(self.v.iter_mut()) {
            l.truncate(own);
        }
    }

    /// Appends one position of layer `li`: `k` and `v` hold every KV
    /// head's values.
    pub fn push(&mut self, li: usize, k: &[f32], v: &[f32]) {
        let d = self.head_dim;
        let heads = k.len() / d;
        for (h, (k, v)) in k.chunks_exact(d).zip(v.chunks_exact(d)).enumerate() {
            self.k[li * heads + h].extend_from_slice(k);
            self.v[li * heads + h].extend_from_slice(v);
        }
    }

    /// Asks for the memory that [`Cache::push`] of layer `li` will write
    /// to be brought into cache (a hint; pushes work without it).
    pub fn prefetch_push(&self, li: usize, heads: usize) {
        for l in self.k[li * heads..(li + 1) * heads].iter().chain(&self.v[li * heads..(li + 1) * heads]) {
            let tail = l.as_ptr().wrapping_add(l.len()) as *const u8;
            for off in (0..self.head_dim * 4 + 64).step_by(64) {
                prefetch_line(tail.wrapping_add(off));
            }
        }
    }

    /// Lane `lane` as attention reads it.
    pub fn lane(&self, lane: usize) -> LaneKv<'_> {
        LaneKv { cache: self, lane }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: usize = 4;
    const LANES: usize = 2;

    /// Position `p` of lane `l`: keys `p·10 + l + i/10`, values negated.
    fn push(c: &mut Cache, p: usize) {
        let k: Vec<f32> = (0..LANES * D).map(|x| (p * 10 + x / D) as f32 + (x % D) as f32 / 10.0).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        c.push(0, &k, &v);
    }

    /// Lane `l`'s keys and values in position order, as attention reads them.
    fn read(c: &Cache, l: usize) -> (Vec<f32>, Vec<f32>) {
        let kv = c.lane(l);
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (ks, vs, _) in kv.parts() {
            k.extend_from_slice(ks);
            v.extend_from_slice(vs);
        }
        (k, v)
    }

    /// What a cache of positions `0..n` holds, read flat.
    fn want(n: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
        let mut c = Cache::new(LANES, D);
        (0..n).for_each(|p| push(&mut c, p));
        (0..LANES).map(|l| read(&c, l)).collect()
    }

    fn check(c: &Cache, n: usize) {
        assert_eq!(c.base() + c.own(), n);
        assert_eq!((0..LANES).map(|l| read(c, l)).collect::<Vec<_>>(), want(n), "{n} positions");
        assert_eq!(c.bytes(), n * LANES * D * 2 * 4);
    }

    #[test]
    fn frozen_blocks_read_as_one_cache_and_are_shared() {
        let mut c = Cache::new(LANES, D);
        (0..5).for_each(|p| push(&mut c, p));
        c.freeze();
        let fork = c.clone();
        assert!(Arc::ptr_eq(&fork.shared[0].0, &c.shared[0].0), "a clone after a freeze shares the block");
        (5..9).for_each(|p| push(&mut c, p));
        check(&c, 9);
        check(&fork, 5);
        // Prefixes inside the blocks share them; longer ones freeze their own part once.
        for len in 0..=9 {
            let p = c.prefix(len);
            check(&p, len);
            if len > 0 {
                assert!(Arc::ptr_eq(&p.shared[0].0, &c.shared[0].0), "prefix {len} shares the first block");
            }
        }
        // Truncating into a block, then growing again.
        let mut t = c.prefix(9);
        t.truncate(3);
        check(&t, 3);
        (3..7).for_each(|p| push(&mut t, p));
        check(&t, 7);
        check(&c, 9);
    }

    #[test]
    fn a_prefix_copies_short_parts_at_its_end() {
        let mut c = Cache::new(LANES, D);
        (0..40).for_each(|p| push(&mut c, p));
        c.freeze();
        (40..40 + SHORT_PART + 2).for_each(|p| push(&mut c, p));
        c.freeze();
        (40 + SHORT_PART + 2..40 + 2 * SHORT_PART + 2).for_each(|p| push(&mut c, p));
        // Three positions of the second block: copied, read as before.
        let p = c.prefix(43);
        check(&p, 43);
        assert_eq!((p.shared.len(), p.own()), (1, 3));
        assert!(Arc::ptr_eq(&p.shared[0].0, &c.shared[0].0), "the first block stays shared");
        // All of it: shared in place.
        let p = c.prefix(40 + SHORT_PART + 2);
        check(&p, 40 + SHORT_PART + 2);
        assert_eq!((p.shared.len(), p.own()), (2, 0));
        // A few own positions after the blocks: copied, not frozen; many:
        // frozen, so that caches forked from the prefix share them.
        let p = c.prefix(40 + SHORT_PART + 5);
        check(&p, 40 + SHORT_PART + 5);
        assert_eq!((p.shared.len(), p.own()), (2, 3));
        let p = c.prefix(40 + 2 * SHORT_PART + 2);
        check(&p, 40 + 2 * SHORT_PART + 2);
        assert_eq!((p.shared.len(), p.own()), (3, 0));
        // A first block is never copied, however short, nor are a cache's
        // first positions left unfrozen.
        let p = c.prefix(2);
        check(&p, 2);
        assert_eq!((p.shared.len(), p.own()), (1, 0));
        let mut c = Cache::new(LANES, D);
        (0..3).for_each(|p| push(&mut c, p));
        let p = c.prefix(2);
        check(&p, 2);
        assert_eq!((p.shared.len(), p.own()), (1, 0));
    }

    #[test]
    fn few_own_positions_stay_unfrozen() {
        let mut c = Cache::new(LANES, D);
        (0..SHARE_FROM - 1).for_each(|p| push(&mut c, p));
        c.freeze_unless_short();
        assert!(c.shared.is_empty());
        check(&c, SHARE_FROM - 1);
        push(&mut c, SHARE_FROM - 1);
        c.freeze_unless_short();
        assert_eq!((c.shared.len(), c.own()), (1, 0));
        check(&c, SHARE_FROM);
    }

    #[test]
    fn long_chains_merge_behind_their_first_block() {
        let mut c = Cache::new(LANES, D);
        push(&mut c, 0);
        c.freeze();
        let first = c.clone();
        for p in 1..3 * MAX_BLOCKS {
            push(&mut c, p);
            c.freeze();
            assert!(c.shared.len() <= MAX_BLOCKS);
            assert!(Arc::ptr_eq(&c.shared[0].0, &first.shared[0].0), "the first block stays shared");
            check(&c, p + 1);
        }
    }

    #[test]
    fn dots_and_axpys_over_parts_equal_one_call_over_the_whole() {
        let ops = VecOps::best();
        let mut c = Cache::new(LANES, D);
        (0..6).for_each(|p| push(&mut c, p));
        c.freeze();
        (6..11).for_each(|p| push(&mut c, p));
        let (keys, vals) = read(&c, 1);
        // Two heads read the lane: each head's dots and values are its own
        // call's over the whole.
        let qs = [0.5, -1.25, 2.0, 0.75, -0.5, 1.5, 0.25, -2.0];
        let p: Vec<f32> = (0..18).map(|j| j as f32 * 0.1 - 0.5).collect();
        let (mut got, mut want) = (vec![0f32; 18], vec![0f32; 18]);
        c.lane(1).dots_heads(&ops, &qs, 2, &mut got);
        for (q, w) in qs.chunks_exact(D).zip(want.chunks_exact_mut(9)) {
            (ops.dots)(q, &keys, D, w);
        }
        assert_eq!(got, want);
        let (mut y, mut z) = (vec![0f32; 2 * D], vec![0f32; 2 * D]);
        c.lane(1).axpys_heads(&ops, &mut y, 2, &p);
        for (z, p) in z.chunks_exact_mut(D).zip(p.chunks_exact(9)) {
            (ops.axpys)(z, p, &vals, D);
        }
        assert_eq!(y, z);
    }
}
