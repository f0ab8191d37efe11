//! Page bookkeeping: a flat list of equally sized, 16-byte aligned pages with an O(1) free list.
//!
//! The pool knows nothing about tokens, layers or codecs (those live in `table` and `codec`).
//! It grows one page at a time unless told to `reserve` more, and never returns memory on its
//! own: pages released by truncate/reset go back on the free list and are handed out again
//! before anything new is allocated. `trim` gives free pages back; their ids stay valid
//! (vacant) and get memory again when next allocated.
//!
//! Pages are carved from slabs of 2 MiB, anonymous memory the kernel may back with one huge
//! page each (Linux, transparent huge pages in `madvise` or `always` mode). A decode step reads
//! every page of every layer once, scattered over the pool: at depth 7,680 SmolLM2-135M's
//! turbo cache is ~7,200 pages over ~40 MB, several times what the CPU's TLB maps in 4 KiB
//! pages, so every page read took a page walk. In 2 MiB pages decode attention ran 8–11 % faster
//! at that depth, and 20 % with the fp16 cache (AMD EPYC Zen 4, two caches in turns in one
//! process). The page stays the unit of allocation
//! and of every count and byte figure; a slab's memory goes back to the system when every page
//! of it has been trimmed. Where anonymous maps are not available (wasm32) a slab is a heap
//! allocation.

use bytemuck::{Pod, Zeroable};

/// Index of a page inside its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PageId(u32);

impl PageId {
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// The unit of heap slab storage; its alignment is what makes every page (and its body, which
/// starts at a multiple of 16) 16-byte aligned. (Mapped slabs start on a 4 KiB boundary.)
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk16([u8; 16]);

// SAFETY: `Chunk16` is `repr(C)`, 16 bytes of `u8` with alignment 16 and no padding; every bit
// pattern is a valid value and all-zero is a valid value.
unsafe impl Zeroable for Chunk16 {}
// SAFETY: as above; it contains no pointers or interior mutability.
unsafe impl Pod for Chunk16 {}

/// Slab size: one transparent huge page on x86-64 and most arm64 kernels.
const SLAB_BYTES: usize = 2 << 20;

/// Zeroed memory for a run of pages.
enum SlabMemory {
    Mapped(memmap2::MmapMut),
    Heap(Box<[Chunk16]>),
}

impl SlabMemory {
    fn new(bytes: usize) -> Self {
        match crate::huge_pages::map_anonymous(bytes) {
            Ok(map) => SlabMemory::Mapped(map),
            Err(_) => SlabMemory::heap(bytes),
        }
    }

    /// The slab where anonymous maps are unavailable (wasm32), zeroed.
    fn heap(bytes: usize) -> Self {
        SlabMemory::Heap(vec![Chunk16([0; 16]); bytes.div_ceil(16)].into_boxed_slice())
    }

    fn bytes(&self) -> &[u8] {
        match self {
            SlabMemory::Mapped(map) => map,
            SlabMemory::Heap(chunks) => bytemuck::cast_slice(chunks),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            SlabMemory::Mapped(map) => map,
            SlabMemory::Heap(chunks) => bytemuck::cast_slice_mut(chunks),
        }
    }
}

struct Slab {
    memory: SlabMemory,
    /// Ids of this slab that hold memory (grown and not trimmed).
    live: usize,
}

pub(crate) struct PagePool {
    page_bytes: usize,
    /// Pages per slab, and a slab's bytes.
    per_slab: usize,
    slab_bytes: usize,
    /// `None` where every id of the slab is vacant (or not grown yet).
    slabs: Vec<Option<Slab>>,
    /// Stack of released pages; `alloc` pops, `release` pushes.
    free: Vec<PageId>,
    /// Ids whose memory was given back by `trim`.
    vacant: Vec<PageId>,
    /// One per id grown so far.
    in_use: Vec<bool>,
}

impl PagePool {
    /// A pool of pages of `page_bytes` bytes each (rounded up to a multiple of 16, at least 16).
    pub(crate) fn new(page_bytes: usize) -> Self {
        let page_bytes = page_bytes.div_ceil(16).max(1) * 16;
        let per_slab = (SLAB_BYTES / page_bytes).max(1);
        PagePool {
            page_bytes,
            per_slab,
            slab_bytes: (per_slab * page_bytes).div_ceil(SLAB_BYTES) * SLAB_BYTES,
            slabs: Vec::new(),
            free: Vec::new(),
            vacant: Vec::new(),
            in_use: Vec::new(),
        }
    }

    pub(crate) fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// A page for exclusive use by the caller, recycled if one is free. Its contents are
    /// unspecified (the caller writes a header before use).
    pub(crate) fn alloc(&mut self) -> PageId {
        let id = self.free.pop().unwrap_or_else(|| self.grow_one());
        self.in_use[id.index()] = true;
        id
    }

    /// A page with memory, not in use and not on the free list.
    fn grow_one(&mut self) -> PageId {
        let id = match self.vacant.pop() {
            Some(id) => id,
            None => {
                let index = u32::try_from(self.in_use.len()).expect("page pool exceeds 2^32 pages");
                self.in_use.push(false);
                PageId(index)
            }
        };
        let s = self.slab_of(id);
        if s >= self.slabs.len() {
            self.slabs.resize_with(s + 1, || None);
        }
        let slab_bytes = self.slab_bytes;
        let slab = self.slabs[s].get_or_insert_with(|| Slab {
            memory: SlabMemory::new(slab_bytes),
            live: 0,
        });
        slab.live += 1;
        id
    }

    /// Grows the pool (onto the free list) until it holds `pages` pages with memory.
    pub(crate) fn reserve(&mut self, pages: usize) {
        while self.allocated() < pages {
            let id = self.grow_one();
            self.free.push(id);
        }
    }

    /// Gives back free pages until at most `keep` pages hold memory; a slab's memory goes back
    /// to the system with its last page.
    pub(crate) fn trim(&mut self, keep: usize) {
        while self.allocated() > keep {
            let Some(id) = self.free.pop() else { break };
            self.vacant.push(id);
            let s = self.slab_of(id);
            let slab = self.slabs[s].as_mut().expect("a free page has memory");
            slab.live -= 1;
            if slab.live == 0 {
                self.slabs[s] = None;
            }
        }
    }

    /// Return a page to the free list.
    pub(crate) fn release(&mut self, id: PageId) {
        let slot = &mut self.in_use[id.index()];
        assert!(*slot, "page {id:?} released twice");
        *slot = false;
        self.free.push(id);
    }

    /// The slab page `id` sits in.
    fn slab_of(&self, id: PageId) -> usize {
        id.index() / self.per_slab
    }

    /// Where page `id` sits: its slab and the byte range inside it.
    fn place(&self, id: PageId) -> (usize, std::ops::Range<usize>) {
        let i = id.index() % self.per_slab;
        (
            self.slab_of(id),
            i * self.page_bytes..(i + 1) * self.page_bytes,
        )
    }

    pub(crate) fn page(&self, id: PageId) -> &[u8] {
        let (s, bytes) = self.place(id);
        let slab = self.slabs[s].as_ref().expect("page without memory");
        &slab.memory.bytes()[bytes]
    }

    pub(crate) fn page_mut(&mut self, id: PageId) -> &mut [u8] {
        let (s, bytes) = self.place(id);
        let slab = self.slabs[s].as_mut().expect("page without memory");
        &mut slab.memory.bytes_mut()[bytes]
    }

    /// Pages holding memory (in use + free).
    pub(crate) fn allocated(&self) -> usize {
        self.in_use.len() - self.vacant.len()
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn used(&self) -> usize {
        self.allocated() - self.free.len()
    }

    /// Bytes held by the pool's pages, in use or free.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.allocated() * self.page_bytes
    }

    /// Size of the id space (ids are `0..id_bound()`), for per-page side tables.
    pub(crate) fn id_bound(&self) -> usize {
        self.in_use.len()
    }

    #[cfg(test)]
    fn slabs_held(&self) -> usize {
        self.slabs.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_recycled_before_growing() {
        let mut pool = PagePool::new(100);
        assert_eq!(pool.page_bytes(), 112);
        let a = pool.alloc();
        let b = pool.alloc();
        assert_eq!(
            (pool.allocated(), pool.used(), pool.free_count()),
            (2, 2, 0)
        );
        pool.release(a);
        assert_eq!(
            (pool.allocated(), pool.used(), pool.free_count()),
            (2, 1, 1)
        );
        let c = pool.alloc();
        assert_eq!(c, a);
        assert_ne!(c, b);
        assert_eq!(pool.allocated(), 2);
        assert_eq!(pool.allocated_bytes(), 224);
    }

    #[test]
    fn pages_are_16_byte_aligned_and_sized() {
        let mut pool = PagePool::new(64 + 40);
        for _ in 0..4 {
            let id = pool.alloc();
            let page = pool.page_mut(id);
            assert_eq!(page.len(), 112);
            assert_eq!(page.as_ptr() as usize % 16, 0);
            page[111] = 7;
        }
    }

    #[test]
    fn reserve_and_trim_move_memory_not_ids() {
        let mut pool = PagePool::new(32);
        pool.reserve(4);
        assert_eq!(
            (pool.allocated(), pool.used(), pool.free_count()),
            (4, 0, 4)
        );
        let a = pool.alloc();
        assert_eq!(pool.allocated(), 4);
        pool.trim(1);
        assert_eq!(
            (pool.allocated(), pool.used(), pool.free_count()),
            (1, 1, 0)
        );
        assert_eq!(pool.allocated_bytes(), 32);
        let b = pool.alloc();
        assert_ne!(a, b);
        assert_eq!(pool.page(b).len(), 32, "a vacant id gets memory again");
        assert_eq!(pool.id_bound(), 4);
        pool.release(a);
        pool.release(b);
        pool.trim(0);
        assert_eq!(pool.allocated(), 0);
    }

    #[test]
    fn pages_of_several_slabs_keep_their_bytes() {
        // Two 700 KB pages to a 2 MiB slab: five pages take three slabs.
        let mut pool = PagePool::new(700_000);
        let ids: Vec<PageId> = (0..5).map(|_| pool.alloc()).collect();
        assert_eq!(pool.slabs_held(), 3);
        for (n, &id) in ids.iter().enumerate() {
            let page = pool.page_mut(id);
            assert_eq!(page.len(), 700_000);
            assert_eq!(page.as_ptr() as usize % 16, 0);
            page.fill(n as u8 + 1);
        }
        for (n, &id) in ids.iter().enumerate() {
            assert!(
                pool.page(id).iter().all(|&b| b == n as u8 + 1),
                "page {n} overwritten"
            );
        }
    }

    #[test]
    fn a_slab_goes_back_with_its_last_page_and_comes_again() {
        let mut pool = PagePool::new(700_000);
        pool.reserve(4);
        assert_eq!(pool.slabs_held(), 2);
        // The free list hands out the last id grown first: `a` sits in the second slab.
        let a = pool.alloc();
        pool.trim(1);
        assert_eq!((pool.allocated(), pool.slabs_held()), (1, 1));
        pool.page_mut(a).fill(9);
        pool.trim(2);
        assert_eq!((pool.allocated(), pool.slabs_held()), (1, 1));
        let b = pool.alloc();
        assert_eq!((pool.allocated(), pool.slabs_held()), (2, 2));
        pool.page_mut(b).fill(3);
        assert!(pool.page(a).iter().all(|&x| x == 9));
        pool.release(a);
        pool.release(b);
        pool.trim(0);
        assert_eq!((pool.allocated(), pool.slabs_held()), (0, 0));
    }

    #[test]
    fn a_page_larger_than_a_slab_gets_a_slab_of_its_own() {
        let mut pool = PagePool::new(3 << 20);
        let (a, b) = (pool.alloc(), pool.alloc());
        assert_eq!(pool.slabs_held(), 2);
        pool.page_mut(a).fill(1);
        pool.page_mut(b).fill(2);
        assert_eq!(pool.page(a).len(), 3 << 20);
        assert!(pool.page(a).iter().all(|&x| x == 1));
    }

    #[test]
    fn heap_slabs_are_zeroed_and_aligned() {
        let mut slab = SlabMemory::heap(16_000);
        assert_eq!(slab.bytes().len(), 16_000);
        assert_eq!(slab.bytes().as_ptr() as usize % 16, 0);
        assert!(slab.bytes().iter().all(|&b| b == 0));
        slab.bytes_mut()[15_999] = 1;
        assert_eq!(slab.bytes()[15_999], 1);
    }

    #[test]
    #[should_panic(expected = "released twice")]
    fn double_release_is_caught() {
        let mut pool = PagePool::new(16);
        let a = pool.alloc();
        pool.release(a);
        pool.release(a);
    }
}
