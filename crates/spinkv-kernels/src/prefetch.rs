//! Cache prefetch hints for the attention scan.
//!
//! A decode step reads a layer's pages a few KiB at a time from scattered addresses: too short a
//! stream for the hardware prefetchers to lock on to. Asking for the next tile's pages while the
//! current tile is scanned hides most of the memory latency. The lines go to L2, not L1: a
//! tile's pages are tens of KiB, and on an AMD EPYC Zen 4 loading them into L2 ran the scan of
//! pages from DRAM ~20 % faster than the same hints into L1. A hint has no effect on results,
//! so there is nothing to compare across ISAs.

/// Cache line size assumed for the hints (64 bytes on every CPU spinkv targets).
const LINE: usize = 64;

/// Asks the CPU to start loading `bytes` into its L2 cache; returns at once.
#[inline]
pub fn prefetch_read(bytes: &[u8]) {
    for offset in (0..bytes.len()).step_by(LINE) {
        line(bytes[offset..].as_ptr());
    }
}

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
        }
        assert!(bytes.iter().all(|&b| b == 7));
    }
}
