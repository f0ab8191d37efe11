//! The kernel parity suite (every SIMD128 kernel against its scalar reference) and the kernel
//! benchmark, as `run.mjs parity|bench` calls them.

use spinkv_kernels::{f16, matvec, parity as suite, runnable_isas, set_isa, Isa, WeightRef};

use crate::host::{install, now_ms, say};

/// SIMD128's f16 matvec (decode's hot loop) widens finite halves on a fast path and falls back
/// to the general one for a row holding an inf or NaN; either way each output must equal, bit
/// for bit, the f32 matvec on the same weights widened exactly (the same chains, the same
/// products). Rows: ordinary values, subnormals and signed zeros, then one inf, one NaN, one
/// near the top of the range; lengths with every tail (16-steps, 4-steps, single elements).
fn matvec_f16_matches_f32() -> Result<(), String> {
    set_isa(Isa::Simd128).map_err(|e| e.to_string())?;
    for k in [16usize, 20, 23, 64, 576, 1536] {
        let rows = 6;
        let mut w: Vec<f16> = (0..rows * k)
            .map(|i| {
                let v = ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32;
                f16::from_f32(v / (1u64 << 24) as f32 - 0.5)
            })
            .collect();
        for (j, v) in w[k..2 * k].iter_mut().enumerate() {
            // Subnormals of both signs, and zeros of both signs.
            *v = f16::from_bits(match j % 4 {
                0 => 0x0001 + j as u16 % 0x3ff,
                1 => 0x8000 | (0x0200 + j as u16 % 0x1ff),
                2 => 0x8000,
                _ => 0x0000,
            });
        }
        w[2 * k + k / 2] = f16::INFINITY;
        w[3 * k + k - 1] = f16::NAN;
        w[4 * k] = f16::from_f32(-65504.0);
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let (mut got, mut want) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        matvec(WeightRef::F16(&w), k, &x, 0..rows, &mut got);
        matvec(WeightRef::F32(&wide), k, &x, 0..rows, &mut want);
        for (r, (g, e)) in got.iter().zip(&want).enumerate() {
            let same = g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan());
            if !same {
                return Err(format!("k={k} row {r}: f16 {g:e} but f32 {e:e}"));
            }
        }
    }
    Ok(())
}

/// Runs the parity suite on every ISA this build can run; returns the number of failures.
#[no_mangle]
pub extern "C" fn parity() -> u32 {
    install();
    let mut failures = 0;
    let isas = runnable_isas();
    say(&format!(
        "parity: isas {:?}",
        isas.iter().map(|i| i.name()).collect::<Vec<_>>()
    ));
    for isa in isas {
        for (name, check) in suite::OPS {
            let started = now_ms();
            match check(isa) {
                Ok(()) => say(&format!(
                    "ok   {isa:<8} {name:<14} ({:.0} ms)",
                    now_ms() - started
                )),
                Err(e) => {
                    failures += 1;
                    say(&format!("FAIL {isa:<8} {name:<14} {e}"));
                }
            }
        }
    }
    match matvec_f16_matches_f32() {
        Ok(()) => say("ok   simd128  matvec f16 = f32 on the widened weights, bit for bit"),
        Err(e) => {
            failures += 1;
            say(&format!("FAIL simd128  matvec f16 fast path: {e}"));
        }
    }
    failures
}

/// The kernel benchmark (same cases as `cargo run --example kernel_bench`), every ISA.
#[no_mangle]
pub extern "C" fn bench() {
    install();
    for isa in runnable_isas() {
        for line in spinkv_kernels::bench::run(isa, &now_ms) {
            say(&line);
        }
    }
}
