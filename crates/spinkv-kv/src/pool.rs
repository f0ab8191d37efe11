//! Page bookkeeping: a flat list of equally sized, 16-byte aligned pages with an O(1) free list.
//!
//! The pool knows nothing about tokens, layers or codecs (those live in `table` and `codec`).
//! It grows one page at a time unless told to `reserve` more, and never returns memory on its
//! own: pages released by truncate/reset go back on the free list and are handed out again
//! before anything new is allocated. `trim` gives free pages' memory back; their ids stay
//! valid (vacant) and get memory again when next allocated.

use bytemuck::{Pod, Zeroable};

/// Index of a page inside its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PageId(u32);

impl PageId {
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// The unit of page storage; its alignment is what makes every page (and its body, which starts
/// at a multiple of 16) 16-byte aligned.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk16([u8; 16]);

// SAFETY: `Chunk16` is `repr(C)`, 16 bytes of `u8` with alignment 16 and no padding; every bit
// pattern is a valid value and all-zero is a valid value.
unsafe impl Zeroable for Chunk16 {}
// SAFETY: as above; it contains no pointers or interior mutability.
unsafe impl Pod for Chunk16 {}

pub(crate) struct PagePool {
    page_bytes: usize,
    pages: Vec<Box<[Chunk16]>>,
    /// Stack of released pages; `alloc` pops, `release` pushes.
    free: Vec<PageId>,
    /// Ids whose memory was given back by `trim` (their slot in `pages` is empty).
    vacant: Vec<PageId>,
    in_use: Vec<bool>,
}

impl PagePool {
    /// A pool of pages of `page_bytes` bytes each (rounded up to a multiple of 16).
    pub(crate) fn new(page_bytes: usize) -> Self {
        PagePool {
            page_bytes: page_bytes.div_ceil(16) * 16,
            pages: Vec::new(),
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
        let memory = vec![Chunk16([0; 16]); self.page_bytes / 16].into_boxed_slice();
        if let Some(id) = self.vacant.pop() {
            self.pages[id.index()] = memory;
            return id;
        }
        let index = u32::try_from(self.pages.len()).expect("page pool exceeds 2^32 pages");
        self.pages.push(memory);
        self.in_use.push(false);
        PageId(index)
    }

    /// Grows the pool (onto the free list) until it holds `pages` pages with memory.
    pub(crate) fn reserve(&mut self, pages: usize) {
        while self.allocated() < pages {
            let id = self.grow_one();
            self.free.push(id);
        }
    }

    /// Gives back the memory of free pages until at most `keep` pages hold memory.
    pub(crate) fn trim(&mut self, keep: usize) {
        while self.allocated() > keep {
            let Some(id) = self.free.pop() else { break };
            self.pages[id.index()] = Box::new([]);
            self.vacant.push(id);
        }
    }

    /// Return a page to the free list.
    pub(crate) fn release(&mut self, id: PageId) {
        let slot = &mut self.in_use[id.index()];
        assert!(*slot, "page {id:?} released twice");
        *slot = false;
        self.free.push(id);
    }

    pub(crate) fn page(&self, id: PageId) -> &[u8] {
        bytemuck::cast_slice(&self.pages[id.index()])
    }

    pub(crate) fn page_mut(&mut self, id: PageId) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.pages[id.index()])
    }

    /// Pages holding memory (in use + free).
    pub(crate) fn allocated(&self) -> usize {
        self.pages.len() - self.vacant.len()
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn used(&self) -> usize {
        self.allocated() - self.free.len()
    }

    /// Bytes held by the pool, in use or free.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.allocated() * self.page_bytes
    }

    /// Size of the id space (ids are `0..id_bound()`), for per-page side tables.
    pub(crate) fn id_bound(&self) -> usize {
        self.pages.len()
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
    #[should_panic(expected = "released twice")]
    fn double_release_is_caught() {
        let mut pool = PagePool::new(16);
        let a = pool.alloc();
        pool.release(a);
        pool.release(a);
    }
}
