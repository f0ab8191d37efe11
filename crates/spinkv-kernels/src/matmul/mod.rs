//! Batched matrix product for prefill: `Y[t, r] = X[t, :] · W[r, :]` for every token `t` and
//! every row `r` of a row range.
//!
//! The SIMD kernels hold a small block of weight rows in registers/L1 and sweep it across a
//! block of tokens, so each weight is widened from f16/bf16 once per token block instead of
//! once per token.

crate::isa::isa_modules!(scalar, x86, quad);
#[cfg(target_arch = "x86_64")]
mod avx2_f16;

use crate::isa::{active_isa, dispatch, Isa};
use crate::WeightRef;
use std::ops::Range;

/// `x`: `[n_tokens, k]`; `y`: `[n_tokens, rows.len()]` — a dense tile for just these rows, so
/// threads working on different row ranges write disjoint buffers (the caller scatters).
/// `w` is `[n_rows, k]` row-major with `n_rows >= rows.end`.
pub fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    check_shapes(w, k, x, &rows, y);
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes were checked,
    // which is all the kernels' pointer arithmetic relies on.
    unsafe { matmul_on(active_isa(), w, k, x, rows, y) }
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn matmul_on(
    isa: Isa,
    w: WeightRef<'_>,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    dispatch!(isa, matmul(w, k, x, rows, y))
}

/// Bytes of activations a token block may take: a block is swept by every weight row of the
/// range, so it should stay in the core's L2 (1–2 MiB on current x86/ARM cores) next to the
/// weight rows streaming through.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "wasm32")),
    allow(dead_code)
)]
const TOKEN_BLOCK_BYTES: usize = 192 * 1024;

/// Tokens per block for rows of `k` f32 activations: a multiple of `t_tile`, at least one tile.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "wasm32")),
    allow(dead_code)
)]
fn token_block(k: usize, t_tile: usize) -> usize {
    let fit = TOKEN_BLOCK_BYTES / (k * core::mem::size_of::<f32>()).max(1);
    (fit / t_tile).max(1) * t_tile
}

/// Walks the `[n_tokens] × rows` output in register tiles of `R` rows × `T` tokens. Tokens go
/// in cache-sized blocks (outer loop) so each block of activations is read from L2 by every
/// weight row rather than from memory; within a block: full tiles first, then the leftover
/// tokens of each row block one at a time, then the leftover rows. `tile(row,
/// n_rows_in_tile, token, n_tokens_in_tile)` with sizes `(R, T)`, `(R, 1)`, `(1, T)` or
/// `(1, 1)` only, so each ISA instantiates just four register tiles. The visiting order does
/// not change any output: each is one independent dot product. (SIMD128 walks the same order
/// with packing steps between, in `simd128.rs`.)
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) fn for_each_tile(
    rows: Range<usize>,
    n_tokens: usize,
    k: usize,
    r_tile: usize,
    t_tile: usize,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    let full_rows = rows.start + rows.len() / r_tile * r_tile;
    let block = token_block(k, t_tile);
    for block_start in (0..n_tokens).step_by(block) {
        let block_end = (block_start + block).min(n_tokens);
        let full_tokens = block_start + (block_end - block_start) / t_tile * t_tile;
        for r in (rows.start..full_rows).step_by(r_tile) {
            for t in (block_start..full_tokens).step_by(t_tile) {
                tile(r, r_tile, t, t_tile);
            }
            for t in full_tokens..block_end {
                tile(r, r_tile, t, 1);
            }
        }
        for r in full_rows..rows.end {
            for t in (block_start..full_tokens).step_by(t_tile) {
                tile(r, 1, t, t_tile);
            }
            for t in full_tokens..block_end {
                tile(r, 1, t, 1);
            }
        }
    }
}

/// Bytes of weight rows a row block may take: [`for_each_tile_rows_inner`] sweeps a block once
/// per token tile, so it should stay in the core's L2 beside the activations.
const ROW_BLOCK_BYTES: usize = 224 * 1024;

/// Like [`for_each_tile`], but with the token tile outside the row tiles: rows go in blocks
/// of at most [`ROW_BLOCK_BYTES`] (`weight_bytes` per element), and within a block every
/// token tile sweeps all the block's rows, so its `t_tile` activation rows stay in L1 while
/// the (narrower, f16/bf16) weights stream from L2. Same four tile shapes, each output once.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn for_each_tile_rows_inner(
    rows: Range<usize>,
    n_tokens: usize,
    k: usize,
    weight_bytes: usize,
    r_tile: usize,
    t_tile: usize,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    let fit = ROW_BLOCK_BYTES / (k * weight_bytes).max(1);
    let block = (fit / r_tile).max(1) * r_tile;
    let full_tokens = n_tokens / t_tile * t_tile;
    for block_start in rows.clone().step_by(block) {
        let block_end = (block_start + block).min(rows.end);
        let full_rows = block_start + (block_end - block_start) / r_tile * r_tile;
        let mut sweep = |t: usize, nt: usize| {
            for r in (block_start..full_rows).step_by(r_tile) {
                tile(r, r_tile, t, nt);
            }
            for r in full_rows..block_end {
                tile(r, 1, t, nt);
            }
        };
        for t in (0..full_tokens).step_by(t_tile) {
            sweep(t, t_tile);
        }
        for t in full_tokens..n_tokens {
            sweep(t, 1);
        }
    }
}

/// One register tile's operands, as the per-ISA tile functions take them (SIMD128's packed
/// tiles take their own).
#[cfg(any(target_arch = "aarch64", target_arch = "x86_64"))]
pub(crate) struct TileArgs<L> {
    /// First weight row of the tile; rows are `k` apart.
    pub(crate) w: *const L,
    /// First token of the tile; tokens are `k` apart.
    pub(crate) x: *const f32,
    /// Output for (first token, first row); tokens are `y_stride` apart, rows adjacent.
    pub(crate) y: *mut f32,
    pub(crate) k: usize,
    pub(crate) y_stride: usize,
}

pub(crate) fn check_shapes(w: WeightRef<'_>, k: usize, x: &[f32], rows: &Range<usize>, y: &[f32]) {
    check_shapes_generic(w.len(), k, x, rows, y)
}

pub(crate) fn check_shapes_generic(
    w_len: usize,
    k: usize,
    x: &[f32],
    rows: &Range<usize>,
    y: &[f32],
) {
    assert!(k > 0, "matmul: k must be positive");
    assert!(rows.start <= rows.end, "matmul: reversed row range");
    assert!(
        w_len >= rows.end * k,
        "matmul: weight has fewer than {} rows",
        rows.end
    );
    assert_eq!(x.len() % k, 0, "matmul: x is not [n_tokens, k]");
    assert_eq!(
        y.len(),
        x.len() / k * rows.len(),
        "matmul: y is not [n_tokens, rows]"
    );
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    use half::{bf16, f16};
    for &k in &AWKWARD_SIZES {
        for &(n_rows, n_tokens) in &[(1, 1), (7, 5), (13, 4), (9, 13), (17, 3), (25, 7)] {
            let raw = random_vec(k as u64, n_rows * k);
            let w16: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
            let wb16: Vec<bf16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            for w in [
                WeightRef::F16(&w16),
                WeightRef::Bf16(&wb16),
                WeightRef::F32(&raw),
            ] {
                let x = random_vec(7 + k as u64, n_tokens * k);
                check_against_scalar(isa, w, k, &x, n_rows)?;
            }
        }
    }
    // 160 f16 rows of 1536 (480 KiB) span several of the L2 row blocks the AVX2 kernel sweeps
    // per token tile; 7 tokens leave a token tail after its 3-token tiles.
    let k = 1536;
    let raw = random_vec(k as u64 + 3, 160 * k);
    let w16: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
    check_against_scalar(isa, WeightRef::F16(&w16), k, &random_vec(13, 7 * k), 160)?;
    for &k in &Q8_SIZES {
        // 70 rows span more than one dequantized block when k = 576 or 1536.
        for &(n_rows, n_tokens) in &[(1, 1), (9, 5), (70, 3)] {
            let (codes, scales) = random_q8(k as u64 + 5, n_rows * k);
            let w = WeightRef::Q8_0(crate::Q8Weights::new(&codes, &scales).unwrap());
            let x = random_vec(11 + k as u64, n_tokens * k);
            check_against_scalar(isa, w, k, &x, n_rows)?;
        }
    }
    Ok(())
}

/// `isa`'s matmul of rows `n_rows / 3..n_rows` (an offset range exercises the rows.start
/// arithmetic) against the scalar reference.
#[cfg(any(test, feature = "parity"))]
fn check_against_scalar(
    isa: Isa,
    w: WeightRef<'_>,
    k: usize,
    x: &[f32],
    n_rows: usize,
) -> crate::test_util::Check {
    let rows = n_rows / 3..n_rows;
    let n_tokens = x.len() / k;
    let mut expected = vec![0.0; n_tokens * rows.len()];
    scalar::matmul(w, k, x, rows.clone(), &mut expected);
    let mut got = vec![0.0; expected.len()];
    // SAFETY: `isa` comes from the runnable list.
    unsafe { matmul_on(isa, w, k, x, rows.clone(), &mut got) };
    crate::test_util::canonical(isa, &got, &expected, k as f32, &|| {
        format!(
            "matmul {:?} k={k} rows={n_rows} tokens={n_tokens}",
            w.dtype()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How often each output of `rows` × `n_tokens` is visited by the tiles `walk` hands out
    /// (`[rows.end][n_tokens]`, rows before `rows.start` included so a stray visit shows);
    /// every tile must be `tile` or have one row or one token.
    fn visits(
        rows: Range<usize>,
        n_tokens: usize,
        tile: (usize, usize),
        walk: impl FnOnce(&mut dyn FnMut(usize, usize, usize, usize)),
    ) -> Vec<u32> {
        let mut seen = vec![0; rows.end * n_tokens];
        walk(&mut |r, nr, t, nt| {
            assert!((nr, nt) == tile || nr == 1 || nt == 1);
            for i in r..r + nr {
                for j in t..t + nt {
                    seen[i * n_tokens + j] += 1;
                }
            }
        });
        seen
    }

    #[test]
    fn tiles_cover_every_output_once() {
        // k = 8_000 makes token blocks of 6 tokens (two tiles of 3): blocks and tails mix.
        for (rows, n_tokens, k) in [
            (0..10, 7, 8),
            (3..4, 1, 8),
            (5..17, 12, 8),
            (0..0, 3, 8),
            (0..10, 17, 8_000),
            (2..9, 6, 8_000),
        ] {
            let seen = visits(rows.clone(), n_tokens, (4, 3), |tile| {
                for_each_tile(rows.clone(), n_tokens, k, 4, 3, tile)
            });
            assert!(seen[rows.start * n_tokens..].iter().all(|&c| c == 1));
        }
    }

    #[test]
    fn row_blocked_tiles_cover_every_output_once() {
        // k = 50_000 f16 (100 KB rows) makes row blocks of one 2-row tile, so 11 rows end in
        // a 1-row block; 7 tokens in tiles of 3 leave a token tail.
        for (rows, n_tokens, k) in [
            (0..10, 7, 8),
            (3..4, 1, 8),
            (5..17, 12, 8),
            (0..0, 3, 8),
            (0..11, 7, 50_000),
            (2..9, 6, 50_000),
        ] {
            let seen = visits(rows.clone(), n_tokens, (2, 3), |tile| {
                for_each_tile_rows_inner(rows.clone(), n_tokens, k, 2, 2, 3, tile)
            });
            assert!(seen[rows.start * n_tokens..].iter().all(|&c| c == 1));
            assert!(seen[..rows.start * n_tokens].iter().all(|&c| c == 0));
        }
    }

    #[test]
    fn scalar_matches_naive_definition() {
        let (k, n_rows, n_tokens) = (5, 4, 3);
        let w = crate::test_util::random_vec(1, n_rows * k);
        let x = crate::test_util::random_vec(2, n_tokens * k);
        let mut y = vec![0.0; n_tokens * 2];
        scalar::matmul(WeightRef::F32(&w), k, &x, 1..3, &mut y);
        for t in 0..n_tokens {
            for (j, r) in (1..3).enumerate() {
                let want: f32 = (0..k).map(|i| w[r * k + i] * x[t * k + i]).sum();
                assert!((y[t * 2 + j] - want).abs() < 1e-6);
            }
        }
    }
}
