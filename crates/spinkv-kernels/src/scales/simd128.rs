//! WASM SIMD128 scale decoding, 4 tokens at a time (SIMD128 has no FMA: rounds as scalar).

use super::{EXP2_MAX, EXP2_MIN, EXP2_P};
use core::arch::wasm32::*;

/// # Safety
/// Equal lengths.
pub unsafe fn decode_log_u8(codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    let n = codes.len();
    let (vlo, vstep) = (f32x4_splat(lo), f32x4_splat(step));
    let mut i = 0;
    while i + 4 <= n {
        let word = u32::from_le_bytes(codes[i..i + 4].try_into().expect("4 bytes"));
        let c = u32x4_extend_low_u16x8(u16x8_extend_low_u8x16(u32x4_splat(word)));
        let cm1 = f32x4_convert_i32x4(i32x4_sub(c, i32x4_splat(1)));
        let v = exp2(f32x4_add(vlo, f32x4_mul(cm1, vstep)));
        let zero = i32x4_eq(c, i32x4_splat(0));
        // SAFETY: i + 4 <= n.
        unsafe { v128_store(out.as_mut_ptr().add(i) as *mut v128, v128_andnot(v, zero)) };
        i += 4;
    }
    super::scalar::decode_log_u8(&codes[i..], lo, step, &mut out[i..]);
}

#[inline(always)]
fn exp2(x: v128) -> v128 {
    let x = f32x4_min(f32x4_max(x, f32x4_splat(EXP2_MIN)), f32x4_splat(EXP2_MAX));
    let n = f32x4_floor(f32x4_add(x, f32x4_splat(0.5)));
    let r = f32x4_sub(x, n);
    let mut p = f32x4_splat(EXP2_P[0]);
    for &c in &EXP2_P[1..] {
        p = f32x4_add(f32x4_mul(p, r), f32x4_splat(c));
    }
    let two_r = f32x4_add(f32x4_splat(1.0), f32x4_mul(r, p));
    let two_n = i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23);
    f32x4_mul(two_r, two_n)
}

/// # Safety
/// As [`decode_log_u8`]; `out` as long as the runs together.
pub unsafe fn decode_log_u8_runs(runs: &[super::LogRun<'_>], out: &mut [f32]) {
    super::decode_runs!(runs, out);
}
