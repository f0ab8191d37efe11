//! The on-page format: a 64-byte header followed by a 16-byte aligned body.
//!
//! A page holds `page_tokens` tokens of one layer, every KV head, K and V. Body sections, in
//! order (offsets from the page start; empty sections have equal start and end):
//!
//! | section   | from          | to            | content                                    |
//! |-----------|---------------|---------------|--------------------------------------------|
//! | K side    | `k_side`      | `k_codes`     | key norms (Turbo) / per-channel params (KIVI) |
//! | K codes   | `k_codes`     | `k_residual`  | bit-packed key codes, or fp16 keys         |
//! | K residual| `k_residual`  | `v_side`      | QJL sign stream + residual norms           |
//! | V side    | `v_side`      | `v_codes`     | value norms / per-token params             |
//! | V codes   | `v_codes`     | `body_end`    | bit-packed value codes, or fp16 values     |
//! | padding   | `body_end`    | page end      | zero, up to a multiple of 16               |
//!
//! Every section starts at a multiple of 16. Within a section data is head-major: all tokens of
//! head 0, then head 1, ... so scoring one head reads one contiguous run. The header is encoded
//! field by field in little endian, so parsing never reinterprets raw bytes.

use thiserror::Error;

use crate::config::KvCodecKind;

pub const PAGE_MAGIC: [u8; 4] = *b"SKVP";
pub const PAGE_FORMAT_VERSION: u16 = 1;
pub const HEADER_BYTES: usize = 64;

/// Flag bit: the page is sealed (immutable) and `checksum` covers header and body.
pub const FLAG_SEALED: u8 = 1;

/// In-memory image of the header; `encode`/`decode` give its exact byte layout (the field order
/// and offsets of this `repr(C)` struct).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub magic: [u8; 4],
    pub version: u16,
    pub codec: u8,
    pub flags: u8,
    /// Bit policy: key and value bits per channel in half-bit units (fp16 pages: 32).
    pub k_half_bits: u8,
    pub v_half_bits: u8,
    /// 0 = log-u8 key norms, 1 = f16 key norms.
    pub norm_format: u8,
    pub codebook_version: u8,
    pub layer: u16,
    pub n_kv_heads: u16,
    pub head_dim: u16,
    pub page_tokens: u16,
    /// Tokens written so far (≤ `page_tokens`).
    pub tokens: u16,
    /// KIVI group size (0 for other codecs).
    pub group: u16,
    /// Position of the page's first token in the sequence.
    pub first_token: u32,
    pub k_side: u32,
    pub k_codes: u32,
    pub k_residual: u32,
    pub v_side: u32,
    pub v_codes: u32,
    pub body_end: u32,
    /// FNV-1a over the header (this field zeroed) and the body, valid when sealed.
    pub checksum: u32,
    pub reserved: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<PageHeader>() == HEADER_BYTES);

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PageError {
    #[error("page is {0} bytes, shorter than its 64-byte header")]
    TooShort(usize),
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported page format version {0}")]
    UnsupportedVersion(u16),
    #[error("unknown codec code {0}")]
    UnknownCodec(u8),
    #[error("{tokens} tokens written in a page of {page_tokens}")]
    TokenCount { tokens: u16, page_tokens: u16 },
    #[error("section offsets {0:?} are unordered, unaligned or beyond the page")]
    BadOffsets([u32; 6]),
    #[error("checksum mismatch: header says {stored:#010x}, contents give {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

impl PageHeader {
    pub fn offsets(&self) -> [u32; 6] {
        [
            self.k_side,
            self.k_codes,
            self.k_residual,
            self.v_side,
            self.v_codes,
            self.body_end,
        ]
    }

    /// Every field but the magic and the checksum, by name, widened to u64: what a reader
    /// compares with the header it expects (a snapshot reports the first that differs).
    pub(crate) fn named_fields(&self) -> [(&'static str, u64); 21] {
        [
            ("codec", self.codec.into()),
            ("flags", self.flags.into()),
            ("k_bits", self.k_half_bits.into()),
            ("v_bits", self.v_half_bits.into()),
            ("norm_format", self.norm_format.into()),
            ("codebook_version", self.codebook_version.into()),
            ("layer", self.layer.into()),
            ("n_kv_heads", self.n_kv_heads.into()),
            ("head_dim", self.head_dim.into()),
            ("page_tokens", self.page_tokens.into()),
            ("tokens", self.tokens.into()),
            ("group", self.group.into()),
            ("first_token", self.first_token.into()),
            ("k_side", self.k_side.into()),
            ("k_codes", self.k_codes.into()),
            ("k_residual", self.k_residual.into()),
            ("v_side", self.v_side.into()),
            ("v_codes", self.v_codes.into()),
            ("body_end", self.body_end.into()),
            ("reserved", u64::from_le_bytes(self.reserved)),
            ("version", self.version.into()),
        ]
    }

    pub fn codec_kind(&self) -> Option<KvCodecKind> {
        KvCodecKind::from_code(self.codec)
    }

    pub fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..HEADER_BYTES];
        out[0..4].copy_from_slice(&self.magic);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6] = self.codec;
        out[7] = self.flags;
        out[8] = self.k_half_bits;
        out[9] = self.v_half_bits;
        out[10] = self.norm_format;
        out[11] = self.codebook_version;
        let u16s = [
            self.layer,
            self.n_kv_heads,
            self.head_dim,
            self.page_tokens,
            self.tokens,
            self.group,
        ];
        put_consecutive(out, 12, &u16s.map(u16::to_le_bytes));
        out[24..28].copy_from_slice(&self.first_token.to_le_bytes());
        put_consecutive(out, 28, &self.offsets().map(u32::to_le_bytes));
        out[52..56].copy_from_slice(&self.checksum.to_le_bytes());
        out[56..64].copy_from_slice(&self.reserved);
    }

    /// Reads the header fields without judging them (see [`parse_page`] for validation).
    pub fn decode(bytes: &[u8]) -> Result<PageHeader, PageError> {
        let Some(b) = bytes.get(..HEADER_BYTES) else {
            return Err(PageError::TooShort(bytes.len()));
        };
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut reserved = [0u8; 8];
        reserved.copy_from_slice(&b[56..64]);
        Ok(PageHeader {
            magic: [b[0], b[1], b[2], b[3]],
            version: u16_at(4),
            codec: b[6],
            flags: b[7],
            k_half_bits: b[8],
            v_half_bits: b[9],
            norm_format: b[10],
            codebook_version: b[11],
            layer: u16_at(12),
            n_kv_heads: u16_at(14),
            head_dim: u16_at(16),
            page_tokens: u16_at(18),
            tokens: u16_at(20),
            group: u16_at(22),
            first_token: u32_at(24),
            k_side: u32_at(28),
            k_codes: u32_at(32),
            k_residual: u32_at(36),
            v_side: u32_at(40),
            v_codes: u32_at(44),
            body_end: u32_at(48),
            checksum: u32_at(52),
            reserved,
        })
    }
}

/// Writes `words` (each `N` bytes) one after another into `out` from byte `at`.
fn put_consecutive<const N: usize>(out: &mut [u8], at: usize, words: &[[u8; N]]) {
    for (i, word) in words.iter().enumerate() {
        out[at + N * i..at + N * (i + 1)].copy_from_slice(word);
    }
}

/// FNV-1a 32 of the page: header with its checksum field zeroed, then the body.
pub fn page_checksum(page: &[u8], body_end: usize) -> u32 {
    let mut hash = 0x811c_9dc5u32;
    let mut eat = |byte: u8| {
        hash ^= byte as u32;
        hash = hash.wrapping_mul(0x0100_0193);
    };
    for (i, &byte) in page[..HEADER_BYTES].iter().enumerate() {
        eat(if (52..56).contains(&i) { 0 } else { byte });
    }
    for &byte in &page[HEADER_BYTES..body_end] {
        eat(byte);
    }
    hash
}

/// Writes `header` into `page`, computing its checksum first when it is sealed.
pub fn write_header(page: &mut [u8], header: &PageHeader) {
    let mut header = *header;
    header.checksum = 0;
    header.encode(page);
    if header.flags & FLAG_SEALED != 0 {
        header.checksum = page_checksum(page, header.body_end as usize);
        page[52..56].copy_from_slice(&header.checksum.to_le_bytes());
    }
}

/// Validates a page image: magic, version, codec, token count, section offsets (ordered,
/// 16-byte aligned, inside the page) and, for sealed pages, the checksum. Never panics.
pub fn parse_page(page: &[u8]) -> Result<PageHeader, PageError> {
    let header = PageHeader::decode(page)?;
    if header.magic != PAGE_MAGIC {
        return Err(PageError::BadMagic(header.magic));
    }
    if header.version != PAGE_FORMAT_VERSION {
        return Err(PageError::UnsupportedVersion(header.version));
    }
    if header.codec_kind().is_none() {
        return Err(PageError::UnknownCodec(header.codec));
    }
    if header.tokens > header.page_tokens {
        return Err(PageError::TokenCount {
            tokens: header.tokens,
            page_tokens: header.page_tokens,
        });
    }
    let offsets = header.offsets();
    let ordered = offsets.windows(2).all(|w| w[0] <= w[1]);
    let aligned = offsets[..5].iter().all(|&o| o % 16 == 0);
    let inside = header.k_side as usize >= HEADER_BYTES && header.body_end as usize <= page.len();
    if !(ordered && aligned && inside) {
        return Err(PageError::BadOffsets(offsets));
    }
    if header.flags & FLAG_SEALED != 0 {
        let computed = page_checksum(page, header.body_end as usize);
        if computed != header.checksum {
            return Err(PageError::Checksum {
                stored: header.checksum,
                computed,
            });
        }
    }
    Ok(header)
}

/// Rounds a byte count up to the 16-byte section alignment.
pub(crate) fn align16(bytes: usize) -> usize {
    bytes.div_ceil(16) * 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_header() -> PageHeader {
        PageHeader {
            magic: PAGE_MAGIC,
            version: PAGE_FORMAT_VERSION,
            codec: KvCodecKind::Fp16.code(),
            flags: FLAG_SEALED,
            k_half_bits: 32,
            v_half_bits: 32,
            norm_format: 0,
            codebook_version: 1,
            layer: 3,
            n_kv_heads: 1,
            head_dim: 4,
            page_tokens: 2,
            tokens: 2,
            group: 0,
            first_token: 96,
            k_side: 64,
            k_codes: 64,
            k_residual: 80,
            v_side: 80,
            v_codes: 80,
            body_end: 96,
            checksum: 0,
            reserved: [0; 8],
        }
    }

    #[test]
    fn header_round_trips_and_checksum_detects_changes() {
        let mut page = vec![0u8; 96];
        for (i, b) in page.iter_mut().enumerate().skip(64) {
            *b = i as u8;
        }
        let header = sample_header();
        write_header(&mut page, &header);
        let parsed = parse_page(&page).unwrap();
        assert_eq!(parsed.checksum, page_checksum(&page, 96));
        assert_eq!(
            PageHeader {
                checksum: 0,
                ..parsed
            },
            header
        );
        page[70] ^= 1;
        assert!(matches!(parse_page(&page), Err(PageError::Checksum { .. })));
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_page(&bytes);
        }

        #[test]
        fn parsing_corrupted_pages_never_panics(
            flips in proptest::collection::vec((0usize..96, any::<u8>()), 1..8),
            cut in 0usize..=96,
        ) {
            let mut page = vec![0u8; 96];
            write_header(&mut page, &sample_header());
            for (at, value) in flips {
                page[at] = value;
            }
            let _ = parse_page(&page);
            let _ = parse_page(&page[..cut]);
        }
    }
}
