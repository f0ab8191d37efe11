//! What the JavaScript host provides (`env` imports) and what the runtime takes from it: log
//! lines, a millisecond clock, random bits. Installed into spinkv-model's platform layer once.

mod imports {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub(crate) fn log(ptr: *const u8, len: usize);
        pub(crate) fn now() -> f64;
        #[cfg(feature = "runtime")]
        pub(crate) fn random_u32() -> u32;
    }
}

/// One UTF-8 line to the host's console.
pub(crate) fn say(line: &str) {
    // SAFETY: the host reads `len` bytes at `ptr` from this module's memory, synchronously.
    unsafe { imports::log(line.as_ptr(), line.len()) }
}

/// Milliseconds on the host's monotonic clock (`performance.now()`).
pub(crate) fn now_ms() -> f64 {
    // SAFETY: a plain host call without arguments.
    unsafe { imports::now() }
}

/// 32 random bits from the host (`crypto.getRandomValues`).
#[cfg(feature = "runtime")]
pub(crate) fn random_u32() -> u32 {
    // SAFETY: a plain host call without arguments.
    unsafe { imports::random_u32() }
}

#[cfg(feature = "runtime")]
fn random_u64() -> u64 {
    (u64::from(random_u32()) << 32) | u64::from(random_u32())
}

/// Panics abort the module (wasm32 has no unwinding): say why first. Installs the clock and
/// entropy into the runtime. Idempotent.
pub(crate) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| say(&format!("panic: {info}"))));
        #[cfg(feature = "runtime")]
        spinkv_core::set_host_hooks(spinkv_core::HostHooks { now_ms, random_u64 });
    });
}

/// getrandom's "custom" backend (selected by the bundle build with `--cfg getrandom_backend="custom"`):
/// the host's crypto.getRandomValues, four bytes at a time.
///
/// # Safety
/// getrandom calls it with a writable buffer of `len` bytes at `dest`.
#[cfg(feature = "runtime")]
#[no_mangle]
unsafe extern "Rust" fn __getrandom_v03_custom(
    dest: *mut u8,
    len: usize,
) -> Result<(), getrandom::Error> {
    // SAFETY: getrandom passes `len` writable bytes at `dest`, exclusively ours for the call.
    let out = unsafe { std::slice::from_raw_parts_mut(dest, len) };
    for chunk in out.chunks_mut(4) {
        let bits = random_u32().to_le_bytes();
        chunk.copy_from_slice(&bits[..chunk.len()]);
    }
    Ok(())
}
