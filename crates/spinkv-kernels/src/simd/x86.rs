//! The lane trait of the x86 kernels: one register of f32 lanes, `__m256` (AVX2, 8 lanes) or
//! `__m512` (AVX-512, 16 lanes), so a kernel's tiles, tails and reductions are written once
//! (the op's `x86.rs`) and instantiated per width by [`x86_kernels`](crate::isa::x86_kernels).
//!
//! The canonical 16 lanes of `crate::canon` are [`Vector::Sum`]: two `__m256` (lanes 0..8 and
//! 8..16, two FMA chains) or one `__m512`, so every reduction keeps each ISA's exact order.
//!
//! Every method is `#[inline(always)]` without target features of its own: it only ever runs
//! inlined into a `#[target_feature]` entry point of its ISA, where the intrinsics inline too.
//! Hence all are `unsafe`: the caller must run with that ISA's features (its entry point).

use super::{avx2, avx512, Lanes};
use crate::Isa;
use std::arch::x86_64::*;

/// A register of f32 lanes (see the module docs). # Safety (every method): the CPU supports
/// `Self::ISA` and the caller runs with its target features; pointers as each method says.
pub(crate) trait Vector: Copy {
    const ISA: Isa;
    /// Lanes per register.
    const N: usize;
    /// Whether partial groups of f16/bf16 load in one masked instruction (AVX-512); AVX2
    /// kernels keep halves to whole registers and finish with scalar code instead.
    const MASKED_HALVES: bool;
    /// Lanes `0..n` of a register, for partial loads and stores.
    type Mask: Copy;
    /// The canonical 16 lanes (one or two registers).
    type Sum: Copy;

    unsafe fn mask(n: usize) -> Self::Mask;
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// `ptr` readable for `N` floats.
    unsafe fn load(ptr: *const f32) -> Self;
    /// Lanes outside `mask` read as 0 and are not touched in memory.
    unsafe fn load_masked(ptr: *const f32, mask: Self::Mask) -> Self;
    /// `ptr` writable for `N` floats.
    unsafe fn store(ptr: *mut f32, v: Self);
    /// Only the lanes in `mask` are written.
    unsafe fn store_masked(ptr: *mut f32, mask: Self::Mask, v: Self);
    /// Lanes `0..n` (`n <= N`) read, the others 0: a plain load for a whole register.
    #[inline(always)]
    unsafe fn load_part(ptr: *const f32, n: usize) -> Self {
        // SAFETY: `ptr` readable for `n` floats (the caller's contract), `N` when whole.
        unsafe {
            if n == Self::N {
                Self::load(ptr)
            } else {
                Self::load_masked(ptr, Self::mask(n))
            }
        }
    }
    /// Lanes `0..n` (`n <= N`) written, the rest of memory untouched: a plain store for a
    /// whole register, because AMD runs AVX2's masked store as microcode (~13 cycles each on
    /// a Zen 3, against ~1 for a plain store: the narrow value tile's 24 a chunk took about
    /// as long as its FMAs).
    #[inline(always)]
    unsafe fn store_part(ptr: *mut f32, n: usize, v: Self) {
        // SAFETY: `ptr` writable for `n` floats (the caller's contract), `N` when whole.
        unsafe {
            if n == Self::N {
                Self::store(ptr, v)
            } else {
                Self::store_masked(ptr, Self::mask(n), v)
            }
        }
    }
    /// `a·b + c`, one rounding.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    /// `max(m, |v|)` lane by lane (no NaN).
    unsafe fn max_abs(m: Self, v: Self) -> Self;
    /// The largest lane (no NaN).
    unsafe fn reduce_max(v: Self) -> f32;
    /// Each lane rounded to the nearest integer, ties to even.
    unsafe fn round_even(v: Self) -> Self;
    /// `N` elements widened to f32; `ptr` readable for them.
    unsafe fn widen<L: Lanes>(ptr: *const L) -> Self;
    /// The first `n <= N` elements widened (other lanes 0); only those are read.
    unsafe fn widen_part<L: Lanes>(ptr: *const L, n: usize) -> Self;
    /// Bit `l` set for each lane `l < n` that is not 0.
    unsafe fn nonzero_bits(v: Self, n: usize) -> u32;

    unsafe fn sum_zero() -> Self::Sum;
    /// 16 elements widened; `ptr` readable for them.
    unsafe fn sum_widen<L: Lanes>(ptr: *const L) -> Self::Sum;
    /// The first `n < 16` elements widened (other lanes 0); only those are read.
    unsafe fn sum_widen_part<L: Lanes>(ptr: *const L, n: usize) -> Self::Sum;
    unsafe fn sum_fma(a: Self::Sum, b: Self::Sum, c: Self::Sum) -> Self::Sum;
    /// `crate::canon::reduce16` of the 16 lanes.
    unsafe fn reduce(s: Self::Sum) -> f32;
}

impl Vector for __m256 {
    const ISA: Isa = Isa::Avx2;
    const N: usize = 8;
    const MASKED_HALVES: bool = false;
    type Mask = __m256i;
    type Sum = (__m256, __m256);

    #[inline(always)]
    unsafe fn mask(n: usize) -> __m256i {
        // SAFETY (every intrinsic of this impl): the caller runs with AVX2+FMA+F16C; the
        // pointer arguments are valid as each trait method requires.
        unsafe { avx2::tail_mask(n) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: as above.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(ptr: *const f32) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_loadu_ps(ptr) }
    }
    #[inline(always)]
    unsafe fn load_masked(ptr: *const f32, mask: __m256i) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_maskload_ps(ptr, mask) }
    }
    #[inline(always)]
    unsafe fn store(ptr: *mut f32, v: Self) {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(ptr, v) }
    }
    #[inline(always)]
    unsafe fn store_masked(ptr: *mut f32, mask: __m256i, v: Self) {
        // SAFETY: as above.
        unsafe { _mm256_maskstore_ps(ptr, mask, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max_abs(m: Self, v: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)) }
    }
    #[inline(always)]
    unsafe fn reduce_max(v: Self) -> f32 {
        // SAFETY: as above.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
            _mm_cvtss_f32(m)
        }
    }
    #[inline(always)]
    unsafe fn round_even(v: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v) }
    }
    #[inline(always)]
    unsafe fn widen<L: Lanes>(ptr: *const L) -> Self {
        // SAFETY: as above.
        unsafe { L::load8(ptr) }
    }
    #[inline(always)]
    unsafe fn widen_part<L: Lanes>(ptr: *const L, n: usize) -> Self {
        // SAFETY: as above; halves have no masked load here, so a partial group goes through
        // a zero-padded copy of its `n` elements.
        unsafe {
            if L::IS_F32 {
                _mm256_maskload_ps(ptr as *const f32, avx2::tail_mask(n))
            } else if n == 8 {
                L::load8(ptr)
            } else {
                let mut t = [0.0f32; 8];
                for (j, v) in t.iter_mut().enumerate().take(n) {
                    *v = (*ptr.add(j)).widen();
                }
                _mm256_loadu_ps(t.as_ptr())
            }
        }
    }
    #[inline(always)]
    unsafe fn nonzero_bits(v: Self, n: usize) -> u32 {
        // SAFETY: as above.
        let nonzero = unsafe { _mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps()) };
        // SAFETY: as above.
        (unsafe { _mm256_movemask_ps(nonzero) }) as u32 & ((1u32 << n) - 1)
    }

    #[inline(always)]
    unsafe fn sum_zero() -> Self::Sum {
        // SAFETY: as above.
        unsafe { (_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn sum_widen<L: Lanes>(ptr: *const L) -> Self::Sum {
        // SAFETY: as above.
        unsafe { (L::load8(ptr), L::load8(ptr.add(8))) }
    }
    #[inline(always)]
    unsafe fn sum_widen_part<L: Lanes>(ptr: *const L, n: usize) -> Self::Sum {
        // SAFETY: as above; the upper half reads from `ptr + 8` only when `n > 8`.
        unsafe {
            (
                Self::widen_part(ptr, n.min(8)),
                Self::widen_part(ptr.wrapping_add(8), n.saturating_sub(8)),
            )
        }
    }
    #[inline(always)]
    unsafe fn sum_fma(a: Self::Sum, b: Self::Sum, c: Self::Sum) -> Self::Sum {
        // SAFETY: as above.
        unsafe {
            (
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn reduce(s: Self::Sum) -> f32 {
        // SAFETY: as above.
        unsafe { avx2::reduce16(s.0, s.1) }
    }
}

impl Vector for __m512 {
    const ISA: Isa = Isa::Avx512;
    const N: usize = 16;
    const MASKED_HALVES: bool = true;
    type Mask = __mmask16;
    type Sum = __m512;

    #[inline(always)]
    unsafe fn mask(n: usize) -> __mmask16 {
        avx512::tail_mask(n)
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY (every intrinsic of this impl): the caller runs with AVX-512 F/BW/VL; the
        // pointer arguments are valid as each trait method requires.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(ptr: *const f32) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_loadu_ps(ptr) }
    }
    #[inline(always)]
    unsafe fn load_masked(ptr: *const f32, mask: __mmask16) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_maskz_loadu_ps(mask, ptr) }
    }
    #[inline(always)]
    unsafe fn store(ptr: *mut f32, v: Self) {
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(ptr, v) }
    }
    #[inline(always)]
    unsafe fn store_masked(ptr: *mut f32, mask: __mmask16, v: Self) {
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(ptr, mask, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max_abs(m: Self, v: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_max_ps(m, _mm512_abs_ps(v)) }
    }
    #[inline(always)]
    unsafe fn reduce_max(v: Self) -> f32 {
        // SAFETY: as above.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    unsafe fn round_even(v: Self) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v) }
    }
    #[inline(always)]
    unsafe fn widen<L: Lanes>(ptr: *const L) -> Self {
        // SAFETY: as above.
        unsafe { L::load16(ptr) }
    }
    #[inline(always)]
    unsafe fn widen_part<L: Lanes>(ptr: *const L, n: usize) -> Self {
        // SAFETY: as above (a whole register, or the masked lanes only).
        unsafe {
            if n == 16 {
                L::load16(ptr)
            } else {
                L::load16_masked(ptr, avx512::tail_mask(n))
            }
        }
    }
    #[inline(always)]
    unsafe fn nonzero_bits(v: Self, n: usize) -> u32 {
        // SAFETY: as above.
        let nonzero = unsafe { _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, _mm512_setzero_ps()) };
        (nonzero & avx512::tail_mask(n)) as u32
    }

    #[inline(always)]
    unsafe fn sum_zero() -> Self::Sum {
        // SAFETY: as above.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn sum_widen<L: Lanes>(ptr: *const L) -> Self::Sum {
        // SAFETY: as above.
        unsafe { L::load16(ptr) }
    }
    #[inline(always)]
    unsafe fn sum_widen_part<L: Lanes>(ptr: *const L, n: usize) -> Self::Sum {
        // SAFETY: as above.
        unsafe { L::load16_masked(ptr, avx512::tail_mask(n)) }
    }
    #[inline(always)]
    unsafe fn sum_fma(a: Self::Sum, b: Self::Sum, c: Self::Sum) -> Self::Sum {
        // SAFETY: as above.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn reduce(s: Self::Sum) -> f32 {
        // SAFETY: as above.
        unsafe { avx512::reduce16(s) }
    }
}

/// The blocks `i..i + n` of `len` elements, `n == V::N` but for the last. An iterator, not a
/// closure-taking helper: a closure in a width-generic body has no target features and
/// would keep the intrinsics out of line unless LLVM happened to inline it.
#[inline(always)]
pub(crate) fn blocks<V: Vector>(len: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(V::N)
        .map(move |i| (i, (len - i).min(V::N)))
}

/// Canonical `Σ x[i]·y[i]` over `n` elements: 16-lane FMA chains, zero-filled tail.
///
/// # Safety
/// `V`'s features; `x` and `y` valid for `n` elements.
#[inline(always)]
pub(crate) unsafe fn dot16<V: Vector, L: Lanes>(x: *const L, y: *const f32, n: usize) -> f32 {
    let mut i = 0;
    // SAFETY: whole loads cover i..i+16 <= n; the partial ones only i..n.
    unsafe {
        let mut acc = V::sum_zero();
        while i + 16 <= n {
            acc = V::sum_fma(V::sum_widen(x.add(i)), V::sum_widen(y.add(i)), acc);
            i += 16;
        }
        if i < n {
            let (xs, ys) = (
                V::sum_widen_part(x.add(i), n - i),
                V::sum_widen_part(y.add(i), n - i),
            );
            acc = V::sum_fma(xs, ys, acc);
        }
        V::reduce(acc)
    }
}

/// Calls `crate::$op::avx2::$f(..)` or `crate::$op::avx512::$f(..)`, whichever ISA the register
/// type `$v` belongs to (a constant branch): how width-generic bodies use other operations'
/// kernels. Needs `unsafe` around it: the callee is an ISA entry point.
macro_rules! on_width {
    ($v:ty, $op:ident :: $f:ident ($($arg:expr),* $(,)?)) => {
        if <$v as $crate::simd::x86::Vector>::ISA == $crate::Isa::Avx512 {
            $crate::$op::avx512::$f($($arg),*)
        } else {
            $crate::$op::avx2::$f($($arg),*)
        }
    };
}
pub(crate) use on_width;
