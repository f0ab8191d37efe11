//! Batched matrix product for prefill: `Y[t, r] = X[t, :] · W[r, :]` for every token `t` and
//! every row `r` of a row range.
//!
//! The SIMD kernels hold a small block of weight rows in registers/L1 and sweep it across a
//! block of tokens, so each weight is widened from f16/bf16 once per token block instead of
//! once per token.

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

use crate::WeightRef;
use std::ops::Range;

/// `x`: `[n_tokens, k]`; `y`: `[n_tokens, rows.len()]` — a dense tile for just these rows, so
/// threads working on different row ranges write disjoint buffers (the caller scatters).
/// `w` is `[n_rows, k]` row-major with `n_rows >= rows.end`.
pub fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    check_shapes(w, k, x, &rows, y);
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: use_avx2() is true only after the CPU was checked for AVX2, FMA and F16C;
        // shapes were checked above, which is all the kernel's pointer arithmetic relies on.
        unsafe {
            match w {
                WeightRef::F16(w) => avx2::matmul(w, k, x, rows, y),
                WeightRef::Bf16(w) => avx2::matmul(w, k, x, rows, y),
                WeightRef::F32(w) => avx2::matmul(w, k, x, rows, y),
            }
        }
        return;
    }
    scalar::matmul(w, k, x, rows, y)
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

#[cfg(test)]
mod tests {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use super::*;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use crate::test_util::*;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use half::{bf16, f16};

    #[cfg(target_arch = "x86_64")]
    fn check(w: WeightRef<'_>, k: usize, n_rows: usize, n_tokens: usize) {
        let x = random_vec(7 + k as u64, n_tokens * k);
        // An offset row range exercises the rows.start arithmetic.
        let rows = n_rows / 3..n_rows;
        let mut expected = vec![0.0; n_tokens * rows.len()];
        scalar::matmul(w, k, &x, rows.clone(), &mut expected);
        let mut got = vec![0.0; expected.len()];
        // SAFETY: guarded by the CPU check below in the caller.
        unsafe {
            match w {
                WeightRef::F16(w) => avx2::matmul(w, k, &x, rows.clone(), &mut got),
                WeightRef::Bf16(w) => avx2::matmul(w, k, &x, rows.clone(), &mut got),
                WeightRef::F32(w) => avx2::matmul(w, k, &x, rows.clone(), &mut got),
            }
        }
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_close(
                *g,
                *e,
                k as f32,
                &format!("matmul k={k} tokens={n_tokens} i={i}"),
            );
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_matches_scalar() {
        if !avx2_available() {
            eprintln!("skipped: no avx2");
            return;
        }
        for &k in &AWKWARD_SIZES {
            for &(n_rows, n_tokens) in &[(1, 1), (7, 5), (13, 4), (9, 13), (17, 3)] {
                let raw = random_vec(k as u64, n_rows * k);
                let w16: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
                let wb16: Vec<bf16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
                check(WeightRef::F16(&w16), k, n_rows, n_tokens);
                check(WeightRef::Bf16(&wb16), k, n_rows, n_tokens);
                check(WeightRef::F32(&raw), k, n_rows, n_tokens);
            }
        }
    }

    #[test]
    fn scalar_matches_naive_definition() {
        let (k, n_rows, n_tokens) = (5, 4, 3);
        let w = random_vec(1, n_rows * k);
        let x = random_vec(2, n_tokens * k);
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
