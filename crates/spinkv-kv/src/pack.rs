//! Bit packing of code vectors: a little-endian, LSB-first bit stream, widths 1..=8.
//!
//! A code vector of `d` channels uses a [`BitLayout`]: the first `n_hi` channels at `hi` bits and
//! the rest at `lo` bits. That is how fractional rates are exact without entropy coding
//! (3.5 bits = half the channels at 4 bits, half at 3), and every vector starts on a byte.

/// Widths of the channels of one code vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BitLayout {
    pub(crate) d: usize,
    pub(crate) n_hi: usize,
    pub(crate) hi: u32,
    pub(crate) lo: u32,
}

impl BitLayout {
    /// The layout for a rate in half bits per channel (5 = 2.5 bits): integer rates use one
    /// width; `x.5` rates give the first `d/2` channels the higher width.
    pub(crate) fn for_half_bits(d: usize, half_bits: u8) -> Self {
        let half_bits = half_bits as u32;
        if half_bits % 2 == 0 {
            BitLayout {
                d,
                n_hi: 0,
                hi: half_bits / 2,
                lo: half_bits / 2,
            }
        } else {
            BitLayout {
                d,
                n_hi: d / 2,
                hi: half_bits / 2 + 1,
                lo: half_bits / 2,
            }
        }
    }

    /// One width for every channel.
    pub(crate) fn uniform(d: usize, bits: u32) -> Self {
        BitLayout {
            d,
            n_hi: 0,
            hi: bits,
            lo: bits,
        }
    }

    #[inline]
    pub(crate) fn width(&self, channel: usize) -> u32 {
        if channel < self.n_hi {
            self.hi
        } else {
            self.lo
        }
    }

    pub(crate) fn bits(&self) -> usize {
        self.n_hi * self.hi as usize + (self.d - self.n_hi) * self.lo as usize
    }

    /// Bytes of one packed vector (its bits rounded up to a byte).
    pub(crate) fn bytes(&self) -> usize {
        self.bits().div_ceil(8)
    }
}

/// Packs `codes` (each below `2^width`) into `out` (`layout.bytes()` long, fully overwritten).
pub(crate) fn pack(codes: &[u8], layout: &BitLayout, out: &mut [u8]) {
    debug_assert_eq!(codes.len(), layout.d);
    debug_assert_eq!(out.len(), layout.bytes());
    let mut acc: u64 = 0;
    let mut filled = 0u32;
    let mut at = 0;
    for (c, &code) in codes.iter().enumerate() {
        let width = layout.width(c);
        acc |= ((code as u64) & ((1 << width) - 1)) << filled;
        filled += width;
        while filled >= 8 {
            out[at] = acc as u8;
            at += 1;
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        out[at] = acc as u8;
        at += 1;
    }
    out[at..].fill(0);
}

/// Unpacks one vector packed by [`pack`] into `codes` (`layout.d` long). When the high-width
/// segment ends on a byte (every even head dim at integer rates, multiples of 16 at x.5 rates)
/// both segments go through the width-specialised reader; otherwise through the generic one.
#[inline]
pub(crate) fn unpack(bytes: &[u8], layout: &BitLayout, codes: &mut [u8]) {
    let hi_bits = layout.n_hi * layout.hi as usize;
    if hi_bits % 8 == 0 {
        let (hi_codes, lo_codes) = codes.split_at_mut(layout.n_hi);
        let (hi_bytes, lo_bytes) = bytes.split_at(hi_bits / 8);
        unpack_uniform(hi_bytes, layout.hi, hi_codes);
        unpack_uniform(lo_bytes, layout.lo, lo_codes);
    } else {
        unpack_generic(bytes, layout, codes);
    }
}

/// Unpacks `codes.len()` codes of one width from the start of `bytes`.
#[inline]
pub(crate) fn unpack_uniform(bytes: &[u8], width: u32, codes: &mut [u8]) {
    match width {
        1 => unpack_width::<1>(bytes, codes),
        2 => unpack_width::<2>(bytes, codes),
        3 => unpack_width::<3>(bytes, codes),
        4 => unpack_width::<4>(bytes, codes),
        5 => unpack_width::<5>(bytes, codes),
        6 => unpack_width::<6>(bytes, codes),
        7 => unpack_width::<7>(bytes, codes),
        _ => unpack_width::<8>(bytes, codes),
    }
}

/// Eight codes of `W` bits are exactly `W` bytes: read them as one integer and shift.
#[inline]
fn unpack_width<const W: usize>(bytes: &[u8], codes: &mut [u8]) {
    let mask = ((1u16 << W) - 1) as u64;
    let groups = codes.len() / 8;
    for (group, out) in bytes.chunks_exact(W).zip(codes.chunks_exact_mut(8)) {
        let mut word = [0u8; 8];
        word[..W].copy_from_slice(group);
        let word = u64::from_le_bytes(word);
        for (k, code) in out.iter_mut().enumerate() {
            *code = ((word >> (k * W)) & mask) as u8;
        }
    }
    let done = groups * 8;
    if done < codes.len() {
        let tail = BitLayout::uniform(codes.len() - done, W as u32);
        unpack_generic(&bytes[groups * W..], &tail, &mut codes[done..]);
    }
}

fn unpack_generic(bytes: &[u8], layout: &BitLayout, codes: &mut [u8]) {
    debug_assert_eq!(codes.len(), layout.d);
    let mut acc: u64 = 0;
    let mut have = 0u32;
    let mut at = 0;
    for (c, code) in codes.iter_mut().enumerate() {
        let width = layout.width(c);
        while have < width {
            acc |= (bytes[at] as u64) << have;
            at += 1;
            have += 8;
        }
        *code = (acc & ((1 << width) - 1)) as u8;
        acc >>= width;
        have -= width;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn uniform_widths_round_trip(bits in 1u32..=8, raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let codes: Vec<u8> = raw.iter().map(|c| c & ((1u16 << bits) - 1) as u8).collect();
            let layout = BitLayout::uniform(codes.len(), bits);
            prop_assert_eq!(layout.bytes(), (codes.len() * bits as usize).div_ceil(8));
            let mut packed = vec![0xAAu8; layout.bytes()];
            pack(&codes, &layout, &mut packed);
            let mut back = vec![0u8; codes.len()];
            unpack(&packed, &layout, &mut back);
            prop_assert_eq!(&back, &codes);
            unpack_generic(&packed, &layout, &mut back);
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
