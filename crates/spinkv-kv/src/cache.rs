//! The cache manager: validates calls, moves tokens between page tables, pools and codecs.

use crate::profile::{timed, Phase, PhaseCounters, PhaseTimes};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::attend::{attend, AttendJob};
use crate::codec::fp16::Fp16Layout;
use crate::codec::SealedCodec;
use crate::config::{KvConfig, KvShape};
use crate::error::KvError;
use crate::kernels::f16_to_f32;
use crate::lifecycle::{Checkpoint, Growth};
use crate::pool::{PageId, PagePool};
use crate::stats::{CacheStats, LayerStats};
use crate::table::{LayerTable, PageKind, TokenRun};

/// A paged KV cache for one sequence: every layer's keys and values, recent tokens in fp16
/// and (with a compressing codec) older tokens in compressed pages.
///
/// Cache indices vs sequence positions: after [`KvCache::retire`] dropped the tokens at
/// positions `gap..gap + retired`, cache index `i` holds position `i` below `gap` and
/// `i + retired` from `gap` on. Attention works on cache indices (keys carry their position
/// in their RoPE rotation); page headers record sequence positions.
pub struct KvCache {
    pub(crate) shape: KvShape,
    pub(crate) config: KvConfig,
    pub(crate) fp16: Fp16Layout,
    pub(crate) fp16_pool: PagePool,
    pub(crate) codec: Option<Box<dyn SealedCodec>>,
    pub(crate) sealed_pool: PagePool,
    pub(crate) layers: Vec<LayerTable>,
    /// Each layer's sliding window (`None`: full attention); see `window.rs`.
    pub(crate) layer_windows: Vec<Option<usize>>,
    /// Tokens dropped by `retire`, and the cache index where they were.
    pub(crate) retired: usize,
    pub(crate) gap: usize,
    /// State to return to on `rollback`; its pages are held while it lives.
    pub(crate) checkpoint: Option<Checkpoint>,
    /// Geometric growth of the pools, once `reserve` was called.
    pub(crate) growth: Option<Growth>,
    /// `[n_kv_heads][page_tokens][head_dim]` floats for moving a page through a codec.
    pub(crate) staging_keys: Vec<f32>,
    pub(crate) staging_values: Vec<f32>,
    peak_scratch: AtomicUsize,
    /// Per layer, per segment: how many KV heads' value blocks the last decode split read
    /// (what the next split weighs each sealed page by; `attend`).
    value_reads: Mutex<Vec<Vec<u8>>>,
    /// Phase timers, when profiling is on (`set_profiling`).
    pub(crate) profile: Option<Box<PhaseCounters>>,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("shape", &self.shape)
            .field("config", &self.config)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl KvCache {
    pub fn new(shape: KvShape, config: KvConfig) -> Result<Self, KvError> {
        config.validate(&shape)?;
        let codec = crate::codec::build(&shape, &config)?;
        let fp16 = Fp16Layout::new(shape.n_kv_heads, shape.head_dim, config.page_tokens);
        let staging = shape.kv_width() * config.page_tokens;
        Ok(KvCache {
            fp16_pool: PagePool::new(fp16.page_bytes()),
            sealed_pool: PagePool::new(codec.as_ref().map_or(16, |c| c.page_bytes())),
            codec,
            fp16,
            layers: (0..shape.n_layers).map(|_| LayerTable::default()).collect(),
            layer_windows: vec![None; shape.n_layers],
            retired: 0,
            gap: 0,
            checkpoint: None,
            growth: None,
            staging_keys: vec![0.0; staging],
            staging_values: vec![0.0; staging],
            peak_scratch: AtomicUsize::new(0),
            value_reads: Mutex::new(vec![Vec::new(); shape.n_layers]),
            profile: None,
            shape,
            config,
        })
    }

    pub fn shape(&self) -> &KvShape {
        &self.shape
    }

    pub fn config(&self) -> &KvConfig {
        &self.config
    }

    /// Switches the phase timers on (from zero) or off. See [`PhaseTimes`].
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(Box::default);
    }

    /// Time per phase since profiling was switched on; `None` when it is off.
    pub fn phase_times(&self) -> Option<PhaseTimes> {
        self.profile.as_ref().map(|p| p.times())
    }

    /// Tokens committed in every layer.
    pub fn len(&self) -> usize {
        let p = self.config.page_tokens;
        self.layers.iter().map(|t| t.len(p)).min().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens held by one layer (layers run ahead of `len` in the middle of a forward pass).
    pub fn layer_len(&self, layer: usize) -> Result<usize, KvError> {
        Ok(self.table(layer)?.len(self.config.page_tokens))
    }

    /// Appends n tokens to one layer. `k`, `v`: `[n, n_kv_heads, head_dim]`, keys after RoPE.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        let width = self.shape.kv_width();
        let len = self.table(layer)?.len(self.config.page_tokens);
        if !k.len().is_multiple_of(width) {
            return Err(KvError::ShapeMismatch {
                what: "k: a multiple of n_kv_heads * head_dim",
                expected: k.len().div_ceil(width) * width,
                got: k.len(),
            });
        }
        if v.len() != k.len() {
            return Err(KvError::ShapeMismatch {
                what: "v: as many values as k",
                expected: k.len(),
                got: v.len(),
            });
        }
        let n = k.len() / width;
        if len + n > self.config.max_tokens {
            return Err(KvError::ContextFull {
                len,
                adding: n,
                max: self.config.max_tokens,
            });
        }
        // The block's queries start at `len`: pages no query from there on can see go back.
        self.recycle(layer, len);
        for (t, (k_row, v_row)) in k.chunks_exact(width).zip(v.chunks_exact(width)).enumerate() {
            let to_sink = self.codec.is_some() && len + t < self.config.sink_tokens;
            self.push_token(layer, to_sink, k_row, v_row);
        }
        self.seal_overflow(layer);
        Ok(())
    }

    /// Attention of n queries at positions `start..start + n`, each over tokens `0..=pos`.
    /// `q`, `out`: `[n, n_heads, head_dim]`; softmax scale `1/sqrt(head_dim)`; GQA: query head
    /// h uses KV head `h / (n_heads / n_kv_heads)`.
    pub fn attend(
        &self,
        layer: usize,
        q: &[f32],
        start: usize,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        self.attend_within(layer, q, start, None, out)
    }

    /// [`KvCache::attend`], each query limited to the last `window` cache indices when set.
    pub(crate) fn attend_within(
        &self,
        layer: usize,
        q: &[f32],
        start: usize,
        window: Option<usize>,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        let width = self.shape.q_width();
        let table = self.table(layer)?;
        if !q.len().is_multiple_of(width) {
            return Err(KvError::ShapeMismatch {
                what: "q: a multiple of n_heads * head_dim",
                expected: q.len().div_ceil(width) * width,
                got: q.len(),
            });
        }
        if out.len() != q.len() {
            return Err(KvError::ShapeMismatch {
                what: "out: as many values as q",
                expected: q.len(),
                got: out.len(),
            });
        }
        let n = q.len() / width;
        let len = table.len(self.config.page_tokens);
        if start + n > len {
            return Err(KvError::PositionOutOfRange {
                layer,
                start,
                end: start + n,
                len,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let job = AttendJob {
            shape: self.shape,
            layer,
            page_tokens: self.config.page_tokens,
            table,
            fp16: &self.fp16,
            fp16_pool: &self.fp16_pool,
            codec: self.codec.as_deref(),
            sealed_pool: &self.sealed_pool,
            q,
            start,
            n,
            window,
            sparse_v: self.config.sparse_v,
            profile: self.profile.as_deref(),
        };
        let records = || {
            self.value_reads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        let mut reads = std::mem::take(&mut records()[layer]);
        let scratch = attend(&job, &mut reads, out);
        records()[layer] = reads;
        self.peak_scratch.fetch_max(scratch, Ordering::Relaxed);
        Ok(())
    }

    /// Drops every token at cache index `>= len` in every layer (no-op beyond the current
    /// length). Rolling back into a compressed page re-stores the kept part of it in fp16 from
    /// its codes. Cutting at or below the retirement gap forgets the retirement.
    /// A sliding-window layer that recycled pages the next query at `len` would see cannot be
    /// cut there: the cache is then cut further back, to its sinks (see
    /// [`KvCache::servable_len`]); check `len()` after.
    pub fn truncate(&mut self, len: usize) {
        let len = self.servable_len(len);
        for layer in 0..self.shape.n_layers {
            self.truncate_layer(layer, len);
        }
        if self.retired > 0 && len <= self.gap {
            self.retired = 0;
            self.gap = 0;
        }
    }

    /// Sequence position of the token at cache index `index`.
    pub fn position_of(&self, index: usize) -> usize {
        if self.retired > 0 && index >= self.gap {
            index + self.retired
        } else {
            index
        }
    }

    /// Tokens dropped by [`KvCache::retire`] so far.
    pub fn retired(&self) -> usize {
        self.retired
    }

    /// Cache index where retired tokens were (0 when none were).
    pub fn gap(&self) -> usize {
        self.gap
    }

    /// Empties the cache; its pages stay in the pools for reuse.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    pub fn stats(&self) -> CacheStats {
        let p = self.config.page_tokens;
        let fp16_page = self.fp16_pool.page_bytes();
        let fp16_payload = self.fp16.payload_bytes();
        let sealed = self
            .codec
            .as_ref()
            .map(|c| c.accounting())
            .unwrap_or_default();
        let sealed_page = self.codec.as_ref().map_or(0, |c| c.page_bytes());
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut total = LayerStats::default();
        for (table, window) in self.layers.iter().zip(&self.layer_windows) {
            let fp16_pages = table.fp16_pages();
            let sealed_pages = table.sealed.len();
            let window_bytes = fp16_pages * fp16_page;
            let mut stats = LayerStats {
                tokens: table.len(p),
                compressed_tokens: sealed_pages * p,
                fp16_tokens: table.sink.tokens + table.window.tokens,
                recycled_tokens: table.recycled,
                window: window.unwrap_or(0),
                pages_used: fp16_pages + sealed_pages,
                k_payload_bytes: fp16_pages * fp16_payload + sealed_pages * sealed.k_payload,
                v_payload_bytes: fp16_pages * fp16_payload + sealed_pages * sealed.v_payload,
                norm_bytes: sealed_pages * sealed.norms,
                header_bytes: (fp16_pages + sealed_pages) * crate::page::HEADER_BYTES,
                padding_bytes: fp16_pages
                    * (fp16_page - crate::page::HEADER_BYTES - 2 * fp16_payload)
                    + sealed_pages * sealed.padding,
                window_bytes,
                allocated_bytes: window_bytes + sealed_pages * sealed_page,
                ..LayerStats::default()
            };
            stats.finish(self.shape.kv_width());
            total.add(&stats);
            layers.push(stats);
        }
        total.finish(self.shape.kv_width());
        debug_assert_eq!(
            total.pages_used + self.checkpoint.as_ref().map_or(0, |c| c.held_pages()),
            self.fp16_pool.used() + self.sealed_pool.used()
        );
        let len = self.len();
        CacheStats {
            codec: self.config.codec,
            layers,
            total,
            tokens: len,
            pages_allocated: self.fp16_pool.allocated() + self.sealed_pool.allocated(),
            pages_free: self.fp16_pool.free_count() + self.sealed_pool.free_count(),
            pool_bytes: self.fp16_pool.allocated_bytes() + self.sealed_pool.allocated_bytes(),
            fp16_page_bytes: fp16_page,
            sealed_page_bytes: sealed_page,
            scratch_bytes: self.peak_scratch.load(Ordering::Relaxed),
            fp16_equivalent_bytes: len * self.shape.fp16_bytes_per_token(),
        }
    }

    fn table(&self, layer: usize) -> Result<&LayerTable, KvError> {
        self.layers.get(layer).ok_or(KvError::LayerOutOfRange {
            layer,
            n_layers: self.shape.n_layers,
        })
    }

    /// Writes one token (`[n_kv_heads][head_dim]` rows) at the end of the sink or window run.
    fn push_token(&mut self, layer: usize, to_sink: bool, k_row: &[f32], v_row: &[f32]) {
        let p = self.config.page_tokens;
        let first_token = self.position_of(self.layers[layer].len(p));
        let (page, slot) = match run_of(&mut self.layers[layer], to_sink).next_slot(p) {
            // A page the checkpoint still needs is copied before it is written to (a truncate
            // inside the turn may have cut it short).
            Some((held, slot)) if self.held_tokens(PageKind::Fp16, held) > slot => {
                let copy = self.alloc_page(PageKind::Fp16);
                let bytes = self.fp16_pool.page(held).to_vec();
                self.fp16_pool.page_mut(copy).copy_from_slice(&bytes);
                let run = run_of(&mut self.layers[layer], to_sink);
                *run.pages.back_mut().expect("next_slot found a page") = copy;
                self.release_page(PageKind::Fp16, held);
                (copy, slot)
            }
            Some(at) => at,
            None => {
                let page = self.alloc_page(PageKind::Fp16);
                self.fp16
                    .init_page(self.fp16_pool.page_mut(page), layer, first_token);
                run_of(&mut self.layers[layer], to_sink)
                    .pages
                    .push_back(page);
                (page, 0)
            }
        };
        let bytes = self.fp16_pool.page_mut(page);
        self.fp16.write_token(bytes, slot, k_row, v_row);
        self.fp16.set_tokens(bytes, slot + 1);
        run_of(&mut self.layers[layer], to_sink).tokens += 1;
    }

    /// Encodes the window's oldest pages while the window holds a full page beyond its size.
    fn seal_overflow(&mut self, layer: usize) {
        // Short sliding windows stay fp16 (window.rs says why).
        if self.codec.is_none() || self.keeps_fp16(layer) {
            return;
        }
        let p = self.config.page_tokens;
        while self.layers[layer].window.tokens >= self.config.window + p {
            let first_token = self.position_of(self.layers[layer].window_start(p));
            let sealed = self.alloc_page(PageKind::Sealed);
            let codec = self.codec.as_deref().expect("checked above");
            let table = &mut self.layers[layer];
            let fp16_page = table
                .window
                .pages
                .pop_front()
                .expect("window holds a full page");
            table.window.tokens -= p;
            let bytes = self.fp16_pool.page(fp16_page);
            timed(self.profile.as_deref(), Phase::AppendEncode, || {
                f16_to_f32(self.fp16.keys_section(bytes), &mut self.staging_keys);
                f16_to_f32(self.fp16.values_section(bytes), &mut self.staging_values);
                codec.encode_page(
                    layer,
                    first_token,
                    &self.staging_keys,
                    &self.staging_values,
                    self.sealed_pool.page_mut(sealed),
                );
            });
            self.release_page(PageKind::Fp16, fp16_page);
            self.layers[layer].sealed.push(sealed);
        }
    }

    fn truncate_layer(&mut self, layer: usize, len: usize) {
        let p = self.config.page_tokens;
        let table = &mut self.layers[layer];
        if len >= table.len(p) {
            return;
        }
        // The record describes pages that may be gone.
        let records = self.value_reads.get_mut();
        records.unwrap_or_else(PoisonError::into_inner)[layer].clear();
        let mut released = Vec::new();
        let window_start = table.window_start(p);
        if len >= window_start {
            shrink_run(
                &mut table.window,
                len - window_start,
                p,
                &mut self.fp16_pool,
                &self.fp16,
                &mut released,
            );
            self.release_pages(PageKind::Fp16, released);
            return;
        }
        shrink_run(
            &mut table.window,
            0,
            p,
            &mut self.fp16_pool,
            &self.fp16,
            &mut released,
        );
        // `servable_len` put the cut at or before the sinks of a layer that recycled pages.
        table.recycled = 0;
        let sink_end = table.sink.tokens;
        if len < sink_end {
            let sealed: Vec<_> = table.sealed.drain(..).collect();
            shrink_run(
                &mut table.sink,
                len,
                p,
                &mut self.fp16_pool,
                &self.fp16,
                &mut released,
            );
            self.release_pages(PageKind::Fp16, released);
            self.release_pages(PageKind::Sealed, sealed);
            return;
        }
        self.release_pages(PageKind::Fp16, released);
        let table = &mut self.layers[layer];
        let keep_pages = (len - sink_end) / p;
        let keep_tokens = (len - sink_end) % p;
        let partial = (keep_tokens > 0).then(|| table.sealed[keep_pages]);
        let dropped: Vec<_> = table.sealed.drain(keep_pages..).collect();
        if let (Some(page), Some(codec)) = (partial, self.codec.as_deref()) {
            codec.decode_page(
                self.sealed_pool.page(page),
                layer,
                &mut self.staging_keys,
                &mut self.staging_values,
            );
            let (width, d) = (self.shape.kv_width(), self.shape.head_dim);
            let mut k_row = vec![0.0f32; width];
            let mut v_row = vec![0.0f32; width];
            for slot in 0..keep_tokens {
                for head in 0..self.shape.n_kv_heads {
                    let src = (head * p + slot) * d;
                    k_row[head * d..(head + 1) * d]
                        .copy_from_slice(&self.staging_keys[src..src + d]);
                    v_row[head * d..(head + 1) * d]
                        .copy_from_slice(&self.staging_values[src..src + d]);
                }
                self.push_token(layer, false, &k_row, &v_row);
            }
        }
        self.release_pages(PageKind::Sealed, dropped);
    }

    /// A page from one of the pools, growing it geometrically once `reserve` was called.
    pub(crate) fn alloc_page(&mut self, kind: PageKind) -> PageId {
        let started = self.profile.as_ref().map(|_| std::time::Instant::now());
        let page = self.alloc_page_untimed(kind);
        if let (Some(profile), Some(started)) = (self.profile.as_deref(), started) {
            profile.add(Phase::PageAlloc, started.elapsed().as_nanos() as u64);
        }
        page
    }

    fn alloc_page_untimed(&mut self, kind: PageKind) -> PageId {
        let cap = self.growth.map(|g| match kind {
            PageKind::Fp16 => g.fp16_cap,
            PageKind::Sealed => g.sealed_cap,
        });
        let pool = match kind {
            PageKind::Fp16 => &mut self.fp16_pool,
            PageKind::Sealed => &mut self.sealed_pool,
        };
        if let Some(cap) = cap {
            if pool.free_count() == 0 {
                // Doubling up to the cap; past it (copies a checkpoint forces) one page at a time.
                let grown = (pool.allocated() * 2).min(cap).max(pool.allocated() + 1);
                pool.reserve(grown);
            }
        }
        pool.alloc()
    }

    /// Returns a page to its pool, or to the checkpoint when the checkpoint still needs it.
    pub(crate) fn release_page(&mut self, kind: PageKind, page: PageId) {
        if let Some(checkpoint) = self.checkpoint.as_mut() {
            if checkpoint.hold(kind, page) {
                return;
            }
        }
        match kind {
            PageKind::Fp16 => self.fp16_pool.release(page),
            PageKind::Sealed => self.sealed_pool.release(page),
        }
    }

    fn release_pages(&mut self, kind: PageKind, pages: Vec<PageId>) {
        for page in pages {
            self.release_page(kind, page);
        }
    }

    /// Tokens the checkpoint keeps in `page` (0 when there is no checkpoint or it does not
    /// own the page).
    fn held_tokens(&self, kind: PageKind, page: PageId) -> usize {
        self.checkpoint
            .as_ref()
            .map_or(0, |c| c.owned_tokens(kind, page))
    }
}

/// All-in bits per cached K or V channel of a compressed page of `config` (header, norms,
/// parameters, residuals and alignment padding included): the rate of every token beyond the
/// fp16 window and sinks. 16-bit pages plus their header for the fp16 codec.
pub fn sealed_bits_per_channel(shape: &KvShape, config: &KvConfig) -> Result<f64, KvError> {
    config.validate(shape)?;
    let page_bytes = match crate::codec::build(shape, config)? {
        Some(codec) => codec.page_bytes(),
        None => Fp16Layout::new(shape.n_kv_heads, shape.head_dim, config.page_tokens).page_bytes(),
    };
    let channels = config.page_tokens * shape.kv_width() * 2;
    Ok(page_bytes as f64 * 8.0 / channels as f64)
}

fn run_of(table: &mut LayerTable, sink: bool) -> &mut TokenRun {
    if sink {
        &mut table.sink
    } else {
        &mut table.window
    }
}

/// Keeps the first `keep` tokens of an fp16 run; the pages it no longer needs go to `released`.
fn shrink_run(
    run: &mut TokenRun,
    keep: usize,
    page_tokens: usize,
    pool: &mut PagePool,
    layout: &Fp16Layout,
    released: &mut Vec<PageId>,
) {
    let keep_pages = keep.div_ceil(page_tokens);
    while run.pages.len() > keep_pages {
        let page = run.pages.pop_back().expect("len > keep_pages >= 0");
        released.push(page);
    }
    run.tokens = keep;
    if let Some(&last) = run.pages.back() {
        let in_last = keep - (keep_pages - 1) * page_tokens;
        layout.set_tokens(pool.page_mut(last), in_last);
    }
}

#[cfg(test)]
impl KvCache {
    /// The keys and values attention effectively sees, `[len][n_kv_heads][d]` each: fp16 pages
    /// widened, sealed pages decoded. Test-only: the runtime never materialises this.
    pub(crate) fn effective_kv(&mut self, layer: usize) -> (Vec<f32>, Vec<f32>) {
        let (p, d, h) = (
            self.config.page_tokens,
            self.shape.head_dim,
            self.shape.n_kv_heads,
        );
        let table = &self.layers[layer];
        let len = table.len(p);
        let (mut keys, mut values) = (vec![0.0f32; len * h * d], vec![0.0f32; len * h * d]);
        for index in 0..table.segment_count() {
            let seg = table.segment(index, p);
            let (mut k_page, mut v_page) = (vec![0.0f32; h * p * d], vec![0.0f32; h * p * d]);
            match seg.kind {
                crate::table::PageKind::Fp16 => {
                    let bytes = self.fp16_pool.page(seg.page);
                    f16_to_f32(self.fp16.keys_section(bytes), &mut k_page);
                    f16_to_f32(self.fp16.values_section(bytes), &mut v_page);
                }
                crate::table::PageKind::Sealed => {
                    let codec = self.codec.as_deref().unwrap();
                    codec.decode_page(
                        self.sealed_pool.page(seg.page),
                        layer,
                        &mut k_page,
                        &mut v_page,
                    );
                }
            }
            for slot in 0..seg.count {
                for head in 0..h {
                    let dst = ((seg.first + slot) * h + head) * d;
                    let src = (head * p + slot) * d;
                    keys[dst..dst + d].copy_from_slice(&k_page[src..src + d]);
                    values[dst..dst + d].copy_from_slice(&v_page[src..src + d]);
                }
            }
        }
        (keys, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KvCodecKind, NormFormat};
    use crate::rng::SplitMix64;
    use crate::test_support::{normals, reference_attention};

    const SHAPE: KvShape = KvShape {
        n_layers: 2,
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 32,
    };

    fn configs() -> Vec<KvConfig> {
        let small = |c: KvConfig| KvConfig {
            page_tokens: 8,
            window: 12,
            max_tokens: 4096,
            ..c
        };
        vec![
            small(KvConfig::turbo_study()),
            small(KvConfig {
                k_bits: 2.5,
                v_bits: 2.0,
                key_norm: NormFormat::F16,
                ..KvConfig::turbo_study()
            }),
            small(KvConfig {
                k_bits: 4.0,
                v_bits: 4.0,
                window: 0,
                ..KvConfig::turbo_study()
            }),
            small(KvConfig {
                sink_tokens: 5,
                ..KvConfig::turbo_study()
            }),
            small(KvConfig {
                kivi_group: 8,
                ..KvConfig::kivi(2)
            }),
            small(KvConfig {
                kivi_group: 4,
                ..KvConfig::kivi(4)
            }),
        ]
    }

    /// The decode split's cost runs are the segments' costs (fp16 pages, partial ones
    /// included, by their tokens; sealed pages by their keys and the value blocks a record says
    /// were read, every head's where it has no entry), at every length from empty through
    /// sinks, sealed pages and a partly filled window, with and without a record.
    #[test]
    fn segment_costs_follow_the_segments() {
        use crate::attend::{split_costs, SegmentCosts};
        use crate::table::PageKind;
        // The split's bounds, walked from every segment's cost and their plain sum.
        let walked_bounds = |costs: &[usize], chunks: usize| -> Vec<usize> {
            let n = costs.len();
            let total: usize = costs.iter().sum();
            let prefix: Vec<usize> = costs
                .iter()
                .scan(0, |running, cost| {
                    *running += cost;
                    Some(*running)
                })
                .collect();
            (0..=chunks)
                .map(|c| match c {
                    _ if total == 0 => c * n / chunks,
                    0 => 0,
                    _ if c == chunks => n,
                    _ => {
                        1 + prefix
                            .iter()
                            .position(|&r| r * chunks >= c * total)
                            .expect("the whole sum reaches every share")
                    }
                })
                .collect()
        };
        let heads = SHAPE.n_kv_heads;
        let c = split_costs();
        for config in configs() {
            let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
            let mut rng = SplitMix64::new(9);
            let width = SHAPE.kv_width();
            for step in 0..70 {
                let table = cache.table(0).unwrap();
                let p = config.page_tokens;
                // A record of every other segment's reads, one short of the segments.
                let record: Vec<u8> = (0..table.segment_count().saturating_sub(1))
                    .map(|i| (i % (heads + 1)) as u8)
                    .collect();
                for reads in [None, Some(&record[..])] {
                    let costs = SegmentCosts {
                        table,
                        page_tokens: p,
                        n_kv_heads: heads,
                        reads,
                    };
                    let each: Vec<usize> = costs.each().collect();
                    let walked: Vec<usize> = (0..table.segment_count())
                        .map(|i| {
                            let seg = table.segment(i, p);
                            let read = reads.and_then(|r| r.get(i)).map_or(heads, |&r| r as usize);
                            match seg.kind {
                                PageKind::Fp16 => c.fp16 * heads * seg.count,
                                PageKind::Sealed => {
                                    (c.sealed_key * heads + c.sealed_value * read) * seg.count
                                }
                            }
                        })
                        .collect();
                    let at = format!("{config:?} after {step} tokens, {reads:?}");
                    assert_eq!(each, walked, "{at}");
                    assert_eq!(costs.total(), walked.iter().sum::<usize>(), "{at}");
                    for chunks in 1..5 {
                        assert_eq!(
                            costs.bounds(chunks),
                            walked_bounds(&walked, chunks),
                            "{at}, {chunks} chunks"
                        );
                    }
                }
                let k = normals(&mut rng, width, 1.0);
                let v = normals(&mut rng, width, 1.0);
                for layer in 0..SHAPE.n_layers {
                    cache.append(layer, &k, &v).unwrap();
                }
            }
        }
    }

    /// Profiling times every phase a compressed cache goes through and changes no output.
    #[test]
    fn profiling_times_the_phases_and_changes_nothing() {
        let config = configs().remove(0);
        let mut rng = SplitMix64::new(3);
        let width = SHAPE.kv_width();
        let k = normals(&mut rng, 40 * width, 1.0);
        let v = normals(&mut rng, 40 * width, 1.0);
        let q = normals(&mut rng, SHAPE.q_width(), 1.0);
        let mut outputs = Vec::new();
        for profiling in [false, true] {
            let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
            cache.set_profiling(profiling);
            for layer in 0..SHAPE.n_layers {
                cache.append(layer, &k, &v).unwrap();
            }
            let mut out = vec![0.0f32; q.len()];
            cache.attend(0, &q, 39, &mut out).unwrap();
            outputs.push(out);
            match cache.phase_times() {
                None => assert!(!profiling),
                Some(t) => {
                    assert!(profiling);
                    for (name, ns) in t.as_pairs() {
                        assert!(ns > 0, "{name} was not timed: {t:?}");
                    }
                }
            }
        }
        assert_eq!(outputs[0], outputs[1]);
    }

    /// Attention straight from codes equals exact attention over the decoded cache: the codes
    /// are scored and accumulated correctly, causal masks and all.
    #[test]
    fn attention_from_codes_equals_attention_over_decoded_pages() {
        for config in configs() {
            let mut rng = SplitMix64::new(21);
            let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
            let width = SHAPE.kv_width();
            for chunk in [13usize, 1, 30, 2, 9, 1, 40] {
                let start = cache.len();
                for layer in 0..SHAPE.n_layers {
                    let k = normals(&mut rng, chunk * width, 1.5);
                    let v = normals(&mut rng, chunk * width, 1.0);
                    cache.append(layer, &k, &v).unwrap();
                }
                let (keys, values) = cache.effective_kv(1);
                for q_start in [start, start.saturating_sub(20)] {
                    let n = start + chunk - q_start;
                    let q = normals(&mut rng, n * SHAPE.q_width(), 1.0);
                    let mut out = vec![0.0f32; q.len()];
                    cache.attend(1, &q, q_start, &mut out).unwrap();
                    let expected = reference_attention(&SHAPE, &keys, &values, &q, q_start);
                    let err = out
                        .iter()
                        .zip(&expected)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f32::max);
                    assert!(
                        err < crate::test_support::attention_tolerance(&config),
                        "{:?}: error {err} at start {q_start}",
                        config.codec
                    );
                }
            }
            let stats = cache.stats();
            assert!(stats.total.compressed_tokens > 0);
            if config.sink_tokens > 0 {
                assert!(stats.layers[0].fp16_tokens >= config.sink_tokens + config.window);
            }
        }
    }

    /// Sparse values leave out pages whose weights are negligible, and only those: with a
    /// threshold below every page's weights the output has the same bits as reading every page;
    /// with one between the quiet and the loud pages' weights the output moves, by no more than
    /// the quiet pages' share of the attention allows.
    #[test]
    fn sparse_values_leave_out_only_negligible_pages() {
        let (d, width) = (SHAPE.head_dim, SHAPE.kv_width());
        let config = KvConfig {
            page_tokens: 8,
            window: 8,
            max_tokens: 4096,
            ..KvConfig::turbo_study()
        };
        let mut rng = SplitMix64::new(5);
        // One unit direction per KV head; its group's queries point along it, and every other
        // page's keys point against it (scores ~ -5.7 where the others' are ~N(0, 0.5)).
        let (directions, q) = group_directions(&mut rng);
        let tokens = 20 * 8 + 8;
        let quiet = |t: usize| t < 160 && (t / 8) % 2 == 1;
        let mut k = Vec::with_capacity(tokens * width);
        for t in 0..tokens {
            for direction in &directions {
                let noise = normals(&mut rng, d, if quiet(t) { 0.1 } else { 1.0 });
                k.extend(noise.iter().zip(direction).map(
                    |(n, u)| {
                        if quiet(t) {
                            n - 8.0 * u
                        } else {
                            *n
                        }
                    },
                ));
            }
        }
        let v = normals(&mut rng, tokens * width, 1.0);
        let attend = |threshold: f32| sparse_attend(&config, threshold, (&k, &v), &q, None);
        // 20 sealed pages, 2 KV heads; half the pages are quiet.
        let (every_page, blocks, (keys, values)) = attend(0.0);
        assert_eq!(blocks, (40, 0));
        let (barely, blocks, _) = attend(1e-30);
        assert_eq!(barely, every_page, "a page of weight was left out");
        assert_eq!(blocks, (40, 0));
        let (sparse, blocks, _) = attend(1e-3);
        assert_ne!(sparse, every_page, "no quiet page was left out");
        assert_eq!(blocks.0 + blocks.1, 40);
        assert!(blocks.1 > 0 && blocks.1 <= 20, "{blocks:?}");
        let quiet_share = attention_share(&keys, &q, tokens, quiet);
        assert!(
            quiet_share < 0.01,
            "the quiet pages are not quiet: {quiet_share}"
        );
        assert_moved_within(&sparse, &every_page, quiet_share, &values, &config);
    }

    /// One random unit direction per KV head, and queries along their group's direction (4 ×
    /// the unit vector, every head).
    fn group_directions(rng: &mut SplitMix64) -> (Vec<Vec<f32>>, Vec<f32>) {
        let d = SHAPE.head_dim;
        let directions: Vec<Vec<f32>> = (0..SHAPE.n_kv_heads)
            .map(|_| {
                let v = normals(rng, d, 1.0);
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.iter().map(|x| x / norm).collect()
            })
            .collect();
        let q = (0..SHAPE.n_heads)
            .flat_map(|h| directions[h / SHAPE.group_size()].iter().map(|u| 4.0 * u))
            .collect();
        (directions, q)
    }

    /// Layer 0's attention for `q` at the last of the `(k, v)` tokens (every layer holds them)
    /// with sparse values at `threshold`, on `team` if given: the output, the value blocks read
    /// and left out, and the cache's decoded keys and values.
    #[allow(clippy::type_complexity)]
    fn sparse_attend(
        config: &KvConfig,
        threshold: f32,
        (k, v): (&[f32], &[f32]),
        q: &[f32],
        team: Option<&std::sync::Arc<spinkv_kernels::team::Team>>,
    ) -> (Vec<f32>, (u64, u64), (Vec<f32>, Vec<f32>)) {
        let config = KvConfig {
            sparse_v: threshold,
            ..config.clone()
        };
        let tokens = k.len() / SHAPE.kv_width();
        let mut cache = KvCache::new(SHAPE, config).unwrap();
        for layer in 0..SHAPE.n_layers {
            cache.append(layer, k, v).unwrap();
        }
        cache.set_profiling(true);
        let mut out = vec![0.0f32; q.len()];
        let mut run = || cache.attend(0, q, tokens - 1, &mut out).unwrap();
        match team {
            Some(team) => team.install(run),
            None => run(),
        }
        let times = cache.phase_times().unwrap();
        let blocks = (times.value_blocks_read, times.value_blocks_skipped);
        (out, blocks, cache.effective_kv(0))
    }

    /// The sparse output moved from reading every page by at most twice the left-out tokens'
    /// `share` of the attention × the largest value, plus the codec's tolerance.
    fn assert_moved_within(
        sparse: &[f32],
        every_page: &[f32],
        share: f32,
        values: &[f32],
        config: &KvConfig,
    ) {
        let largest_value = values.iter().fold(0.0f32, |a, b| a.max(b.abs()));
        let moved = sparse
            .iter()
            .zip(every_page)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let allowed =
            2.0 * share * largest_value + crate::test_support::attention_tolerance(config);
        assert!(moved <= allowed, "moved {moved}, allowed {allowed}");
    }

    /// The largest share, over query heads, of a head's attention that falls on the tokens
    /// `picked` says, computed in f64 over the decoded `keys` (`[token][kv head][d]`).
    fn attention_share(
        keys: &[f32],
        q: &[f32],
        tokens: usize,
        picked: impl Fn(usize) -> bool,
    ) -> f32 {
        let (d, group) = (SHAPE.head_dim, SHAPE.group_size());
        (0..SHAPE.n_heads)
            .map(|h| {
                let scores: Vec<f64> = (0..tokens)
                    .map(|t| {
                        let key = &keys[(t * SHAPE.n_kv_heads + h / group) * d..][..d];
                        let dot: f64 = key
                            .iter()
                            .zip(&q[h * d..][..d])
                            .map(|(a, b)| (a * b) as f64)
                            .sum();
                        dot / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                let share: f64 = (0..tokens)
                    .filter(|&t| picked(t))
                    .map(|t| (scores[t] - m).exp())
                    .sum();
                share / total
            })
            .fold(0.0, f64::max) as f32
    }

    /// Four sinks, 24 sealed pages of 8 tokens and a window page; the sinks and the last
    /// sealed page (`LOUD_PAGE`, tokens `loud`) lie along each group's query (scores ~8.5) and
    /// hold nearly all the attention; every other token scores ~0, so within the later half of
    /// a two-item split every page looks weighty against that half's own sum. The config, keys,
    /// values and query.
    fn sinks_and_a_loud_page() -> (KvConfig, Vec<f32>, Vec<f32>, Vec<f32>) {
        let (d, width) = (SHAPE.head_dim, SHAPE.kv_width());
        let config = KvConfig {
            page_tokens: 8,
            window: 8,
            sink_tokens: 4,
            max_tokens: 4096,
            ..KvConfig::turbo_study()
        };
        let mut rng = SplitMix64::new(9);
        let (directions, q) = group_directions(&mut rng);
        let tokens = 4 + 24 * 8 + 8;
        let mut k = Vec::with_capacity(tokens * width);
        for t in 0..tokens {
            for direction in &directions {
                let noise = normals(&mut rng, d, 0.1);
                let along = if loud(t) { 12.0 } else { 0.0 };
                k.extend(noise.iter().zip(direction).map(|(n, u)| n + along * u));
            }
        }
        let v = normals(&mut rng, tokens * width, 1.0);
        (config, k, v, q)
    }

    /// Whether token `t` of [`sinks_and_a_loud_page`] is a sink or on the loud page.
    fn loud(t: usize) -> bool {
        t < 4 || (4 + 23 * 8..4 + 24 * 8).contains(&t)
    }

    #[test]
    fn sparse_values_bound_a_split_without_the_sinks_by_them() {
        let (config, k, v, q) = sinks_and_a_loud_page();
        let tokens = k.len() / SHAPE.kv_width();
        let team = std::sync::Arc::new(spinkv_kernels::team::Team::new(2).unwrap());
        let attend = |threshold: f32| sparse_attend(&config, threshold, (&k, &v), &q, Some(&team));
        // 24 sealed pages, 2 KV heads.
        let (every_page, blocks, (keys, values)) = attend(0.0);
        assert_eq!(blocks, (48, 0));
        let (sparse, blocks, _) = attend(1e-3);
        assert_eq!(blocks, (2, 46), "the loud page alone should be read");
        let rest_share = attention_share(&keys, &q, tokens, |t| !loud(t));
        assert!(rest_share < 0.05, "the sinks do not dominate: {rest_share}");
        assert_moved_within(&sparse, &every_page, rest_share, &values, &config);
    }

    /// Sealing a page encodes its heads' key and value blocks as tasks of the team: the pages
    /// (and so a snapshot of the cache) are the same bytes as sealed on one thread, for every
    /// compressing preset.
    #[test]
    fn pages_sealed_on_a_team_are_the_bytes_sealed_on_one_thread() {
        let (_, k, v, _) = sinks_and_a_loud_page();
        let team = std::sync::Arc::new(spinkv_kernels::team::Team::new(2).unwrap());
        for preset in ["turbo", "turbo-qjl", "kivi2"] {
            let config = KvConfig::preset(preset).unwrap();
            let fill = || {
                let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
                for layer in 0..SHAPE.n_layers {
                    cache.append(layer, &k, &v).unwrap();
                }
                cache.snapshot_bytes()
            };
            let alone = fill();
            let on_team = team.install(fill);
            assert!(alone == on_team, "{preset}: the pages differ");
        }
    }

    /// A decode split keeps, per segment, how many KV heads' value blocks it read (the loud
    /// sealed page: both; the quiet ones: none; fp16 pages: every head), and the next split
    /// weighs the pages by it; a call on one thread leaves the record alone, and truncating
    /// clears it.
    #[test]
    fn a_decode_split_records_the_value_blocks_it_read() {
        let (config, k, v, q) = sinks_and_a_loud_page();
        let tokens = k.len() / SHAPE.kv_width();
        let config = KvConfig {
            sparse_v: 1e-3,
            ..config
        };
        let mut cache = KvCache::new(SHAPE, config).unwrap();
        for layer in 0..SHAPE.n_layers {
            cache.append(layer, &k, &v).unwrap();
        }
        let record = |cache: &KvCache| cache.value_reads.lock().unwrap()[0].clone();
        let mut out = vec![0.0f32; q.len()];
        cache.attend(0, &q, tokens - 1, &mut out).unwrap();
        assert!(record(&cache).is_empty(), "one thread wrote a record");

        let team = std::sync::Arc::new(spinkv_kernels::team::Team::new(2).unwrap());
        team.install(|| cache.attend(0, &q, tokens - 1, &mut out).unwrap());
        let heads = SHAPE.n_kv_heads as u8;
        // Segments: the sink page, 24 sealed pages (the last one loud), the window page.
        let mut want = vec![0u8; 26];
        (want[0], want[24], want[25]) = (heads, heads, heads);
        assert_eq!(record(&cache), want);
        let table = cache.table(0).unwrap();
        let costs = crate::attend::SegmentCosts {
            table,
            page_tokens: 8,
            n_kv_heads: SHAPE.n_kv_heads,
            reads: Some(&want),
        };
        let costs: Vec<usize> = costs.each().collect();
        assert!(costs[1..24].iter().all(|&c| c == costs[1]), "{costs:?}");
        assert!(costs[24] > costs[1], "{costs:?}");
        // The same split again reads the same blocks.
        team.install(|| cache.attend(0, &q, tokens - 1, &mut out).unwrap());
        assert_eq!(record(&cache), want);

        // A prefill clears it (a restored session starts its turn with none either).
        let two = [&q[..], &q[..]].concat();
        let mut out_two = vec![0.0f32; two.len()];
        cache.attend(0, &two, tokens - 2, &mut out_two).unwrap();
        assert!(record(&cache).is_empty(), "a prefill kept the record");
        team.install(|| cache.attend(0, &q, tokens - 1, &mut out).unwrap());
        assert_eq!(record(&cache), want);
        cache.truncate(tokens - 1);
        assert!(record(&cache).is_empty(), "truncating kept the record");
    }

    #[test]
    fn compressed_attention_is_close_to_fp16() {
        let shape = KvShape {
            n_layers: 1,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
        };
        let mut rng = SplitMix64::new(3);
        let n = 256;
        let k = normals(&mut rng, n * shape.kv_width(), 1.0);
        let v = normals(&mut rng, n * shape.kv_width(), 1.0);
        let q = normals(&mut rng, 4 * shape.q_width(), 2.0);
        let run = |config: KvConfig| {
            let mut cache = KvCache::new(
                shape,
                KvConfig {
                    window: 0,
                    ..config
                },
            )
            .unwrap();
            cache.append(0, &k, &v).unwrap();
            let mut out = vec![0.0f32; q.len()];
            cache.attend(0, &q, n - 4, &mut out).unwrap();
            out
        };
        let exact = run(KvConfig::fp16());
        let rel = |out: &[f32]| {
            let num: f32 = out.iter().zip(&exact).map(|(a, b)| (a - b).powi(2)).sum();
            let den: f32 = exact.iter().map(|b| b * b).sum();
            (num / den).sqrt()
        };
        let mut errors = Vec::new();
        for config in [
            KvConfig {
                k_bits: 4.0,
                v_bits: 4.0,
                ..KvConfig::turbo_study()
            },
            KvConfig::turbo_study(),
            KvConfig {
                k_bits: 2.0,
                v_bits: 2.0,
                ..KvConfig::turbo_study()
            },
            KvConfig::turbo_qjl(),
            KvConfig::kivi(4),
            KvConfig::kivi(2),
        ] {
            let e = rel(&run(config.clone()));
            eprintln!(
                "{:?} k{} v{}: relative error {e:.4}",
                config.codec, config.k_bits, config.v_bits
            );
            errors.push(e);
        }
        assert!(errors[0] < errors[1] && errors[1] < errors[2], "{errors:?}");
        // Random keys give logits of std ~2 here, so errors are larger than on real models.
        assert!(errors[0] < 0.3 && errors[1] < 0.4, "{errors:?}");
        assert!(errors[4] < errors[5], "{errors:?}");
    }

    #[test]
    fn stats_match_allocation_and_the_exact_rate_function() {
        let shape = KvShape {
            n_layers: 2,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
        };
        for config in [
            KvConfig::turbo_study(),
            KvConfig::turbo_qjl(),
            KvConfig::kivi(2),
            KvConfig::kivi(4),
        ] {
            let config = KvConfig {
                window: 0,
                ..config
            };
            let mut cache = KvCache::new(shape, config.clone()).unwrap();
            let mut rng = SplitMix64::new(9);
            for layer in 0..2 {
                let kv = normals(&mut rng, 96 * shape.kv_width(), 1.0);
                cache.append(layer, &kv, &kv).unwrap();
            }
            let stats = cache.stats();
            let t = &stats.total;
            assert_eq!(t.compressed_tokens, 2 * 96);
            assert_eq!(t.pages_used, stats.pages_allocated - stats.pages_free);
            assert_eq!(
                t.allocated_bytes,
                t.header_bytes
                    + t.k_payload_bytes
                    + t.v_payload_bytes
                    + t.norm_bytes
                    + t.padding_bytes
            );
            assert_eq!(t.allocated_bytes, 6 * stats.sealed_page_bytes);
            let rate = sealed_bits_per_channel(&shape, &config).unwrap();
            assert!(
                (t.bits_per_channel - rate).abs() < 1e-12,
                "{rate} vs {}",
                t.bits_per_channel
            );
            eprintln!(
                "{:?}: {rate:.4} bits per channel all-in, {:.2}x vs fp16",
                config.codec, t.compression_vs_fp16
            );
        }
        // The default product mode on SmolLM2's shape: header + log-u8 norms + 3.5/3.0 codes.
        let rate = sealed_bits_per_channel(&shape, &KvConfig::turbo_study()).unwrap();
        let bytes = 64 + 112 + 3 * 32 * 28 + 112 + 3 * 32 * 24;
        assert_eq!(rate, bytes as f64 * 8.0 / (32 * 3 * 64 * 2) as f64);
        assert!(16.0 / rate >= 4.5);
        assert_eq!(KvConfig::turbo_study().codec, KvCodecKind::Turbo);
    }

    /// Scratch of a decode step does not grow with depth (beyond one page).
    #[test]
    fn scratch_does_not_grow_with_depth() {
        let shape = KvShape {
            n_layers: 1,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
        };
        for config in [
            KvConfig::fp16(),
            KvConfig::turbo_study(),
            KvConfig::turbo_qjl(),
            KvConfig::kivi(2),
        ] {
            let scratch_at = |depth: usize| {
                let mut cache = KvCache::new(shape, config.clone()).unwrap();
                let mut rng = SplitMix64::new(1);
                let kv = normals(&mut rng, depth * shape.kv_width(), 1.0);
                cache.append(0, &kv, &kv).unwrap();
                let q = normals(&mut rng, shape.q_width(), 1.0);
                let mut out = vec![0.0; q.len()];
                cache.attend(0, &q, depth - 1, &mut out).unwrap();
                (
                    cache.stats().scratch_bytes,
                    cache
                        .stats()
                        .fp16_page_bytes
                        .max(cache.stats().sealed_page_bytes),
                )
            };
            let (shallow, page) = scratch_at(512);
            let (deep, _) = scratch_at(4096);
            eprintln!(
                "{:?}: scratch {shallow} B at 512, {deep} B at 4096",
                config.codec
            );
            assert!(
                deep <= shallow + page,
                "{:?}: {deep} > {shallow} + {page}",
                config.codec
            );
        }
    }

    #[test]
    fn truncating_into_a_sealed_page_keeps_the_prefix() {
        let config = KvConfig {
            page_tokens: 8,
            window: 8,
            ..KvConfig::turbo_study()
        };
        let mut cache = KvCache::new(SHAPE, config).unwrap();
        let mut rng = SplitMix64::new(4);
        for layer in 0..2 {
            let kv = normals(&mut rng, 40 * SHAPE.kv_width(), 1.0);
            cache.append(layer, &kv, &kv).unwrap();
        }
        let (before_k, before_v) = cache.effective_kv(0);
        cache.truncate(13);
        assert_eq!(cache.len(), 13);
        let (after_k, after_v) = cache.effective_kv(0);
        let w = 13 * SHAPE.kv_width();
        // Tokens 8..13 came back from codes into fp16: equal up to f16 rounding.
        for (a, b) in after_k
            .iter()
            .zip(&before_k[..w])
            .chain(after_v.iter().zip(&before_v[..w]))
        {
            assert!((a - b).abs() <= 2e-3 * (1.0 + b.abs()), "{a} vs {b}");
        }
        let stats = cache.stats();
        assert_eq!(
            stats.total.pages_used,
            stats.pages_allocated - stats.pages_free
        );
        assert_eq!(stats.layers[0].compressed_tokens, 8);
    }
}
