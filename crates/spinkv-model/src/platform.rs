//! What the runtime needs from the platform, in one place: a clock for the phase timers and
//! entropy for an unseeded sampler. Natively these are `std::time::Instant` and the system
//! time mixed with the process id. A wasm32-unknown-unknown build has neither (both panic
//! there), so its host hands them over once with [`set_host_hooks`] (spinkv-wasm does, from
//! `performance.now()` and `crypto.getRandomValues`).
//!
//! Weights from bytes instead of memory maps live in `weights` (`WeightBytes`); the thread
//! pool's wasm variant in `parallel`.

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use std::time::Instant;

/// A seed for a sampler created without one (not reproducible, by design).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn entropy_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (std::process::id() as u64).rotate_left(32)
}

#[cfg(target_arch = "wasm32")]
pub use host::{set_host_hooks, HostHooks};

#[cfg(target_arch = "wasm32")]
pub(crate) use host::{entropy_seed, Instant};

#[cfg(target_arch = "wasm32")]
mod host {
    use std::sync::OnceLock;
    use std::time::Duration;

    /// The host's clock and entropy source.
    #[derive(Clone, Copy, Debug)]
    pub struct HostHooks {
        /// Milliseconds from any fixed origin, monotonic (`performance.now()`).
        pub now_ms: fn() -> f64,
        /// 64 random bits (`crypto.getRandomValues`).
        pub random_u64: fn() -> u64,
    }

    static HOOKS: OnceLock<HostHooks> = OnceLock::new();

    /// Installs the host's clock and entropy (the first call wins). Until then timers read 0
    /// and an unseeded sampler uses a fixed seed.
    pub fn set_host_hooks(hooks: HostHooks) {
        let _ = HOOKS.set(hooks);
    }

    fn now_ms() -> f64 {
        HOOKS.get().map_or(0.0, |h| (h.now_ms)())
    }

    /// `std::time::Instant`'s subset the runtime uses, on the host's clock.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Instant(f64);

    impl Instant {
        pub(crate) fn now() -> Instant {
            Instant(now_ms())
        }

        pub(crate) fn elapsed(&self) -> Duration {
            let ms = (now_ms() - self.0).max(0.0);
            Duration::from_nanos((ms * 1e6) as u64)
        }
    }

    pub(crate) fn entropy_seed() -> u64 {
        HOOKS
            .get()
            .map_or(0x5EED_5EED_5EED_5EED, |h| (h.random_u64)())
    }
}
