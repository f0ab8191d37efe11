//! fp16 pass-through pages: the reference codec, and the storage of the recent window and the
//! sink tokens of every other codec. Body: K as `[n_kv_heads][page_tokens][head_dim]` halves,
//! then V in the same layout, each section 16-byte aligned.

use half::f16;

use crate::config::KvCodecKind;
use crate::kernels::f32_to_f16;
use crate::page::{
    align16, write_header, PageHeader, FLAG_SEALED, HEADER_BYTES, PAGE_FORMAT_VERSION, PAGE_MAGIC,
};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Fp16Layout {
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) page_tokens: usize,
    k_offset: usize,
    v_offset: usize,
    body_end: usize,
}

impl Fp16Layout {
    pub(crate) fn new(n_kv_heads: usize, head_dim: usize, page_tokens: usize) -> Self {
        let section = align16(n_kv_heads * page_tokens * head_dim * 2);
        let k_offset = HEADER_BYTES;
        let v_offset = k_offset + section;
        Fp16Layout {
            n_kv_heads,
            head_dim,
            page_tokens,
            k_offset,
            v_offset,
            body_end: v_offset + section,
        }
    }

    pub(crate) fn page_bytes(&self) -> usize {
        self.body_end
    }

    /// Bytes of K (or V) halves a full page holds, padding excluded.
    pub(crate) fn payload_bytes(&self) -> usize {
        self.n_kv_heads * self.page_tokens * self.head_dim * 2
    }

    /// The header of a page of this layout (flags and checksum 0: a writable page).
    pub(crate) fn header(&self, layer: usize, first_token: usize, tokens: usize) -> PageHeader {
        PageHeader {
            magic: PAGE_MAGIC,
            version: PAGE_FORMAT_VERSION,
            codec: KvCodecKind::Fp16.code(),
            flags: 0,
            k_half_bits: 32,
            v_half_bits: 32,
            norm_format: 0,
            codebook_version: 0,
            layer: layer as u16,
            n_kv_heads: self.n_kv_heads as u16,
            head_dim: self.head_dim as u16,
            page_tokens: self.page_tokens as u16,
            tokens: tokens as u16,
            group: 0,
            first_token: first_token as u32,
            k_side: self.k_offset as u32,
            k_codes: self.k_offset as u32,
            k_residual: self.v_offset as u32,
            v_side: self.v_offset as u32,
            v_codes: self.v_offset as u32,
            body_end: self.body_end as u32,
            checksum: 0,
            reserved: [0; 8],
        }
    }

    /// Writes the header of an empty, writable page.
    pub(crate) fn init_page(&self, page: &mut [u8], layer: usize, first_token: usize) {
        write_header(page, &self.header(layer, first_token, 0));
    }

    /// The canonical image of a live page of `layer` whose first token is at `first_token` and
    /// that holds `tokens` tokens, as snapshots store it: the tokens' rows, every other byte
    /// zero, the sealed flag set and the checksum filled in.
    pub(crate) fn canonical_image(
        &self,
        page: &[u8],
        layer: usize,
        first_token: usize,
        tokens: usize,
        out: &mut [u8],
    ) {
        out.fill(0);
        let header = PageHeader {
            flags: FLAG_SEALED,
            ..self.header(layer, first_token, tokens)
        };
        debug_assert_eq!(
            PageHeader::decode(page).map(|h| h.first_token),
            Ok(first_token as u32),
            "live page header and table disagree"
        );
        let row = self.head_dim * 2;
        let run = self.page_tokens * row;
        for offset in [self.k_offset, self.v_offset] {
            for head in 0..self.n_kv_heads {
                let at = offset + head * run;
                out[at..at + tokens * row].copy_from_slice(&page[at..at + tokens * row]);
            }
        }
        write_header(out, &header);
    }

    /// Turns a snapshot image back into a live page: sealed flag and checksum cleared.
    pub(crate) fn reopen(&self, page: &mut [u8]) {
        page[7] &= !FLAG_SEALED;
        page[52..56].fill(0);
    }

    /// Whether every stored half of the first `tokens` rows of each head is finite.
    pub(crate) fn rows_are_finite(&self, page: &[u8], tokens: usize) -> bool {
        (0..self.n_kv_heads).all(|head| {
            [self.keys(page, head), self.values(page, head)]
                .iter()
                .all(|rows| rows[..tokens * self.head_dim].iter().all(|h| h.is_finite()))
        })
    }

    /// Records how many tokens the page holds (header field `tokens`).
    pub(crate) fn set_tokens(&self, page: &mut [u8], tokens: usize) {
        page[20..22].copy_from_slice(&(tokens as u16).to_le_bytes());
    }

    /// Stores one token (`k_row`, `v_row`: `[n_kv_heads][head_dim]`) at `slot`.
    pub(crate) fn write_token(&self, page: &mut [u8], slot: usize, k_row: &[f32], v_row: &[f32]) {
        let d = self.head_dim;
        for (offset, row) in [(self.k_offset, k_row), (self.v_offset, v_row)] {
            let section = self.section_mut(page, offset);
            for head in 0..self.n_kv_heads {
                let at = (head * self.page_tokens + slot) * d;
                f32_to_f16(&row[head * d..(head + 1) * d], &mut section[at..at + d]);
            }
        }
    }

    /// Keys of one head: `[page_tokens][head_dim]`.
    pub(crate) fn keys<'p>(&self, page: &'p [u8], head: usize) -> &'p [f16] {
        self.head_rows(page, self.k_offset, head)
    }

    /// Values of one head: `[page_tokens][head_dim]`.
    pub(crate) fn values<'p>(&self, page: &'p [u8], head: usize) -> &'p [f16] {
        self.head_rows(page, self.v_offset, head)
    }

    /// All keys of the page: `[n_kv_heads][page_tokens][head_dim]`.
    pub(crate) fn keys_section<'p>(&self, page: &'p [u8]) -> &'p [f16] {
        bytemuck::cast_slice(&page[self.k_offset..self.k_offset + self.payload_bytes()])
    }

    /// All values of the page: `[n_kv_heads][page_tokens][head_dim]`.
    pub(crate) fn values_section<'p>(&self, page: &'p [u8]) -> &'p [f16] {
        bytemuck::cast_slice(&page[self.v_offset..self.v_offset + self.payload_bytes()])
    }

    fn head_rows<'p>(&self, page: &'p [u8], offset: usize, head: usize) -> &'p [f16] {
        let run = self.page_tokens * self.head_dim;
        let halves: &[f16] = bytemuck::cast_slice(&page[offset..offset + self.payload_bytes()]);
        &halves[head * run..(head + 1) * run]
    }

    fn section_mut<'p>(&self, page: &'p mut [u8], offset: usize) -> &'p mut [f16] {
        bytemuck::cast_slice_mut(&mut page[offset..offset + self.payload_bytes()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::parse_page;

    #[test]
    fn tokens_land_head_major_and_the_page_parses() {
        let layout = Fp16Layout::new(2, 3, 4);
        assert_eq!(layout.page_bytes() % 16, 0);
        let mut page = vec![0u8; layout.page_bytes()];
        layout.init_page(&mut page, 5, 64);
        layout.write_token(
            &mut page,
            1,
            &[1., 2., 3., 4., 5., 6.],
            &[-1., -2., -3., -4., -5., -6.],
        );
        layout.set_tokens(&mut page, 2);
        let header = parse_page(&page).unwrap();
        assert_eq!(
            (header.layer, header.tokens, header.first_token),
            (5, 2, 64)
        );
        let k1: Vec<f32> = layout.keys(&page, 1)[3..6]
            .iter()
            .map(|h| h.to_f32())
            .collect();
        assert_eq!(k1, [4., 5., 6.]);
        let v0: Vec<f32> = layout.values(&page, 0)[3..6]
            .iter()
            .map(|h| h.to_f32())
            .collect();
        assert_eq!(v0, [-1., -2., -3.]);
    }
}
