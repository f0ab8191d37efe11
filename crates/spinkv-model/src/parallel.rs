//! The thread pool and the row-parallel linear layers built on it.
//!
//! A forward pass runs inside `run_in_pool`, so the `par_iter`s below execute on pool threads
//! without a cross-thread hand-off per matmul. Several matrices that read the same input (Q/K/V,
//! gate/up) are split into one task list so one fork-join covers all of them.

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use spinkv_kernels::{matmul, matvec, WeightRef};
use std::ops::Range;
use std::sync::{Arc, RwLock};

static POOL: RwLock<Option<Arc<ThreadPool>>> = RwLock::new(None);

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn build_pool(n: usize) -> Arc<ThreadPool> {
    let n = if n == 0 { default_threads() } else { n };
    let pool = ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("spinkv-{i}"))
        .build()
        // Building only fails when the OS refuses threads; one thread always works or nothing does.
        .unwrap_or_else(|_| {
            ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("cannot start even one worker thread")
        });
    Arc::new(pool)
}

fn pool() -> Arc<ThreadPool> {
    if let Some(pool) = POOL.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return pool.clone();
    }
    let mut slot = POOL.write().unwrap_or_else(|e| e.into_inner());
    slot.get_or_insert_with(|| build_pool(0)).clone()
}

/// Size of the global compute pool; `0` means one thread per core (the default).
/// Sessions pick up the new pool on their next call.
pub fn set_threads(n: usize) {
    *POOL.write().unwrap_or_else(|e| e.into_inner()) = Some(build_pool(n));
}

/// Threads in the global compute pool.
pub fn threads() -> usize {
    pool().current_num_threads()
}

pub(crate) fn run_in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
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

/// Decode: every job's matvec against the single input `x` (`[k]`), split into row tasks.
pub(crate) fn matvec_jobs(x: &[f32], jobs: &mut [LinearJob<'_>]) {
    let k = x.len();
    assert!(
        jobs.iter().all(|j| j.cols == k),
        "matvec_jobs: input width differs from a weight's columns"
    );
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
        matvec(w, k, x, rows, out);
        return;
    }
    tasks
        .into_par_iter()
        .for_each(|(w, rows, out)| matvec(w, k, x, rows, out));
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
    let weights: Vec<WeightRef<'_>> = jobs.iter().map(|j| j.weight).collect();
    let tiles: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|(j, rows)| {
            let mut tile = vec![0.0; n_tokens * rows.len()];
            matmul(weights[*j], k, x, rows.clone(), &mut tile);
            tile
        })
        .collect();
    for ((j, rows), tile) in tasks.iter().zip(&tiles) {
        let job = &mut jobs[*j];
        let width = rows.len();
        for t in 0..n_tokens {
            job.out[t * job.rows + rows.start..t * job.rows + rows.end]
                .copy_from_slice(&tile[t * width..(t + 1) * width]);
        }
    }
}
