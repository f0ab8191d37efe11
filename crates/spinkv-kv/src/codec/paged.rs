//! A sealed page format built from a key half and a value half, each coding one head's block of
//! `page_tokens` tokens. This file owns the page layout (header + five 16-byte aligned
//! sections, head-major within each) and dispatches attention calls to the halves.

use super::{PageAccounting, SealedCodec};
use crate::codebook::CODEBOOK_VERSION;
use crate::config::{KvCodecKind, KvConfig, KvShape, NormFormat};
use crate::page::{
    align16, write_header, PageHeader, FLAG_SEALED, HEADER_BYTES, PAGE_FORMAT_VERSION, PAGE_MAGIC,
};
use spinkv_kernels::team::for_each_mut;

/// Maximum head dim of the compressing codecs (their per-token scratch lives on the stack).
pub(crate) const MAX_CODED_DIM: usize = 1024;

/// Most pages one scan call takes (the run's block views live on the stack); longer runs are
/// split.
pub(crate) const MAX_RUN_PAGES: usize = 8;

/// One head's view of a key block.
#[derive(Clone, Copy)]
pub(crate) struct KeyBlock<'a> {
    pub(crate) side: &'a [u8],
    pub(crate) codes: &'a [u8],
    pub(crate) residual: &'a [u8],
}

/// One head's view of a value block.
#[derive(Clone, Copy)]
pub(crate) struct ValueBlock<'a> {
    pub(crate) side: &'a [u8],
    pub(crate) codes: &'a [u8],
}

/// The query heads' rows of scores (or softmax weights) against one page: `n_qh` rows,
/// `stride` apart, of which the first `visible` tokens count.
#[derive(Clone, Copy)]
pub(crate) struct ScoreRows {
    pub(crate) n_qh: usize,
    pub(crate) visible: usize,
    pub(crate) stride: usize,
}

pub(crate) struct KeyBlockMut<'a> {
    pub(crate) side: &'a mut [u8],
    pub(crate) codes: &'a mut [u8],
    pub(crate) residual: &'a mut [u8],
}

/// Key coding of one head's page block. Shapes as in [`SealedCodec`]; `rows` `[page_tokens][d]`.
pub(crate) trait KeyHalf: Send + Sync {
    fn half_bits(&self) -> u8;
    /// Bytes per head and page of the side (norm/parameter), code and residual sections.
    fn side_bytes(&self) -> usize;
    fn code_bytes(&self) -> usize;
    fn residual_bytes(&self) -> usize;
    fn encode(&self, layer: usize, head: usize, rows: &[f32], block: KeyBlockMut<'_>);
    fn decode(&self, layer: usize, head: usize, block: KeyBlock<'_>, rows: &mut [f32]);
    /// Floats of prepared state per query head.
    fn prepared_len(&self) -> usize;
    fn prepare(&self, layer: usize, head: usize, query: &[f32], prepared: &mut [f32]);
    fn score(&self, block: KeyBlock<'_>, prepared: &[f32], rows: ScoreRows, scores: &mut [f32]);
    /// [`KeyHalf::score`] over a run of consecutive full pages of `page_tokens` tokens: the
    /// first `rows.visible` tokens of the run, token `t` of the run in column `t` of `scores`.
    /// The default scores page by page; a half whose kernels can take the run whole overrides
    /// it (set-up, scale decoding and dispatch once per run).
    fn score_run(
        &self,
        blocks: &[KeyBlock<'_>],
        page_tokens: usize,
        prepared: &[f32],
        rows: ScoreRows,
        scores: &mut [f32],
    ) {
        for_each_page(blocks, page_tokens, rows, |block, first, rows| {
            self.score(block, prepared, rows, &mut scores[first..])
        });
    }
}

/// Calls `f(block, first token, rows)` for each page of a run that holds visible tokens, with
/// `rows.visible` cut to that page's.
pub(crate) fn for_each_page<B: Copy>(
    blocks: &[B],
    page_tokens: usize,
    rows: ScoreRows,
    mut f: impl FnMut(B, usize, ScoreRows),
) {
    for (i, &block) in blocks.iter().enumerate() {
        let first = i * page_tokens;
        if first >= rows.visible {
            break;
        }
        let visible = (rows.visible - first).min(page_tokens);
        f(block, first, ScoreRows { visible, ..rows });
    }
}

/// Value coding of one head's page block.
pub(crate) trait ValueHalf: Send + Sync {
    fn half_bits(&self) -> u8;
    fn side_bytes(&self) -> usize;
    fn code_bytes(&self) -> usize;
    fn encode(&self, layer: usize, head: usize, rows: &[f32], side: &mut [u8], codes: &mut [u8]);
    fn decode(&self, layer: usize, head: usize, block: ValueBlock<'_>, rows: &mut [f32]);
    /// `acc[qh] += Σ_j weights[qh][j] · value_j` (in the half's own domain until `finish`).
    fn accumulate(&self, block: ValueBlock<'_>, weights: &[f32], rows: ScoreRows, acc: &mut [f32]);
    /// [`ValueHalf::accumulate`] over a run of consecutive full pages (as
    /// [`KeyHalf::score_run`]).
    fn accumulate_run(
        &self,
        blocks: &[ValueBlock<'_>],
        page_tokens: usize,
        weights: &[f32],
        rows: ScoreRows,
        acc: &mut [f32],
    ) {
        for_each_page(blocks, page_tokens, rows, |block, first, rows| {
            self.accumulate(block, &weights[first..], rows, acc)
        });
    }
    /// Brings one accumulated row to the plain domain.
    fn finish(&self, layer: usize, head: usize, acc_row: &mut [f32]);
}

pub(crate) struct PagedCodec<K, V> {
    kind: KvCodecKind,
    keys: K,
    values: V,
    n_kv_heads: usize,
    head_dim: usize,
    page_tokens: usize,
    norm_format: NormFormat,
    group: usize,
    /// Section starts: k_side, k_codes, k_residual, v_side, v_codes, body_end.
    offsets: [usize; 6],
}

impl<K: KeyHalf, V: ValueHalf> PagedCodec<K, V> {
    /// The page format of `config`'s codec for `shape` from its halves; `group` is the header's
    /// quantisation group (KIVI's, 0 for the others).
    pub(crate) fn new(
        keys: K,
        values: V,
        shape: &KvShape,
        config: &KvConfig,
        group: usize,
    ) -> Self {
        let n_kv_heads = shape.n_kv_heads;
        let sections = [
            keys.side_bytes(),
            keys.code_bytes(),
            keys.residual_bytes(),
            values.side_bytes(),
            values.code_bytes(),
        ];
        let mut offsets = [0usize; 6];
        let mut at = HEADER_BYTES;
        for (i, per_head) in sections.iter().enumerate() {
            offsets[i] = at;
            at += align16(per_head * n_kv_heads);
        }
        offsets[5] = at;
        PagedCodec {
            kind: config.codec,
            keys,
            values,
            n_kv_heads,
            head_dim: shape.head_dim,
            page_tokens: config.page_tokens,
            norm_format: config.key_norm,
            group,
            offsets,
        }
    }

    fn section<'p>(&self, page: &'p [u8], index: usize, per_head: usize, head: usize) -> &'p [u8] {
        &page[self.offsets[index] + head * per_head..][..per_head]
    }

    fn key_block<'p>(&self, page: &'p [u8], head: usize) -> KeyBlock<'p> {
        KeyBlock {
            side: self.section(page, 0, self.keys.side_bytes(), head),
            codes: self.section(page, 1, self.keys.code_bytes(), head),
            residual: self.section(page, 2, self.keys.residual_bytes(), head),
        }
    }

    fn value_block<'p>(&self, page: &'p [u8], head: usize) -> ValueBlock<'p> {
        ValueBlock {
            side: self.section(page, 3, self.values.side_bytes(), head),
            codes: self.section(page, 4, self.values.code_bytes(), head),
        }
    }
}

/// One head's key or value block of a page being sealed: a task of [`SealedCodec::encode_page`].
enum Half<'p> {
    Keys(usize, KeyBlockMut<'p>),
    Values(usize, &'p mut [u8], &'p mut [u8]),
}

/// Views of the blocks of up to [`MAX_RUN_PAGES`] pages of a run, built on the stack.
fn run_blocks<'p, B: Copy>(
    pages: &[&'p [u8]],
    empty: B,
    block: impl Fn(&'p [u8]) -> B,
) -> ([B; MAX_RUN_PAGES], usize) {
    let mut blocks = [empty; MAX_RUN_PAGES];
    for (slot, page) in blocks.iter_mut().zip(pages) {
        *slot = block(page);
    }
    (blocks, pages.len().min(MAX_RUN_PAGES))
}

/// Calls `f(pages, first token, rows)` for each run of at most [`MAX_RUN_PAGES`] of `pages`
/// that holds visible tokens, with `rows.visible` cut to the run's.
fn for_each_run<'p>(
    pages: &[&'p [u8]],
    page_tokens: usize,
    rows: ScoreRows,
    mut f: impl FnMut(&[&'p [u8]], usize, ScoreRows),
) {
    let run_tokens = MAX_RUN_PAGES * page_tokens;
    for (i, run) in pages.chunks(MAX_RUN_PAGES).enumerate() {
        let first = i * run_tokens;
        if first >= rows.visible {
            break;
        }
        let visible = (rows.visible - first).min(run_tokens);
        f(run, first, ScoreRows { visible, ..rows });
    }
}

impl<K: KeyHalf, V: ValueHalf> SealedCodec for PagedCodec<K, V> {
    fn page_bytes(&self) -> usize {
        self.offsets[5]
    }

    fn accounting(&self) -> PageAccounting {
        let h = self.n_kv_heads;
        let used = HEADER_BYTES
            + h * (self.keys.side_bytes() + self.keys.code_bytes() + self.keys.residual_bytes())
            + h * (self.values.side_bytes() + self.values.code_bytes());
        PageAccounting {
            header: HEADER_BYTES,
            k_payload: h * (self.keys.code_bytes() + self.keys.residual_bytes()),
            v_payload: h * self.values.code_bytes(),
            norms: h * (self.keys.side_bytes() + self.values.side_bytes()),
            padding: self.page_bytes() - used,
        }
    }

    fn page_header(&self, layer: usize, first_token: usize) -> PageHeader {
        PageHeader {
            magic: PAGE_MAGIC,
            version: PAGE_FORMAT_VERSION,
            codec: self.kind.code(),
            flags: FLAG_SEALED,
            k_half_bits: self.keys.half_bits(),
            v_half_bits: self.values.half_bits(),
            norm_format: match self.norm_format {
                NormFormat::LogU8 => 0,
                NormFormat::F16 => 1,
            },
            codebook_version: CODEBOOK_VERSION,
            layer: layer as u16,
            n_kv_heads: self.n_kv_heads as u16,
            head_dim: self.head_dim as u16,
            page_tokens: self.page_tokens as u16,
            tokens: self.page_tokens as u16,
            group: self.group as u16,
            first_token: first_token as u32,
            k_side: self.offsets[0] as u32,
            k_codes: self.offsets[1] as u32,
            k_residual: self.offsets[2] as u32,
            v_side: self.offsets[3] as u32,
            v_codes: self.offsets[4] as u32,
            body_end: self.offsets[5] as u32,
            checksum: 0,
            reserved: [0; 8],
        }
    }

    fn encode_page(
        &self,
        layer: usize,
        first_token: usize,
        keys: &[f32],
        values: &[f32],
        page: &mut [u8],
    ) {
        let run = self.page_tokens * self.head_dim;
        page[HEADER_BYTES..].fill(0);
        let h = self.n_kv_heads;
        // The five sections, each cut into its heads' blocks.
        let mut sections: [Vec<&mut [u8]>; 5] = Default::default();
        let sizes = [
            self.keys.side_bytes(),
            self.keys.code_bytes(),
            self.keys.residual_bytes(),
            self.values.side_bytes(),
            self.values.code_bytes(),
        ];
        let mut rest = &mut page[self.offsets[0]..self.offsets[5]];
        for (i, (blocks, &per_head)) in sections.iter_mut().zip(&sizes).enumerate() {
            let (section, tail) = rest.split_at_mut(self.offsets[i + 1] - self.offsets[i]);
            rest = tail;
            let mut section = &mut section[..per_head * h];
            for _ in 0..h {
                let (block, tail) = section.split_at_mut(per_head);
                blocks.push(block);
                section = tail;
            }
        }
        let [k_side, k_codes, k_residual, v_side, v_codes] = sections;
        // Every head's key block and value block is a task of its own: sealing a page on
        // decode's path waits for all of them, and its halves take about as long.
        let mut halves: Vec<Half<'_>> = Vec::with_capacity(2 * h);
        for (head, ((side, codes), residual)) in
            k_side.into_iter().zip(k_codes).zip(k_residual).enumerate()
        {
            let block = KeyBlockMut {
                side,
                codes,
                residual,
            };
            halves.push(Half::Keys(head, block));
        }
        for (head, (side, codes)) in v_side.into_iter().zip(v_codes).enumerate() {
            halves.push(Half::Values(head, side, codes));
        }
        for_each_mut(&mut halves, |half| match half {
            Half::Keys(head, block) => {
                let rows = &keys[*head * run..(*head + 1) * run];
                let block = KeyBlockMut {
                    side: &mut *block.side,
                    codes: &mut *block.codes,
                    residual: &mut *block.residual,
                };
                self.keys.encode(layer, *head, rows, block);
            }
            Half::Values(head, side, codes) => {
                let rows = &values[*head * run..(*head + 1) * run];
                self.values.encode(layer, *head, rows, side, codes);
            }
        });
        write_header(page, &self.page_header(layer, first_token));
    }

    fn decode_page(&self, page: &[u8], layer: usize, keys: &mut [f32], values: &mut [f32]) {
        let run = self.page_tokens * self.head_dim;
        for head in 0..self.n_kv_heads {
            self.keys.decode(
                layer,
                head,
                self.key_block(page, head),
                &mut keys[head * run..(head + 1) * run],
            );
            self.values.decode(
                layer,
                head,
                self.value_block(page, head),
                &mut values[head * run..(head + 1) * run],
            );
        }
    }

    fn prepared_len(&self, n_qh: usize) -> usize {
        n_qh * self.keys.prepared_len()
    }

    fn prepare(&self, layer: usize, kv_head: usize, queries: &[f32], prepared: &mut [f32]) {
        let per = self.keys.prepared_len();
        for (query, out) in queries
            .chunks_exact(self.head_dim)
            .zip(prepared.chunks_exact_mut(per))
        {
            self.keys.prepare(layer, kv_head, query, out);
        }
    }

    fn score_pages(
        &self,
        pages: &[&[u8]],
        kv_head: usize,
        prepared: &[f32],
        rows: ScoreRows,
        scores: &mut [f32],
    ) {
        let empty = KeyBlock {
            side: &[],
            codes: &[],
            residual: &[],
        };
        let p = self.page_tokens;
        for_each_run(pages, p, rows, |run, first, rows| {
            let (blocks, n) = run_blocks(run, empty, |page| self.key_block(page, kv_head));
            let scores = &mut scores[first..];
            self.keys.score_run(&blocks[..n], p, prepared, rows, scores);
        });
    }

    fn accumulate_pages(
        &self,
        pages: &[&[u8]],
        kv_head: usize,
        weights: &[f32],
        rows: ScoreRows,
        acc: &mut [f32],
    ) {
        let empty = ValueBlock {
            side: &[],
            codes: &[],
        };
        let p = self.page_tokens;
        for_each_run(pages, p, rows, |run, first, rows| {
            let (blocks, n) = run_blocks(run, empty, |page| self.value_block(page, kv_head));
            let weights = &weights[first..];
            self.values
                .accumulate_run(&blocks[..n], p, weights, rows, acc);
        });
    }

    fn finish(&self, layer: usize, kv_head: usize, acc: &mut [f32]) {
        for row in acc.chunks_exact_mut(self.head_dim) {
            self.values.finish(layer, kv_head, row);
        }
    }
}
