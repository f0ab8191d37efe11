//! Deterministic inputs and tolerances for the SIMD-vs-scalar parity checks. Compiled for
//! tests and for the `parity` feature (the wasm harness runs the same checks in node).

/// The sizes every parity check runs: SIMD-width edges plus the real model's widths.
pub(crate) const AWKWARD_SIZES: [usize; 15] =
    [1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 576, 1536];

/// splitmix64 stream mapped to [-1, 1).
pub(crate) fn random_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform()).collect()
}

/// splitmix64, for inputs that are not plain vectors (codes, signs, weights).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        crate::splitmix64(&mut self.0)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Stated tolerance for reductions: SIMD reorders the sum (and may fuse multiply-adds), so the
/// error bound scales with the magnitude of the terms (`scale` = sum of |terms|), not with the
/// result: `|simd - scalar| <= 1e-5 · max(scale, 1)`.
pub(crate) fn close(simd: f32, scalar: f32, scale: f32, what: &dyn Fn() -> String) -> Check {
    let tolerance = 1e-5 * scale.max(1.0);
    if (simd - scalar).abs() <= tolerance || (simd.is_nan() && scalar.is_nan()) {
        Ok(())
    } else {
        Err(format!(
            "{}: simd {simd} vs scalar {scalar} (tolerance {tolerance})",
            what()
        ))
    }
}

/// Element-wise [`close`] with one scale for every element.
pub(crate) fn all_close(
    simd: &[f32],
    scalar: &[f32],
    scale: f32,
    what: &dyn Fn() -> String,
) -> Check {
    if simd.len() != scalar.len() {
        return Err(format!("{}: lengths differ", what()));
    }
    for (i, (g, e)) in simd.iter().zip(scalar).enumerate() {
        close(*g, *e, scale, &|| format!("{} [{i}]", what()))?;
    }
    Ok(())
}

/// Exact equality, for integer and packing paths.
pub(crate) fn identical<T: PartialEq + core::fmt::Debug>(
    simd: &[T],
    scalar: &[T],
    what: &dyn Fn() -> String,
) -> Check {
    match simd.iter().zip(scalar).position(|(a, b)| a != b) {
        None if simd.len() == scalar.len() => Ok(()),
        None => Err(format!("{}: lengths differ", what())),
        Some(i) => Err(format!(
            "{}: first difference at {i}: simd {:?} vs scalar {:?}",
            what(),
            simd[i],
            scalar[i]
        )),
    }
}

/// [`identical`] on floats' bits, except that any NaN matches any: a NaN's sign and payload are
/// not the same from one wasm engine's code to the next (the spec leaves them open).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) fn identical_bits(simd: &[f32], scalar: &[f32], what: &dyn Fn() -> String) -> Check {
    let bits = |v: &[f32]| {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect::<Vec<_>>()
    };
    identical(&bits(simd), &bits(scalar), what)
}

/// Outcome of one parity check: the first mismatch, described.
pub(crate) type Check = Result<(), String>;

/// Whether `isa` follows the canonical arithmetic (`crate::canon`) and so must match the scalar
/// reference bit for bit: every ISA with a fused multiply-add — all but SIMD128.
pub(crate) fn is_canonical(isa: crate::Isa) -> bool {
    isa != crate::Isa::Simd128
}

/// Bit-identical on canonical ISAs, [`all_close`] with `scale` on the others.
pub(crate) fn canonical(
    isa: crate::Isa,
    simd: &[f32],
    scalar: &[f32],
    scale: f32,
    what: &dyn Fn() -> String,
) -> Check {
    if is_canonical(isa) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        identical(&bits(simd), &bits(scalar), &|| {
            format!("{} (bit-exact)", what())
        })
    } else {
        all_close(simd, scalar, scale, what)
    }
}

/// Q8_0 row lengths: whole blocks, one to many.
pub(crate) const Q8_SIZES: [usize; 5] = [32, 64, 96, 576, 1536];

/// A random Q8_0 matrix of `n` weights: codes over the whole i8 range but -128, scales in
/// (0, 1/64] as a quantizer makes them (absmax / 127).
pub(crate) fn random_q8(seed: u64, n: usize) -> (Vec<i8>, Vec<half::f16>) {
    let codes = random_vec(seed, n)
        .iter()
        .map(|&v| (v * 127.0).round() as i8)
        .collect();
    let scales = random_vec(seed ^ 0x5eed, n / crate::weight::Q8_BLOCK)
        .iter()
        .map(|&v| half::f16::from_f32((v.abs() + 0.01) / 64.0))
        .collect();
    (codes, scales)
}
