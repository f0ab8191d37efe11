//! Storage formats of cached tokens. `fp16` pages hold the fp16 codec's tokens and the recent
//! window and sink tokens of every other codec; a [`SealedCodec`] turns full window pages into
//! compressed pages and attends over them without decoding them.

pub(crate) mod fp16;
pub(crate) mod kivi;
pub(crate) mod norm;
pub(crate) mod paged;
pub(crate) mod qjl;
pub(crate) mod rotated;
pub(crate) mod turbo_key;
pub(crate) mod turbo_value;

use crate::config::{KvCodecKind, KvConfig, KvShape};
use crate::error::KvError;
use kivi::{KiviKeys, KiviValues};
pub(crate) use paged::ScoreRows;
use paged::{PagedCodec, MAX_CODED_DIM};
use turbo_key::TurboKeys;
use turbo_value::TurboValues;

/// The sealed-page codec of a configuration (`None` for fp16, which never seals).
pub(crate) fn build(
    shape: &KvShape,
    config: &KvConfig,
) -> Result<Option<Box<dyn SealedCodec>>, KvError> {
    if config.codec == KvCodecKind::Fp16 {
        return Ok(None);
    }
    let (d, p) = (shape.head_dim, config.page_tokens);
    if d > MAX_CODED_DIM {
        return Err(KvError::InvalidConfig(format!(
            "head_dim {d} exceeds {MAX_CODED_DIM}, the largest the compressing codecs support"
        )));
    }
    let (k_half, v_half) = (config.k_half_bits()?, config.v_half_bits()?);
    let codec: Box<dyn SealedCodec> = match config.codec {
        KvCodecKind::Fp16 => unreachable!("handled above"),
        KvCodecKind::Turbo | KvCodecKind::TurboQjl => {
            let qjl = config.codec == KvCodecKind::TurboQjl;
            let keys = TurboKeys::new(shape, p, k_half, config.key_norm, qjl, config.seed);
            let values = TurboValues::new(shape, p, v_half, config.seed);
            Box::new(PagedCodec::new(keys, values, shape, config, 0))
        }
        KvCodecKind::Kivi => {
            let g = config.kivi_group;
            let keys = KiviKeys::new(d, p, g, k_half as u32 / 2);
            let values = KiviValues::new(d, p, g, v_half as u32 / 2);
            Box::new(PagedCodec::new(keys, values, shape, config, g))
        }
    };
    Ok(Some(codec))
}
/// Bytes of one sealed page by purpose (they add up to the page size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PageAccounting {
    pub(crate) header: usize,
    pub(crate) k_payload: usize,
    pub(crate) v_payload: usize,
    pub(crate) norms: usize,
    pub(crate) padding: usize,
}

/// A compressed page format together with attention straight from its codes.
///
/// Shapes: `n_qh` query heads of one KV head; `queries` `[n_qh][head_dim]` already multiplied
/// by the softmax scale; `scores` and `weights` `[n_qh][stride]`; `acc` `[n_qh][head_dim]`
/// in the codec's own (e.g. rotated) domain until [`SealedCodec::finish`].
pub(crate) trait SealedCodec: Send + Sync {
    fn page_bytes(&self) -> usize;
    fn accounting(&self) -> PageAccounting;
    /// The header `encode_page` writes (checksum 0): what a valid page must carry.
    fn page_header(&self, layer: usize, first_token: usize) -> crate::page::PageHeader;
    /// Encodes a full page of tokens. `keys`, `values`: `[n_kv_heads][page_tokens][head_dim]`.
    fn encode_page(
        &self,
        layer: usize,
        first_token: usize,
        keys: &[f32],
        values: &[f32],
        page: &mut [u8],
    );
    /// Decodes a page back to floats (rollback into the middle of a sealed page only).
    fn decode_page(&self, page: &[u8], layer: usize, keys: &mut [f32], values: &mut [f32]);
    /// Floats of per-query state (`prepare`'s output) for `n_qh` query heads.
    fn prepared_len(&self, n_qh: usize) -> usize;
    fn prepare(&self, layer: usize, kv_head: usize, queries: &[f32], prepared: &mut [f32]);
    /// Scores of a run of consecutive full sealed pages (one scan tile; the pages stay the
    /// unit of storage): the first `rows.visible` tokens of the run for every query head, token
    /// `t` of the run at `scores[qh · rows.stride + t]`.
    fn score_pages(
        &self,
        pages: &[&[u8]],
        kv_head: usize,
        prepared: &[f32],
        rows: ScoreRows,
        scores: &mut [f32],
    );
    /// `acc[qh] += Σ_t weights[qh · rows.stride + t] · value_t` over the first `rows.visible`
    /// tokens of a run of consecutive full sealed pages.
    fn accumulate_pages(
        &self,
        pages: &[&[u8]],
        kv_head: usize,
        weights: &[f32],
        rows: ScoreRows,
        acc: &mut [f32],
    );

    /// Brings accumulated values back to the plain domain, once per head and step.
    fn finish(&self, layer: usize, kv_head: usize, acc: &mut [f32]);
}
