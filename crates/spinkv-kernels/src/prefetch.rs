//! Cache prefetch hints for the attention scan, and whether decode's weight reads use any.
//!
//! A decode step reads a layer's pages a few KiB at a time from scattered addresses: too short a
//! stream for the hardware prefetchers to lock on to. Asking for the next tile's pages while the
//! current tile is scanned hides most of the memory latency. The lines go to L2, not L1: a
//! tile's pages are tens of KiB, and on an AMD EPYC Zen 4 loading them into L2 ran the scan of
//! pages from DRAM ~20 % faster than the same hints into L1. A hint has no effect on results,
//! so there is nothing to compare across ISAs.

/// Whether decode's weight streams should ask for their lines ahead of the hardware
/// prefetchers (`matvec`, the AVX2 Q8_0 decode loop). Measured both ways: on a 2-core AMD EPYC
/// Zen 3 without AVX-512 (1 thread, 4 KiB pages) the hints cut an F16 LM head's decode time by
/// ~7–15 % and a Q8_0 decode's by ~15–20 %; on a 2-core AMD EPYC Zen 4 the same hints made decode
/// slower — in-process A/B at depth 512, F16 B/A 0.865–0.919 and Q8_0 0.911–0.938 without them,
/// and a model-shaped F16 matvec read 32–34 GB/s without against 25–27 with, at 1 and 2 threads,
/// in 2 MiB and in 4 KiB pages. So they are issued only where AVX-512 is absent, the CPU class
/// where they paid. Results do not depend on it: a hint changes no value.
#[inline]
pub fn weight_hints() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How far ahead of the bytes being read decode's weight hints reach (bytes; rows are
/// contiguous, so a hint runs on into the next row). On the 2-core AMD EPYC (Zen 3, loaded),
/// 1 thread, the CPU time of a SmolLM2 Q8_0 decode fell ~3 % with 512 bytes ahead, ~9 % with
/// 1 KiB and ~15–20 % with 4–8 KiB (alike).
#[cfg(target_arch = "x86_64")]
pub(crate) const WEIGHT_AHEAD: usize = 4096;

/// Cache line size assumed for the hints (64 bytes on every CPU spinkv targets).
const LINE: usize = 64;

/// Byte ranges a thread's queue holds at most; [`enqueue`] issues a range at once when full.
const QUEUE_RANGES: usize = 64;

/// Ranges waiting to be prefetched, oldest first: a ring of `(next line, end)` addresses.
/// Addresses, not slices: a hint for memory freed in between is still harmless (a prefetch
/// never faults), and [`clear`] drops what a scan did not get to.
struct Queue {
    ranges: [(usize, usize); QUEUE_RANGES],
    head: usize,
    len: usize,
    /// Lines not issued yet, over every range.
    lines: usize,
}

thread_local! {
    static QUEUE: core::cell::RefCell<Queue> = const {
        core::cell::RefCell::new(Queue {
            ranges: [(0, 0); QUEUE_RANGES],
            head: 0,
            len: 0,
            lines: 0,
        })
    };
}

/// Queues `bytes` for [`pump`] on this thread: the attention scan queues the next tile's pages
/// and the scan kernels issue a few lines per block of rows, so the loads spread over the scan
/// instead of filling the CPU's miss queue in one burst (which stalls it: on an AMD EPYC Zen
/// 4, ~80 % of the burst loop's samples sat on its prefetch instruction).
pub fn enqueue(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let range = (
        bytes.as_ptr() as usize,
        bytes.as_ptr() as usize + bytes.len(),
    );
    QUEUE.with(|queue| {
        let mut queue = queue.borrow_mut();
        if queue.len == QUEUE_RANGES {
            drop(queue);
            prefetch_read(bytes);
            return;
        }
        let at = (queue.head + queue.len) % QUEUE_RANGES;
        queue.ranges[at] = range;
        queue.len += 1;
        queue.lines += bytes.len().div_ceil(LINE);
    })
}

/// What a scan kernel issues for `rows` rows it scanned: half a line per row. The attention
/// scan queues the next tile's pages, ~110 lines per head's key or value scan of a 256-token
/// tile at head dim 64, so 128 lines finish them within the scan.
#[inline]
pub fn pump_rows(rows: usize) {
    pump(rows / 2);
}

/// [`pump_rows`] for the AVX-512 scan kernels, which take about half the time a row: three
/// quarters of a line per row, so the next tile's lines are all asked for during the current
/// tile's first three or four scans (keys, then the first values) instead of spread to its
/// last, and the lines the next tile's first scans read have arrived. In-process A/B of decode
/// attention at depth 7,680 against half a line (SmolLM2-135M, turbo, 2 threads, AMD EPYC Zen
/// 4): 0.969, 0.960, 0.901, 0.953, 0.991, 0.982; one line a row read 0.936–1.012 (median
/// 0.974), two 0.98–1.07 (bursts that fill the miss queue), and hints for every other line
/// alone 1.27–1.31 (no line comes without its own hint). Prefill's many-head key layout
/// (`int_dot/avx512/heads.rs`) takes the same rate; it was not measured apart. The AVX2, NEON
/// and SIMD128 kernels keep half a line, as measured on an AVX2-only Zen 3
/// (docs/PERFORMANCE.md).
#[inline]
pub fn pump_rows_avx512(rows: usize) {
    pump(rows * 3 / 4);
}

/// Issues up to `lines` queued cache lines; returns at once when nothing is queued.
///
/// The scan kernels call this once per block of 16 rows, so it settles the count once and
/// walks each range's lines in a plain loop: bookkeeping per line, as before, cost ~2 % of a
/// decode's attention at depth 7,680 (in-process A/B, SmolLM2-135M F16, turbo, AMD EPYC Zen 4:
/// attention B/A 0.975, 0.958, 0.997 with this loop).
#[inline]
pub fn pump(lines: usize) {
    QUEUE.with(|queue| {
        let queue = &mut *queue.borrow_mut();
        let mut left = lines.min(queue.lines);
        queue.lines -= left;
        while left > 0 {
            let head = queue.head;
            let (next, end) = queue.ranges[head];
            // `lines` counts every range's lines from `next`, so a range left over here has
            // at least one.
            let in_range = (end - next).div_ceil(LINE);
            let n = left.min(in_range);
            for i in 0..n {
                line((next + i * LINE) as *const u8);
            }
            left -= n;
            if n == in_range {
                queue.head = (head + 1) % QUEUE_RANGES;
                queue.len -= 1;
            } else {
                queue.ranges[head].0 = next + n * LINE;
            }
        }
    })
}

/// Lines queued and not issued yet.
pub fn queued_lines() -> usize {
    QUEUE.with(|queue| queue.borrow().lines)
}

/// Issues queued lines until at most `left` remain: a caller whose kernels may not pump keeps
/// the queue on schedule.
pub fn pump_to(left: usize) {
    pump(queued_lines().saturating_sub(left));
}

/// Drops what is queued without issuing it.
pub fn clear() {
    QUEUE.with(|queue| {
        let mut queue = queue.borrow_mut();
        queue.len = 0;
        queue.lines = 0;
    })
}

/// Asks the CPU to start loading `bytes` into its L2 cache; returns at once.
#[inline]
pub fn prefetch_read(bytes: &[u8]) {
    for offset in (0..bytes.len()).step_by(LINE) {
        line(bytes[offset..].as_ptr());
    }
}

/// Asks the CPU to bring `bytes` into its L1 cache, a hint per line, for a kernel about to read
/// them: its own loads then find the lines coming in together instead of missing one by one.
#[inline]
pub fn to_l1(bytes: &[u8]) {
    for offset in (0..bytes.len()).step_by(LINE) {
        line_l1(bytes[offset..].as_ptr());
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn line_l1(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: as `line`.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn line_l1(p: *const u8) {
    // SAFETY: as `line`.
    unsafe {
        core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn line_l1(_p: *const u8) {}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn line(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: a prefetch never faults and reads nothing architecturally; `p` points into a
    // live slice anyway. SSE is part of the x86_64 baseline.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) };
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn line(p: *const u8) {
    // SAFETY: PRFM is a hint: it never faults, writes nothing and touches no flags or stack.
    unsafe {
        core::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn line(_p: *const u8) {}

#[cfg(test)]
mod tests {
    #[test]
    fn any_length_is_fine() {
        let bytes = vec![7u8; 1000];
        for len in [0, 1, 63, 64, 65, 1000] {
            super::prefetch_read(&bytes[..len]);
            super::to_l1(&bytes[..len]);
        }
        assert!(bytes.iter().all(|&b| b == 7));
    }

    /// Against a model (a list of every queued line, oldest first): random ranges and pumps
    /// leave the same lines queued, so nothing is issued twice or skipped.
    #[test]
    fn pumping_takes_lines_oldest_first() {
        let mut rng = crate::test_util::Rng::new(11);
        let bytes = vec![5u8; 4096 + 700];
        let base = bytes.as_ptr() as usize;
        for _ in 0..50 {
            super::clear();
            let mut model: std::collections::VecDeque<usize> = Default::default();
            for _ in 0..40 {
                if rng.below(3) == 0 || model.is_empty() {
                    if super::QUEUE.with(|q| q.borrow().len) == super::QUEUE_RANGES {
                        continue;
                    }
                    let at = rng.below(4096) as usize;
                    let len = 1 + rng.below(700) as usize;
                    super::enqueue(&bytes[at..at + len]);
                    model.extend((base + at..base + at + len).step_by(super::LINE));
                } else {
                    let n = rng.below(12) as usize;
                    super::pump(n);
                    for _ in 0..n.min(model.len()) {
                        model.pop_front();
                    }
                }
                assert_eq!(super::queued_lines(), model.len());
                let next = super::QUEUE.with(|q| {
                    let q = q.borrow();
                    (q.len > 0).then(|| q.ranges[q.head].0)
                });
                assert_eq!(next, model.front().copied());
            }
        }
        super::clear();
        assert!(bytes.iter().all(|&b| b == 5));
    }

    /// The queue hands out every line of what was queued, oldest first, and takes more ranges
    /// than it holds (the extra ones are issued at once).
    #[test]
    fn queued_ranges_drain_in_order_and_overflow_is_issued() {
        let bytes = vec![3u8; 64 * 1000];
        super::clear();
        for i in 0..super::QUEUE_RANGES + 5 {
            super::enqueue(&bytes[i * 100..i * 100 + 130]);
        }
        super::QUEUE.with(|q| assert_eq!(q.borrow().len, super::QUEUE_RANGES));
        // Each 130-byte range is 3 lines from its start (start, +64, +128).
        assert_eq!(super::queued_lines(), 3 * super::QUEUE_RANGES);
        super::pump(3);
        super::QUEUE.with(|q| assert_eq!(q.borrow().len, super::QUEUE_RANGES - 1));
        super::pump(1);
        super::QUEUE.with(|q| {
            let q = q.borrow();
            let (next, _) = q.ranges[q.head];
            assert_eq!(next, bytes.as_ptr() as usize + 100 + 64);
        });
        super::pump_to(5);
        assert_eq!(super::queued_lines(), 5);
        super::pump_to(0);
        super::QUEUE.with(|q| assert_eq!(q.borrow().len, 0));
        super::enqueue(&bytes[..10]);
        super::clear();
        super::QUEUE.with(|q| assert_eq!(q.borrow().len, 0));
        assert!(bytes.iter().all(|&b| b == 3));
    }
}
