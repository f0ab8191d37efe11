//! Per-ISA building blocks shared by the operations' per-ISA files: horizontal reductions,
//! widening loads of f16/bf16 lanes, a vector `exp`, masks for tails.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod simd128;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// The 4-lane ISA of this build, for code written once for NEON and SIMD128.
#[cfg(target_arch = "aarch64")]
pub(crate) use neon as quad;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) use simd128 as quad;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m256, __m512, __mmask16};

/// A storage dtype (weights, cached rows) whose elements widen exactly to f32. One trait for
/// every ISA, so a kernel generic over it serves f32, f16 and bf16; each ISA adds its vector
/// load behind its `cfg`, implemented by that ISA's module. (`pub` in a private module: the
/// public per-ISA kernels may be generic over it without naming it outside the crate.)
pub trait Lanes: Copy {
    /// Whether the elements already are f32 (nothing to widen).
    const IS_F32: bool = false;
    /// Whether the elements are IEEE halves (SIMD128 widens their rows on a faster path).
    const IS_F16: bool = false;
    fn widen(self) -> f32;
    /// # Safety
    /// `ptr` valid for reading 8 elements; AVX2+FMA+F16C present.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(ptr: *const Self) -> __m256;
    /// # Safety
    /// `ptr` valid for reading 16 elements; AVX-512 F/BW/VL present.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(ptr: *const Self) -> __m512;
    /// Lanes outside `mask` read as 0 and are not touched in memory.
    /// # Safety
    /// `ptr` valid for the lanes in `mask`; AVX-512 F/BW/VL present.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16_masked(ptr: *const Self, mask: __mmask16) -> __m512;
    /// # Safety
    /// `ptr` valid for reading 4 elements.
    #[cfg(any(
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    ))]
    unsafe fn load4(ptr: *const Self) -> quad::F4;
}

/// Implements [`Lanes`] for `$ty` with the loaders each ISA module names after it.
macro_rules! lanes {
    ($ty:ty, $is_f32:expr, $is_f16:expr, $widen:expr, $load8:ident, $load16:ident, $load16_masked:ident, $load4:ident) => {
        impl Lanes for $ty {
            const IS_F32: bool = $is_f32;
            const IS_F16: bool = $is_f16;
            #[inline(always)]
            fn widen(self) -> f32 {
                $widen(self)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn load8(ptr: *const Self) -> __m256 {
                // SAFETY: forwarded from the caller.
                unsafe { avx2::$load8(ptr) }
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn load16(ptr: *const Self) -> __m512 {
                // SAFETY: forwarded from the caller.
                unsafe { avx512::$load16(ptr) }
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn load16_masked(ptr: *const Self, mask: __mmask16) -> __m512 {
                // SAFETY: forwarded from the caller.
                unsafe { avx512::$load16_masked(ptr, mask) }
            }
            #[cfg(any(
                target_arch = "aarch64",
                all(target_arch = "wasm32", target_feature = "simd128")
            ))]
            #[inline(always)]
            unsafe fn load4(ptr: *const Self) -> quad::F4 {
                // SAFETY: forwarded from the caller.
                unsafe { quad::$load4(ptr) }
            }
        }
    };
}

lanes!(
    f32,
    true,
    false,
    |v| v,
    load8_f32,
    load16_f32,
    load16_masked_f32,
    load4_f32
);
lanes!(
    half::f16,
    false,
    true,
    half::f16::to_f32,
    load8_f16,
    load16_f16,
    load16_masked_f16,
    load4_f16
);
lanes!(
    half::bf16,
    false,
    false,
    half::bf16::to_f32,
    load8_bf16,
    load16_bf16,
    load16_masked_bf16,
    load4_bf16
);

lanes!(
    i8,
    false,
    false,
    |v: i8| v as f32,
    load8_i8,
    load16_i8,
    load16_masked_i8,
    load4_i8
);

/// Constants of the vector `exp` every ISA shares (Cephes-style: x = n·ln2 + r, degree-6
/// polynomial for e^r), so all SIMD versions round alike.
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )),
    allow(dead_code)
)]
pub(crate) mod exp_consts {
    /// Inputs below this flush to 0 (including -inf), so masked scores vanish.
    pub(crate) const LOW: f32 = -87.3;
    pub(crate) const HIGH: f32 = 88.3;
    pub(crate) const LN2_HI: f32 = 0.693_359_4;
    pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
    pub(crate) const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    /// The polynomial of softmax weights ([`crate::canon::exp_softmax`]): degree 2,
    /// near-minimax on `|r| ≤ ln2/2`, 5.4·10^-6 relative at most. A weight only scales its
    /// token's value, and the value scan rounds each weight to 1/254 of its chunk's largest
    /// (`kv_accumulate::grid`): three multiply-adds fewer per 16 weights.
    pub(crate) const P_SOFTMAX: [f32; 3] = [0.041_277_75, 0.167_535_14, 0.500_051_1];
}

/// One decoded row of a page (keys or values widened to f32), cache-line aligned.
#[repr(align(64))]
pub(crate) struct RowBuf(pub(crate) [f32; crate::MAX_CODED_DIM]);

impl RowBuf {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        RowBuf([0.0; crate::MAX_CODED_DIM])
    }
}
