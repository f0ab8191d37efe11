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
