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
    /// Tokens a sliding-window layer will never attend to again, whose pages were recycled
    /// (`tokens = compressed_tokens + fp16_tokens + recycled_tokens`).
    pub recycled_tokens: usize,
    /// The layer's sliding window in tokens, 0 for full (global) attention; 0 in the total.
    pub window: usize,
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
        self.recycled_tokens += other.recycled_tokens;
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

impl CacheStats {
    /// fp16 pages and compressed pages of `layer` (one layer or the total), from its byte
    /// counts: the stats carry page sizes, not page counts per kind. Compressed pages come out
    /// negative when the figures disagree (see [`CacheStats::accounting_problems`]).
    pub fn page_split(&self, layer: &LayerStats) -> (i64, i64) {
        let fp16_pages = layer
            .window_bytes
            .checked_div(self.fp16_page_bytes)
            .unwrap_or(0) as i64;
        (fp16_pages, layer.pages_used as i64 - fp16_pages)
    }

    /// Ways the figures disagree with each other or with the allocator's page count; empty
    /// when they all agree. The invariants: every additive total is the sum over layers; each
    /// layer's bytes are its pages times the page sizes, and equal the sum of their parts; the
    /// pages in use are the pages allocated minus the free ones.
    pub fn accounting_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        type Field = fn(&LayerStats) -> usize;
        let additive: [(&str, Field); 12] = [
            ("tokens", |l| l.tokens),
            ("compressed_tokens", |l| l.compressed_tokens),
            ("fp16_tokens", |l| l.fp16_tokens),
            ("recycled_tokens", |l| l.recycled_tokens),
            ("pages_used", |l| l.pages_used),
            ("k_payload_bytes", |l| l.k_payload_bytes),
            ("v_payload_bytes", |l| l.v_payload_bytes),
            ("norm_bytes", |l| l.norm_bytes),
            ("header_bytes", |l| l.header_bytes),
            ("padding_bytes", |l| l.padding_bytes),
            ("window_bytes", |l| l.window_bytes),
            ("allocated_bytes", |l| l.allocated_bytes),
        ];
        for (key, field) in additive {
            let summed: u128 = self.layers.iter().map(|l| field(l) as u128).sum();
            let total = field(&self.total);
            if summed != total as u128 {
                problems.push(format!("total {key} {total} != sum over layers {summed}"));
            }
        }
        let named = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layer {i}"), l))
            .chain([("total".to_string(), &self.total)]);
        for (name, layer) in named {
            let (fp16_pages, coded_pages) = self.page_split(layer);
            let expected = fp16_pages as i128 * self.fp16_page_bytes as i128
                + coded_pages as i128 * self.sealed_page_bytes as i128;
            if layer.allocated_bytes as i128 != expected {
                problems.push(format!(
                    "{name}: allocated {} != pages x size {expected}",
                    layer.allocated_bytes
                ));
            }
            let parts: u128 = [
                layer.header_bytes,
                layer.k_payload_bytes,
                layer.v_payload_bytes,
                layer.norm_bytes,
                layer.padding_bytes,
            ]
            .iter()
            .map(|&n| n as u128)
            .sum();
            if parts != layer.allocated_bytes as u128 {
                problems.push(format!(
                    "{name}: parts {parts} != allocated {}",
                    layer.allocated_bytes
                ));
            }
            if coded_pages < 0 {
                problems.push(format!("{name}: more fp16 pages than pages used"));
            }
        }
        let in_use = self.pages_allocated as i128 - self.pages_free as i128;
        if self.total.pages_used as i128 != in_use {
            problems.push(format!(
                "pages used {} != allocated - free {in_use}",
                self.total.pages_used
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use crate::{KvCache, KvConfig, KvShape};

    fn filled(config: KvConfig) -> super::CacheStats {
        let shape = KvShape {
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
        };
        let mut cache = KvCache::new(shape, config).unwrap();
        let rows: Vec<f32> = (0..300 * shape.kv_width())
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        for layer in 0..shape.n_layers {
            cache.append(layer, &rows, &rows).unwrap();
        }
        cache.stats()
    }

    #[test]
    fn a_real_cache_satisfies_every_accounting_invariant() {
        for config in [
            KvConfig::fp16(),
            KvConfig::turbo(),
            KvConfig {
                window: 0,
                ..KvConfig::kivi(4)
            },
        ] {
            let stats = filled(config);
            assert_eq!(stats.accounting_problems(), Vec::<String>::new());
        }
    }

    #[test]
    fn disagreeing_figures_are_named() {
        let mut stats = filled(KvConfig {
            window: 0,
            ..KvConfig::turbo()
        });
        stats.layers[0].allocated_bytes += 16;
        let problems = stats.accounting_problems();
        assert!(problems.iter().any(|p| p.contains("sum over layers")));
        assert!(problems.iter().any(|p| p.starts_with("layer 0:")));
        let mut stats = filled(KvConfig::turbo());
        stats.pages_free += 1;
        assert!(stats
            .accounting_problems()
            .iter()
            .any(|p| p.contains("allocated - free")));
    }
}
