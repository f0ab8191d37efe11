//! SplitMix64 (Steele, Lea & Flood, 2014): the one seeded generator of the workspace — the KV
//! cache's random signs and projections (`spinkv-kv`), and the inputs of the parity checks and
//! tests. Written out here rather than borrowed from a crate whose streams may change between
//! versions: the cache's stream for a given seed is part of its identity.

/// Advances `state` by one step and returns the next 64 random bits.
#[inline]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn first_outputs_of_seed_zero_are_the_published_ones() {
        let mut state = 0;
        assert_eq!(super::splitmix64(&mut state), 0xE220_A839_7B1D_CDAF);
        assert_eq!(super::splitmix64(&mut state), 0x6E78_9E6A_A1B9_65F4);
    }
}
