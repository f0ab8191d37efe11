//! Per-layer page tables: which pages hold which token positions.
//!
//! A layer's tokens are three consecutive runs:
//!
//! ```text
//! [0, sink)                      sink run    fp16 pages, the first `sink_tokens` tokens
//! [sink, sink + recycled)        recycled    no pages: whole pages a sliding-window layer
//!                                            will never attend to again, given back
//! [.., + sealed·P)               sealed      codec pages, exactly P tokens each
//! [window_start, len)            window run  fp16 pages, all full except the last
//! ```
//!
//! Tables hold page ids only; bytes live in the pools and their meaning in the codecs.

use std::collections::VecDeque;

use crate::pool::PageId;

/// Which pool a page id refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageKind {
    /// An fp16 page (window or sink) from the fp16 pool.
    Fp16,
    /// A sealed page from the codec pool.
    Sealed,
}

/// A page and the token positions it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) kind: PageKind,
    pub(crate) page: PageId,
    /// Position of the page's first token.
    pub(crate) first: usize,
    /// Tokens the page holds.
    pub(crate) count: usize,
}

/// fp16 pages holding consecutive tokens; every page is full except possibly the last.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenRun {
    pub(crate) pages: VecDeque<PageId>,
    pub(crate) tokens: usize,
}

impl TokenRun {
    /// Tokens held by page `index` of the run.
    pub(crate) fn count_of(&self, index: usize, page_tokens: usize) -> usize {
        (self.tokens - index * page_tokens).min(page_tokens)
    }

    /// Page and slot that the next token goes to, `None` when a new page is needed.
    pub(crate) fn next_slot(&self, page_tokens: usize) -> Option<(PageId, usize)> {
        let slot = self.tokens % page_tokens;
        if slot == 0 {
            None
        } else {
            self.pages.back().map(|&page| (page, slot))
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct LayerTable {
    pub(crate) sink: TokenRun,
    /// Tokens after the sink run whose pages were recycled (a multiple of the page size; only
    /// on sliding-window layers, see `KvCache::set_layer_windows`).
    pub(crate) recycled: usize,
    pub(crate) sealed: Vec<PageId>,
    pub(crate) window: TokenRun,
}

impl LayerTable {
    pub(crate) fn len(&self, page_tokens: usize) -> usize {
        self.window_start(page_tokens) + self.window.tokens
    }

    /// Position of the first token of the window run.
    pub(crate) fn window_start(&self, page_tokens: usize) -> usize {
        self.sink.tokens + self.recycled + self.sealed.len() * page_tokens
    }

    pub(crate) fn segment_count(&self) -> usize {
        self.sink.pages.len() + self.sealed.len() + self.window.pages.len()
    }

    /// Segment `index` in token order (sink pages, sealed pages, window pages).
    pub(crate) fn segment(&self, index: usize, page_tokens: usize) -> Segment {
        let n_sink = self.sink.pages.len();
        if index < n_sink {
            return Segment {
                kind: PageKind::Fp16,
                page: self.sink.pages[index],
                first: index * page_tokens,
                count: self.sink.count_of(index, page_tokens),
            };
        }
        let index = index - n_sink;
        if index < self.sealed.len() {
            return Segment {
                kind: PageKind::Sealed,
                page: self.sealed[index],
                first: self.sink.tokens + self.recycled + index * page_tokens,
                count: page_tokens,
            };
        }
        let index = index - self.sealed.len();
        Segment {
            kind: PageKind::Fp16,
            page: self.window.pages[index],
            first: self.window_start(page_tokens) + index * page_tokens,
            count: self.window.count_of(index, page_tokens),
        }
    }

    pub(crate) fn fp16_pages(&self) -> usize {
        self.sink.pages.len() + self.window.pages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_positions_in_order() {
        // Page ids are opaque here; build them through a pool.
        let mut pool = crate::pool::PagePool::new(16);
        let mut ids = (0..6).map(|_| pool.alloc());
        let mut table = LayerTable::default();
        table.sink.pages.push_back(ids.next().unwrap());
        table.sink.tokens = 3;
        table.sealed.push(ids.next().unwrap());
        table.sealed.push(ids.next().unwrap());
        table.window.pages.push_back(ids.next().unwrap());
        table.window.pages.push_back(ids.next().unwrap());
        table.window.tokens = 6;
        let p = 4;
        assert_eq!(table.len(p), 3 + 8 + 6);
        let segs: Vec<_> = (0..table.segment_count())
            .map(|i| table.segment(i, p))
            .collect();
        let spans: Vec<_> = segs.iter().map(|s| (s.kind, s.first, s.count)).collect();
        assert_eq!(
            spans,
            [
                (PageKind::Fp16, 0, 3),
                (PageKind::Sealed, 3, 4),
                (PageKind::Sealed, 7, 4),
                (PageKind::Fp16, 11, 4),
                (PageKind::Fp16, 15, 2),
            ]
        );
        assert_eq!(table.window.next_slot(p), Some((segs[4].page, 2)));
        // Recycled tokens hold no page and shift everything after the sink run.
        table.recycled = 8;
        assert_eq!(table.len(p), 3 + 8 + 8 + 6);
        assert_eq!(table.segment_count(), 5);
        let firsts: Vec<_> = (0..5).map(|i| table.segment(i, p).first).collect();
        assert_eq!(firsts, [0, 11, 15, 19, 23]);
    }
}
