//! Matrix–vector product for decode: `y[r - rows.start] = W[r, :] · x` for `r` in a row range.
//!
//! Decode is memory-bound: the SIMD kernels widen f16/bf16 weights in registers (never to an
//! f32 copy) and stream several rows at once with independent accumulators.

crate::isa::isa_modules!(scalar, x86, quad);

use crate::isa::{active_isa, dispatch, Isa};
use crate::WeightRef;
use std::ops::Range;

/// `w`: `[n_rows, k]` row-major with `n_rows >= rows.end`; `x`: `[k]`; `y`: `[rows.len()]`.
pub fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    check_shapes(w.len(), k, x, &rows, y);
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes were checked,
    // which is all the kernels' pointer arithmetic relies on.
    unsafe { matvec_on(active_isa(), w, k, x, rows, y) }
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn matvec_on(
    isa: Isa,
    w: WeightRef<'_>,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    dispatch!(isa, matvec(w, k, x, rows, y))
}

/// Q8_0 rows hold whole blocks of 32 weights.
pub(crate) fn check_q8_row(k: usize) {
    assert!(
        k.is_multiple_of(crate::weight::Q8_BLOCK),
        "matvec: Q8_0 rows of {k} weights are not whole blocks"
    );
}

/// Q8_0 matvec for ISAs without a fused kernel: rows dequantized (exactly) a block at a time
/// into an f32 scratch and given to `kernel(rows_f32, y_block)`, so the result equals the f32
/// kernel's on the dequantized matrix.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "wasm32")),
    allow(dead_code)
)]
// Inlined into each ISA entry point, so `kernel` compiles with the ISA's features.
#[inline(always)]
pub(crate) fn q8_by_dequantized_rows(
    w: crate::weight::Q8Weights<'_>,
    k: usize,
    rows: Range<usize>,
    y: &mut [f32],
    mut kernel: impl FnMut(&[f32], &mut [f32]),
) {
    check_q8_row(k);
    let per_block = (Q8_SCRATCH_FLOATS / k).max(1);
    let mut scratch = vec![0.0f32; per_block.min(rows.len()) * k];
    for (i, y_block) in y.chunks_mut(per_block).enumerate() {
        let first = rows.start + i * per_block;
        let block = &mut scratch[..y_block.len() * k];
        w.dequantize_rows(k, first..first + y_block.len(), block);
        kernel(block, y_block);
    }
}

/// Floats of dequantized Q8_0 rows held at once (stays in L2).
pub(crate) const Q8_SCRATCH_FLOATS: usize = 32 * 1024;

pub(crate) fn check_shapes(w_len: usize, k: usize, x: &[f32], rows: &Range<usize>, y: &[f32]) {
    assert!(k > 0, "matvec: k must be positive");
    assert!(rows.start <= rows.end, "matvec: reversed row range");
    assert!(
        w_len >= rows.end * k,
        "matvec: weight has fewer than {} rows",
        rows.end
    );
    assert_eq!(x.len(), k, "matvec: x is not [k]");
    assert_eq!(y.len(), rows.len(), "matvec: y is not [rows]");
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    use half::{bf16, f16};
    for &k in &AWKWARD_SIZES {
        for &n_rows in &[1usize, 3, 4, 5, 9, 17] {
            let raw = random_vec(k as u64 * 31 + n_rows as u64, n_rows * k);
            let x = random_vec(99, k);
            let w16: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
            let wb16: Vec<bf16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            for w in [
                WeightRef::F16(&w16),
                WeightRef::Bf16(&wb16),
                WeightRef::F32(&raw),
            ] {
                for rows in [0..n_rows, n_rows / 2..n_rows] {
                    let mut expected = vec![0.0; rows.len()];
                    scalar::matvec(w, k, &x, rows.clone(), &mut expected);
                    let mut got = vec![0.0; rows.len()];
                    // SAFETY: `isa` comes from the runnable list.
                    unsafe { matvec_on(isa, w, k, &x, rows.clone(), &mut got) };
                    canonical(isa, &got, &expected, k as f32, &|| {
                        format!("matvec {:?} k={k} rows={rows:?}", w.dtype())
                    })?;
                }
            }
        }
    }
    for &k in &Q8_SIZES {
        for &n_rows in &[1usize, 5, 70] {
            let (codes, scales) = random_q8(k as u64 * 3 + n_rows as u64, n_rows * k);
            let w = WeightRef::Q8_0(crate::Q8Weights::new(&codes, &scales).unwrap());
            let x = random_vec(98, k);
            for rows in [0..n_rows, n_rows / 2..n_rows] {
                let mut expected = vec![0.0; rows.len()];
                scalar::matvec(w, k, &x, rows.clone(), &mut expected);
                // Scalar Q8_0 is the f32 reference on the dequantized rows.
                let dense: Vec<f32> = (0..n_rows * k)
                    .map(|i| codes[i] as f32 * scales[i / 32].to_f32())
                    .collect();
                let mut dense_out = vec![0.0; rows.len()];
                scalar::matvec(WeightRef::F32(&dense), k, &x, rows.clone(), &mut dense_out);
                if dense_out != expected {
                    return Err(format!(
                        "scalar matvec q8_0 k={k} differs from f32 on its dequantized rows"
                    ));
                }
                let mut got = vec![0.0; rows.len()];
                // SAFETY: `isa` comes from the runnable list.
                unsafe { matvec_on(isa, w, k, &x, rows.clone(), &mut got) };
                canonical(isa, &got, &expected, k as f32, &|| {
                    format!("matvec q8_0 k={k} rows={rows:?}")
                })?;
            }
        }
    }
    Ok(())
}
