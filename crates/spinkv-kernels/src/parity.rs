//! The parity suite: every SIMD kernel against its scalar reference on random inputs over
//! awkward sizes (1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129 and the model's widths).
//! Integer and packing paths must be bit-identical; float paths meet a stated tolerance (see
//! each operation's `parity` function). `cargo test` runs it per ISA; the wasm32 harness
//! (crates/spinkv-wasm) and the aarch64 build under qemu run the same checks.

use crate::Isa;

/// One operation's check: every SIMD path of `Isa` against the scalar reference.
pub type Check = fn(Isa) -> Result<(), String>;

/// Declares [`OPS`] and, for tests, one test per ISA and operation
/// (`parity::tests::<isa>::<op>`), so the report names what ran. An ISA this build has no
/// kernels for is an ignored test (a compile-time fact); one the CPU lacks at run time (AVX-512
/// on an AVX2 machine) cannot be ignored by stable libtest, so it passes with a printed
/// `skipped:` line.
macro_rules! suite {
    ($($op:ident),* $(,)?) => {
        /// Name and check of every operation.
        pub const OPS: &[(&str, Check)] = &[$((stringify!($op), crate::$op::parity)),*];

        #[cfg(test)]
        mod tests {
            use crate::Isa;

            fn run(isa: Isa, op: &str, check: super::Check) {
                if !isa.cpu_supports() {
                    eprintln!("skipped: {isa} {op}: this CPU lacks {isa}");
                    return;
                }
                check(isa).unwrap_or_else(|e| panic!("{isa} {op}: {e}"));
                eprintln!("{isa}: {op} matches scalar");
            }

            suite!(@isa scalar, Scalar, all(), "", $($op),*);
            suite!(@isa avx2, Avx2, target_arch = "x86_64", "not x86_64", $($op),*);
            suite!(@isa avx512, Avx512, target_arch = "x86_64", "not x86_64", $($op),*);
            suite!(@isa neon, Neon, target_arch = "aarch64", "not aarch64", $($op),*);
            suite!(@isa simd128, Simd128,
                all(target_arch = "wasm32", target_feature = "simd128"),
                "not wasm32+simd128", $($op),*);
        }
    };
    (@isa $module:ident, $isa:ident, $built:meta, $why:literal, $($op:ident),*) => {
        mod $module {
            $(
                #[test]
                #[cfg_attr(not($built), ignore = $why)]
                fn $op() {
                    super::run(crate::Isa::$isa, stringify!($op), crate::$op::parity);
                }
            )*
        }
    };
}

suite!(
    convert,
    vec_f32,
    vec_f16,
    softmax,
    rmsnorm,
    rope,
    swiglu,
    matvec,
    matmul,
    codes,
    fwht,
    kv_score,
    kv_accumulate,
    q8dot,
    quantize,
    scales,
);

/// Runs every operation's check for `isa`; `Err` names the operation and the first mismatch.
/// An ISA this process cannot run is an error, not a silent pass.
pub fn check(isa: Isa) -> Result<usize, String> {
    if !(isa.has_kernels() && isa.cpu_supports()) {
        return Err(format!("{isa} cannot run in this process"));
    }
    for (name, op) in OPS {
        op(isa).map_err(|e| format!("{isa} {name}: {e}"))?;
    }
    Ok(OPS.len())
}
