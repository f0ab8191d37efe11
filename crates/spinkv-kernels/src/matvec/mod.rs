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
    // Q8_0 goes through `crate::q8dot` (its own parity); here only the route from matvec.
    for &k in &Q8_SIZES {
        let (codes, scales) = random_q8(k as u64 * 3, 5 * k);
        let w = WeightRef::Q8_0(crate::Q8Weights::new(&codes, &scales).unwrap());
        let x = random_vec(98, k);
        let (mut expected, mut got) = (vec![0.0; 4], vec![0.0; 4]);
        scalar::matvec(w, k, &x, 1..5, &mut expected);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { matvec_on(isa, w, k, &x, 1..5, &mut got) };
        canonical(isa, &got, &expected, k as f32, &|| {
            format!("matvec q8_0 k={k}")
        })?;
    }
    Ok(())
}
