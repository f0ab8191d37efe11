//! Append-time encoding's hot loop: snap each coordinate of a rotated unit vector to its
//! channel's scalar codebook. `codes[c]` = how many of the codebook's sorted thresholds lie
//! below `y[c]` (the nearest level when thresholds are the midpoints), `recon[c]` = that
//! level. Comparisons and table lookups only: bit-identical on every ISA. (Packing the codes
//! is [`crate::codes::pack`].)

crate::isa::isa_modules!(scalar, avx2, avx512, quad);

use crate::codes::{CodeLayout, Levels};
use crate::isa::{active_isa, dispatch, Isa};

/// `thresholds` (sorted, at most `2^width - 1` per table) and `levels` (`2^width` per table)
/// of the hi and lo channel groups; `y`, `codes`, `recon`: `[d]`.
pub fn quantize(
    y: &[f32],
    layout: &CodeLayout,
    thresholds: Levels<'_>,
    levels: Levels<'_>,
    codes: &mut [u8],
    recon: &mut [f32],
) {
    assert!(
        (1..=8).contains(&layout.hi) && (1..=8).contains(&layout.lo) && layout.n_hi <= layout.d,
        "quantize: bad code layout"
    );
    levels.check(layout);
    assert!(
        thresholds.hi.len() < 1 << layout.hi && thresholds.lo.len() < 1 << layout.lo,
        "quantize: more thresholds than codes"
    );
    let d = layout.d;
    assert!(
        y.len() == d && codes.len() == d && recon.len() == d,
        "quantize: y, codes, recon must be [d]"
    );
    let books = Codebooks {
        layout,
        thresholds,
        levels,
    };
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes checked.
    unsafe { quantize_on(active_isa(), books, y, codes, recon) }
}

/// A code layout with its codebooks: per channel group, the sorted thresholds and the levels
/// they separate. The per-ISA kernels' argument.
#[derive(Clone, Copy)]
pub struct Codebooks<'a> {
    pub layout: &'a CodeLayout,
    pub thresholds: Levels<'a>,
    pub levels: Levels<'a>,
}

impl<'a> Codebooks<'a> {
    /// The two channel runs (hi, then lo).
    #[inline]
    pub(crate) fn runs(&self) -> [Run<'a>; 2] {
        runs(self.layout, self.thresholds, self.levels)
    }
}

/// A run of channels of one codebook: `(first, len, thresholds, levels, width)`.
pub(crate) type Run<'a> = (usize, usize, &'a [f32], &'a [f32], u32);

/// The two channel runs (hi, then lo) of a layout.
pub(crate) fn runs<'a>(
    layout: &CodeLayout,
    thresholds: Levels<'a>,
    levels: Levels<'a>,
) -> [Run<'a>; 2] {
    [
        (0, layout.n_hi, thresholds.hi, levels.hi, layout.hi),
        (
            layout.n_hi,
            layout.d - layout.n_hi,
            thresholds.lo,
            levels.lo,
            layout.lo,
        ),
    ]
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`quantize`].
pub(crate) unsafe fn quantize_on(
    isa: Isa,
    books: Codebooks<'_>,
    y: &[f32],
    codes: &mut [u8],
    recon: &mut [f32],
) {
    dispatch!(isa, quantize(books, y, codes, recon))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(11);
    for layout in crate::kv_score::parity_layouts() {
        let d = layout.d;
        let book = |rng: &mut Rng, bits: u32| {
            let mut levels: Vec<f32> = (0..1 << bits).map(|_| rng.uniform() * 0.5).collect();
            levels.sort_by(f32::total_cmp);
            let thresholds: Vec<f32> = levels.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
            (thresholds, levels)
        };
        let (t_hi, l_hi) = book(&mut rng, layout.hi);
        let (t_lo, l_lo) = book(&mut rng, layout.lo);
        let thresholds = Levels {
            hi: &t_hi,
            lo: &t_lo,
        };
        let levels = Levels {
            hi: &l_hi,
            lo: &l_lo,
        };
        let mut y: Vec<f32> = random_vec(rng.next_u64(), d)
            .iter()
            .map(|v| v * 0.6)
            .collect();
        // Exactly on a threshold, and NaN: both sides must count alike.
        y[0] = t_hi.first().copied().unwrap_or(t_lo[0]);
        if d > 2 {
            y[d - 1] = f32::NAN;
        }
        let (mut want_codes, mut got_codes) = (vec![0u8; d], vec![9u8; d]);
        let (mut want, mut got) = (vec![0.0f32; d], vec![1.0f32; d]);
        let books = Codebooks {
            layout: &layout,
            thresholds,
            levels,
        };
        scalar::quantize(books, &y, &mut want_codes, &mut want);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { quantize_on(isa, books, &y, &mut got_codes, &mut got) };
        let what = || format!("quantize d={d} {}/{}x{}", layout.hi, layout.lo, layout.n_hi);
        identical(&got_codes, &want_codes, &what)?;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        identical(&bits(&got), &bits(&want), &what)?;
    }
    Ok(())
}
