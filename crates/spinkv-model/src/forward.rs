//! The Llama forward pass over a block of consecutive tokens.
//!
//! embeddings → per layer: RMSNorm → Q/K/V → RoPE(Q, K) → KV append + attend → o_proj →
//! residual → RMSNorm → SwiGLU MLP → residual; final RMSNorm → lm_head.
//! Activations and accumulation are f32; weights stay in their stored dtype.

use crate::error::ModelError;
use crate::model::Model;
use crate::parallel::{matmul_jobs, LinearJob};
use crate::timings::ForwardClock;
use crate::weights::{Matrix, Weights};
use spinkv_kernels::{axpy_f32, rmsnorm, rope, rope_tables, swiglu};
use spinkv_kv::KvCache;

/// Which positions of the block need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogitsFor {
    None,
    Last,
    All,
}

/// Consecutive tokens at cache indices `start..start + tokens.len()` and sequence (RoPE)
/// positions `position..position + tokens.len()`; the two differ once the cache retired pages.
#[derive(Clone, Copy)]
pub(crate) struct Block<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub position: usize,
    pub want: LogitsFor,
}

/// Activation buffers, grown to the largest block seen and reused.
#[derive(Default)]
pub(crate) struct Scratch {
    /// [n, hidden] residual stream
    x: Vec<f32>,
    /// [n, hidden] normed input of the current sub-layer
    xn: Vec<f32>,
    /// [n, q_width]
    q: Vec<f32>,
    /// [n, kv_width]
    k: Vec<f32>,
    /// [n, kv_width]
    v: Vec<f32>,
    /// [n, q_width] attention output
    attn: Vec<f32>,
    /// [n, hidden] output of o_proj / down_proj before the residual add
    proj: Vec<f32>,
    /// [n, intermediate]
    gate: Vec<f32>,
    /// [n, intermediate]
    up: Vec<f32>,
}

fn job<'a>(weights: &'a Weights, m: &'a Matrix, out: &'a mut [f32]) -> LinearJob<'a> {
    LinearJob {
        weight: weights.view(m),
        rows: m.rows,
        cols: m.cols,
        out,
    }
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

/// Run `tokens` (already validated: ids < vocab, fits the context) at positions
/// `start..start + n`, appending their K/V to `cache`. Writes logits into `logits`:
/// `[n, vocab]` for `All`, `[vocab]` for `Last`, untouched for `None`.
pub(crate) fn forward(
    model: &Model,
    cache: &mut KvCache,
    block: Block<'_>,
    logits: &mut Vec<f32>,
    s: &mut Scratch,
    clock: &mut ForwardClock,
) -> Result<(), ModelError> {
    let Block {
        tokens,
        start,
        position,
        want,
    } = block;
    let c = model.config();
    let w = &model.weights;
    let n = tokens.len();
    let (hidden, inter) = (c.hidden_size, c.intermediate_size);
    let (q_width, kv_width, head_dim) = (c.q_width(), c.kv_width(), c.head_dim);

    let x = sized(&mut s.x, n * hidden);
    let embed = w.view(&w.embed_tokens);
    for (row, &token) in x.chunks_exact_mut(hidden).zip(tokens) {
        embed.row_to_f32(token as usize, hidden, row);
    }
    // [n, head_dim / 2] each
    let (cos, sin) = rope_tables(
        head_dim,
        c.rope_theta,
        c.rope_linear_factor,
        position..position + n,
    );
    let half = head_dim / 2;

    for (layer_index, layer) in w.layers.iter().enumerate() {
        // --- attention block ---
        let xn = sized(&mut s.xn, n * hidden);
        for (out, row) in xn.chunks_exact_mut(hidden).zip(x.chunks_exact(hidden)) {
            rmsnorm(row, &layer.attn_norm, c.rms_norm_eps, out);
        }
        let q = sized(&mut s.q, n * q_width);
        let k = sized(&mut s.k, n * kv_width);
        let v = sized(&mut s.v, n * kv_width);
        clock.time_matmul(|| {
            matmul_jobs(
                xn,
                hidden,
                &mut [
                    job(w, &layer.q_proj, q),
                    job(w, &layer.k_proj, k),
                    job(w, &layer.v_proj, v),
                ],
            )
        });
        for t in 0..n {
            let (cos_t, sin_t) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            rope(
                &mut q[t * q_width..(t + 1) * q_width],
                head_dim,
                cos_t,
                sin_t,
            );
            rope(
                &mut k[t * kv_width..(t + 1) * kv_width],
                head_dim,
                cos_t,
                sin_t,
            );
        }
        let attn = sized(&mut s.attn, n * q_width);
        clock.time_attention(|| -> Result<(), ModelError> {
            cache.append(layer_index, k, v)?;
            cache.attend(layer_index, q, start, attn)?;
            Ok(())
        })?;
        let proj = sized(&mut s.proj, n * hidden);
        clock.time_matmul(|| matmul_jobs(attn, q_width, &mut [job(w, &layer.o_proj, proj)]));
        axpy_f32(1.0, proj, x);

        // --- MLP block ---
        for (out, row) in xn.chunks_exact_mut(hidden).zip(x.chunks_exact(hidden)) {
            rmsnorm(row, &layer.mlp_norm, c.rms_norm_eps, out);
        }
        let gate = sized(&mut s.gate, n * inter);
        let up = sized(&mut s.up, n * inter);
        clock.time_matmul(|| {
            matmul_jobs(
                xn,
                hidden,
                &mut [job(w, &layer.gate_proj, gate), job(w, &layer.up_proj, up)],
            )
        });
        swiglu(gate, up);
        clock.time_matmul(|| matmul_jobs(gate, inter, &mut [job(w, &layer.down_proj, proj)]));
        axpy_f32(1.0, proj, x);
    }

    // --- head ---
    let rows = match want {
        LogitsFor::None => return Ok(()),
        LogitsFor::Last => n - 1..n,
        LogitsFor::All => 0..n,
    };
    let xn = sized(&mut s.xn, rows.len() * hidden);
    for (out, t) in xn.chunks_exact_mut(hidden).zip(rows) {
        rmsnorm(
            &x[t * hidden..(t + 1) * hidden],
            &w.final_norm,
            c.rms_norm_eps,
            out,
        );
    }
    let vocab = c.vocab_size;
    let out = sized(logits, xn.len() / hidden * vocab);
    clock.time_matmul(|| matmul_jobs(xn, hidden, &mut [job(w, w.lm_head(), out)]));
    Ok(())
}
