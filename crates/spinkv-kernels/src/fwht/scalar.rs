//! Reference FWHT: stage by stage, butterflies `(u, v) → (u + v, u - v)`, then `1/√n`.

pub fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    for (xi, s) in x.iter_mut().zip(signs) {
        *xi *= s;
    }
    fwht(x);
}

pub fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    fwht(x);
    for (xi, s) in x.iter_mut().zip(signs) {
        *xi *= s;
    }
}

/// In-place Walsh–Hadamard transform scaled by `1/sqrt(n)`; `x.len()` a power of two.
pub(crate) fn fwht(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        butterflies(x, h);
        h *= 2;
    }
    let scale = 1.0 / (n as f32).sqrt();
    for xi in x {
        *xi *= scale;
    }
}

/// One stage: `(x[i], x[i + h]) → (x[i] + x[i + h], x[i] - x[i + h])` in every block of `2h`.
#[inline(always)]
pub(crate) fn butterflies(x: &mut [f32], h: usize) {
    for block in x.chunks_exact_mut(2 * h) {
        let (lo, hi) = block.split_at_mut(h);
        for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
            let (u, v) = (*a, *b);
            *a = u + v;
            *b = u - v;
        }
    }
}
