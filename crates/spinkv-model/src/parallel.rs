//! The thread pool and the row-parallel linear layers built on it.
//!
//! A forward pass runs inside `run_in_pool`, so the `par_iter`s below execute on pool threads
//! without a cross-thread hand-off per matmul. Several matrices that read the same input (Q/K/V,
//! gate/up) are split into one task list so one fork-join covers all of them.
//!
//! A wasm32 build without atomics has no threads: there the pool is the calling thread (rayon's
//! global pool falls back to it, so the cache's `par_iter`s run in place), `set_threads` accepts
//! only one thread, and the row tasks run in a plain loop (same tasks, same results).

use rayon::prelude::*;
use spinkv_kernels::q8dot::{matmul_quantized, Q8Activations};
use spinkv_kernels::{matmul, matvec, WeightRef};
use std::ops::Range;

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
    use rayon::{ThreadPool, ThreadPoolBuilder};
    use std::sync::{Arc, RwLock};

    use super::MAX_THREADS;
    use crate::error::ModelError;

    static POOL: RwLock<Option<Arc<ThreadPool>>> = RwLock::new(None);

    fn default_threads() -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(MAX_THREADS)
    }

    fn build_pool(n: usize) -> Result<Arc<ThreadPool>, ModelError> {
        ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("spinkv-{i}"))
            .build()
            .map(Arc::new)
            .map_err(|e| ModelError::Threads(format!("cannot start {n} worker threads: {e}")))
    }

    fn pool() -> Result<Arc<ThreadPool>, ModelError> {
        if let Some(pool) = POOL.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(pool.clone());
        }
        let mut slot = POOL.write().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = slot.as_ref() {
            return Ok(pool.clone());
        }
        // The default pool only fails when the OS refuses threads: one thread may still work.
        let pool = build_pool(default_threads()).or_else(|_| build_pool(1))?;
        Ok(slot.insert(pool).clone())
    }

    /// Sets the size of the global compute pool; `0` means one thread per core (the default,
    /// at most [`MAX_THREADS`]). Sessions pick up the new pool on their next call. More than
    /// `MAX_THREADS`, or a pool the OS cannot start, is an error and the old pool stays.
    pub fn set_threads(n: usize) -> Result<(), ModelError> {
        if n > MAX_THREADS {
            return Err(ModelError::Threads(format!(
                "{n} threads requested; spinkv uses at most {MAX_THREADS} (this machine has {} cores)",
                default_threads()
            )));
        }
        let pool = build_pool(if n == 0 { default_threads() } else { n })?;
        *POOL.write().unwrap_or_else(|e| e.into_inner()) = Some(pool);
        Ok(())
    }

    /// Threads in the global compute pool (1 if it cannot be started).
    pub fn threads() -> usize {
        pool().map_or(1, |p| p.current_num_threads())
    }

    pub(crate) fn run_in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R, ModelError> {
        Ok(pool()?.install(f))
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

    pub(crate) fn run_in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R, ModelError> {
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

/// Rows per task: big enough that fork-join overhead is small next to the weight reads, small
/// enough that each thread gets several tasks (load balance when one core is busy elsewhere).
fn rows_per_task(total_rows: usize, granule: usize) -> usize {
    let tasks_wanted = rayon::current_num_threads() * 4;
    let rows = total_rows.div_ceil(tasks_wanted.max(1)).max(64);
    rows.div_ceil(granule) * granule
}

/// The input shared by one fork-join (`[n_tokens, k]`), quantized once up front when a Q8_0
/// weight reads it: quantizing it inside every row task repeated the same work ~8 times per
/// matrix (7 % of a SmolLM2 Q8_0 decode, and the whole input per task in prefill).
struct SharedInput<'a> {
    x: &'a [f32],
    k: usize,
    q8: Option<Q8Activations>,
}

impl<'a> SharedInput<'a> {
    fn new(x: &'a [f32], k: usize, jobs: &[LinearJob<'_>]) -> Self {
        let any_q8 = jobs.iter().any(|j| matches!(j.weight, WeightRef::Q8_0(_)));
        SharedInput {
            x,
            k,
            q8: any_q8.then(|| Q8Activations::quantize(x)),
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

/// Decode: every job's matvec against the single input `x` (`[k]`), split into row tasks.
pub(crate) fn matvec_jobs(x: &[f32], jobs: &mut [LinearJob<'_>]) {
    let k = x.len();
    assert!(
        jobs.iter().all(|j| j.cols == k),
        "matvec_jobs: input width differs from a weight's columns"
    );
    let input = SharedInput::new(x, k, jobs);
    let total: usize = jobs.iter().map(|j| j.rows).sum();
    let chunk = rows_per_task(total, 4);
    let mut tasks: Vec<(WeightRef<'_>, Range<usize>, &mut [f32])> = Vec::new();
    for job in jobs.iter_mut() {
        for (i, out) in job.out.chunks_mut(chunk).enumerate() {
            let start = i * chunk;
            tasks.push((job.weight, start..start + out.len(), out));
        }
    }
    if tasks.len() == 1 {
        let (w, rows, out) = tasks.pop().expect("one task");
        input.apply(w, rows, out);
        return;
    }
    if cfg!(target_arch = "wasm32") {
        for (w, rows, out) in tasks {
            input.apply(w, rows, out);
        }
        return;
    }
    tasks
        .into_par_iter()
        .for_each(|(w, rows, out)| input.apply(w, rows, out));
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
    let input = SharedInput::new(x, k, jobs);
    let weights: Vec<WeightRef<'_>> = jobs.iter().map(|j| j.weight).collect();
    let tile_of = |(j, rows): &(usize, Range<usize>)| {
        let mut tile = vec![0.0; n_tokens * rows.len()];
        input.apply(weights[*j], rows.clone(), &mut tile);
        tile
    };
    let tiles: Vec<Vec<f32>> = if cfg!(target_arch = "wasm32") {
        tasks.iter().map(tile_of).collect()
    } else {
        tasks.par_iter().map(tile_of).collect()
    };
    for ((j, rows), tile) in tasks.iter().zip(&tiles) {
        let job = &mut jobs[*j];
        let width = rows.len();
        for t in 0..n_tokens {
            job.out[t * job.rows + rows.start..t * job.rows + rows.end]
                .copy_from_slice(&tile[t * width..(t + 1) * width]);
        }
    }
}
