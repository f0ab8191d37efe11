//! The thread team and the row-parallel linear layers built on it.
//!
//! A forward pass runs on its caller's thread inside `run_in_pool`, with the global
//! [`Team`](spinkv_kernels::team::Team) current, so the fork-joins below (and the cache's
//! attention) run on the team's threads and the caller's. Several matrices that read the same
//! input (Q/K/V, gate/up) are split into one task list so one fork-join covers all of them.
//!
//! A wasm32 build without atomics has no threads: there no team is current, `set_threads`
//! accepts only one thread, and the same tasks run in place in a plain loop (same results).

use spinkv_kernels::q8dot::{matmul_quantized, quantize_tokens, CodeOrder, Q8Activations};
use spinkv_kernels::team::{current_threads, for_each, for_each_mut};
use spinkv_kernels::Q8_BLOCK;
use spinkv_kernels::{matmul, matvec, WeightRef};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;

#[cfg(not(target_arch = "wasm32"))]
pub use pool::{set_threads, threads};
#[cfg(target_arch = "wasm32")]
pub use single::{set_threads, threads};

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use pool::run_in_pool;
#[cfg(target_arch = "wasm32")]
pub(crate) use single::run_in_pool;

/// Most threads `set_threads` accepts. The kernels split rows into ~4 tasks per thread, so far
/// more threads than cores only add fork-join and spin-wait overhead (1000 threads on 2 cores
/// made a decode crawl); and asking the OS for billions of threads never returns.
pub const MAX_THREADS: usize = 256;

#[cfg(not(target_arch = "wasm32"))]
mod pool {
    use spinkv_kernels::team::Team;
    use std::sync::{Arc, RwLock};

    use super::MAX_THREADS;
    use crate::error::ModelError;

    static TEAM: RwLock<Option<Arc<Team>>> = RwLock::new(None);

    fn default_threads() -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(MAX_THREADS)
    }

    fn build_team(n: usize) -> Result<Arc<Team>, ModelError> {
        Team::new(n)
            .map(Arc::new)
            .map_err(|e| ModelError::Threads(format!("cannot start {n} worker threads: {e}")))
    }

    pub(super) fn team() -> Result<Arc<Team>, ModelError> {
        if let Some(team) = TEAM.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(team.clone());
        }
        let mut slot = TEAM.write().unwrap_or_else(|e| e.into_inner());
        if let Some(team) = slot.as_ref() {
            return Ok(team.clone());
        }
        // The default team only fails when the OS refuses threads: one thread may still work.
        let team = build_team(default_threads()).or_else(|_| build_team(1))?;
        Ok(slot.insert(team).clone())
    }

    /// Sets the size of the global compute team; `0` means one thread per core (the default,
    /// at most [`MAX_THREADS`]). Sessions pick up the new team on their next call. More than
    /// `MAX_THREADS`, or a team the OS cannot start, is an error and the old team stays.
    pub fn set_threads(n: usize) -> Result<(), ModelError> {
        if n > MAX_THREADS {
            return Err(ModelError::Threads(format!(
                "{n} threads requested; spinkv uses at most {MAX_THREADS} (this machine has {} cores)",
                default_threads()
            )));
        }
        let team = build_team(if n == 0 { default_threads() } else { n })?;
        *TEAM.write().unwrap_or_else(|e| e.into_inner()) = Some(team);
        Ok(())
    }

    /// Threads in the global compute team (1 if it cannot be started).
    pub fn threads() -> usize {
        team().map_or(1, |t| t.threads())
    }

    /// Runs `f` on the calling thread with the global team current: its fork-joins run there.
    pub(crate) fn run_in_pool<R>(f: impl FnOnce() -> R) -> Result<R, ModelError> {
        Ok(team()?.install(f))
    }
}

#[cfg(target_arch = "wasm32")]
mod single {
    use crate::error::ModelError;

    /// `0` or `1`: this build runs on the calling thread; more is an error.
    pub fn set_threads(n: usize) -> Result<(), ModelError> {
        match n {
            0 | 1 => Ok(()),
            _ => Err(ModelError::Threads(format!(
                "{n} threads requested; this wasm build runs on one thread"
            ))),
        }
    }

    pub fn threads() -> usize {
        1
    }

    pub(crate) fn run_in_pool<R>(f: impl FnOnce() -> R) -> Result<R, ModelError> {
        Ok(f())
    }
}

/// One matrix applied to a shared input: `out[t, :] = W · x[t, :]`, `out`: `[n_tokens, rows]`.
pub(crate) struct LinearJob<'a> {
    pub weight: WeightRef<'a>,
    pub rows: usize,
    /// Must equal the input width `k`.
    pub cols: usize,
    pub out: &'a mut [f32],
}

/// Tokens a task of a prefill's per-token steps between the matmuls (norms, RoPE, the gated
/// activation, residual adds) takes at least: each token's step is a few microseconds.
const STEP_TOKENS: usize = 16;

/// Tokens per task of those steps for a block of `n_tokens`: two tasks a thread when every
/// task gets [`STEP_TOKENS`], else all in one (decode). Run alone, they held one thread while
/// the other waited: 12–15 ms of a prefill of 256 at 512 (F16, AVX2, 2 threads, AMD EPYC Zen 4).
pub(crate) fn token_chunk(n_tokens: usize) -> usize {
    let per_task = n_tokens.div_ceil(current_threads() * 2);
    if per_task >= STEP_TOKENS {
        per_task
    } else {
        n_tokens.max(1)
    }
}

/// `work(part)` for every part (whole tokens of each buffer, cut by [`token_chunk`]) on the
/// team; a single part (decode's every step) runs in place without collecting the parts. Every
/// token's step is its own, so the cut changes no bit.
pub(crate) fn on_token_chunks<T: Send>(
    mut parts: impl Iterator<Item = T>,
    work: impl Fn(&mut T) + Sync,
) {
    let Some(mut first) = parts.next() else {
        return;
    };
    let Some(second) = parts.next() else {
        return work(&mut first);
    };
    let mut all = vec![first, second];
    all.extend(parts);
    for_each_mut(&mut all, work);
}

/// Rows per task: big enough that fork-join overhead is small next to the weight reads, small
/// enough that each thread gets several tasks (load balance when one core is busy elsewhere).
fn rows_per_task(total_rows: usize, granule: usize) -> usize {
    let tasks_wanted = current_threads() * 4;
    let rows = total_rows.div_ceil(tasks_wanted.max(1)).max(64);
    rows.div_ceil(granule) * granule
}

/// Tokens quantized per task when a prefill input is quantized on the pool's threads.
const QUANTIZE_TOKENS_PER_TASK: usize = 16;

thread_local! {
    /// Buffers a fork-join on this thread reuses: the quantized input and prefill's output
    /// tiles (at most 256 tokens × the widest fork-join's rows: ~6.3 MiB of f32 on SmolLM2's
    /// gate/up). Fresh ones per call were zeroed page by page by the kernel (`clear_page_erms`
    /// ~5 % of a Q8_0 prefill's samples); with these and the scatter on every thread, a Q8_0
    /// prefill of 512 tokens ran 8 % faster (in-process A/B, AMD EPYC Zen 4).
    static REUSED: std::cell::Cell<Buffers> = std::cell::Cell::new(Buffers::default());
}

/// Allocations kept from one fork-join to the next on the same thread.
#[derive(Default)]
struct Buffers {
    q8: Q8Activations,
    tiles: Vec<f32>,
}

/// Takes this thread's reusable buffers (empty ones if a fork-join on this thread holds them).
fn take_buffers() -> Buffers {
    REUSED.with(|b| b.take())
}

fn put_buffers(buffers: Buffers) {
    REUSED.with(|b| b.set(buffers));
}

/// Frees the buffers this thread keeps between fork-joins (a forward pass runs on its
/// caller's thread, so these are its sessions'); the next fork-join allocates them again.
pub(crate) fn release_buffers() {
    drop(take_buffers());
}

/// The input shared by one fork-join (`[n_tokens, k]`), quantized once up front when a Q8_0
/// weight reads it: quantizing it inside every row task repeated the same work ~8 times per
/// matrix (7 % of a SmolLM2 Q8_0 decode, and the whole input per task in prefill). The codes
/// are laid out as the active ISA's kernels read them, and a prefill's tokens are quantized on
/// every thread of the pool.
struct SharedInput<'a> {
    x: &'a [f32],
    k: usize,
    q8: Option<Q8Activations>,
}

impl<'a> SharedInput<'a> {
    fn new(x: &'a [f32], k: usize, jobs: &[LinearJob<'_>], reuse: Q8Activations) -> Self {
        let any_q8 = jobs.iter().any(|j| matches!(j.weight, WeightRef::Q8_0(_)));
        SharedInput {
            x,
            k,
            q8: any_q8.then(|| quantize_shared(x, k, reuse)),
        }
    }

    /// `out[t, r - rows.start] = W[r, :] · x[t, :]` (`out`: `[n_tokens, rows.len()]`).
    fn apply(&self, w: WeightRef<'_>, rows: Range<usize>, out: &mut [f32]) {
        match (w, &self.q8) {
            (WeightRef::Q8_0(q), Some(xq)) => matmul_quantized(q, self.k, xq, rows, out),
            _ if self.x.len() == self.k => matvec(w, self.k, self.x, rows, out),
            _ => matmul(w, self.k, self.x, rows, out),
        }
    }
}

/// `x` (`[n_tokens, k]`) quantized for the active ISA into `q8`'s buffers; many tokens on the
/// pool's threads.
fn quantize_shared(x: &[f32], k: usize, mut q8: Q8Activations) -> Q8Activations {
    let order = CodeOrder::for_isa(spinkv_kernels::active_isa());
    q8.resize(x.len(), order);
    let part = QUANTIZE_TOKENS_PER_TASK * k;
    if x.len() <= part {
        quantize_tokens(x, k, order, &mut q8.codes, &mut q8.scales);
        return q8;
    }
    let mut parts: Vec<_> = x
        .chunks(part)
        .zip(q8.codes.chunks_mut(part))
        .zip(q8.scales.chunks_mut(part / Q8_BLOCK))
        .collect();
    for_each_mut(&mut parts, |((x, codes), scales)| {
        quantize_tokens(x, k, order, codes, scales)
    });
    drop(parts);
    q8
}

/// Decode: every job's matvec against the single input `x` (`[k]`). Each thread streams its
/// own contiguous part of the rows ([`thread_parts`]); with F16 weights a thread done with its
/// part takes rows from the back of another's ([`Shares`]).
pub(crate) fn matvec_jobs(x: &[f32], jobs: &mut [LinearJob<'_>]) {
    let k = x.len();
    assert!(
        jobs.iter().all(|j| j.cols == k),
        "matvec_jobs: input width differs from a weight's columns"
    );
    let mut buffers = take_buffers();
    let input = SharedInput::new(x, k, jobs, std::mem::take(&mut buffers.q8));
    let mut parts = thread_parts(jobs, current_threads());
    if input.q8.is_some() || parts.len() == 1 {
        // The Q8_0 decode kernel walks a call's rows as four streams a quarter apart: it
        // wants each part whole. One thread has no one to share with.
        for_each_mut(&mut parts, |part| {
            for (w, rows, out) in part.iter_mut() {
                input.apply(*w, rows.clone(), out)
            }
        });
    } else {
        let shares: Vec<Shares<'_, '_>> = parts.into_iter().map(Shares::new).collect();
        for_each(shares.len(), |own| {
            while let Some((w, rows, out)) = shares[own].claim(false) {
                input.apply(w, rows, out)
            }
            for other in (1..shares.len()).map(|i| (own + i) % shares.len()) {
                while let Some((w, rows, out)) = shares[other].claim(true) {
                    input.apply(w, rows, out)
                }
            }
        });
    }
    buffers.q8 = input.q8.unwrap_or_default();
    put_buffers(buffers);
}

/// Rows a claim takes at least.
const MIN_CLAIM_ROWS: usize = 16;

/// A thread's part of a decode fork-join, its rows handed out under a lock: its own thread
/// claims from the front (a quarter of what is left, so its stream runs on unbroken), a thread
/// done with its own part claims from the back (half of what is left). Two threads on equal
/// halves still ended 4–7 µs apart on average (timers per fork-join, AMD EPYC Zen 4: 0.57–0.78
/// ms a token of one thread waiting for the other; ~1 µs with this); taking the rest measured
/// decode B/A 0.987, 0.976, 0.971, 0.963 against whole halves (F16, depths 512 and 7,680,
/// in-process). With Q8_0 weights it read 1.11–1.23: that kernel splits a call's rows into
/// four streams, which small claims break up.
struct Shares<'w, 'o> {
    left: Mutex<VecDeque<RowSpan<'w, 'o>>>,
}

impl<'w, 'o> Shares<'w, 'o> {
    fn new(spans: Vec<RowSpan<'w, 'o>>) -> Self {
        Shares {
            left: Mutex::new(spans.into()),
        }
    }

    /// The next rows of this part from its front (its own thread) or its back (a helper).
    fn claim(&self, from_back: bool) -> Option<RowSpan<'w, 'o>> {
        let mut spans = self.left.lock().unwrap_or_else(|e| e.into_inner());
        // A part holds a span per matrix it touches: a handful to add up.
        let rows: usize = spans.iter().map(|(_, r, _)| r.len()).sum();
        let share = if from_back { 2 } else { 4 };
        let want = (rows / share).max(MIN_CLAIM_ROWS);
        let (w, range, out) = if from_back {
            spans.pop_back()
        } else {
            spans.pop_front()
        }?;
        if range.len() <= want {
            return Some((w, range, out));
        }
        if from_back {
            let keep = range.len() - want;
            let (rest, mine) = out.split_at_mut(keep);
            spans.push_back((w, range.start..range.start + keep, rest));
            Some((w, range.start + keep..range.end, mine))
        } else {
            let (mine, rest) = out.split_at_mut(want);
            spans.push_front((w, range.start + want..range.end, rest));
            Some((w, range.start..range.start + want, mine))
        }
    }
}

/// One matrix's rows in a decode part, with their outputs.
type RowSpan<'w, 'o> = (WeightRef<'w>, Range<usize>, &'o mut [f32]);

/// The jobs' rows (one token's outputs) end to end, cut into `n` parts of equal rows, each a
/// run of rows that may go on from one matrix into the next: one weight stream per thread.
/// A decode matvec reads its weights from DRAM at the hardware prefetchers' pace, and every
/// task a thread starts restarts its stream and its claim. Against ~4 tasks per thread this
/// split measured decode B/A 0.946–1.004 with F16 weights (median 0.983 over 12 in-process
/// runs at depths 512 and 7,680) and 0.943, 0.951 with Q8_0 (2 threads, AMD EPYC Zen 4); the
/// same bits, as every row's dot product is its own. Balance comes from equal rows: every row
/// of a fork-join reads the same input width.
fn thread_parts<'w, 'o>(jobs: &'o mut [LinearJob<'w>], n: usize) -> Vec<Vec<RowSpan<'w, 'o>>> {
    let total: usize = jobs.iter().map(|j| j.rows).sum();
    // Whole quads of rows where it can (the kernels' row blocks); no empty parts.
    let per_part = total.div_ceil(n.max(1)).next_multiple_of(4).max(1);
    let n = total.div_ceil(per_part).max(1);
    let mut parts: Vec<Vec<RowSpan<'w, 'o>>> = (0..n).map(|_| Vec::new()).collect();
    // The first row of the current job in the rows end to end.
    let mut offset = 0;
    for job in jobs.iter_mut() {
        let mut out = &mut job.out[..job.rows];
        let mut start = 0;
        while start < job.rows {
            let part = (offset + start) / per_part;
            let end = ((part + 1) * per_part - offset).min(job.rows);
            let (span, rest) = std::mem::take(&mut out).split_at_mut(end - start);
            parts[part].push((job.weight, start..end, span));
            out = rest;
            start = end;
        }
        offset += job.rows;
    }
    parts
}

/// Prefill: every job's batched matmul against `x` (`[n_tokens, k]`). Tasks compute dense
/// `[n_tokens, task_rows]` tiles that are then scattered into the `[n_tokens, rows]` outputs.
pub(crate) fn matmul_jobs(x: &[f32], k: usize, jobs: &mut [LinearJob<'_>]) {
    assert!(
        jobs.iter().all(|j| j.cols == k),
        "matmul_jobs: input width differs from a weight's columns"
    );
    let n_tokens = x.len() / k;
    if n_tokens == 1 {
        return matvec_jobs(x, jobs);
    }
    let total: usize = jobs.iter().map(|j| j.rows).sum();
    let chunk = rows_per_task(total, 12);
    let mut tasks: Vec<(usize, Range<usize>)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let mut start = 0;
        while start < job.rows {
            let end = (start + chunk).min(job.rows);
            tasks.push((j, start..end));
            start = end;
        }
    }
    let mut buffers = take_buffers();
    let input = SharedInput::new(x, k, jobs, std::mem::take(&mut buffers.q8));
    let weights: Vec<WeightRef<'_>> = jobs.iter().map(|j| j.weight).collect();
    // Every task's dense `[n_tokens, task rows]` tile, one after another in one buffer.
    // Grown, never shrunk: the tasks overwrite every float they use, and shrinking to a
    // narrow fork-join (down_proj) then growing back (gate/up) zero-filled the difference,
    // 2.5 MiB a layer (memset 0.5 % of a prefill profile: decode_bench pp256 at depth 512,
    // turbo, 1 thread, AMD EPYC Zen 3; 0.4 % left, the attention scratch).
    let needed = n_tokens * total;
    if buffers.tiles.len() < needed {
        buffers.tiles.resize(needed, 0.0);
    }
    let mut task_tiles: Vec<&mut [f32]> = Vec::with_capacity(tasks.len());
    let mut rest = &mut buffers.tiles[..needed];
    for (_, rows) in &tasks {
        let (tile, after) = rest.split_at_mut(n_tokens * rows.len());
        task_tiles.push(tile);
        rest = after;
    }
    let mut work: Vec<_> = tasks.iter().zip(task_tiles.iter_mut()).collect();
    for_each_mut(&mut work, |((j, rows), tile)| {
        input.apply(weights[*j], rows.clone(), tile)
    });
    drop(work);
    // Scattered token by token, groups of tokens shared between the threads.
    let tokens_per_task = n_tokens.div_ceil(current_threads() * 4);
    for (j, job) in jobs.iter_mut().enumerate() {
        let parts: Vec<(Range<usize>, &[f32])> = tasks
            .iter()
            .zip(&task_tiles)
            .filter(|((task_job, _), _)| *task_job == j)
            .map(|((_, rows), tile)| (rows.clone(), &**tile))
            .collect();
        let mut groups: Vec<_> = job
            .out
            .chunks_mut(job.rows * tokens_per_task)
            .enumerate()
            .collect();
        for_each_mut(&mut groups, |(g, outs)| {
            for (i, out) in outs.chunks_mut(job.rows).enumerate() {
                let t = *g * tokens_per_task + i;
                for (rows, tile) in &parts {
                    let row = &tile[t * rows.len()..(t + 1) * rows.len()];
                    out[rows.clone()].copy_from_slice(row);
                }
            }
        });
    }
    drop(task_tiles);
    buffers.q8 = input.q8.unwrap_or_default();
    put_buffers(buffers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use spinkv_kernels::f16;

    fn kept_tile_floats() -> usize {
        let buffers = take_buffers();
        let n = buffers.tiles.len();
        put_buffers(buffers);
        n
    }

    #[test]
    fn token_chunks_cover_every_token_once() {
        for n in [1, 5, 31, 32, 33, 100, 256, 257] {
            let chunk = token_chunk(n);
            assert!(
                chunk >= 1 && chunk <= n.max(1),
                "{n} tokens: chunks of {chunk}"
            );
            if n < STEP_TOKENS {
                assert_eq!(chunk, n.max(1), "decode and short blocks stay whole");
            }
            let mut seen = vec![0u8; n * 3];
            on_token_chunks(seen.chunks_mut(chunk * 3), |part| {
                assert!(part.len() <= chunk * 3);
                part.iter_mut().for_each(|v| *v += 1);
            });
            assert!(seen.iter().all(|&v| v == 1), "{n} tokens");
        }
    }

    #[test]
    fn decode_parts_cover_every_row_once_in_order_and_evenly() {
        let weights: Vec<f16> = vec![f16::ZERO; 97 * 8];
        for n in [1, 2, 3, 7, 200] {
            let sizes = [37, 64, 5, 1];
            let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&r| vec![0.0; r]).collect();
            let mut jobs: Vec<LinearJob<'_>> = outs
                .iter_mut()
                .zip(sizes)
                .map(|(out, rows)| LinearJob {
                    weight: WeightRef::F16(&weights[..rows * 8]),
                    rows,
                    cols: 8,
                    out,
                })
                .collect();
            let parts = thread_parts(&mut jobs, n);
            assert!(parts.len() <= n && !parts.is_empty());
            let per_part: Vec<usize> = parts
                .iter()
                .map(|p| p.iter().map(|(_, rows, _)| rows.len()).sum())
                .collect();
            assert_eq!(per_part.iter().sum::<usize>(), 107);
            let widest = *per_part.iter().max().unwrap();
            assert!(
                per_part.iter().rev().skip(1).all(|&r| r == widest),
                "{n} parts: {per_part:?}"
            );
            // Spans in order: each job's rows from 0 to the end, outputs as long as the rows.
            let mut next = vec![0; sizes.len()];
            let mut job = 0;
            for (w, rows, out) in parts.iter().flatten() {
                let WeightRef::F16(w) = w else { unreachable!() };
                while w.len() != sizes[job] * 8 || next[job] == sizes[job] {
                    job += 1;
                }
                assert_eq!(rows.start, next[job]);
                assert_eq!(out.len(), rows.len());
                next[job] = rows.end;
            }
            assert_eq!(next, sizes);
        }
    }

    #[test]
    fn claims_from_both_ends_hand_out_every_row_once() {
        let weights: Vec<f16> = vec![f16::ZERO; 300];
        let sizes = [37, 200, 5];
        let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&r| vec![0.0; r]).collect();
        let mut jobs: Vec<LinearJob<'_>> = outs
            .iter_mut()
            .zip(sizes)
            .map(|(out, rows)| LinearJob {
                weight: WeightRef::F16(&weights[..rows]),
                rows,
                cols: 1,
                out,
            })
            .collect();
        let mut seen = vec![vec![0u8; 200]; 3];
        for part in thread_parts(&mut jobs, 2) {
            let shares = Shares::new(part);
            let mut front = true;
            loop {
                let claim = shares.claim(!front);
                let Some((WeightRef::F16(w), rows, out)) = claim else {
                    break;
                };
                assert_eq!(out.len(), rows.len());
                out.fill(1.0);
                let job = sizes.iter().position(|&r| r == w.len()).unwrap();
                rows.for_each(|r| seen[job][r] += 1);
                front = !front;
            }
        }
        for (job, rows) in sizes.iter().enumerate() {
            assert!(seen[job][..*rows].iter().all(|&n| n == 1), "job {job}");
        }
        assert!(outs.iter().flatten().all(|&v| v == 1.0));
    }

    #[test]
    fn decode_jobs_match_each_matrix_alone() {
        let k = 40;
        let sizes = [37, 64, 5];
        let weights: Vec<Vec<f16>> = sizes
            .iter()
            .enumerate()
            .map(|(j, &rows)| {
                (0..rows * k)
                    .map(|i| f16::from_f32(((i * 7 + j * 3) % 23) as f32 * 0.01 - 0.1))
                    .collect()
            })
            .collect();
        let x: Vec<f32> = (0..k).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut outs: Vec<Vec<f32>> = sizes.iter().map(|&r| vec![0.0; r]).collect();
        let team = std::sync::Arc::new(spinkv_kernels::team::Team::new(3).unwrap());
        team.install(|| {
            let mut jobs: Vec<LinearJob<'_>> = outs
                .iter_mut()
                .zip(&weights)
                .zip(sizes)
                .map(|((out, w), rows)| LinearJob {
                    weight: WeightRef::F16(w),
                    rows,
                    cols: k,
                    out,
                })
                .collect();
            matvec_jobs(&x, &mut jobs);
        });
        for ((out, w), rows) in outs.iter().zip(&weights).zip(sizes) {
            let mut expected = vec![0.0; rows];
            matvec(WeightRef::F16(w), k, &x, 0..rows, &mut expected);
            assert_eq!(out, &expected);
        }
    }

    #[test]
    fn prefill_buffers_are_kept_then_released() {
        let (k, rows, n_tokens) = (64, 200, 5); // several row tasks with two threads or more
        let weights: Vec<f16> = (0..k * rows)
            .map(|i| f16::from_f32(i as f32 * 1e-3))
            .collect();
        let x: Vec<f32> = (0..n_tokens * k).map(|i| (i % 7) as f32).collect();
        let mut out = vec![0.0; n_tokens * rows];
        let mut jobs = [LinearJob {
            weight: WeightRef::F16(&weights),
            rows,
            cols: k,
            out: &mut out,
        }];
        matmul_jobs(&x, k, &mut jobs);
        assert_eq!(kept_tile_floats(), n_tokens * rows);
        let mut expected = vec![0.0; n_tokens * rows];
        matmul(WeightRef::F16(&weights), k, &x, 0..rows, &mut expected);
        assert_eq!(out, expected, "tiles scattered to their tokens and rows");
        release_buffers();
        assert_eq!(kept_tile_floats(), 0);
    }
}
