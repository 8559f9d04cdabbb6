//! Memory for a model's weight matrices: large chunks aligned to 2 MB that
//! the kernel is asked to back with huge pages (`MADV_HUGEPAGE` on Linux),
//! each matrix's bytes placed one after another in them.
//!
//! A pass streams every weight once, and in 4 KB pages each page of a
//! 100 MB model is a TLB miss and a page walk per pass; the kernels
//! prefetch the bytes but the walks still stall them (8 rows of
//! `Q4_1` 3072 × 576 streaming from memory: 62–65 µs a product in 4 KB
//! pages, 54–56 in 2 MB ones, 51 in cache). Matrices allocated one by one
//! cannot use huge pages: most are smaller than one.

use std::alloc::{alloc, dealloc, Layout};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

/// A huge page's size, the chunks' alignment.
const HUGE: usize = 2 << 20;
/// The smallest chunk (a matrix larger than this gets a chunk of its own).
const CHUNK: usize = 32 << 20;
/// Each matrix starts on a cache line.
const LINE: usize = 64;

/// Places byte strings in chunks of memory advised for huge pages.
#[derive(Debug, Default)]
pub struct Arena {
    /// The chunk being filled and the bytes of it handed out.
    current: Option<(Arc<Chunk>, usize)>,
}

/// One allocation of `len` bytes aligned to [`HUGE`].
#[derive(Debug)]
struct Chunk {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a chunk is raw memory with no thread affinity; its bytes are
// written only by `Arena::place_with`, through `&mut Arena`, in a range that no
// `Region` covers yet, and read only through `Region`s, whose ranges are
// never written again.
unsafe impl Send for Chunk {}
// SAFETY: as above: shared access only reads bytes already written.
unsafe impl Sync for Chunk {}

impl Chunk {
    fn new(len: usize) -> Chunk {
        let layout = Layout::from_size_align(len, HUGE).expect("a chunk's size is a multiple of its alignment");
        // SAFETY: the layout has a non-zero size (callers ask for at least
        // one huge page).
        let ptr = unsafe { alloc(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        advise_huge(ptr.as_ptr(), len);
        Chunk { ptr, len }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc` with this layout and is freed once;
        // no `Region` outlives the chunk (each holds an `Arc` of it).
        unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, HUGE)) }
    }
}

/// Asks Linux to back `len` bytes at `ptr` with huge pages as they are
/// first touched (with transparent huge pages set to `madvise`, the usual
/// default, memory is not given them unasked). A hint: failure changes
/// nothing but speed.
#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, len: usize) {
    // SAFETY: the range is one live allocation of ours, page-aligned (its
    // alignment is a huge page's); `MADV_HUGEPAGE` changes how the kernel
    // backs it, never its contents.
    unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _len: usize) {}

/// Hands the memory the allocator holds free back to the system. Placing
/// a loaded model's matrices in an arena frees the loaded copies a piece
/// at a time, into holes of the heap that the allocator keeps (resident)
/// unless told: without this, loading peaked at about twice the weights.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system; no
    // live allocation moves or changes.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes placed in an [`Arena`], read-only; they live as long as the
/// region (it shares its chunk).
#[derive(Debug, Clone)]
pub struct Region {
    chunk: Arc<Chunk>,
    start: usize,
    len: usize,
}

impl Deref for Region {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `start + len ≤ chunk.len` (asserted in `place_with`); those bytes
        // were written before the region existed and are never written again.
        unsafe { std::slice::from_raw_parts(self.chunk.ptr.as_ptr().add(self.start), self.len) }
    }
}

impl Arena {
    /// An arena with no memory yet (chunks are allocated as bytes arrive).
    pub fn new() -> Arena {
        Arena::default()
    }

    /// An arena of one chunk for `bytes` of matrices (counted before they
    /// are read), with a huge page more for each one's start on a cache line
    /// (room for 32,768 of them). Its pages become resident as they are
    /// filled, so the room unused costs address space only.
    pub fn with_capacity(bytes: usize) -> Arena {
        if bytes == 0 {
            return Arena::new();
        }
        Arena { current: Some((Arc::new(Chunk::new(bytes.div_ceil(HUGE).saturating_add(1) * HUGE)), 0)) }
    }

    /// A copy of `bytes` in the arena.
    pub fn place(&mut self, bytes: &[u8]) -> Region {
        self.place_with(bytes.len(), |dst| dst.copy_from_slice(bytes))
    }

    /// `len` bytes in the arena, written by `fill` (handed them zeroed).
    pub fn place_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Region {
        let need = len.div_ceil(LINE) * LINE;
        let fits = self.current.as_ref().is_some_and(|(c, used)| c.len - used >= need);
        if !fits {
            self.current = Some((Arc::new(Chunk::new((need.div_ceil(HUGE).max(1) * HUGE).max(CHUNK))), 0));
        }
        let (chunk, used) = self.current.as_mut().expect("a chunk with room");
        let start = *used;
        assert!(start + need <= chunk.len, "the chunk has room");
        // SAFETY: `start..start + len` lies inside the chunk (asserted) and
        // past every region handed out so far (`used` only grows), so no
        // other reference reads or aliases it; it is zeroed before the
        // slice over it exists, so the slice's bytes are initialised.
        let dst = unsafe {
            let p = chunk.ptr.as_ptr().add(start);
            std::ptr::write_bytes(p, 0, len);
            std::slice::from_raw_parts_mut(p, len)
        };
        fill(dst);
        *used += need;
        Region { chunk: Arc::clone(chunk), start, len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placed bytes read back as they went in, whatever their sizes: empty,
    /// odd, several in one chunk, one larger than a chunk, and a chunk
    /// that fills up; every region starts on a cache line.
    #[test]
    fn placed_bytes_read_back_unchanged() {
        let mut arena = Arena::new();
        let sizes = [0, 1, 63, 64, 65, 1000, 3 << 20, CHUNK + 5, 17, CHUNK / 2, CHUNK / 2, 9];
        let wanted: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (j * 31 + i * 7) as u8).collect()).collect();
        let regions: Vec<Region> = wanted.iter().map(|w| arena.place(w)).collect();
        for (w, r) in wanted.iter().zip(&regions) {
            assert_eq!(&r[..], &w[..]);
            assert_eq!(r.as_ptr() as usize % LINE, 0);
        }
        // Regions outlive the arena and its later chunks.
        drop(arena);
        assert!(wanted.iter().zip(&regions).all(|(w, r)| r[..] == w[..]));
    }

    /// An arena sized up front holds what fits in one chunk, and takes more
    /// when asked.
    #[test]
    fn a_sized_arena_fills_its_chunk_then_grows() {
        let mut arena = Arena::with_capacity(2 * HUGE);
        let first: Vec<u8> = (0..HUGE + 5).map(|i| (i % 251) as u8).collect();
        let a = arena.place(&first);
        let b = arena.place(&first[..HUGE - 200]);
        // Past the chunk's 6 MB (4 asked for, 2 of room): a new one.
        let c = arena.place(&first);
        let d = arena.place(&first);
        assert!(a[..] == first[..] && b[..] == first[..HUGE - 200] && c[..] == first[..] && d[..] == first[..]);
        assert!(Arc::ptr_eq(&a.chunk, &c.chunk) && !Arc::ptr_eq(&a.chunk, &d.chunk));
        assert!(Arena::with_capacity(0).current.is_none());
    }
}
