//! The decoder forward pass over a block of consecutive tokens.
//!
//! embeddings (× embed_scale) → per layer: RMSNorm → Q/K/V (+ biases) → [per-head Q/K RMSNorm]
//! → RoPE(Q, K) with the layer's base → KV append + attend (sliding window on local layers) →
//! o_proj → [post-attention RMSNorm] → residual → RMSNorm → SwiGLU or GeGLU MLP → [post-MLP
//! RMSNorm] → residual; final RMSNorm → lm_head → [soft-capping]. Bracketed steps are the
//! families' additions (config.rs says which family has which).
//! Activations and accumulation are f32; weights stay in their stored dtype.

use crate::config::{Activation, Rope};
use crate::error::ModelError;
use crate::model::Model;
use crate::parallel::{matmul_jobs, on_token_chunks, token_chunk, LinearJob};
use crate::timings::ForwardClock;
use crate::weights::{Matrix, Weights};
use spinkv_kernels::{axpy_f32, rmsnorm, rope, swiglu};
use spinkv_kv::KvCache;
use std::ops::Range;

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
    /// [head_dim] one head of Q or K through its norm
    head: Vec<f32>,
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
        if c.embed_scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= c.embed_scale);
        }
    }
    // [n, head_dim / 2] each, for global layers and (Gemma 3) local ones.
    let positions = position..position + n;
    let global_tables = rope_tables(&c.rope, head_dim, positions.clone());
    let local_tables = c
        .local_rope
        .as_ref()
        .map(|rope| rope_tables(rope, head_dim, positions));
    let half = head_dim / 2;
    // Tokens per task of the per-token steps between the matmuls (all of them in decode).
    let chunk = token_chunk(n);
    // The attention kernel scales scores by 1/sqrt(head_dim); another scale goes into q.
    let q_scale = c.query_scale;

    for (layer_index, layer) in w.layers.iter().enumerate() {
        let extras = &layer.extras;
        let window = c.window(layer_index);
        let (cos, sin) = match (&local_tables, window) {
            (Some(local), Some(_)) => (&local.0, &local.1),
            _ => (&global_tables.0, &global_tables.1),
        };
        // --- attention block ---
        let xn = sized(&mut s.xn, n * hidden);
        norm_rows(x, &layer.attn_norm, c.rms_norm_eps, xn, chunk);
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
        add_bias(q, extras.q_bias.as_deref());
        add_bias(k, extras.k_bias.as_deref());
        add_bias(v, extras.v_bias.as_deref());
        if let (Some(q_norm), Some(k_norm)) = (&extras.q_norm, &extras.k_norm) {
            let head = sized(&mut s.head, head_dim);
            norm_heads(q, q_norm, c.rms_norm_eps, head);
            norm_heads(k, k_norm, c.rms_norm_eps, head);
        }
        let tables = cos.chunks(chunk * half).zip(sin.chunks(chunk * half));
        let heads = q
            .chunks_mut(chunk * q_width)
            .zip(k.chunks_mut(chunk * kv_width));
        on_token_chunks(heads.zip(tables), |((q, k), (cos, sin))| {
            let tokens = q
                .chunks_exact_mut(q_width)
                .zip(k.chunks_exact_mut(kv_width));
            for (t, (q, k)) in tokens.enumerate() {
                let (cos_t, sin_t) = (
                    &cos[t * half..(t + 1) * half],
                    &sin[t * half..(t + 1) * half],
                );
                rope(q, head_dim, cos_t, sin_t);
                rope(k, head_dim, cos_t, sin_t);
            }
        });
        if q_scale != 1.0 {
            q.iter_mut().for_each(|v| *v *= q_scale);
        }
        let attn = sized(&mut s.attn, n * q_width);
        clock.time_attention(|| -> Result<(), ModelError> {
            cache.append(layer_index, k, v)?;
            match window {
                Some(window) => cache.attend_window(layer_index, q, start, window, attn)?,
                None => cache.attend(layer_index, q, start, attn)?,
            }
            Ok(())
        })?;
        let proj = sized(&mut s.proj, n * hidden);
        clock.time_matmul(|| matmul_jobs(attn, q_width, &mut [job(w, &layer.o_proj, proj)]));
        add_bias(proj, extras.o_bias.as_deref());
        add_normed(
            proj,
            extras.post_attn_norm.as_deref(),
            c.rms_norm_eps,
            xn,
            x,
            chunk * hidden,
        );

        // --- MLP block ---
        norm_rows(x, &layer.mlp_norm, c.rms_norm_eps, xn, chunk);
        let gate = sized(&mut s.gate, n * inter);
        let up = sized(&mut s.up, n * inter);
        clock.time_matmul(|| {
            matmul_jobs(
                xn,
                hidden,
                &mut [job(w, &layer.gate_proj, gate), job(w, &layer.up_proj, up)],
            )
        });
        let halves = gate.chunks_mut(chunk * inter).zip(up.chunks(chunk * inter));
        on_token_chunks(halves, |(gate, up)| match c.activation {
            Activation::Silu => swiglu(gate, up),
            Activation::GeluTanh => geglu_tanh(gate, up),
        });
        clock.time_matmul(|| matmul_jobs(gate, inter, &mut [job(w, &layer.down_proj, proj)]));
        let post_norm = extras.post_mlp_norm.as_deref();
        add_normed(proj, post_norm, c.rms_norm_eps, xn, x, chunk * hidden);
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
    if let Some(cap) = c.final_logit_softcapping {
        out.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    }
    Ok(())
}

/// cos/sin tables `[positions.len(), head_dim / 2]` of `rope`, computed in f64 so long
/// contexts keep their phase.
fn rope_tables(rope: &Rope, head_dim: usize, positions: Range<usize>) -> (Vec<f32>, Vec<f32>) {
    let inv_freq = rope.inv_freq(head_dim);
    let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
    let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
    for pos in positions {
        for &f in &inv_freq {
            let angle = pos as f64 * f;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// `rows[t] += bias` for every row, when there is a bias.
fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        for row in rows.chunks_exact_mut(bias.len()) {
            axpy_f32(1.0, bias, row);
        }
    }
}

/// RMSNorm of every `gains.len()`-wide head of `rows` in place (`head`: scratch of that width).
fn norm_heads(rows: &mut [f32], gains: &[f32], eps: f32, head: &mut [f32]) {
    for chunk in rows.chunks_exact_mut(gains.len()) {
        rmsnorm(chunk, gains, eps, head);
        chunk.copy_from_slice(head);
    }
}

/// `out[t] = RMSNorm(x[t])` for every token (rows of `gains.len()`), `chunk` tokens a task.
fn norm_rows(x: &[f32], gains: &[f32], eps: f32, out: &mut [f32], chunk: usize) {
    let width = gains.len();
    let parts = x.chunks(chunk * width).zip(out.chunks_mut(chunk * width));
    on_token_chunks(parts, |(x, out)| {
        for (dst, row) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            rmsnorm(row, gains, eps, dst);
        }
    });
}

/// The residual add `x += out`, through the family's post-norm (`normed` as scratch) if it has
/// one; `step` values (whole tokens) a task.
fn add_normed(
    out: &[f32],
    post_norm: Option<&[f32]>,
    eps: f32,
    normed: &mut [f32],
    x: &mut [f32],
    step: usize,
) {
    let parts = out
        .chunks(step)
        .zip(x.chunks_mut(step))
        .zip(normed.chunks_mut(step));
    on_token_chunks(parts, |((out, x), normed)| match post_norm {
        None => axpy_f32(1.0, out, x),
        Some(gains) => {
            let width = gains.len();
            for (dst, row) in normed.chunks_exact_mut(width).zip(out.chunks_exact(width)) {
                rmsnorm(row, gains, eps, dst);
            }
            axpy_f32(1.0, &normed[..out.len()], x);
        }
    });
}

/// GeGLU in place: `gate = gelu_tanh(gate) * up`, with PyTorch's tanh approximation
/// `0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
fn geglu_tanh(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}
