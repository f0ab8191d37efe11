//! Causal GQA attention over a layer's pages with a streaming (online) softmax.
//!
//! Work is split into items of (query range, page range). An item walks its pages once, a tile
//! at a time — one fp16 page, or a run of up to [`TILE_TOKENS`] tokens of consecutive sealed
//! pages — and handles every KV head inside the tile: it scores every query head of the head's
//! group against the tile's keys (each key row is read once for the whole group), folds the
//! tile's scores into a running max/sum per query head, and accumulates the tile's values with
//! the resulting weights. A page holds all KV heads (head-major sections), so taking the heads
//! inside the tile reads each page whole and in one place, and the next tile can be prefetched
//! as whole pages. Items over the same queries but different page ranges are merged afterwards
//! (split-K), which is what keeps both cores busy during decode. Scratch per item is one tile of
//! scores per query head plus a few rows; nothing the size of the history is ever materialised.

use std::cell::RefCell;
use std::ops::Range;

use spinkv_kernels::team::{current_threads, for_each_mut};

use crate::codec::fp16::Fp16Layout;
use crate::codec::paged::MAX_RUN_PAGES;
use crate::codec::{ScoreRows, SealedCodec};
use crate::config::KvShape;
use crate::kernels::{
    axpy_f32, blocks_reaching, exp_sub_sum, exp_sub_sum_capped, kv_accumulate, kv_score, max_f32,
    prefetch, scale_f32,
};
use crate::pool::PagePool;
use crate::profile::{Laps, Phase, PhaseCounters};
use crate::table::{LayerTable, PageKind, Segment};

/// Below this many multiply-adds (`queries · heads · context · head_dim`) attention runs on the
/// calling thread: splitting costs more than it saves. Decode on a 9-head, head-dim-64 model
/// splits from depth 57: with the team's threads awake, splitting from there instead of from
/// depth 455 (2^18) measured B/A 0.90–1.07, median 0.97, over depths 64–512 (SmolLM2-135M F16,
/// turbo, 2 threads, AMD EPYC Zen 4).
pub(crate) const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Items per team thread when splitting prefill: equal-sized items, a multiple of the thread
/// count, several per thread to even out the causal mask's uneven query ranges and a core that
/// is busy elsewhere. Decode (one query, split over pages only) takes one item per thread:
/// every item prepares the query of every head and starts its prefetch cold, and at depth 512
/// two items per thread ran 1.80 ms of attention per token against 1.63 ms (AMD EPYC Zen 4,
/// SmolLM2-135M Q8_0, turbo; no difference measured at depth 7,680).
const ITEMS_PER_THREAD: usize = 2;

/// Tokens of sealed pages scanned as one tile: consecutive sealed pages are scored, folded
/// into the softmax and accumulated together (up to [`MAX_RUN_PAGES`] pages), so the per-call
/// costs — codec dispatch, scale decoding, kernel set-up, the softmax's max/exp/rescale per
/// query head — are paid per tile instead of per 32-token page. The page stays the unit of
/// allocation, identity and storage. 256 keeps the tile's token scales on the stack.
const TILE_TOKENS: usize = 256;

/// Scores (floats) of an fp16 tile's query heads and tokens, at most: fp16 pages are scanned
/// several to a tile when that keeps the tile's scores in L1 (decode: ~5 % less attention time
/// at depth 512, where half the context is the fp16 window), one at a time in prefill (a tile
/// of 256 tokens for 192 query heads made a prefill of 256 tokens 2–4 % slower).
const FP16_TILE_SCORES: usize = 4096;

/// Sealed pages per scan tile at `page_tokens` tokens a page (at least one).
fn tile_pages(page_tokens: usize) -> usize {
    (TILE_TOKENS / page_tokens.max(1)).clamp(1, MAX_RUN_PAGES)
}

/// Everything one `attend` call reads.
pub(crate) struct AttendJob<'a> {
    pub(crate) shape: KvShape,
    pub(crate) layer: usize,
    pub(crate) page_tokens: usize,
    pub(crate) table: &'a LayerTable,
    pub(crate) fp16: &'a Fp16Layout,
    pub(crate) fp16_pool: &'a PagePool,
    pub(crate) codec: Option<&'a dyn SealedCodec>,
    pub(crate) sealed_pool: &'a PagePool,
    /// `[n][n_heads][head_dim]`.
    pub(crate) q: &'a [f32],
    pub(crate) start: usize,
    pub(crate) n: usize,
    /// Sliding-window attention: a query at cache index `i` sees keys `i + 1 - window ..= i`
    /// only (`None`: every key up to `i`).
    pub(crate) window: Option<usize>,
    /// [`crate::KvConfig::sparse_v`]: compressed pages whose weights all fall below this
    /// fraction of a lower bound of the softmax sum (the sum so far, plus the sinks' share for
    /// an item without them) are not read (0: every page is).
    pub(crate) sparse_v: f32,
    pub(crate) profile: Option<&'a PhaseCounters>,
}

/// Running softmax state of `qh` query heads, one item's slice of the call's state buffer:
/// `m` the reference score (the max of the first scores seen; it moves only when a later score
/// rises more than [`MAX_HEADROOM`] above it), `l` sum of `exp(s - m)`, `acc` sum of
/// `exp(s - m)·v` in the plain domain and `acc_sealed` in the codec's domain (finished into
/// `acc` when the item ends).
struct Partial<'a> {
    m: &'a mut [f32],
    l: &'a mut [f32],
    acc: &'a mut [f32],
    acc_sealed: &'a mut [f32],
}

impl<'a> Partial<'a> {
    /// Floats of state for `qh` query heads.
    fn len(qh: usize, d: usize) -> usize {
        qh * (2 + 2 * d)
    }

    /// Splits `buf` (`len(qh, d)` floats) into a fresh state: no scores seen yet.
    fn init(buf: &'a mut [f32], qh: usize, d: usize) -> Self {
        let (m, rest) = buf.split_at_mut(qh);
        let (l, rest) = rest.split_at_mut(qh);
        let (acc, acc_sealed) = rest.split_at_mut(qh * d);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        acc.fill(0.0);
        acc_sealed.fill(0.0);
        Partial {
            m,
            l,
            acc,
            acc_sealed,
        }
    }

    /// A view of a state `init` laid out in `buf`.
    fn view(buf: &'a mut [f32], qh: usize, d: usize) -> Self {
        let (m, rest) = buf.split_at_mut(qh);
        let (l, rest) = rest.split_at_mut(qh);
        let (acc, acc_sealed) = rest.split_at_mut(qh * d);
        Partial {
            m,
            l,
            acc,
            acc_sealed,
        }
    }

    /// Folds `other` (same query heads, a disjoint set of keys) into `self`: the plain
    /// accumulators only, the codec's domain having been finished into them (`run_item_with`).
    fn merge_plain(&mut self, other: &Partial<'_>, d: usize) {
        for qh in 0..self.m.len() {
            let m = self.m[qh].max(other.m[qh]);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let a = (self.m[qh] - m).exp();
            let b = (other.m[qh] - m).exp();
            self.m[qh] = m;
            self.l[qh] = self.l[qh] * a + other.l[qh] * b;
            let rows = qh * d..(qh + 1) * d;
            let acc = &mut self.acc[rows.clone()];
            scale_f32(acc, a);
            axpy_f32(b, &other.acc[rows], acc);
        }
    }
}

/// One unit of parallel work: every KV head, for `queries` against the keys of `segments`.
/// Its state is one [`Partial`] per KV head, in head order.
struct Item {
    queries: Range<usize>,
    segments: Range<usize>,
}

thread_local! {
    /// The split-K states of `attend` on its calling thread, kept for the next call (the
    /// largest so far stays: a 256-query prefill's on SmolLM2-135M is ~1.2 MB, as large as the
    /// items' own scratch).
    static STATES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-thread scratch of `run_item` (queries, prepared state, a page of scores), reused
    /// across calls so the decode loop allocates nothing per page or per item.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs the attention; returns the scratch bytes it used (all threads together).
///
/// `value_reads` is the layer's record of the last decode split (per segment: how many KV
/// heads' value blocks were read): a decode split weighs each sealed page by it and writes
/// this call's counts over it. A call of several queries (a prefill) clears it, so a turn's
/// decode starts from an empty record whether the session ran on or was restored before it,
/// and splits alike in both; a decode call on one thread leaves it alone.
pub(crate) fn attend(job: &AttendJob<'_>, value_reads: &mut Vec<u8>, out: &mut [f32]) -> usize {
    let shape = job.shape;
    let d = shape.head_dim;
    let group = shape.group_size();
    let n_segments = job.table.segment_count();
    let context = job.start + job.n;
    let work = job.n * shape.n_heads * context * d;
    let threads = current_threads();
    let parallel = threads > 1 && work >= PARALLEL_MIN_WORK;

    let items_per_thread = if job.n == 1 { 1 } else { ITEMS_PER_THREAD };
    let target = if parallel {
        items_per_thread * threads
    } else {
        1
    };
    if job.n > 1 {
        value_reads.clear();
    }
    let decode_split = parallel && job.n == 1;
    let n_kv = shape.n_kv_heads.min(u8::MAX as usize) as u8;
    let reads = if decode_split {
        // Pages this record has not seen yet count as read by every head.
        value_reads.resize(n_segments, n_kv);
        Some(&value_reads[..])
    } else {
        None
    };
    let costs = SegmentCosts {
        table: job.table,
        page_tokens: job.page_tokens,
        n_kv_heads: shape.n_kv_heads,
        reads,
    };
    let items = plan_items(job.n, n_segments, |chunks| costs.bounds(chunks), target);
    debug_assert_eq!(
        items.last().map_or(n_segments, |it| it.segments.end),
        n_segments
    );
    // Every item's state at the same stride (query ranges differ by at most one query).
    let max_qh = items.iter().map(|it| it.queries.len()).max().unwrap_or(0) * group;
    let head_stride = Partial::len(max_qh, d);
    let stride = shape.n_kv_heads * head_stride;
    // Reused across calls: every item initialises its own state. A fresh zeroed buffer per
    // call cost ~1.5 % of decode attention at depth 7,680 (in-process B/A 0.989, 0.968,
    // 0.981, 0.990 with the reuse; turbo, 2 threads, AMD EPYC Zen 4).
    let mut states_buf = STATES.with(|cell| cell.take());
    if states_buf.len() < items.len() * stride {
        states_buf.resize(items.len() * stride, 0.0);
    }
    let states = &mut states_buf[..items.len() * stride];
    // Each item's slice of the value-read record (a decode split's items cover the segments
    // in order, end to end).
    let mut item_reads: Vec<Option<&mut [u8]>> = Vec::with_capacity(items.len());
    if decode_split {
        let mut rest = &mut value_reads[..];
        for item in &items {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(item.segments.len());
            item_reads.push(Some(mine));
            rest = tail;
        }
    } else {
        item_reads.resize_with(items.len(), || None);
    }
    // Each item with the scratch bytes it used, costliest (latest queries) first.
    type Work<'i, 's, 'r> = (&'i Item, &'s mut [f32], usize, Option<&'r mut [u8]>);
    let mut work: Vec<Work<'_, '_, '_>> = items
        .iter()
        .zip(states.chunks_mut(stride))
        .zip(item_reads)
        .map(|((item, state), reads)| (item, state, 0, reads))
        .rev()
        .collect();
    let run = |(item, state, used, reads): &mut Work<'_, '_, '_>| {
        *used = run_item(job, item, state, head_stride, reads.as_deref_mut())
    };
    if parallel {
        for_each_mut(&mut work, run);
    } else {
        work.iter_mut().for_each(run);
    }
    let per_thread = work.iter().map(|w| w.2).max().unwrap_or(0);
    drop(work);
    // Item scratch is per thread (reused across items and calls), states are per item.
    let scratch = per_thread * items.len().min(threads) + 4 * states.len();

    // Merge split-K partials in order and write the outputs.
    let mut i = 0;
    while i < items.len() {
        let queries = items[i].queries.clone();
        let mut j = i + 1;
        while j < items.len() && items[j].queries == queries {
            j += 1;
        }
        let n_qh = queries.len() * group;
        let (first, rest) = states[i * stride..j * stride].split_at_mut(stride);
        for kv_head in 0..shape.n_kv_heads {
            let head = kv_head * head_stride..(kv_head + 1) * head_stride;
            let mut total = Partial::view(&mut first[head.clone()], n_qh, d);
            for other in rest.chunks_mut(stride) {
                total.merge_plain(&Partial::view(&mut other[head.clone()], n_qh, d), d);
            }
            for (qi, query) in queries.clone().enumerate() {
                for h in 0..group {
                    let qh = qi * group + h;
                    let dst = &mut out[(query * shape.n_heads + kv_head * group + h) * d..][..d];
                    let l = total.l[qh];
                    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
                    for (o, a) in dst.iter_mut().zip(&total.acc[qh * d..(qh + 1) * d]) {
                        *o = a * inv;
                    }
                }
            }
        }
        i = j;
    }
    STATES.with(|cell| cell.replace(states_buf));
    scratch
}

/// Splits the work into about `target` items: query ranges first (prefill has plenty), then
/// page ranges (decode has one query) of about equal total cost (`bounds(chunks)`: `chunks + 1`
/// ascending segment bounds, [`SegmentCosts::bounds`]). Items of one query range are adjacent
/// and in page order, as `attend`'s merge expects.
fn plan_items(
    n: usize,
    n_segments: usize,
    bounds: impl FnOnce(usize) -> Vec<usize>,
    target: usize,
) -> Vec<Item> {
    let target = target.max(1);
    let query_chunks = target.min(n).max(1);
    let segment_chunks = target.div_ceil(query_chunks).min(n_segments).max(1);
    let bounds = bounds(segment_chunks);
    let mut items = Vec::with_capacity(query_chunks * segment_chunks);
    for qc in 0..query_chunks {
        let queries = qc * n / query_chunks..(qc + 1) * n / query_chunks;
        for pair in bounds.windows(2) {
            items.push(Item {
                queries: queries.clone(),
                segments: pair[0]..pair[1],
            });
        }
    }
    items
}

/// Split costs per token and KV head, in units of 0.2 ns: of a sealed page's keys (scored, with
/// the softmax), of a sealed page's value block when it is read, of an fp16 page (keys, softmax
/// and values).
///
/// A decode split gives each thread pages of equal total cost. Sparse values read some layers'
/// older pages' values hardly at all and others' nearly all (depth 7,680 on the licence mix:
/// layers 0–11 read 2.5–3.0 of 3 heads' blocks a page, layers 12–29 0.02–0.5 in the first half
/// and 0.5–2.4 in the second), so a page's cost follows what the layer's last decode split read
/// of it. What a page costs against an fp16 page depends on the kernels: see [`split_costs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitCosts {
    pub(crate) sealed_key: usize,
    pub(crate) sealed_value: usize,
    pub(crate) fp16: usize,
}

/// The costs where the AVX-512 kernels run: a fit of `time = key · sealed + value · read + fp16
/// · fp16 + const` (per head-token) to the median time of each layer's two items over 256
/// decode steps, split by this model (SmolLM2-135M, turbo, 2 threads, AMD EPYC Zen 4, licence
/// mix): 5.2, 4.2 and 32 ns at depth 7,680; 6.6, 4.1 and 38 ns at 2,048; here 5.6, 4.2 and 35
/// (fp16 30 since: see the end). In-process A/B of decode attention, these costs against key
/// 4, value 4.4, fp16 32 ns (an earlier fit, made while one split served every layer): at 7,680
/// licence mix 0.977, Python code 0.957; at 2,048 0.944, 0.952. That one against a single cost
/// per sealed token (and an fp16 token at 3–6 of them, by depth): at 7,680 0.970, 0.968, bash
/// manual 0.992; at 2,048 0.921, 0.938. A key cost of 6.6 ns read 1.031, 0.997, 0.885, 1.005
/// against these: within the noise. Old and new binaries in turns read less than these A/Bs
/// add up to (docs/PERFORMANCE.md). The fp16 cost came down from 35 to 30 ns with the tiled
/// fp16 key scan (`kv_score::avx512`): attention B/A 0.951, 0.953, 0.961, 0.938, 0.985 at
/// depth 2,048 (A/A 0.970, 1.029), 0.95 and 1.01 at 512, 1.006, 0.961, 1.04, 1.00 at 7,680.
const AVX512_COSTS: SplitCosts = SplitCosts {
    sealed_key: 28,
    sealed_value: 21,
    fp16: 150,
};

/// The costs where the best kernels are AVX2's: a sealed page's keys cost more against an fp16
/// page than on AVX-512 (the integer key scan has no VBMI cut and no VNNI sums there). With the
/// AVX-512 costs, on a 2-core AMD EPYC Zen 3 at depth 7,680, the item of the older pages took
/// 293 µs a layer and the one ending in the fp16 window 250 (mean over 256 decode steps); with
/// a key cost of 36, 40, 44 the two read 272 / 255, 266 / 257, 251 / 246 µs. In-process A/B of
/// decode (SmolLM2-135M F16, turbo, 2 threads, licence mix), attention B/A with a key cost of
/// 48 against 28: 0.868, 0.959 at 7,680; 0.944, 0.866 at 2,048; 1.010, 0.977 at 4,096 (44:
/// 0.938, 0.958, 0.925; 56: 0.960, 0.945; a value cost of 14: 0.970, 0.980; key 40 and fp16
/// 140: 0.984, 1.045 — all at 7,680).
const AVX2_COSTS: SplitCosts = SplitCosts {
    sealed_key: 48,
    sealed_value: 21,
    fp16: 175,
};

/// This machine's split costs, by the best ISA its CPU has rather than the active one: every
/// ISA a machine runs then splits a decode step alike, so their logits stay bit-identical
/// (tests/test_isa_parity.py). CPUs whose best is not x86 keep the AVX-512 fit (unmeasured).
pub(crate) fn split_costs() -> SplitCosts {
    match spinkv_kernels::detected_isa() {
        spinkv_kernels::Isa::Avx2 => AVX2_COSTS,
        _ => AVX512_COSTS,
    }
}

/// What scanning each segment of a layer costs: the fp16 pages by their tokens, the sealed
/// pages by their keys and by the value blocks `reads` (per segment, the layer's last decode
/// split's record) says were read of each (every KV head's without a record).
pub(crate) struct SegmentCosts<'a> {
    pub(crate) table: &'a LayerTable,
    pub(crate) page_tokens: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) reads: Option<&'a [u8]>,
}

impl SegmentCosts<'_> {
    /// Each segment's cost, in segment order.
    pub(crate) fn each(&self) -> impl Iterator<Item = usize> + '_ {
        let (table, p, heads) = (self.table, self.page_tokens, self.n_kv_heads);
        let costs = split_costs();
        let first = table.sink.pages.len();
        let key = p * costs.sealed_key * heads;
        let sealed = (first..first + table.sealed.len())
            .map(move |index| key + p * costs.sealed_value * self.read(index));
        fp16_costs(&table.sink, p, heads, costs.fp16)
            .chain(sealed)
            .chain(fp16_costs(&table.window, p, heads, costs.fp16))
    }

    /// KV heads whose value blocks count as read of segment `index`.
    fn read(&self, index: usize) -> usize {
        self.reads
            .and_then(|r| r.get(index))
            .map_or(self.n_kv_heads, |&r| r as usize)
    }

    /// The sum of [`SegmentCosts::each`], the sealed pages' without walking them one by one.
    pub(crate) fn total(&self) -> usize {
        let (table, p, heads) = (self.table, self.page_tokens, self.n_kv_heads);
        let costs = split_costs();
        let fp16 = |run: &crate::table::TokenRun| costs.fp16 * heads * run.tokens;
        let (first, n_sealed) = (table.sink.pages.len(), table.sealed.len());
        let recorded = self.reads.map_or(&[][..], |r| {
            &r[first.min(r.len())..(first + n_sealed).min(r.len())]
        });
        let reads = recorded.iter().map(|&r| r as usize).sum::<usize>()
            + (n_sealed - recorded.len()) * heads;
        fp16(&table.sink)
            + n_sealed * p * costs.sealed_key * heads
            + p * costs.sealed_value * reads
            + fp16(&table.window)
    }

    /// `chunks + 1` ascending bounds from 0 to the segment count: chunk `c` ends at the first
    /// segment whose running cost reaches `c + 1` `chunks`-ths of the total (by count when every
    /// cost is 0). Worked out straight from the table and the record: building the costs as
    /// runs first (a run per sealed page once the record tells pages apart) took ~1.5 µs more
    /// a decode call at depth 7,680 (2.2–2.8 µs of planning against 0.8; SmolLM2-135M, turbo,
    /// 2 threads, AMD EPYC Zen 4).
    pub(crate) fn bounds(&self, chunks: usize) -> Vec<usize> {
        let n = self.table.segment_count();
        if chunks == 1 {
            // Prefill and single-thread calls: nothing to balance, so no cost is read.
            return vec![0, n];
        }
        walk_bounds(self.each(), n, self.total(), chunks)
    }
}

/// The costs of a run of fp16 pages, by their tokens (`head_cost` a token and KV head).
fn fp16_costs(
    run: &crate::table::TokenRun,
    page_tokens: usize,
    n_kv_heads: usize,
    head_cost: usize,
) -> impl Iterator<Item = usize> + '_ {
    (0..run.pages.len()).map(move |page| head_cost * n_kv_heads * run.count_of(page, page_tokens))
}

/// [`SegmentCosts::bounds`] of `n` segments costing `costs` (in order), `total` together.
fn walk_bounds(
    costs: impl Iterator<Item = usize>,
    n: usize,
    total: usize,
    chunks: usize,
) -> Vec<usize> {
    let mut bounds = vec![0; chunks + 1];
    bounds[chunks] = n;
    if total == 0 {
        for (c, bound) in bounds.iter_mut().enumerate() {
            *bound = c * n / chunks;
        }
        return bounds;
    }
    let (mut c, mut running) = (1, 0);
    for (index, cost) in costs.enumerate() {
        if c >= chunks {
            break;
        }
        running += cost;
        while c < chunks && running * chunks >= c * total {
            bounds[c] = index + 1;
            c += 1;
        }
    }
    bounds
}

/// One item's online softmax into `state` (one [`Partial`] of at least `Partial::len` floats
/// every `head_stride` floats, one per KV head); returns the scratch bytes it used.
fn run_item(
    job: &AttendJob<'_>,
    item: &Item,
    state: &mut [f32],
    head_stride: usize,
    reads: Option<&mut [u8]>,
) -> usize {
    SCRATCH.with(|cell| {
        // A re-entrant call on this thread (none today) would get its own buffer.
        match cell.try_borrow_mut() {
            Ok(mut scratch) => run_item_with(job, item, state, head_stride, reads, &mut scratch),
            Err(_) => run_item_with(job, item, state, head_stride, reads, &mut Vec::new()),
        }
    })
}

fn run_item_with(
    job: &AttendJob<'_>,
    item: &Item,
    state: &mut [f32],
    head_stride: usize,
    mut reads: Option<&mut [u8]>,
    scratch: &mut Vec<f32>,
) -> usize {
    let shape = job.shape;
    let (d, group, page_tokens) = (shape.head_dim, shape.group_size(), job.page_tokens);
    let n_kv_heads = shape.n_kv_heads;
    let n_q = item.queries.len();
    let n_qh = n_q * group;
    let first_pos = job.start + item.queries.start;
    let scale = 1.0 / (d as f32).sqrt();
    let mut laps = Laps::start(job.profile);
    if let Some(reads) = reads.as_deref_mut() {
        reads.fill(0);
    }
    // Nothing another call queued on this thread is wanted here.
    prefetch::clear();
    let state_len = Partial::len(n_qh, d);
    for head_state in state.chunks_mut(head_stride).take(n_kv_heads) {
        Partial::init(&mut head_state[..state_len], n_qh, d);
    }

    let sealed = job.codec.filter(|_| !job.table.sealed.is_empty());
    let prepared_len = sealed.map_or(0, |codec| codec.prepared_len(n_qh));
    let tile_pages = if sealed.is_some() {
        tile_pages(page_tokens)
    } else {
        1
    };
    let tile_tokens = tile_pages * page_tokens;
    let fp16_tile_pages = (FP16_TILE_SCORES / (n_qh * page_tokens).max(1)).clamp(1, tile_pages);
    let (queries_len, all_prepared_len) = (n_qh * d, prepared_len * n_kv_heads);
    let sparse_len = if job.sparse_v > 0.0 {
        (n_kv_heads + 1) * n_qh
    } else {
        0
    };
    let needed = n_kv_heads * queries_len + all_prepared_len + sparse_len + n_qh * tile_tokens;
    if scratch.len() < needed {
        scratch.resize(needed, 0.0);
    }
    let (all_queries, rest) = scratch[..needed].split_at_mut(n_kv_heads * queries_len);
    let (all_prepared, rest) = rest.split_at_mut(all_prepared_len);
    let (sparse, scores) = rest.split_at_mut(sparse_len);
    // Sparse values: each KV head's sink bound (`[kv head][query head]`), and a tile's limits.
    let (all_sink_lse, limits) = sparse.split_at_mut(sparse_len.saturating_sub(n_qh));

    // Pre-scaled queries of each KV head's group, `[kv head][query][head in group][d]`, and
    // what the codec prepares from them.
    for kv_head in 0..n_kv_heads {
        let queries = &mut all_queries[kv_head * queries_len..][..queries_len];
        for (qi, query) in item.queries.clone().enumerate() {
            let src = &job.q[(query * shape.n_heads + kv_head * group) * d..][..group * d];
            let dst = &mut queries[qi * group * d..(qi + 1) * group * d];
            dst.copy_from_slice(src);
            scale_f32(dst, scale);
        }
        if let Some(codec) = sealed {
            let prepared = &mut all_prepared[kv_head * prepared_len..][..prepared_len];
            codec.prepare(job.layer, kv_head, queries, prepared);
        }
    }
    let last_pos = first_pos + n_q.max(1) - 1;
    if job.sparse_v > 0.0 {
        all_sink_lse.fill(f32::NEG_INFINITY);
        sink_bound(job, item, all_queries, scores, tile_tokens, all_sink_lse);
    }
    laps.lap(Phase::QueryTransform);

    let end = item.segments.end;
    // The first segment not prefetched yet.
    let mut prefetched = item.segments.start;
    let mut pages: [&[u8]; MAX_RUN_PAGES] = [&[]; MAX_RUN_PAGES];
    let mut index = item.segments.start;
    while index < end {
        let seg = job.table.segment(index, page_tokens);
        if seg.first > last_pos || n_q == 0 {
            break;
        }
        // A page wholly before every query's window carries no weight.
        if let Some(window) = job.window {
            if seg.first + seg.count + window <= first_pos + 1 {
                index += 1;
                continue;
            }
        }
        // The tile: this page and the pages of its kind that follow it, consecutive in tokens
        // after full pages, up to the tile's length and the last query.
        let mut tile = seg;
        let mut n_pages = 1;
        let (pool, max_pages) = match seg.kind {
            PageKind::Fp16 => (job.fp16_pool, fp16_tile_pages),
            PageKind::Sealed => (job.sealed_pool, tile_pages),
        };
        pages[0] = pool.page(seg.page);
        while n_pages < max_pages && index + n_pages < end {
            let next = job.table.segment(index + n_pages, page_tokens);
            if next.kind != seg.kind
                || tile.count != n_pages * page_tokens
                || next.first != tile.first + tile.count
                || next.first > last_pos
            {
                break;
            }
            pages[n_pages] = pool.page(next.page);
            tile.count += next.count;
            n_pages += 1;
        }
        // Tokens of this tile any query of the item may see.
        let visible = tile.count.min(last_pos - tile.first + 1);
        // Loads run a tile's worth of pages past this tile: the scan of a tile, every head,
        // outlasts a DRAM round trip, and the next tile's pages wait in L2. The hints are
        // queued and spread over the tile's key and value scans: the sealed scan kernels
        // issue a few lines per block of rows (`prefetch::pump`), and after each scan the
        // queue is brought down to the share of the scans still to come (for kernels that do
        // not pump). Issued at once, they fill the CPU's miss queue and stall it.
        let ahead = (index + n_pages + tile_pages).min(end);
        prefetch_segments(job, &mut prefetched, ahead);
        let (tile_lines, scans) = (prefetch::queued_lines(), 2 * n_kv_heads);
        let mut scans_left = scans;
        let mut scan_done = || {
            scans_left -= 1;
            prefetch::pump_to(tile_lines * scans_left / scans);
        };
        let rows = ScoreRows {
            n_qh,
            visible,
            stride: tile_tokens,
        };
        for kv_head in 0..n_kv_heads {
            let queries = &all_queries[kv_head * queries_len..][..queries_len];
            let prepared = &all_prepared[kv_head * prepared_len..][..prepared_len];
            let mut state =
                Partial::view(&mut state[kv_head * head_stride..][..state_len], n_qh, d);
            match seg.kind {
                PageKind::Fp16 => {
                    for (first, rows, page) in page_rows(&pages[..n_pages], page_tokens, visible) {
                        let keys = &job.fp16.keys(page, kv_head)[..rows * d];
                        kv_score::score_f16(keys, d, queries, &mut scores[first..], tile_tokens);
                    }
                }
                PageKind::Sealed => {
                    let codec = job.codec.expect("sealed pages imply a codec");
                    codec.score_pages(&pages[..n_pages], kv_head, prepared, rows, scores);
                }
            }
            scan_done();
            laps.lap(Phase::KeyScan);
            softmax_step(
                &tile,
                first_pos,
                job.window,
                group,
                tile_tokens,
                visible,
                scores,
                &mut state,
                d,
            );
            laps.lap(Phase::Softmax);
            match seg.kind {
                PageKind::Fp16 => {
                    for (first, rows, page) in page_rows(&pages[..n_pages], page_tokens, visible) {
                        let values = &job.fp16.values(page, kv_head)[..rows * d];
                        let weights = &scores[first..];
                        kv_accumulate::accumulate_f16(values, d, weights, tile_tokens, state.acc);
                    }
                    if let Some(reads) = reads.as_deref_mut() {
                        let at = index - item.segments.start;
                        for r in &mut reads[at..at + n_pages] {
                            *r = r.saturating_add(1);
                        }
                    }
                }
                PageKind::Sealed => {
                    let codec = job.codec.expect("sealed pages imply a codec");
                    let mut kept: [&[u8]; MAX_RUN_PAGES] = [&[]; MAX_RUN_PAGES];
                    let mut read_mask = u64::MAX;
                    let (read, rows) = if job.sparse_v > 0.0 && visible == tile.count {
                        let sink_lse = &all_sink_lse[kv_head * n_qh..][..n_qh];
                        for (qh, limit) in limits.iter_mut().enumerate() {
                            // The sinks' scores in the units of this tile's weights.
                            let sinks = if sink_lse[qh] == f32::NEG_INFINITY {
                                0.0
                            } else {
                                (sink_lse[qh] - state.m[qh]).exp()
                            };
                            *limit = job.sparse_v * (state.l[qh] + sinks);
                        }
                        read_mask = keep_weighty_pages(
                            &pages[..n_pages],
                            page_tokens,
                            limits,
                            scores,
                            tile_tokens,
                            &mut kept,
                        );
                        let n = read_mask.count_ones() as usize;
                        let rows = ScoreRows {
                            visible: n * page_tokens,
                            ..rows
                        };
                        (&kept[..n], rows)
                    } else {
                        (&pages[..n_pages], rows)
                    };
                    if let Some(counters) = job.profile {
                        counters.count_value_blocks(read.len(), n_pages - read.len());
                    }
                    if let Some(reads) = reads.as_deref_mut() {
                        let at = index - item.segments.start;
                        for (i, r) in reads[at..at + n_pages].iter_mut().enumerate() {
                            *r = r.saturating_add((read_mask >> i & 1) as u8);
                        }
                    }
                    if !read.is_empty() {
                        let acc = &mut *state.acc_sealed;
                        codec.accumulate_pages(read, kv_head, scores, rows, acc);
                    }
                }
            }
            scan_done();
            laps.lap(Phase::ValueScan);
        }
        index += n_pages;
    }
    // The codec's domain finished here, on the item's thread: it is linear, so finishing each
    // item's sum is finishing their total, and the merge moves half the floats and runs
    // vectorised (decode attention at depth 7,680 B/A 0.981, 0.987 in-process against a
    // merge of both domains and one finish after it; turbo, 2 threads, AMD EPYC Zen 4).
    if let Some(codec) = sealed {
        for (kv_head, head_state) in state.chunks_mut(head_stride).take(n_kv_heads).enumerate() {
            let state = Partial::view(&mut head_state[..state_len], n_qh, d);
            codec.finish(job.layer, kv_head, state.acc_sealed);
            axpy_f32(1.0, state.acc_sealed, state.acc);
        }
        laps.lap(Phase::ValueFinish);
    }
    4 * needed
}

/// Copies `len` weights from `from` to the lower index `to` (`to + len <= from`: the ranges
/// never overlap) in 16-float pieces the compiler keeps in registers. `copy_within` called
/// `memmove` for every page and query head moved: in-process A/B of decode attention at depth
/// 7,680 with 32-float copies inline, B/A 0.986, 0.968, 0.962 (SmolLM2-135M, turbo, 2 threads,
/// AMD EPYC Zen 4).
fn move_weights(weights: &mut [f32], from: usize, to: usize, len: usize) {
    const PIECE: usize = 16;
    debug_assert!(to + len <= from);
    let (low, high) = weights.split_at_mut(from);
    let (dst, src) = (&mut low[to..to + len], &high[..len]);
    let mut dst_pieces = dst.chunks_exact_mut(PIECE);
    let mut src_pieces = src.chunks_exact(PIECE);
    for (d, s) in (&mut dst_pieces).zip(&mut src_pieces) {
        let piece: [f32; PIECE] = s.try_into().expect("a whole piece");
        d.copy_from_slice(&piece);
    }
    for (d, s) in dst_pieces
        .into_remainder()
        .iter_mut()
        .zip(src_pieces.remainder())
    {
        *d = *s;
    }
}

/// Sparse values: copies into `kept` the pages of a tile (all of their tokens visible) that
/// some query head gives a weight of at least `limits[head]`, moves their weights to the front
/// of each head's row of `weights` (`stride` apart), and returns which they are (bit `i`: page
/// `i`).
///
/// A limit is `sparse_v · (l + sinks)`, in the units of the weights: `l`, the softmax sum with
/// this tile in it, and the sinks' share (for an item that does not hold them, [`sink_bound`])
/// count disjoint tokens, so the final sum is at least their total, whatever later tiles or
/// the other threads' items add. A weight below the limit ends as a probability below
/// `sparse_v`.
fn keep_weighty_pages<'p>(
    pages: &[&'p [u8]],
    page_tokens: usize,
    limits: &[f32],
    weights: &mut [f32],
    stride: usize,
    kept: &mut [&'p [u8]; MAX_RUN_PAGES],
) -> u64 {
    let (mut n, mut read) = (0, 0u64);
    // One call for the tile's pages and heads: a max per page and head, dispatched each time,
    // cost ~2 % of decode attention at depth 7,680 (in-process B/A 0.992, 0.973, 0.992, 0.967
    // on three texts; turbo, 2 threads, AMD EPYC Zen 4).
    let reaching = blocks_reaching(weights, stride, page_tokens, pages.len(), limits);
    for (i, page) in pages.iter().enumerate() {
        let first = i * page_tokens;
        let weighty = reaching >> i & 1 == 1;
        if !weighty {
            continue;
        }
        if n != i {
            for head in 0..limits.len() {
                let row = head * stride;
                move_weights(weights, row + first, row + n * page_tokens, page_tokens);
            }
        }
        kept[n] = page;
        n += 1;
        read |= 1 << i;
    }
    read
}

/// Sparse values' share of the sinks for an item that does not hold the sink run: writes
/// `ln Σ e^score` over the sink tokens each query head may see into `lse` (`[kv head][query
/// head]`; left as it is where there are none), scored in `scores` (`stride` floats a head).
///
/// Without it, an item over the later pages of a decode split judges its pages against its own
/// sum only. The sinks often hold most of a head's weight, so that item kept ~78 % of its
/// value blocks where the item with the sinks kept ~35 % (SmolLM2-135M, depth 7,680).
fn sink_bound(
    job: &AttendJob<'_>,
    item: &Item,
    all_queries: &[f32],
    scores: &mut [f32],
    stride: usize,
    lse: &mut [f32],
) {
    let (d, page_tokens) = (job.shape.head_dim, job.page_tokens);
    let n_sink_pages = job.table.sink.pages.len();
    let group = job.shape.group_size();
    let n_qh = item.queries.len() * group;
    // Nothing to add without queries or sinks, for the item holding the sinks, or under a
    // sliding window (which may leave them out of sight).
    if n_qh == 0 || n_sink_pages == 0 || item.segments.start < n_sink_pages || job.window.is_some()
    {
        return;
    }
    // The sink pages whose scores fit one tile's rows.
    let (mut pages, mut tokens) = (0, 0);
    while pages < n_sink_pages {
        let count = job.table.segment(pages, page_tokens).count;
        if tokens + count > stride {
            break;
        }
        (pages, tokens) = (pages + 1, tokens + count);
    }
    let first_pos = job.start + item.queries.start;
    for (kv_head, lse) in lse.chunks_mut(n_qh).enumerate() {
        let queries = &all_queries[kv_head * n_qh * d..][..n_qh * d];
        let mut first = 0;
        for index in 0..pages {
            let seg = job.table.segment(index, page_tokens);
            let keys = &job.fp16.keys(job.fp16_pool.page(seg.page), kv_head)[..seg.count * d];
            kv_score::score_f16(keys, d, queries, &mut scores[first..], stride);
            first += seg.count;
        }
        for (qh, lse) in lse.iter_mut().enumerate() {
            // The sink tokens this query head's position may see.
            let seen = tokens.min(first_pos + qh / group + 1);
            let row = &scores[qh * stride..][..seen];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if m.is_finite() {
                *lse = m + row.iter().map(|s| (s - m).exp()).sum::<f32>().ln();
            }
        }
    }
}

/// The tile's pages that hold visible tokens: the tile index of each one's first token, how
/// many of its tokens are visible, and the page.
fn page_rows<'a, 'p>(
    pages: &'a [&'p [u8]],
    page_tokens: usize,
    visible: usize,
) -> impl Iterator<Item = (usize, usize, &'p [u8])> + 'a {
    pages
        .iter()
        .enumerate()
        .map(move |(i, page)| (i * page_tokens, page))
        .take_while(move |(first, _)| *first < visible)
        .map(move |(first, page)| (first, (visible - first).min(page_tokens), *page))
}

/// Queues the pages of the segments from `*next` up to `stop` for prefetching, every head of
/// them (the scan reads them whole), and moves `*next` past them.
fn prefetch_segments(job: &AttendJob<'_>, next: &mut usize, stop: usize) {
    while *next < stop {
        let seg = job.table.segment(*next, job.page_tokens);
        let page = match seg.kind {
            PageKind::Fp16 => job.fp16_pool.page(seg.page),
            PageKind::Sealed => job.sealed_pool.page(seg.page),
        };
        prefetch::enqueue(page);
        *next += 1;
    }
}

/// How far a score may rise above a query head's reference `m` before the reference moves to
/// it: weights `exp(s - m)` up to e^20 (~5·10^8) keep every sum far inside f32 (a softmax sum
/// of 10^6 tokens stays below 10^15), and a tile under it needs no max pass of its own: the
/// check rides along the exponentials (`exp_sub_sum_capped`). Softmax is the same for any
/// reference; only the rounding differs. In-process A/B of decode attention at depth 7,680
/// against a max pass per tile (turbo, 2 threads, AMD EPYC Zen 4): licence mix 0.960, 0.963;
/// Python code 0.974.
const MAX_HEADROOM: f32 = 20.0;

/// Folds one tile's raw scores into the running state and turns them into the weights of the
/// tile's values: `exp(s - m)` for tokens the query may see, 0 for the causally masked.
#[allow(clippy::too_many_arguments)]
fn softmax_step(
    seg: &Segment,
    first_pos: usize,
    window: Option<usize>,
    group: usize,
    stride: usize,
    visible: usize,
    scores: &mut [f32],
    state: &mut Partial<'_>,
    d: usize,
) {
    let n_qh = state.m.len();
    for qh in 0..n_qh {
        let pos = first_pos + qh / group;
        let limit = if pos < seg.first {
            0
        } else {
            (pos - seg.first + 1).min(visible)
        };
        // First key of the page inside the query's sliding window.
        let low = window.map_or(0, |w| (pos + 1).saturating_sub(w).saturating_sub(seg.first));
        let s = &mut scores[qh * stride..qh * stride + visible];
        if limit <= low {
            s.fill(0.0);
            continue;
        }
        s[..low].fill(0.0);
        let s = &mut s[low..];
        let limit = limit - low;
        let m_ref = state.m[qh];
        // The reference stays while the tile's scores stay under it plus the headroom.
        let (done, sum) = if m_ref.is_finite() {
            exp_sub_sum_capped(&mut s[..limit], m_ref, m_ref + MAX_HEADROOM)
        } else {
            (0, 0.0)
        };
        state.l[qh] += sum;
        if done < limit {
            // A score above the headroom: the rest's max becomes the reference, and what is
            // already summed (state and this tile's prefix) moves to it.
            let m_new = m_ref.max(max_f32(&s[done..limit]));
            if m_ref.is_finite() {
                let rescale = (m_ref - m_new).exp();
                state.l[qh] *= rescale;
                scale_f32(&mut state.acc[qh * d..(qh + 1) * d], rescale);
                scale_f32(&mut state.acc_sealed[qh * d..(qh + 1) * d], rescale);
                scale_f32(&mut s[..done], rescale);
            }
            state.m[qh] = m_new;
            state.l[qh] += exp_sub_sum(&mut s[done..limit], m_new);
        }
        s[limit..].fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_weights_copies_one_range_down_and_nothing_else() {
        for len in [1, 5, 16, 17, 32, 33, 64] {
            for (from, to) in [(len, 0), (2 * len + 3, len + 1), (3 * len, 0)] {
                let original: Vec<f32> = (0..from + len + 4).map(|i| i as f32).collect();
                let mut want = original.clone();
                want.copy_within(from..from + len, to);
                let mut got = original;
                move_weights(&mut got, from, to, len);
                assert_eq!(got, want, "len {len}, from {from}, to {to}");
            }
        }
    }

    /// Scores that rise far above the reference after the first tile (inside a tile's later
    /// block, and at a later tile's start) or fall far below it: every query's output is the
    /// exact softmax's.
    #[test]
    fn a_reference_left_far_behind_moves_and_keeps_the_softmax() {
        use crate::config::{KvConfig, KvShape};
        use crate::KvCache;
        let d = 8;
        let shape = KvShape {
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: d,
        };
        let config = KvConfig {
            page_tokens: 128,
            ..KvConfig::fp16()
        };
        let n = 400;
        let spiky = |t: usize| match t {
            200 => 40.0,
            300 => 80.0,
            _ => ((t * 37) % 23) as f32 * 0.25,
        };
        let falling = |t: usize| 60.0 - t as f32 * 0.25;
        for score in [&spiky as &dyn Fn(usize) -> f32, &falling] {
            let mut cache = KvCache::new(shape, config.clone()).unwrap();
            // Key t's first coordinate is its score (f16-exact); values f16-exact too.
            let keys: Vec<Vec<f32>> = (0..n)
                .map(|t| {
                    (0..d)
                        .map(|i| if i == 0 { score(t) } else { 0.0 })
                        .collect()
                })
                .collect();
            let values: Vec<Vec<f32>> = (0..n)
                .map(|t| {
                    (0..d)
                        .map(|i| ((t * 7 + i * 3) % 17) as f32 / 8.0 - 1.0)
                        .collect()
                })
                .collect();
            cache.append(0, &keys.concat(), &values.concat()).unwrap();
            let q: Vec<f32> = (0..d)
                .map(|i| if i == 0 { (d as f32).sqrt() } else { 0.0 })
                .collect();
            let queries = q.repeat(n);
            let mut out = vec![0.0; n * d];
            cache.attend(0, &queries, 0, &mut out).unwrap();
            for t in 0..n {
                let scores: Vec<f64> = (0..=t).map(|j| score(j) as f64).collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = w.iter().sum();
                for i in 0..d {
                    let want: f64 = w
                        .iter()
                        .zip(&values)
                        .map(|(w, v)| w / total * v[i] as f64)
                        .sum();
                    let got = out[t * d + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "query {t} [{i}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn plans_cover_every_query_and_page_once() {
        let shapes: [&[(usize, usize)]; 4] = [
            &[(128, 1)],
            &[(1, 3), (5, 1), (1, 6), (9, 32), (1, 0)],
            &[(2, 0), (0, 5), (3, 0)],
            &[(5, 0), (1, 1), (10, 0)],
        ];
        for (n, target) in [(1, 4), (512, 4), (1, 8), (3, 16), (1, 1)] {
            for runs in shapes {
                let segs: usize = runs.iter().map(|r| r.0).sum();
                let items = plan_items(n, segs, |chunks| run_bounds(runs, chunks), target);
                let mut seen = vec![0u32; n * segs.max(1)];
                for it in &items {
                    for q in it.queries.clone() {
                        if segs == 0 {
                            seen[q] += 1;
                        }
                        for s in it.segments.clone() {
                            seen[q * segs + s] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{n} {runs:?} {target}");
            }
        }
    }

    /// [`walk_bounds`] of segments given as runs of `(count, cost of each)`.
    fn run_bounds(runs: &[(usize, usize)], chunks: usize) -> Vec<usize> {
        let costs = runs
            .iter()
            .flat_map(|&(count, each)| std::iter::repeat_n(each, count));
        let n = runs.iter().map(|r| r.0).sum();
        let total = runs.iter().map(|&(count, each)| count * each).sum();
        walk_bounds(costs, n, total, chunks)
    }

    #[test]
    fn pages_split_by_cost() {
        // Eight sealed pages then eight fp16 pages of three times the cost: the first half of
        // the cost ends three pages into the fp16 window, not after eight pages.
        let runs = [(8, 32), (8, 96)];
        assert_eq!(run_bounds(&runs, 2), [0, 11, 16]);
        assert_eq!(run_bounds(&runs, 1), [0, 16]);
        assert_eq!(run_bounds(&[(4, 0)], 4), [0, 1, 2, 3, 4]);
        assert_eq!(run_bounds(&[(6, 7)], 3), [0, 2, 4, 6]);
    }
}
