//! Per-token scales of the compressed cache, stored as one byte on a logarithmic grid:
//! code 0 is 0, code `c > 0` is `2^(lo + (c - 1)·step)`. Decoding runs once per page and head
//! for keys and values alike, so it is vectorised; [`exp2`] is a fixed polynomial (separate
//! multiplies and adds, no FMA) that every ISA evaluates in the same order: bit-identical.

crate::isa::isa_modules!(scalar, avx2, avx512, neon, simd128);

use crate::isa::{active_isa, dispatch, Isa};

pub use scalar::exp2;

/// Range reduction and polynomial of [`exp2`]: `x = n + r`, `n = floor(x + 1/2)`,
/// `2^r ≈ 1 + r·P(r)` on `[-1/2, 1/2]` with `P` of degree 3 (near-minimax, 2.9·10^-6 relative
/// at most); inputs clamp to `[-126, 127]`. A scale's code is rounded on a grid of 254 steps
/// over its page's range, so the code itself is off by up to half a step (at least ~10^-4
/// relative even for a page whose norms span a twentieth of an octave): the polynomial's error
/// is far inside that. Degree 5 (Cephes, ~1 ulp) cost 4 more operations per 16 scales: with
/// this one (and `vscalefps` for `2^n` on AVX-512) decode attention at depth 7,680 measured
/// B/A 0.981 and 0.971 in-process (turbo, 2 threads, AMD EPYC Zen 4).
pub(crate) const EXP2_P: [f32; 4] = [0.009_582_853, 0.055_906_426, 0.240_241, 0.693_124_2];
pub(crate) const EXP2_MIN: f32 = -126.0;
pub(crate) const EXP2_MAX: f32 = 127.0;

/// `out[j] = 0` if `codes[j] == 0`, else `exp2(lo + (codes[j] - 1)·step)`.
pub fn decode_log_u8(codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    assert_eq!(codes.len(), out.len(), "decode_log_u8: length mismatch");
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { decode_log_u8_on(active_isa(), codes, lo, step, out) }
}

/// The body of every ISA's `decode_log_u8_runs`: its own `decode_log_u8` per run, back to
/// back, inside the caller's target features (so the calls inline and the runs overlap).
macro_rules! decode_runs {
    ($runs:expr, $out:expr) => {{
        let mut at = 0;
        for run in $runs {
            let n = run.codes.len();
            // SAFETY: the caller's features (its own safety contract); the runs together are
            // as long as `out`, so each run's slice exists.
            #[allow(unused_unsafe)]
            unsafe {
                decode_log_u8(run.codes, run.lo, run.step, &mut $out[at..at + n])
            };
            at += n;
        }
    }};
}
pub(crate) use decode_runs;

/// One block of log-grid codes for [`decode_log_u8_runs`]: its codes and grid.
#[derive(Clone, Copy, Debug)]
pub struct LogRun<'a> {
    pub codes: &'a [u8],
    pub lo: f32,
    pub step: f32,
}

/// [`decode_log_u8`] of several blocks into `out` back to back, in one call: a block is a
/// page's 32 scales, and the polynomial's dependency chain is long, so decoding a scan tile's
/// pages in one loop lets the CPU overlap them where one call per page waited on each.
pub fn decode_log_u8_runs(runs: &[LogRun<'_>], out: &mut [f32]) {
    let total: usize = runs.iter().map(|r| r.codes.len()).sum();
    assert_eq!(total, out.len(), "decode_log_u8_runs: length mismatch");
    // SAFETY: active_isa() only returns ISAs validated against this CPU; lengths checked.
    unsafe { decode_log_u8_runs_on(active_isa(), runs, out) }
}

/// # Safety
/// `isa` must run on this CPU; `out` as long as the runs together.
pub(crate) unsafe fn decode_log_u8_runs_on(isa: Isa, runs: &[LogRun<'_>], out: &mut [f32]) {
    dispatch!(isa, decode_log_u8_runs(runs, out))
}

/// # Safety
/// `isa` must run on this CPU; equal lengths.
pub(crate) unsafe fn decode_log_u8_on(isa: Isa, codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    dispatch!(isa, decode_log_u8(codes, lo, step, out))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(13);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for &n in &AWKWARD_SIZES {
        for (lo, hi) in [(-3.0f32, 7.5f32), (0.0, 0.0), (-140.0, 140.0), (2.25, 2.5)] {
            let step = (hi - lo) / 254.0;
            let codes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            let (mut want, mut got) = (vec![0.0f32; n], vec![1.0f32; n]);
            scalar::decode_log_u8(&codes, lo, step, &mut want);
            // SAFETY: `isa` comes from the runnable list.
            unsafe { decode_log_u8_on(isa, &codes, lo, step, &mut got) };
            identical(&bits(&got), &bits(&want), &|| {
                format!("decode_log_u8 n={n} lo={lo}")
            })?;
        }
    }
    // Runs of ragged lengths and different grids, back to back: each block's own bits.
    let codes: Vec<u8> = (0..200).map(|_| rng.next_u64() as u8).collect();
    let cuts = [0usize, 32, 33, 64, 64, 101, 200];
    let runs: Vec<LogRun<'_>> = cuts
        .windows(2)
        .enumerate()
        .map(|(i, w)| LogRun {
            codes: &codes[w[0]..w[1]],
            lo: -3.0 + i as f32,
            step: 0.04 * (i + 1) as f32,
        })
        .collect();
    let mut want = vec![0.0f32; codes.len()];
    for (run, w) in runs.iter().zip(cuts.windows(2)) {
        scalar::decode_log_u8(run.codes, run.lo, run.step, &mut want[w[0]..w[1]]);
    }
    let mut got = vec![1.0f32; codes.len()];
    // SAFETY: `isa` comes from the runnable list; `got` is as long as the runs.
    unsafe { decode_log_u8_runs_on(isa, &runs, &mut got) };
    identical(&bits(&got), &bits(&want), &|| {
        "decode_log_u8_runs".to_string()
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp2_is_accurate() {
        let mut worst = 0.0f64;
        for i in -120_000..120_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp2();
            let rel = ((exp2(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 4e-6, "relative error {worst}");
        assert_eq!(exp2(0.0), 1.0);
        assert_eq!(exp2(3.0), 8.0);
        assert_eq!(exp2(-1.0), 0.5);
    }
}
