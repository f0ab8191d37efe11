//! Deterministic inputs and tolerances for the SIMD-vs-scalar parity tests.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// The sizes every parity test runs: SIMD-width edges plus the real model's widths.
pub(crate) const AWKWARD_SIZES: [usize; 15] =
    [1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 576, 1536];

/// splitmix64 stream mapped to [-1, 1).
pub(crate) fn random_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Stated tolerance for reductions: SIMD reorders the sum, so the error bound scales with the
/// magnitude of the terms (`scale` = sum of |terms|), not with the result.
pub(crate) fn assert_close(simd: f32, scalar: f32, scale: f32, what: &str) {
    let tolerance = 1e-5 * scale.max(1.0);
    assert!(
        (simd - scalar).abs() <= tolerance,
        "{what}: simd {simd} vs scalar {scalar} (tolerance {tolerance})"
    );
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_available() -> bool {
    crate::Isa::Avx2.cpu_supports()
}
