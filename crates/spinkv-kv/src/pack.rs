//! Bit packing of code vectors: a little-endian, LSB-first bit stream, widths 1..=8 (the
//! layout and the loops are spinkv-kernels' `codes` operation; see there for the format).
//!
//! A code vector of `d` channels uses a [`BitLayout`]: the first `n_hi` channels at `hi` bits and
//! the rest at `lo` bits. That is how fractional rates are exact without entropy coding
//! (3.5 bits = half the channels at 4 bits, half at 3), and every vector starts on a byte.

use crate::kernels::codes;

/// Widths of the channels of one code vector.
pub(crate) type BitLayout = codes::CodeLayout;

/// Packs `codes` (each below `2^width`) into `out` (`layout.bytes()` long, fully overwritten).
#[inline]
pub(crate) fn pack(codes: &[u8], layout: &BitLayout, out: &mut [u8]) {
    codes::pack(codes, layout, out)
}

/// Unpacks one vector packed by [`pack`] into `codes` (`layout.d` long).
#[inline]
pub(crate) fn unpack(bytes: &[u8], layout: &BitLayout, codes: &mut [u8]) {
    codes::unpack(bytes, layout, codes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn uniform_widths_round_trip(bits in 1u32..=8, raw in proptest::collection::vec(any::<u8>(), 1..300)) {
            let codes: Vec<u8> = raw.iter().map(|c| c & ((1u16 << bits) - 1) as u8).collect();
            let layout = BitLayout::uniform(codes.len(), bits);
            prop_assert_eq!(layout.bytes(), (codes.len() * bits as usize).div_ceil(8));
            let mut packed = vec![0xAAu8; layout.bytes()];
            pack(&codes, &layout, &mut packed);
            let mut back = vec![0u8; codes.len()];
            unpack(&packed, &layout, &mut back);
            prop_assert_eq!(back, codes);
        }

        #[test]
        fn mixed_widths_round_trip(half_bits in 2u8..=16, raw in proptest::collection::vec(any::<u8>(), 1..300)) {
            let layout = BitLayout::for_half_bits(raw.len(), half_bits);
            let codes: Vec<u8> = raw.iter().enumerate()
                .map(|(c, v)| v & ((1u16 << layout.width(c)) - 1) as u8).collect();
            let mut packed = vec![0x55u8; layout.bytes()];
            pack(&codes, &layout, &mut packed);
            let mut back = vec![0u8; codes.len()];
            unpack(&packed, &layout, &mut back);
            prop_assert_eq!(back, codes);
        }
    }

    #[test]
    fn fractional_rates_hit_exact_bit_counts() {
        for d in [64usize, 128, 80, 96] {
            for (half_bits, rate) in [(4u8, 2.0), (5, 2.5), (6, 3.0), (7, 3.5), (8, 4.0)] {
                let layout = BitLayout::for_half_bits(d, half_bits);
                assert_eq!(layout.bits() as f64, rate * d as f64, "d={d} rate={rate}");
                assert_eq!(layout.bytes() * 8, layout.bits());
            }
        }
        let l = BitLayout::for_half_bits(128, 7);
        assert_eq!((l.n_hi, l.hi, l.lo), (64, 4, 3));
    }
}
