//! Bit-packed code vectors (the compressed KV cache's payload): their layout, packing,
//! unpacking, and decoding to codebook levels. All of it is integer or table work, so every
//! ISA is bit-identical to the scalar reference.
//!
//! A code vector of `d` channels is a little-endian, LSB-first bit stream: the first `n_hi`
//! channels at `hi` bits, the rest at `lo` bits (how fractional rates are exact: 3.5 bits =
//! half the channels at 4 bits, half at 3), padded to a whole byte. The SIMD versions work on
//! groups of 8 or 16 codes, which always start on a byte (8·w bits = w bytes), so a segment
//! that starts on a byte is decoded group by group with per-width shuffle/shift tables.

crate::isa::isa_modules!(scalar, avx2, avx512, quad);

use crate::isa::{active_isa, dispatch, Isa};

/// Largest head dim the code kernels take (their per-token scratch lives on the stack).
pub const MAX_CODED_DIM: usize = 1024;

/// Widths of the channels of one code vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub d: usize,
    pub n_hi: usize,
    pub hi: u32,
    pub lo: u32,
}

impl CodeLayout {
    /// The layout for a rate in half bits per channel (5 = 2.5 bits): integer rates use one
    /// width; `x.5` rates give the first `d/2` channels the higher width.
    pub fn for_half_bits(d: usize, half_bits: u8) -> Self {
        let half_bits = half_bits as u32;
        if half_bits.is_multiple_of(2) {
            CodeLayout::uniform(d, half_bits / 2)
        } else {
            CodeLayout {
                d,
                n_hi: d / 2,
                hi: half_bits / 2 + 1,
                lo: half_bits / 2,
            }
        }
    }

    /// One width for every channel.
    pub fn uniform(d: usize, bits: u32) -> Self {
        CodeLayout {
            d,
            n_hi: 0,
            hi: bits,
            lo: bits,
        }
    }

    #[inline]
    pub fn width(&self, channel: usize) -> u32 {
        if channel < self.n_hi {
            self.hi
        } else {
            self.lo
        }
    }

    pub fn bits(&self) -> usize {
        self.n_hi * self.hi as usize + (self.d - self.n_hi) * self.lo as usize
    }

    /// Bytes of one packed vector (its bits rounded up to a byte).
    pub fn bytes(&self) -> usize {
        self.bits().div_ceil(8)
    }

    /// The two runs of equal-width channels when the second starts on a byte (every even head
    /// dim at integer rates, multiples of 16 at x.5 rates); `None` otherwise.
    pub(crate) fn segments(&self) -> Option<[Segment; 2]> {
        let hi_bits = self.n_hi * self.hi as usize;
        hi_bits.is_multiple_of(8).then(|| {
            [
                Segment {
                    first: 0,
                    len: self.n_hi,
                    width: self.hi,
                    byte: 0,
                },
                Segment {
                    first: self.n_hi,
                    len: self.d - self.n_hi,
                    width: self.lo,
                    byte: hi_bits / 8,
                },
            ]
        })
    }

    fn check(&self) {
        assert!(
            (1..=8).contains(&self.hi) && (1..=8).contains(&self.lo),
            "code widths must be 1..=8 bits"
        );
        assert!(self.n_hi <= self.d, "n_hi exceeds d");
        assert!(self.d <= MAX_CODED_DIM, "d exceeds {MAX_CODED_DIM}");
    }
}

/// Channels `first..first + len` of a vector, all `width` bits, packed from byte `byte`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub(crate) first: usize,
    pub(crate) len: usize,
    pub(crate) width: u32,
    pub(crate) byte: usize,
}

/// Reconstruction levels of the two channel groups: channel `c` with code `v` stands for
/// `hi[v]` if `c < n_hi`, else `lo[v]`. Each table holds at least `2^width` entries.
#[derive(Clone, Copy, Debug)]
pub struct Levels<'a> {
    pub hi: &'a [f32],
    pub lo: &'a [f32],
}

impl Levels<'_> {
    pub(crate) fn check(&self, layout: &CodeLayout) {
        assert!(
            layout.n_hi == 0 || self.hi.len() >= 1 << layout.hi,
            "hi levels: fewer than 2^{} entries",
            layout.hi
        );
        assert!(
            layout.n_hi == layout.d || self.lo.len() >= 1 << layout.lo,
            "lo levels: fewer than 2^{} entries",
            layout.lo
        );
    }

    /// The table of segment `first`'s channels.
    #[inline]
    pub(crate) fn table(&self, layout: &CodeLayout, first_channel: usize) -> &[f32] {
        if first_channel < layout.n_hi {
            self.hi
        } else {
            self.lo
        }
    }
}

/// A block of packed rows with what decodes them: `codes` holds `scales.len()` rows of
/// `layout.bytes()`, row `j` standing for `scales[j] · levels(row j)`. The attention kernels'
/// argument, so every ISA's signature stays short.
#[derive(Clone, Copy)]
pub struct CodedRows<'a> {
    pub codes: &'a [u8],
    pub layout: &'a CodeLayout,
    pub levels: Levels<'a>,
    pub scales: &'a [f32],
}

impl<'a> CodedRows<'a> {
    pub fn new(
        codes: &'a [u8],
        layout: &'a CodeLayout,
        levels: Levels<'a>,
        scales: &'a [f32],
    ) -> Self {
        CodedRows {
            codes,
            layout,
            levels,
            scales,
        }
    }
}

/// The code-row decoder of each x86 register width (`avx2::RowDecoder`, `avx512::RowDecoder`),
/// for the width-generic attention kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Decoders: crate::simd::x86::Vector {
    type Decoder: DecodeRows;
}

/// The methods of both x86 `RowDecoder`s (see there). # Safety (the unsafe ones): the
/// decoder's ISA, and the contracts of its inherent methods.
#[cfg(target_arch = "x86_64")]
pub(crate) trait DecodeRows {
    fn new(layout: &CodeLayout, levels: Levels<'_>) -> Self;
    fn has_segments(&self) -> bool;
    #[allow(clippy::too_many_arguments)]
    unsafe fn decode_rows(
        &self,
        bytes: &[u8],
        at: usize,
        row_bytes: usize,
        n_rows: usize,
        dst: *mut f32,
        stride: usize,
    );
    unsafe fn decode(&self, bytes: &[u8], at: usize, levels: Levels<'_>, out: &mut [f32]);
}

#[cfg(target_arch = "x86_64")]
macro_rules! decoders {
    ($($reg:ty => $isa:ident),*) => {$(
        impl Decoders for $reg {
            type Decoder = $isa::RowDecoder;
        }
        impl DecodeRows for $isa::RowDecoder {
            #[inline(always)]
            fn new(layout: &CodeLayout, levels: Levels<'_>) -> Self {
                $isa::RowDecoder::new(layout, levels)
            }
            #[inline(always)]
            fn has_segments(&self) -> bool {
                $isa::RowDecoder::has_segments(self)
            }
            #[inline(always)]
            unsafe fn decode_rows(&self, bytes: &[u8], at: usize, row_bytes: usize, n_rows: usize, dst: *mut f32, stride: usize) {
                // SAFETY: forwarded from the caller.
                unsafe { $isa::RowDecoder::decode_rows(self, bytes, at, row_bytes, n_rows, dst, stride) }
            }
            #[inline(always)]
            unsafe fn decode(&self, bytes: &[u8], at: usize, levels: Levels<'_>, out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { $isa::RowDecoder::decode(self, bytes, at, levels, out) }
            }
        }
    )*};
}
#[cfg(target_arch = "x86_64")]
decoders!(std::arch::x86_64::__m256 => avx2, std::arch::x86_64::__m512 => avx512);

/// Packs `codes` (`layout.d` of them, each below `2^width`; higher bits are dropped) into `out`
/// (`layout.bytes()` long, fully overwritten).
pub fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    layout.check();
    assert_eq!(codes.len(), layout.d, "pack: codes is not [d]");
    assert_eq!(out.len(), layout.bytes(), "pack: out is not [bytes]");
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { pack_on(active_isa(), codes, layout, out) }
}

/// Unpacks one vector packed by [`pack`] into `codes` (`layout.d` long).
pub fn unpack(bytes: &[u8], layout: &CodeLayout, codes: &mut [u8]) {
    layout.check();
    assert!(bytes.len() >= layout.bytes(), "unpack: bytes too short");
    assert_eq!(codes.len(), layout.d, "unpack: codes is not [d]");
    // SAFETY: as above.
    unsafe { unpack_on(active_isa(), bytes, layout, codes) }
}

/// Levels of `rows` consecutive packed vectors: `out[j][c] = level_c(code_{j,c})`.
/// `bytes`: `rows · layout.bytes()`; `out`: `[rows][d]`.
pub fn dequantize(bytes: &[u8], layout: &CodeLayout, levels: Levels<'_>, out: &mut [f32]) {
    layout.check();
    levels.check(layout);
    let rows = out.len() / layout.d.max(1);
    assert_eq!(
        out.len(),
        rows * layout.d,
        "dequantize: out is not [rows][d]"
    );
    assert!(
        bytes.len() >= rows * layout.bytes(),
        "dequantize: bytes too short"
    );
    // SAFETY: as above.
    unsafe { dequantize_on(active_isa(), bytes, layout, levels, out) }
}

/// # Safety
/// `isa` must run on this CPU; arguments as checked by [`pack`].
pub(crate) unsafe fn pack_on(isa: Isa, codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    dispatch!(isa, pack(codes, layout, out))
}

/// # Safety
/// `isa` must run on this CPU; arguments as checked by [`unpack`].
pub(crate) unsafe fn unpack_on(isa: Isa, bytes: &[u8], layout: &CodeLayout, codes: &mut [u8]) {
    dispatch!(isa, unpack(bytes, layout, codes))
}

/// # Safety
/// `isa` must run on this CPU; arguments as checked by [`dequantize`].
pub(crate) unsafe fn dequantize_on(
    isa: Isa,
    bytes: &[u8],
    layout: &CodeLayout,
    levels: Levels<'_>,
    out: &mut [f32],
) {
    dispatch!(isa, dequantize(bytes, layout, levels, out))
}

/// Word reads and shuffle tables for the SIMD kernels (none of which a build may have).
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "wasm32"
    )),
    allow(dead_code)
)]
pub(crate) mod windows;

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    let mut layouts = Vec::new();
    for &d in &AWKWARD_SIZES[..13] {
        for half_bits in 2..=16u8 {
            layouts.push(CodeLayout::for_half_bits(d, half_bits));
        }
    }
    // The real shapes: head dim 64 at the presets' rates, 128 for larger models.
    for d in [64usize, 128] {
        for half_bits in [4u8, 5, 6, 7, 8] {
            layouts.push(CodeLayout::for_half_bits(d, half_bits));
        }
    }
    let mut rng = Rng::new(17);
    for layout in layouts {
        let rows = 5;
        let codes: Vec<u8> = (0..rows * layout.d)
            .map(|i| (rng.next_u64() as u8) & ((1u16 << layout.width(i % layout.d)) - 1) as u8)
            .collect();
        let bytes = layout.bytes();
        let what = |op: &str| {
            format!(
                "{op} d={} {}/{}x{}",
                layout.d, layout.hi, layout.lo, layout.n_hi
            )
        };
        let mut packed = vec![0xA5u8; rows * bytes];
        let mut expected = vec![0x5Au8; rows * bytes];
        for j in 0..rows {
            let src = &codes[j * layout.d..(j + 1) * layout.d];
            scalar::pack(src, &layout, &mut expected[j * bytes..(j + 1) * bytes]);
            // SAFETY (all `_on` calls): `isa` comes from the runnable list.
            unsafe { pack_on(isa, src, &layout, &mut packed[j * bytes..(j + 1) * bytes]) };
        }
        identical(&packed, &expected, &|| what("pack"))?;
        let mut back = vec![0u8; rows * layout.d];
        for j in 0..rows {
            // The last row's slice ends exactly at the buffer: SIMD must not over-read.
            let src = &packed[j * bytes..(j + 1) * bytes];
            unsafe {
                unpack_on(
                    isa,
                    src,
                    &layout,
                    &mut back[j * layout.d..(j + 1) * layout.d],
                )
            };
        }
        identical(&back, &codes, &|| what("unpack"))?;
        let hi: Vec<f32> = (0..1 << layout.hi)
            .map(|v| rng.uniform() + v as f32)
            .collect();
        let lo: Vec<f32> = (0..1 << layout.lo)
            .map(|v| rng.uniform() - v as f32)
            .collect();
        let levels = Levels { hi: &hi, lo: &lo };
        let mut want = vec![0.0f32; rows * layout.d];
        let mut got = vec![1.0f32; rows * layout.d];
        scalar::dequantize(&packed, &layout, levels, &mut want);
        unsafe { dequantize_on(isa, &packed, &layout, levels, &mut got) };
        identical(&got, &want, &|| what("dequantize"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractional_rates_hit_exact_bit_counts() {
        for d in [64usize, 128, 80, 96] {
            for (half_bits, rate) in [(4u8, 2.0), (5, 2.5), (6, 3.0), (7, 3.5), (8, 4.0)] {
                let layout = CodeLayout::for_half_bits(d, half_bits);
                assert_eq!(layout.bits() as f64, rate * d as f64, "d={d} rate={rate}");
                assert_eq!(layout.bytes() * 8, layout.bits());
            }
        }
        let l = CodeLayout::for_half_bits(128, 7);
        assert_eq!((l.n_hi, l.hi, l.lo), (64, 4, 3));
    }

    #[test]
    fn round_trips_every_width() {
        for bits in 1..=8u32 {
            for d in [1usize, 7, 8, 9, 64, 100] {
                let layout = CodeLayout::uniform(d, bits);
                let codes: Vec<u8> = (0..d).map(|i| (i * 37 % (1 << bits)) as u8).collect();
                let mut packed = vec![0xAAu8; layout.bytes()];
                pack(&codes, &layout, &mut packed);
                let mut back = vec![0u8; d];
                unpack(&packed, &layout, &mut back);
                assert_eq!(back, codes, "bits={bits} d={d}");
            }
        }
    }
}
