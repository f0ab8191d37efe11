//! How fast this machine reads memory with the compute team's threads, and how many bytes of
//! weights a decode step reads: together they bound decode speed from below, whatever the
//! kernels do (`spinkv bench` prints both, so a figure can be read against the hardware).
//!
//! The probe sums a buffer far larger than any last-level cache, split into one contiguous
//! stretch per thread — the access pattern of a matvec over a weight matrix — and reports the
//! median of several passes. Memory is touched (and so committed) before timing.

use crate::error::ModelError;
use crate::parallel::run_in_pool;
use spinkv_kernels::team::{current_threads, for_each_mut};
use std::time::Instant;

/// Smallest and largest buffer the probe accepts, in MiB (a few L3 caches' worth at least,
/// and nothing a typical machine cannot spare).
pub const PROBE_MIB_RANGE: std::ops::RangeInclusive<usize> = 64..=1024;
/// Passes the probe accepts.
pub const PROBE_PASSES_RANGE: std::ops::RangeInclusive<usize> = 1..=100;

/// What one probe measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadBandwidth {
    /// Median bytes per second over the passes.
    pub bytes_per_second: f64,
    /// Best pass, bytes per second.
    pub best_bytes_per_second: f64,
    pub threads: usize,
    pub buffer_bytes: usize,
    pub passes: usize,
}

/// Reads a `mib`-MiB buffer `passes` times with the compute team's threads.
pub fn read_bandwidth(mib: usize, passes: usize) -> Result<ReadBandwidth, ModelError> {
    if !PROBE_MIB_RANGE.contains(&mib) {
        return Err(ModelError::Probe(format!(
            "buffer must be {}..={} MiB, got {mib}",
            PROBE_MIB_RANGE.start(),
            PROBE_MIB_RANGE.end()
        )));
    }
    if !PROBE_PASSES_RANGE.contains(&passes) {
        return Err(ModelError::Probe(format!(
            "passes must be {}..={}, got {passes}",
            PROBE_PASSES_RANGE.start(),
            PROBE_PASSES_RANGE.end()
        )));
    }
    let words = mib * (1 << 20) / 8;
    let mut buffer: Vec<u64> = Vec::new();
    buffer
        .try_reserve_exact(words)
        .map_err(|_| ModelError::Probe(format!("cannot allocate {mib} MiB")))?;
    run_in_pool(move || {
        let threads = current_threads();
        buffer.resize(words, 0);
        // Stretches of one contiguous run each, several per thread so a late thread costs
        // little; distinct values so no page stays shared.
        let stretch = words.div_ceil(threads * 4);
        let mut stretches: Vec<(usize, &mut [u64])> =
            buffer.chunks_mut(stretch).enumerate().collect();
        for_each_mut(&mut stretches, |(i, words)| {
            for (j, w) in words.iter_mut().enumerate() {
                *w = (*i * stretch + j) as u64;
            }
        });
        let mut sums: Vec<(&[u64], u64)> = buffer.chunks(stretch).map(|c| (c, 0)).collect();
        let mut seconds = Vec::with_capacity(passes);
        for _ in 0..passes {
            let start = Instant::now();
            for_each_mut(&mut sums, |(words, sum)| {
                *sum = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            });
            seconds.push(start.elapsed().as_secs_f64());
            std::hint::black_box(&sums);
        }
        seconds.sort_by(f64::total_cmp);
        let bytes = (words * 8) as f64;
        ReadBandwidth {
            bytes_per_second: bytes / seconds[seconds.len() / 2].max(1e-9),
            best_bytes_per_second: bytes / seconds[0].max(1e-9),
            threads,
            buffer_bytes: words * 8,
            passes,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_measures_a_positive_rate_and_rejects_bad_sizes() {
        let r = read_bandwidth(64, 2).unwrap();
        assert!(r.bytes_per_second.is_finite() && r.bytes_per_second > 0.0);
        assert!(r.best_bytes_per_second >= r.bytes_per_second);
        assert_eq!(r.buffer_bytes, 64 << 20);
        assert!(read_bandwidth(1, 2).is_err());
        assert!(read_bandwidth(64, 0).is_err());
        assert!(read_bandwidth(1 << 20, 1).is_err());
        assert!(read_bandwidth(64, 101).is_err());
    }
}
