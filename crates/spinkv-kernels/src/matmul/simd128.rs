//! WASM SIMD128 batched matmul on packed operands. SIMD128 has no half-precision conversion
//! (widening an f16 vector in software costs more than the products it feeds) and engines
//! keep only 16 v128 registers, so the register tile is small: 2 weight rows × 4 tokens (8
//! accumulators), vectorised along k, multiply and add unfused (no FMA). Around it:
//!
//! * Each tile's weight rows are widened once (exactly) into an f32 copy, four lanes of each
//!   row in turn (`[k/4][rows][4]`), which every token tile of the block then multiplies: a
//!   weight is widened once per token block (up to 192 KiB of activations) instead of once per
//!   token tile.
//! * Each token block's activations are copied the same way, four lanes of each of a tile's
//!   tokens in turn (`[k/4][tokens][4]`), so the tile reads both operands through two pointers
//!   at fixed offsets instead of one address per row and token.
//!
//! The arithmetic of every output is unchanged by either copy: one 4-lane chain over k in
//! steps of 4, `acc + w·x`, the lanes summed `(l0 + l2) + (l1 + l3)`, then the last `k % 4`
//! products added one by one — the same bits as the f32 matmul on the widened weights.

use crate::scratch::with_reused;
use crate::simd::simd128::{hsum, load, store, Lanes};
use core::arch::wasm32::*;
use std::ops::Range;

const ROWS: usize = 2;
const TOKENS: usize = 4;

thread_local! {
    /// A token block's packed activations, then one row tile's packed weights.
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `y[t, r - rows.start] = x[t, :] · w[r, :]`; shapes as `super::check_shapes` checks them.
/// Tiles in the order of `crate::matmul::for_each_tile`: token blocks, then row tiles, then the
/// block's token tiles (leftover tokens one at a time), then the leftover row.
pub(super) fn matmul<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    crate::matmul::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let steps = k / 4;
    let block = crate::matmul::token_block(k, TOKENS);
    let full_rows = rows.start + n_out / ROWS * ROWS;
    with_reused(&PACKED, |buf| {
        let x_floats = block.min(n_tokens).div_ceil(TOKENS) * TOKENS * 4 * steps;
        buf.resize(x_floats + ROWS * k, 0.0);
        let (xp, wp) = buf.split_at_mut(x_floats);
        for block_start in (0..n_tokens).step_by(block) {
            let block_end = (block_start + block).min(n_tokens);
            let full_tokens = block_start + (block_end - block_start) / TOKENS * TOKENS;
            for (n, t) in (block_start..full_tokens).step_by(TOKENS).enumerate() {
                let packed = &mut xp[n * TOKENS * 4 * steps..(n + 1) * TOKENS * 4 * steps];
                pack(&x[t * k..(t + TOKENS) * k], k, TOKENS, packed, &mut []);
            }
            let mut sweep = |r: usize, nr: usize| {
                let (packed, tail) = wp[..nr * k].split_at_mut(nr * 4 * steps);
                pack(&w[r * k..(r + nr) * k], k, nr, packed, tail);
                let mut operands = |t: usize, packed_x: *const f32| Tile {
                    w: packed.as_ptr(),
                    x: packed_x,
                    steps,
                    w_tail: tail.as_ptr(),
                    x_tail: x[t * k + 4 * steps..].as_ptr(),
                    k,
                    y: y[t * n_out + (r - rows.start)..].as_mut_ptr(),
                    y_stride: n_out,
                };
                for (n, t) in (block_start..full_tokens).step_by(TOKENS).enumerate() {
                    let packed_x = xp[n * TOKENS * 4 * steps..].as_ptr();
                    // SAFETY: the packed operands hold `steps` steps of nr rows and TOKENS
                    // tokens, the tails k % 4 elements of each; outputs (t.., r..) lie in y.
                    unsafe {
                        match nr {
                            ROWS => tile::<ROWS, TOKENS>(operands(t, packed_x)),
                            _ => tile::<1, TOKENS>(operands(t, packed_x)),
                        }
                    }
                }
                for t in full_tokens..block_end {
                    // One token's activations are already "packed" (`[k/4][1][4]`).
                    let packed_x = x[t * k..].as_ptr();
                    // SAFETY: as above, for one token read in place.
                    unsafe {
                        match nr {
                            ROWS => tile::<ROWS, 1>(operands(t, packed_x)),
                            _ => tile::<1, 1>(operands(t, packed_x)),
                        }
                    }
                }
            };
            for r in (rows.start..full_rows).step_by(ROWS) {
                sweep(r, ROWS);
            }
            for r in full_rows..rows.end {
                sweep(r, 1);
            }
        }
    })
}

/// Copies `n` rows of `k` elements from `src`, widened to f32: the first `k / 4 · 4` of each
/// into `packed` as `[k/4][n][4]` (step `s` of row `i` at `(s·n + i)·4`), the last `k % 4` of
/// each into `tail` as `[n][k % 4]` (left empty when the caller reads the tails in place).
fn pack<L: Lanes>(src: &[L], k: usize, n: usize, packed: &mut [f32], tail: &mut [f32]) {
    let steps = k / 4;
    assert!(src.len() == n * k && packed.len() == n * 4 * steps);
    assert!(tail.is_empty() || tail.len() == n * (k - 4 * steps));
    for i in 0..n {
        let row = &src[i * k..(i + 1) * k];
        for s in 0..steps {
            // SAFETY: 4 * s + 4 <= k elements of the row; (s·n + i)·4 + 4 <= packed.len().
            unsafe {
                let v = L::load4(row.as_ptr().add(4 * s));
                store(packed.as_mut_ptr().add((s * n + i) * 4), v);
            }
        }
        if !tail.is_empty() {
            let rest = k - 4 * steps;
            for (d, s) in tail[i * rest..(i + 1) * rest].iter_mut().zip(&row[4 * steps..]) {
                *d = s.widen();
            }
        }
    }
}

/// One register tile's operands: `w` packed `[steps][R][4]`, `x` packed `[steps][T][4]`;
/// `w_tail` the rows' last `k % 4` widened weights (`[R][k % 4]`), `x_tail` the first
/// token's (the tokens `k` apart); `y` the output of (first token, first row), tokens
/// `y_stride` apart, rows adjacent.
struct Tile {
    w: *const f32,
    x: *const f32,
    steps: usize,
    w_tail: *const f32,
    x_tail: *const f32,
    k: usize,
    y: *mut f32,
    y_stride: usize,
}

/// # Safety
/// The pointers of `a` valid as [`Tile`] describes for R rows and T tokens.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<const R: usize, const T: usize>(a: Tile) {
    let mut acc = [[f32x4_splat(0.0); T]; R];
    let (mut w, mut x) = (a.w, a.x);
    for _ in 0..a.steps {
        // SAFETY: each of the `steps` steps reads R·4 packed weights and T·4 activations.
        unsafe {
            let mut wv = [f32x4_splat(0.0); R];
            for (i, wv) in wv.iter_mut().enumerate() {
                *wv = load(w.add(4 * i));
            }
            for t in 0..T {
                let xv = load(x.add(4 * t));
                for i in 0..R {
                    acc[i][t] = f32x4_add(acc[i][t], f32x4_mul(wv[i], xv));
                }
            }
            w = w.add(4 * R);
            x = x.add(4 * T);
        }
    }
    let rest = a.k - 4 * a.steps;
    for i in 0..R {
        for t in 0..T {
            // SAFETY: register-only reduction; the tails hold `rest` elements per row and
            // token; output (t, i) is inside the tile the caller vouched for.
            unsafe {
                let mut sum = hsum(acc[i][t]);
                for j in 0..rest {
                    sum += *a.w_tail.add(i * rest + j) * *a.x_tail.add(t * a.k + j);
                }
                *a.y.add(t * a.y_stride + i) = sum;
            }
        }
    }
}
