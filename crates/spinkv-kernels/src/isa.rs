//! Which instruction set the kernels use: detected once, overridable (env or API).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Instruction sets spinkv knows about. Not every one has kernels yet (see [`Isa::has_kernels`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C (x86_64). The three always travel together on real CPUs.
    Avx2,
    Avx512,
    Neon,
    Simd128,
}

impl Isa {
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::Simd128];

    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::Simd128 => "simd128",
        }
    }

    /// Case-insensitive name lookup ("AVX2", "scalar", ...).
    pub fn parse(name: &str) -> Option<Isa> {
        let wanted = name.trim().to_ascii_lowercase();
        Isa::ALL.into_iter().find(|isa| isa.name() == wanted)
    }

    /// Whether the CPU running this process can execute this ISA's instructions. AVX-512 means
    /// F + BW + VL on top of everything AVX2 needs (its kernels use F16C and FMA too).
    pub fn cpu_supports(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => {
                #[cfg(target_arch = "x86_64")]
                {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                        && std::arch::is_x86_feature_detected!("f16c")
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    false
                }
            }
            Isa::Avx512 => {
                #[cfg(target_arch = "x86_64")]
                {
                    Isa::Avx2.cpu_supports()
                        && std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    false
                }
            }
            Isa::Neon => {
                #[cfg(target_arch = "aarch64")]
                {
                    std::arch::is_aarch64_feature_detected!("neon")
                }
                #[cfg(not(target_arch = "aarch64"))]
                {
                    false
                }
            }
            // WASM has no run-time detection: simd128 is a compile-time property of the module.
            Isa::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
        }
    }

    /// Whether this build ships kernels for the ISA: the x86 ones on x86_64, NEON on aarch64,
    /// SIMD128 in a wasm32 build compiled with `+simd128`. Selecting any other is an error
    /// rather than a silent scalar run.
    pub const fn has_kernels(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx512 => cfg!(target_arch = "x86_64"),
            Isa::Neon => cfg!(target_arch = "aarch64"),
            Isa::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
        }
    }

    fn to_code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Isa {
        Isa::ALL[code as usize]
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsaError {
    Unknown(String),
    CpuLacks(Isa),
    NoKernels(Isa),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::Unknown(name) => write!(
                f,
                "unknown ISA {name:?} (expected one of: scalar, avx2, avx512, neon, simd128)"
            ),
            IsaError::CpuLacks(isa) => write!(f, "this CPU does not support ISA {isa}"),
            IsaError::NoKernels(isa) => {
                write!(f, "ISA {isa} has no kernels in this build of spinkv")
            }
        }
    }
}

impl std::error::Error for IsaError {}

const UNSET: u8 = u8::MAX;
static ACTIVE: AtomicU8 = AtomicU8::new(UNSET);
static DETECTED: OnceLock<Isa> = OnceLock::new();
static ENV_CHOICE: OnceLock<Result<Option<Isa>, IsaError>> = OnceLock::new();

/// The best ISA that both the CPU supports and this build has kernels for.
pub fn detected_isa() -> Isa {
    *DETECTED.get_or_init(|| {
        [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Simd128]
            .into_iter()
            .find(|isa| isa.has_kernels() && isa.cpu_supports())
            .unwrap_or(Isa::Scalar)
    })
}

/// The `SPINKV_ISA` override, validated: `Ok(None)` when unset or empty.
pub fn env_isa_override() -> Result<Option<Isa>, IsaError> {
    ENV_CHOICE
        .get_or_init(|| match std::env::var("SPINKV_ISA") {
            Ok(name) if !name.trim().is_empty() => validate_name(&name).map(Some),
            _ => Ok(None),
        })
        .clone()
}

/// The ISA every dispatched kernel uses right now. First call settles it: `SPINKV_ISA` if set
/// and valid, otherwise [`detected_isa`]. An invalid `SPINKV_ISA` is reported once on stderr
/// (callers that want it as an error use [`env_isa_override`]).
#[inline]
pub fn active_isa() -> Isa {
    let code = ACTIVE.load(Ordering::Relaxed);
    if code != UNSET {
        return Isa::from_code(code);
    }
    choose_initial_isa()
}

/// The first [`active_isa`] call's choice, kept out of line so that every kernel dispatch
/// inlines only the atomic load.
#[cold]
#[inline(never)]
fn choose_initial_isa() -> Isa {
    let initial = match env_isa_override() {
        Ok(Some(isa)) => isa,
        Ok(None) => detected_isa(),
        Err(err) => {
            eprintln!("spinkv: ignoring SPINKV_ISA: {err}");
            detected_isa()
        }
    };
    // A concurrent set_isa() wins over the lazy default.
    match ACTIVE.compare_exchange(
        UNSET,
        initial.to_code(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    ) {
        Ok(_) => initial,
        Err(current) => Isa::from_code(current),
    }
}

fn validate(isa: Isa) -> Result<Isa, IsaError> {
    if !isa.cpu_supports() {
        return Err(IsaError::CpuLacks(isa));
    }
    if !isa.has_kernels() {
        return Err(IsaError::NoKernels(isa));
    }
    Ok(isa)
}

fn validate_name(name: &str) -> Result<Isa, IsaError> {
    let isa = Isa::parse(name).ok_or_else(|| IsaError::Unknown(name.to_string()))?;
    validate(isa)
}

/// Switch every kernel to `isa` (benchmarks, parity checks). Fails if the CPU lacks it.
pub fn set_isa(isa: Isa) -> Result<(), IsaError> {
    validate(isa)?;
    ACTIVE.store(isa.to_code(), Ordering::Relaxed);
    Ok(())
}

/// Parse `name`, check the CPU and this build support it, and make it the active ISA.
pub fn select_isa(name: &str) -> Result<Isa, IsaError> {
    let isa = validate_name(name)?;
    set_isa(isa)?;
    Ok(isa)
}

/// CPU features relevant to spinkv's kernels that this CPU reports.
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut features = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($name:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($name) {
                    features.push($name);
                }
            )*};
        }
        probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl");
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            features.push("neon");
        }
        if std::arch::is_aarch64_feature_detected!("fp16") {
            features.push("fp16");
        }
    }
    // `extend`, not `push`: clippy would have the wasm32 build start from `vec![...]`.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    features.extend(["simd128"]);
    features
}

/// The ISAs this process can run kernels for (CPU support and kernels in this build), scalar
/// first: what parity checks and per-ISA benchmarks iterate over.
pub fn runnable_isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|isa| isa.has_kernels() && isa.cpu_supports())
        .collect()
}

/// Declares an operation's per-ISA modules, each behind the `cfg` of the targets that have
/// that ISA. `quad` is one file for both 4-lane ISAs (NEON, SIMD128: never in one build),
/// written against `crate::simd::quad`; it stands in as `neon` / `simd128` for [`dispatch`].
/// `x86` is one file for AVX2 and AVX-512, generic over `crate::simd::x86::Vector`, whose
/// [`x86_kernels`] invocation declares the `avx2` and `avx512` modules.
/// Every op also gets `quad` as the name of its 4-lane module, so shared bodies can call other
/// ops' 4-lane kernels without naming the ISA.
macro_rules! isa_modules {
    ($($module:ident),* $(,)?) => { $($crate::isa::isa_modules!(@one $module);)* };
    (@one scalar) => { pub mod scalar; };
    (@one avx2) => { #[cfg(target_arch = "x86_64")] pub mod avx2; };
    (@one avx512) => { #[cfg(target_arch = "x86_64")] pub mod avx512; };
    (@one neon) => {
        #[cfg(target_arch = "aarch64")]
        pub mod neon;
        #[cfg(target_arch = "aarch64")]
        #[allow(unused_imports)]
        pub(crate) use neon as quad;
    };
    (@one simd128) => {
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        pub mod simd128;
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        #[allow(unused_imports)]
        pub(crate) use simd128 as quad;
    };
    (@one x86) => {
        #[cfg(target_arch = "x86_64")]
        pub(crate) mod x86;
        #[cfg(target_arch = "x86_64")]
        pub use x86::{avx2, avx512};
    };
    (@one quad) => {
        #[cfg(any(target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
        pub(crate) mod quad;
        #[cfg(target_arch = "aarch64")]
        use quad as neon;
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        use quad as simd128;
    };
}
pub(crate) use isa_modules;

/// Declares the `avx2` and `avx512` modules of an op's `x86.rs` from its width-generic bodies:
/// each listed `fn` becomes a `#[target_feature]` entry point in both, calling the body of the
/// same name with `__m256` or `__m512` as its first type argument. The bodies are
/// `#[inline(always)]`, so they compile inside the entry point with its features, as a
/// hand-written copy per ISA would.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_kernels {
    (@isa $isa:ident $features:literal $reg:ident $cpu:literal $(
        $(#[doc = $doc:literal])*
        fn $name:ident $(<$($g:ident: $bound:path),*>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
    )*) => {
        pub mod $isa {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[doc = $doc])*
                ///
                /// # Safety
                #[doc = concat!("CPU must support ", $cpu, "; arguments as the public wrapper checks.")]
                #[target_feature(enable = $features)]
                pub unsafe fn $name $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? {
                    // SAFETY: this entry point enables the features the body is written for.
                    unsafe { super::$name::<std::arch::x86_64::$reg $(, $($g),*)?>($($arg),*) }
                }
            )*
        }
    };
    ($($kernels:tt)*) => {
        $crate::isa::x86_kernels!(@isa avx2 "avx2,fma,f16c" __m256 "AVX2+FMA+F16C" $($kernels)*);
        $crate::isa::x86_kernels!(
            @isa avx512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c" __m512
            "AVX-512 F/BW/VL (+AVX2/FMA/F16C)" $($kernels)*
        );
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_kernels;

/// Calls `$f` from the per-ISA module of `$isa` (`avx512::$f`, `avx2::$f`, ...), or
/// `scalar::$f` when this target has no module for it. Used inside each operation's `_on`
/// function, whose contract is that `$isa` was validated against the running CPU.
macro_rules! dispatch {
    ($isa:expr, $f:ident($($arg:expr),* $(,)?)) => {{
        let isa: $crate::Isa = $isa;
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller vouches that `isa` runs on this CPU (validated ISA).
            $crate::Isa::Avx512 => unsafe { avx512::$f($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            $crate::Isa::Avx2 => unsafe { avx2::$f($($arg),*) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            $crate::Isa::Neon => unsafe { neon::$f($($arg),*) },
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            // SAFETY: simd128 is a compile-time feature of this module.
            $crate::Isa::Simd128 => unsafe { simd128::$f($($arg),*) },
            _ => scalar::$f($($arg),*),
        }
    }};
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX2 "), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse9"), None);
    }

    #[test]
    fn unknown_and_unsupported_are_errors() {
        assert!(matches!(select_isa("mmx"), Err(IsaError::Unknown(_))));
        // Neon and x86 never coexist, so one of these is always missing.
        let foreign = if cfg!(target_arch = "aarch64") {
            "avx2"
        } else {
            "neon"
        };
        assert!(matches!(select_isa(foreign), Err(IsaError::CpuLacks(_))));
        assert!(select_isa("scalar").is_ok());
        assert_eq!(active_isa(), Isa::Scalar);
        set_isa(detected_isa()).unwrap();
        assert_eq!(active_isa(), detected_isa());
    }

    #[test]
    fn each_architecture_detects_its_own_simd() {
        let runnable = runnable_isas();
        assert_eq!(runnable[0], Isa::Scalar);
        if cfg!(target_arch = "aarch64") {
            // NEON is baseline on aarch64.
            assert_eq!(detected_isa(), Isa::Neon);
        }
        if cfg!(target_arch = "x86_64") && Isa::Avx512.cpu_supports() {
            assert_eq!(detected_isa(), Isa::Avx512);
        }
        assert!(runnable.contains(&detected_isa()));
    }
}
