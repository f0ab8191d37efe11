//! The kernel parity suite (every SIMD128 kernel against its scalar reference) and the kernel
//! benchmark, as `run.mjs parity|bench` calls them.

use spinkv_kernels::{
    bf16, f16, matmul, matvec, parity as suite, runnable_isas, set_isa, Isa, WeightRef,
};

use crate::host::{install, now_ms, say};

/// SIMD128's f16 matvec (decode's hot loop) widens finite halves on a fast path (two rows at
/// a time with the exponent rebias moved onto the activations when they are all below 2^16,
/// else one row at a time) and falls back to the general one for a row holding an inf or NaN;
/// either way each output must equal, bit for bit, the f32 matvec on the same weights widened
/// exactly (the same chains, the same products). Rows: ordinary values, subnormals and signed
/// zeros, then one inf, one NaN, one near the top of the range, in row ranges of even and odd
/// length; lengths with every tail (16-steps, 4-steps, single elements); activations small,
/// with a subnormal and the largest float below 2^16, and with one at 2^16.
fn matvec_f16_matches_f32() -> Result<(), String> {
    set_isa(Isa::Simd128).map_err(|e| e.to_string())?;
    for k in [16usize, 20, 23, 64, 576, 1536] {
        let n_rows = 7;
        let w = special_rows(n_rows, k);
        let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let small: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut edge = small.clone();
        edge[k / 3] = f32::from_bits(65536f32.to_bits() - 1);
        edge[k - 1] = -edge[k / 3];
        edge[1] = 1e-40;
        let mut large = small.clone();
        large[k / 2] = 65536.0;
        for (name, x) in [("small", &small), ("edge", &edge), ("large", &large)] {
            for rows in [0..n_rows, 1..n_rows] {
                let (mut got, mut want) = (vec![0.0f32; rows.len()], vec![0.0f32; rows.len()]);
                matvec(WeightRef::F16(&w), k, x, rows.clone(), &mut got);
                matvec(WeightRef::F32(&wide), k, x, rows.clone(), &mut want);
                for (r, (g, e)) in rows.clone().zip(got.iter().zip(&want)) {
                    let same = g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan());
                    if !same {
                        return Err(format!(
                            "k={k} x {name} rows {rows:?}: row {r}: f16 {g:e} but f32 {e:e}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// `k` weights per row: ordinary values, then a row of subnormals and signed zeros, one with
/// an inf, one with a NaN, one with the largest finite half.
fn special_rows(rows: usize, k: usize) -> Vec<f16> {
    let mut w: Vec<f16> = (0..rows * k)
        .map(|i| {
            let v = ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32;
            f16::from_f32(v / (1u64 << 24) as f32 - 0.5)
        })
        .collect();
    for (j, v) in w[k..2 * k].iter_mut().enumerate() {
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
    w
}

/// SIMD128's batched matmul (prefill) widens f16/bf16 rows into packed f32 copies and packs
/// the activations (`spinkv_kernels::matmul::simd128`); every output must still be, bit for
/// bit, the documented unfused 4-lane order on the exactly widened weights: lane `l` sums
/// `w[4s + l]·x[4s + l]` over the steps `s` (`acc + w·x`, two roundings), the lanes
/// `(l0 + l2) + (l1 + l3)`, then the last `k % 4` products added one by one. f16, bf16 and f32
/// weights; row ranges with a leftover row; token counts with leftover tokens and (at k = 576
/// and 1536) more than one token block.
fn matmul_matches_lane_order() -> Result<(), String> {
    set_isa(Isa::Simd128).map_err(|e| e.to_string())?;
    for k in [3usize, 17, 23, 64, 576, 1536] {
        let n_rows = 7;
        let w16 = special_rows(n_rows, k);
        let wide: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        let wb16: Vec<bf16> = wide.iter().map(|&v| bf16::from_f32(v)).collect();
        let wide_b: Vec<f32> = wb16.iter().map(|v| v.to_f32()).collect();
        for n_tokens in [1usize, 5, 90] {
            let x: Vec<f32> = (0..n_tokens * k)
                .map(|i| (i as f32 * 0.37).sin() * 4.0)
                .collect();
            for (w, wide) in [
                (WeightRef::F16(&w16), &wide),
                (WeightRef::Bf16(&wb16), &wide_b),
                (WeightRef::F32(&wide), &wide),
            ] {
                for rows in [0..n_rows, 2..n_rows] {
                    let mut got = vec![0.0f32; n_tokens * rows.len()];
                    matmul(w, k, &x, rows.clone(), &mut got);
                    for t in 0..n_tokens {
                        for (j, r) in rows.clone().enumerate() {
                            let (wr, xt) = (&wide[r * k..(r + 1) * k], &x[t * k..(t + 1) * k]);
                            let mut lanes = [0.0f32; 4];
                            for s in 0..k / 4 {
                                for (l, lane) in lanes.iter_mut().enumerate() {
                                    *lane += wr[4 * s + l] * xt[4 * s + l];
                                }
                            }
                            let mut want = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
                            for i in k / 4 * 4..k {
                                want += wr[i] * xt[i];
                            }
                            let g = got[t * rows.len() + j];
                            if g.to_bits() != want.to_bits() && !(g.is_nan() && want.is_nan()) {
                                return Err(format!(
                                    "{:?} k={k} tokens={n_tokens} rows={rows:?}: token {t} row \
                                     {r}: {g:e} but {want:e}",
                                    w.dtype()
                                ));
                            }
                        }
                    }
                }
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
    match matmul_matches_lane_order() {
        Ok(()) => say("ok   simd128  matmul = the unfused 4-lane order, bit for bit"),
        Err(e) => {
            failures += 1;
            say(&format!("FAIL simd128  matmul lane order: {e}"));
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
