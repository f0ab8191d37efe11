//! Memory accounting, computed from the pages actually allocated.

use crate::config::KvCodecKind;

/// Bytes and tokens of one layer (or of all layers, in [`CacheStats::total`]).
///
/// `allocated_bytes = header_bytes + k_payload_bytes + v_payload_bytes + norm_bytes +
/// padding_bytes`: whole pages, including the unused slots of partly filled pages.
/// `window_bytes` is the part of that held by fp16 pages (recent window and sinks).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerStats {
    pub tokens: usize,
    /// Tokens stored in compressed pages.
    pub compressed_tokens: usize,
    /// Tokens stored in fp16 pages (window and sinks, or everything with the fp16 codec).
    pub fp16_tokens: usize,
    pub pages_used: usize,
    pub k_payload_bytes: usize,
    pub v_payload_bytes: usize,
    pub norm_bytes: usize,
    pub header_bytes: usize,
    pub padding_bytes: usize,
    pub window_bytes: usize,
    pub allocated_bytes: usize,
    /// `allocated_bytes · 8 / (tokens · n_kv_heads · head_dim · 2)`: all-in bits per cached
    /// K or V channel (0 when empty).
    pub bits_per_channel: f64,
    /// fp16 bytes of the same tokens / `allocated_bytes` (0 when empty).
    pub compression_vs_fp16: f64,
}

impl LayerStats {
    pub(crate) fn add(&mut self, other: &LayerStats) {
        self.tokens += other.tokens;
        self.compressed_tokens += other.compressed_tokens;
        self.fp16_tokens += other.fp16_tokens;
        self.pages_used += other.pages_used;
        self.k_payload_bytes += other.k_payload_bytes;
        self.v_payload_bytes += other.v_payload_bytes;
        self.norm_bytes += other.norm_bytes;
        self.header_bytes += other.header_bytes;
        self.padding_bytes += other.padding_bytes;
        self.window_bytes += other.window_bytes;
        self.allocated_bytes += other.allocated_bytes;
    }

    /// Fills the two ratios from the byte counts; `kv_width` is `n_kv_heads · head_dim`.
    pub(crate) fn finish(&mut self, kv_width: usize) {
        let channels = (self.tokens * kv_width * 2) as f64;
        if self.tokens > 0 && self.allocated_bytes > 0 {
            self.bits_per_channel = self.allocated_bytes as f64 * 8.0 / channels;
            self.compression_vs_fp16 = channels * 2.0 / self.allocated_bytes as f64;
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CacheStats {
    pub codec: KvCodecKind,
    /// Layer tokens here are per layer; `total.tokens` sums them over layers.
    pub layers: Vec<LayerStats>,
    pub total: LayerStats,
    /// Tokens committed in every layer (`KvCache::len`).
    pub tokens: usize,
    /// Pages held by the pools (used + free) and those on the free lists.
    pub pages_allocated: usize,
    pub pages_free: usize,
    /// Bytes held by the pools, free pages included.
    pub pool_bytes: usize,
    pub fp16_page_bytes: usize,
    /// Size of a compressed page (0 with the fp16 codec).
    pub sealed_page_bytes: usize,
    /// Largest attention scratch (all work items of one call together) seen so far.
    pub scratch_bytes: usize,
    /// Bytes the same tokens take in a plain fp16 cache.
    pub fp16_equivalent_bytes: usize,
}
