//! The parity suite: every SIMD kernel against its scalar reference on random inputs over
//! awkward sizes (1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129 and the model's widths).
//! Integer and packing paths must be bit-identical; float paths meet a stated tolerance (see
//! each operation's `parity` function). `cargo test` runs it per ISA; the wasm32 harness
//! (crates/spinkv-wasm) and the aarch64 build under qemu run the same checks.

use crate::Isa;

/// One operation's check: every SIMD path of `Isa` against the scalar reference.
pub type Check = fn(Isa) -> Result<(), String>;

/// Name and check of every operation.
pub const OPS: &[(&str, Check)] = &[
    ("convert", crate::convert::parity),
    ("vec_f32", crate::vec_f32::parity),
    ("vec_f16", crate::vec_f16::parity),
    ("softmax", crate::softmax::parity),
    ("rmsnorm", crate::rmsnorm::parity),
    ("rope", crate::rope::parity),
    ("swiglu", crate::swiglu::parity),
    ("matvec", crate::matvec::parity),
    ("matmul", crate::matmul::parity),
    ("codes", crate::codes::parity),
    ("fwht", crate::fwht::parity),
    ("kv_score", crate::kv_score::parity),
    ("kv_accumulate", crate::kv_accumulate::parity),
    ("quantize", crate::quantize::parity),
    ("scales", crate::scales::parity),
];

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

#[cfg(test)]
mod tests {
    use super::*;

    /// One test per ISA so the report says which ran and which were skipped.
    fn run(isa: Isa, missing: &str) {
        if !(isa.has_kernels() && isa.cpu_supports()) {
            eprintln!("skipped: {missing}");
            return;
        }
        let n = check(isa).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{isa}: {n} operations match scalar");
    }

    #[test]
    fn avx2_parity() {
        run(Isa::Avx2, "no avx2");
    }

    #[test]
    fn avx512_parity() {
        run(Isa::Avx512, "no avx512f");
    }

    #[test]
    fn neon_parity() {
        run(Isa::Neon, "not aarch64");
    }

    #[test]
    fn simd128_parity() {
        run(Isa::Simd128, "not wasm32+simd128");
    }
}
