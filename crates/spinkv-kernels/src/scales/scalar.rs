//! Reference scale decoding and the shared `exp2`.

use super::{EXP2_MAX, EXP2_MIN, EXP2_P};

/// `2^x` by range reduction and a fixed polynomial (see [`super::EXP2_P`]); every SIMD
/// version performs these operations in this order.
#[inline]
pub fn exp2(x: f32) -> f32 {
    let x = x.clamp(EXP2_MIN, EXP2_MAX);
    let n = (x + 0.5).floor();
    let r = x - n;
    let mut p = EXP2_P[0];
    for &c in &EXP2_P[1..] {
        p = p * r + c;
    }
    let two_r = 1.0 + r * p;
    two_r * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

pub fn decode_log_u8(codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = if c == 0 {
            0.0
        } else {
            exp2(lo + (c - 1) as f32 * step)
        };
    }
}

pub fn decode_log_u8_runs(runs: &[super::LogRun<'_>], out: &mut [f32]) {
    super::decode_runs!(runs, out);
}
