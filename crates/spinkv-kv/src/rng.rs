//! The seeded generator behind the random signs and projections: `spinkv_kernels::splitmix64`
//! (written out in the workspace, as its output for a given seed is part of the cache identity)
//! with the seed derivation and the distributions the codecs draw.

#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    #[cfg(test)]
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A generator for one purpose of one (layer, head), independent of its siblings.
    pub(crate) fn derive(seed: u64, purpose: u64, layer: usize, head: usize) -> Self {
        let mut mix = SplitMix64(seed ^ purpose.wrapping_mul(0xA24B_AED4_963E_E407));
        let a = mix.next_u64() ^ (layer as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25);
        let mut mix = SplitMix64(a);
        SplitMix64(mix.next_u64() ^ (head as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        spinkv_kernels::splitmix64(&mut self.0)
    }

    /// Uniform in (0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller, one value per call).
    pub(crate) fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// ±1 with equal probability.
    pub(crate) fn sign(&mut self) -> f32 {
        if self.next_u64() >> 63 == 0 {
            1.0
        } else {
            -1.0
        }
    }
}
