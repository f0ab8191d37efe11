//! Opt-in timers of the cache's phases (the design study's breakdown): query transform, key
//! scan, softmax, value scan, value finish (inverse transform), append-time encoding, page
//! allocation.
//!
//! Off by default: a decode step at depth 7,680 visits ~20,000 pages, and a clock read per
//! page phase would cost more than some phases take. `spinkv bench` switches it on for a
//! separate profiled pass, so the timed repetitions never pay for it. Attention runs on
//! several threads, so attention phases are thread time summed over the pool, not wall time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The phases, in the order of [`PhaseTimes::as_pairs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    QueryTransform,
    KeyScan,
    Softmax,
    ValueScan,
    ValueFinish,
    AppendEncode,
    PageAlloc,
}

const PHASES: usize = 7;

/// Nanoseconds per phase since profiling was switched on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    pub query_transform_ns: u64,
    pub key_scan_ns: u64,
    pub softmax_ns: u64,
    pub value_scan_ns: u64,
    pub value_finish_ns: u64,
    pub append_encode_ns: u64,
    pub page_alloc_ns: u64,
    /// Compressed (page, KV head) value blocks the value scan read, and those sparse values
    /// left out (`KvConfig::sparse_v`). Counts, not times.
    pub value_blocks_read: u64,
    pub value_blocks_skipped: u64,
}

impl PhaseTimes {
    /// Per cent of the compressed value blocks that sparse values left out (None before any).
    pub fn value_blocks_skipped_pct(&self) -> Option<f64> {
        let total = self.value_blocks_read + self.value_blocks_skipped;
        (total > 0).then(|| 100.0 * self.value_blocks_skipped as f64 / total as f64)
    }

    /// `(name, nanoseconds)` for every phase.
    pub fn as_pairs(&self) -> [(&'static str, u64); PHASES] {
        [
            ("query_transform_ns", self.query_transform_ns),
            ("key_scan_ns", self.key_scan_ns),
            ("softmax_ns", self.softmax_ns),
            ("value_scan_ns", self.value_scan_ns),
            ("value_finish_ns", self.value_finish_ns),
            ("append_encode_ns", self.append_encode_ns),
            ("page_alloc_ns", self.page_alloc_ns),
        ]
    }
}

/// Shared counters, added to by every attention thread.
#[derive(Debug, Default)]
pub(crate) struct PhaseCounters {
    ns: [AtomicU64; PHASES],
    value_blocks_read: AtomicU64,
    value_blocks_skipped: AtomicU64,
}

impl PhaseCounters {
    pub(crate) fn add(&self, phase: Phase, ns: u64) {
        self.ns[phase as usize].fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts one tile's value blocks of one KV head: `read` scanned, `skipped` left out.
    pub(crate) fn count_value_blocks(&self, read: usize, skipped: usize) {
        self.value_blocks_read
            .fetch_add(read as u64, Ordering::Relaxed);
        self.value_blocks_skipped
            .fetch_add(skipped as u64, Ordering::Relaxed);
    }

    pub(crate) fn times(&self) -> PhaseTimes {
        let get = |phase: Phase| self.ns[phase as usize].load(Ordering::Relaxed);
        PhaseTimes {
            query_transform_ns: get(Phase::QueryTransform),
            key_scan_ns: get(Phase::KeyScan),
            softmax_ns: get(Phase::Softmax),
            value_scan_ns: get(Phase::ValueScan),
            value_finish_ns: get(Phase::ValueFinish),
            append_encode_ns: get(Phase::AppendEncode),
            page_alloc_ns: get(Phase::PageAlloc),
            value_blocks_read: self.value_blocks_read.load(Ordering::Relaxed),
            value_blocks_skipped: self.value_blocks_skipped.load(Ordering::Relaxed),
        }
    }
}

/// A lap timer local to one thread's work: `lap(phase)` charges the time since the previous
/// lap to `phase`; totals reach the shared counters on drop. Without counters it reads no
/// clock.
pub(crate) struct Laps<'a> {
    counters: Option<&'a PhaseCounters>,
    last: Option<Instant>,
    local: [u64; PHASES],
}

impl<'a> Laps<'a> {
    pub(crate) fn start(counters: Option<&'a PhaseCounters>) -> Self {
        Laps {
            counters,
            last: counters.map(|_| Instant::now()),
            local: [0; PHASES],
        }
    }

    #[inline]
    pub(crate) fn lap(&mut self, phase: Phase) {
        if let Some(last) = self.last {
            let now = Instant::now();
            self.local[phase as usize] += now.duration_since(last).as_nanos() as u64;
            self.last = Some(now);
        }
    }
}

impl Drop for Laps<'_> {
    fn drop(&mut self) {
        if let Some(counters) = self.counters {
            for (slot, &ns) in counters.ns.iter().zip(&self.local) {
                if ns > 0 {
                    slot.fetch_add(ns, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Runs `f`, charging its time to `phase` when profiling.
pub(crate) fn timed<R>(counters: Option<&PhaseCounters>, phase: Phase, f: impl FnOnce() -> R) -> R {
    match counters {
        None => f(),
        Some(counters) => {
            let start = Instant::now();
            let result = f();
            counters.add(phase, start.elapsed().as_nanos() as u64);
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_charge_each_phase_and_nothing_without_counters() {
        let counters = PhaseCounters::default();
        {
            let mut laps = Laps::start(Some(&counters));
            std::thread::sleep(std::time::Duration::from_millis(2));
            laps.lap(Phase::KeyScan);
            std::thread::sleep(std::time::Duration::from_millis(1));
            laps.lap(Phase::Softmax);
        }
        // Lower bounds only: a thread descheduled between two laps (a loaded machine, qemu)
        // may be charged any amount more.
        let times = counters.times();
        assert!(times.key_scan_ns >= 2_000_000, "{times:?}");
        assert!(times.softmax_ns >= 1_000_000, "{times:?}");
        assert_eq!(times.value_scan_ns, 0);

        let mut off = Laps::start(None);
        off.lap(Phase::KeyScan);
        assert!(off.last.is_none());
        timed(Some(&counters), Phase::PageAlloc, || {
            std::thread::sleep(std::time::Duration::from_millis(1))
        });
        assert!(counters.times().page_alloc_ns >= 1_000_000);
    }
}
