//! Per-phase wall-clock accounting, accumulated with `Instant` around coarse steps (a few
//! hundred timer reads per token: negligible next to the work they measure).

use crate::platform::Instant;

/// Totals since the session started or since `reset_timings`. All durations in nanoseconds.
/// `attention_ns + matmul_ns + other_ns` is the time spent in the forward passes counted by
/// `prefill_ns + decode_ns`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimings {
    pub prefill_tokens: u64,
    pub prefill_ns: u64,
    pub decode_tokens: u64,
    pub decode_ns: u64,
    pub samples: u64,
    pub sample_ns: u64,
    /// KV append + attention over the cache.
    pub attention_ns: u64,
    /// Linear layers (Q/K/V/O, MLP, lm_head).
    pub matmul_ns: u64,
    /// Everything else in the forward: embedding, norms, RoPE, activations, residuals.
    pub other_ns: u64,
}

impl PhaseTimings {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        per_second(self.prefill_tokens, self.prefill_ns)
    }

    pub fn decode_tokens_per_s(&self) -> f64 {
        per_second(self.decode_tokens, self.decode_ns)
    }
}

fn per_second(count: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        count as f64 * 1e9 / ns as f64
    }
}

/// Nanoseconds since `start`, saturating.
pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Splits one forward pass into attention / matmul; the rest is "other".
#[derive(Default)]
pub(crate) struct ForwardClock {
    pub attention_ns: u64,
    pub matmul_ns: u64,
}

impl ForwardClock {
    pub fn time_matmul<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let result = f();
        self.matmul_ns += elapsed_ns(start);
        result
    }

    pub fn time_attention<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let result = f();
        self.attention_ns += elapsed_ns(start);
        result
    }

    /// Fold a forward pass that took `total_ns` into `timings`.
    pub fn finish(self, total_ns: u64, timings: &mut PhaseTimings) {
        timings.attention_ns += self.attention_ns;
        timings.matmul_ns += self.matmul_ns;
        timings.other_ns += total_ns.saturating_sub(self.attention_ns + self.matmul_ns);
    }
}
