//! Canonical arithmetic: the one order of floating-point operations every ISA follows, so
//! scalar, AVX2, AVX-512 and NEON kernels give bit-identical results (and greedy decoding picks
//! the same tokens on every CPU). SIMD128 lacks a fused multiply-add, so its float kernels
//! match within the stated tolerances instead.
//!
//! * Products are accumulated with fused multiply-adds (`f32::mul_add` in scalar code).
//! * A reduction over `n` elements (dot products, sums of squares, sums of exponentials) keeps
//!   16 lanes: lane `l` accumulates elements `l, l + 16, l + 32, ...` in order, starting from
//!   +0. The lanes are then combined by [`reduce16`]:
//!   `q_k = (x[4k] + x[4k+2]) + (x[4k+1] + x[4k+3])`, result `(q_0 + q_1) + (q_2 + q_3)` —
//!   what a 16-lane register reduces to with in-lane permutes, and what the transposing
//!   reductions of the attention kernels compute for 16 rows at once.
//! * `exp` is the polynomial of [`exp`] (range reduction with FMAs, ties-to-even rounding).
//! * Element-wise operations (axpy, RoPE, RMSNorm scaling, SwiGLU) use the same operations in
//!   the same order in every version, FMAs where the SIMD versions fuse.

use crate::simd::exp_consts::*;

/// Lanes of a canonical reduction.
pub(crate) const LANES: usize = 16;

/// `a·b + c` with a single rounding.
#[inline(always)]
pub(crate) fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// The canonical combination of 16 lanes (see the module docs).
#[inline(always)]
pub(crate) fn reduce16(x: &[f32; LANES]) -> f32 {
    let q = |k: usize| (x[4 * k] + x[4 * k + 2]) + (x[4 * k + 1] + x[4 * k + 3]);
    (q(0) + q(1)) + (q(2) + q(3))
}

/// Canonical `Σ x[i]·y[i]` with `x` widened by `widen`.
#[inline(always)]
pub(crate) fn dot<T: Copy>(x: &[T], y: &[f32], widen: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
        acc[i % LANES] = fma(widen(a), b, acc[i % LANES]);
    }
    reduce16(&acc)
}

/// Canonical `Σ x[i]`.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (i, &v) in x.iter().enumerate() {
        acc[i % LANES] += v;
    }
    reduce16(&acc)
}

/// e^x: `x = n·ln2 + r` (n rounded to nearest even, ln2 in two parts), degree-6 polynomial
/// for e^r by FMAs, times 2^n; inputs below -87.3 (including -inf) give 0, above 88.3 clamp.
/// ~2 ulp over the range attention and SwiGLU use.
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    exp_with(x, &P)
}

/// [`exp`] with the softmax weights' shorter polynomial (`P_SOFTMAX`, 5.4·10^-6 relative).
#[inline]
pub(crate) fn exp_softmax(x: f32) -> f32 {
    exp_with(x, &P_SOFTMAX)
}

/// The steps of [`exp`] with the polynomial `p` (highest degree first).
#[inline]
fn exp_with(x: f32, p: &[f32]) -> f32 {
    let underflow = x < LOW;
    let x = x.clamp(LOW, HIGH);
    let n = (x * core::f32::consts::LOG2_E).round_ties_even();
    let r = fma(-n, LN2_HI, x);
    let r = fma(-n, LN2_LO, r);
    let mut poly = p[0];
    for &c in &p[1..] {
        poly = fma(poly, r, c);
    }
    let er = fma(poly, r * r, r) + 1.0;
    let two_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if underflow {
        0.0
    } else {
        er * two_n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_and_flushes_below_the_range() {
        let mut worst = 0.0f64;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp();
            worst = worst.max(((exp(x) as f64 - want) / want).abs());
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        let mut worst = 0.0f64;
        for i in -87_000..20_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp();
            worst = worst.max(((exp_softmax(x) as f64 - want) / want).abs());
        }
        assert!(worst < 6e-6, "softmax relative error {worst}");
        assert_eq!(exp_softmax(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_softmax(0.0), 1.0);
    }

    #[test]
    fn reduce16_is_the_documented_tree() {
        let x: [f32; 16] = core::array::from_fn(|i| 1.0 + (i as f32) * 1e-7);
        let q: Vec<f32> = (0..4)
            .map(|k| (x[4 * k] + x[4 * k + 2]) + (x[4 * k + 1] + x[4 * k + 3]))
            .collect();
        assert_eq!(
            reduce16(&x).to_bits(),
            ((q[0] + q[1]) + (q[2] + q[3])).to_bits()
        );
    }
}
