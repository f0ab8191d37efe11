//! A switch for A/B measurements of a code change inside one process.
//!
//! On the shared VMs spinkv is tuned on, the same binary's decode rate moves by 15 % or more
//! from one run to the next (a neighbour's load, the host's clock), so two builds run in turn
//! cannot tell a 5 % change from noise. Alternating two versions of the code inside one decode
//! can: both arms see the same neighbour. To measure a change, put it behind
//! `if experiment::arm_b() { new } else { old }` and run `decode_bench` with `SPINKV_AB=1`,
//! which switches arms every 32 tokens (A B B A ...) and prints each arm's mean time per
//! token. An A/A run (nothing behind the switch) shows the noise left: B/A 0.963–1.002 on an
//! EPYC Zen 4 VM. Nothing in the shipped code reads the switch; it stays on arm A.

use std::sync::atomic::{AtomicBool, Ordering};

static ARM_B: AtomicBool = AtomicBool::new(false);

/// Whether the code under test should run its B version.
#[inline]
pub fn arm_b() -> bool {
    ARM_B.load(Ordering::Relaxed)
}

/// The arm (0 = A, 1 = B) of turn `turn` in the order A B B A A B B A ...: each arm follows
/// the other as often as it precedes it, so a drift in time weighs on both alike.
pub fn abba_arm(turn: usize) -> usize {
    usize::from(turn % 4 == 1 || turn % 4 == 2)
}

/// Selects arm B (`true`) or A for every thread from the next read on.
pub fn set_arm_b(on: bool) {
    ARM_B.store(on, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_switch_flips_and_comes_back() {
        assert!(!super::arm_b());
        super::set_arm_b(true);
        assert!(super::arm_b());
        super::set_arm_b(false);
        assert!(!super::arm_b());
    }

    #[test]
    fn turns_alternate_abba() {
        let arms: Vec<usize> = (0..8).map(super::abba_arm).collect();
        assert_eq!(arms, [0, 1, 1, 0, 0, 1, 1, 0]);
    }
}
