//! The few f32/f16 loops the cache needs. Scalar versions are written so the compiler
//! vectorises them; the two page-level fp16 loops also have an AVX2+FMA+F16C version chosen at
//! run time (`SPINKV_ISA=scalar` forces the scalar one). They move to spinkv-kernels once that
//! crate exposes equivalents.

use std::sync::OnceLock;

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Whether the AVX2 page kernels may run (detected once).
fn use_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        let forced_scalar =
            std::env::var("SPINKV_ISA").is_ok_and(|v| v.eq_ignore_ascii_case("scalar"));
        !forced_scalar && avx2::available()
    })
}

/// `scores[qh · stride + j] = queries[qh] · keys[j]` for `rows` fp16 key rows of width `d`
/// and every query row (`queries`: `[n_qh][d]`). Each key row is widened once.
pub(crate) fn score_block_f16(
    keys: &[f16],
    d: usize,
    rows: usize,
    queries: &[f32],
    row: &mut [f32],
    scores: &mut [f32],
    stride: usize,
) {
    debug_assert!(keys.len() >= rows * d && row.len() == d && queries.len() % d == 0);
    if use_avx2() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `use_avx2` checked at run time that the CPU has AVX2, FMA and F16C.
        unsafe {
            return avx2::score_block_f16(keys, d, rows, queries, row, scores, stride);
        }
    }
    score_block_f16_scalar(keys, d, rows, queries, row, scores, stride)
}

pub(crate) fn score_block_f16_scalar(
    keys: &[f16],
    d: usize,
    rows: usize,
    queries: &[f32],
    row: &mut [f32],
    scores: &mut [f32],
    stride: usize,
) {
    for j in 0..rows {
        f16_to_f32(&keys[j * d..(j + 1) * d], row);
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            scores[qh * stride + j] = dot_f32(q, row);
        }
    }
}

/// `acc[qh] += Σ_j weights[qh · stride + j] · values[j]` over `rows` fp16 value rows of width
/// `d` (`acc`: `[n_qh][d]`). Each value row is widened once; zero weights are skipped.
pub(crate) fn accumulate_block_f16(
    values: &[f16],
    d: usize,
    rows: usize,
    weights: &[f32],
    stride: usize,
    row: &mut [f32],
    acc: &mut [f32],
) {
    debug_assert!(values.len() >= rows * d && row.len() == d && acc.len() % d == 0);
    if use_avx2() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `use_avx2` checked at run time that the CPU has AVX2, FMA and F16C.
        unsafe {
            return avx2::accumulate_block_f16(values, d, rows, weights, stride, row, acc);
        }
    }
    accumulate_block_f16_scalar(values, d, rows, weights, stride, row, acc)
}

pub(crate) fn accumulate_block_f16_scalar(
    values: &[f16],
    d: usize,
    rows: usize,
    weights: &[f32],
    stride: usize,
    row: &mut [f32],
    acc: &mut [f32],
) {
    for j in 0..rows {
        f16_to_f32(&values[j * d..(j + 1) * d], row);
        for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate() {
            let w = weights[qh * stride + j];
            if w != 0.0 {
                axpy_f32(acc_row, w, row);
            }
        }
    }
}

/// `Σ a[i]·b[i]`, f32 throughout (AVX2+FMA when available).
#[inline]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    if use_avx2() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `use_avx2` checked at run time that the CPU has AVX2, FMA and F16C.
        unsafe {
            return avx2::dot(a, b);
        }
    }
    dot_f32_scalar(a, b)
}

/// `Σ a[i]·b[i]` with eight independent accumulators (vectorisable).
#[inline]
pub(crate) fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let (a_chunks, a_tail) = a.split_at(a.len() - a.len() % 8);
    let (b_chunks, b_tail) = b.split_at(a_chunks.len());
    for (x, y) in a_chunks.chunks_exact(8).zip(b_chunks.chunks_exact(8)) {
        for lane in 0..8 {
            acc[lane] += x[lane] * y[lane];
        }
    }
    let mut sum = (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]);
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y;
    }
    sum
}

/// `y += alpha · x` (AVX2+FMA when available).
#[inline]
pub(crate) fn axpy_f32(y: &mut [f32], alpha: f32, x: &[f32]) {
    if use_avx2() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `use_avx2` checked at run time that the CPU has AVX2, FMA and F16C.
        unsafe {
            return avx2::axpy(y, alpha, x);
        }
    }
    axpy_f32_scalar(y, alpha, x)
}

#[inline]
pub(crate) fn axpy_f32_scalar(y: &mut [f32], alpha: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y *= alpha`.
#[inline]
pub(crate) fn scale_f32(y: &mut [f32], alpha: f32) {
    for yi in y {
        *yi *= alpha;
    }
}

/// Widens a row of halves (F16C when the CPU has it, via `half`).
#[inline]
pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    src.convert_to_f32_slice(dst);
}

/// Narrows a row of floats to halves (round to nearest even).
#[inline]
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    dst.convert_from_f32_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Widens `src` into `dst` (same length), eight lanes at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n = dst.len().min(src.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds both the 16-byte load and the 32-byte store.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for k in i..n {
            dst[k] = src[k].to_f32();
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n bounds all four 32-byte loads.
            unsafe {
                let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb), acc0);
                acc1 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8)), acc1);
            }
            i += 16;
        }
        if i + 8 <= n {
            // SAFETY: i + 8 <= n bounds both loads.
            unsafe {
                acc0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
            }
            i += 8;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let quad = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        let mut sum = _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
        for k in i..n {
            sum += a[k] * b[k];
        }
        sum
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds the loads and the store.
            unsafe {
                let py = y.as_mut_ptr().add(i);
                _mm256_storeu_ps(
                    py,
                    _mm256_fmadd_ps(a, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(py)),
                );
            }
            i += 8;
        }
        for k in i..n {
            y[k] += alpha * x[k];
        }
    }

    /// See [`super::score_block_f16`]. Caller guarantees AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn score_block_f16(
        keys: &[f16],
        d: usize,
        rows: usize,
        queries: &[f32],
        row: &mut [f32],
        scores: &mut [f32],
        stride: usize,
    ) {
        for j in 0..rows {
            // SAFETY (all calls below): this function runs with the same target features.
            unsafe { widen(&keys[j * d..(j + 1) * d], row) };
            for (qh, q) in queries.chunks_exact(d).enumerate() {
                scores[qh * stride + j] = unsafe { dot(q, row) };
            }
        }
    }

    /// See [`super::accumulate_block_f16`]. Caller guarantees AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn accumulate_block_f16(
        values: &[f16],
        d: usize,
        rows: usize,
        weights: &[f32],
        stride: usize,
        row: &mut [f32],
        acc: &mut [f32],
    ) {
        for j in 0..rows {
            // SAFETY (all calls below): this function runs with the same target features.
            unsafe { widen(&values[j * d..(j + 1) * d], row) };
            for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate() {
                let w = weights[qh * stride + j];
                if w != 0.0 {
                    unsafe { axpy(acc_row, w, row) };
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    pub(super) fn available() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_kernels_agree_with_scalar() {
        let d = 20;
        let rows = 7;
        let n_qh = 3;
        let stride = 9;
        let keys: Vec<f16> = (0..rows * d)
            .map(|i| f16::from_f32((i as f32 * 0.13).sin()))
            .collect();
        let queries: Vec<f32> = (0..n_qh * d).map(|i| (i as f32 * 0.7).cos()).collect();
        let weights: Vec<f32> = (0..n_qh * stride)
            .map(|i| if i % 4 == 0 { 0.0 } else { i as f32 * 0.01 })
            .collect();
        let mut row = vec![0.0; d];
        let (mut s1, mut s2) = (vec![0.0; n_qh * stride], vec![0.0; n_qh * stride]);
        score_block_f16(&keys, d, rows, &queries, &mut row, &mut s1, stride);
        score_block_f16_scalar(&keys, d, rows, &queries, &mut row, &mut s2, stride);
        for (a, b) in s1.iter().zip(&s2) {
            assert!((a - b).abs() < 1e-5);
        }
        let (mut a1, mut a2) = (vec![0.5; n_qh * d], vec![0.5; n_qh * d]);
        accumulate_block_f16(&keys, d, rows, &weights, stride, &mut row, &mut a1);
        accumulate_block_f16_scalar(&keys, d, rows, &weights, stride, &mut row, &mut a2);
        for (a, b) in a1.iter().zip(&a2) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    use super::*;

    #[test]
    fn dot_and_axpy_match_naive_for_awkward_lengths() {
        for n in [0usize, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 129] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot_f32(&a, &b) as f64 - naive).abs() < 1e-4, "n={n}");
            assert!(
                (dot_f32_scalar(&a, &b) as f64 - naive).abs() < 1e-4,
                "n={n}"
            );
            let mut y2 = b.clone();
            axpy_f32_scalar(&mut y2, 0.5, &a);
            let mut y = b.clone();
            axpy_f32(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
                assert!((y2[i] - y[i]).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn f16_round_trip() {
        let x = [0.0f32, 1.0, -2.5, 65504.0, 1e-3];
        let mut h = [f16::ZERO; 5];
        let mut back = [0.0f32; 5];
        f32_to_f16(&x, &mut h);
        f16_to_f32(&h, &mut back);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() * 1e-3);
        }
    }
}
