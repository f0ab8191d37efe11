//! Small WASM SIMD128 building blocks shared by the per-op `simd128.rs` files. SIMD128 has no
//! FMA and no half-precision conversion: f16 <-> f32 are exact integer/float bit manipulations
//! that round like `half` (to nearest even, NaN payloads kept).

use core::arch::wasm32::*;
use half::{bf16, f16};

/// Sum of the 4 lanes: `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
pub(crate) fn hsum(v: v128) -> f32 {
    let pair = f32x4_add(v, i32x4_shuffle::<2, 3, 0, 1>(v, v));
    f32x4_extract_lane::<0>(pair) + f32x4_extract_lane::<1>(pair)
}

/// Max of the 4 lanes.
#[inline(always)]
pub(crate) fn hmax(v: v128) -> f32 {
    let pair = f32x4_max(v, i32x4_shuffle::<2, 3, 0, 1>(v, v));
    f32x4_extract_lane::<0>(pair).max(f32x4_extract_lane::<1>(pair))
}

/// Widens 4 halves held as u32 lanes (each below 2^16) to f32, exactly.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: v128) -> v128 {
    let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    let em = v128_and(h, u32x4_splat(0x7fff));
    let shifted = i32x4_shl(em, 13);
    // Normals and subnormals: the f32 with the half's exponent and mantissa bits, times 2^112.
    let finite = f32x4_mul(shifted, f32x4_splat(f32::from_bits((127 + 112) << 23)));
    let inf_nan = v128_or(shifted, u32x4_splat(0x7f80_0000));
    let is_inf_nan = u32x4_ge(em, u32x4_splat(0x7c00));
    v128_or(sign, v128_bitselect(inf_nan, finite, is_inf_nan))
}

/// Narrows 4 floats to half bits in u32 lanes, rounding to nearest even like
/// `half::f16::from_f32` (overflow to inf, NaN payload's top bits kept and quieted).
#[inline(always)]
pub(crate) fn f32_to_f16_bits(v: v128) -> v128 {
    let sign = v128_and(v, u32x4_splat(0x8000_0000));
    let f = v128_xor(v, sign);
    // NaN / inf keep the top mantissa bits; NaN gets the quiet bit.
    let is_nan = u32x4_gt(f, u32x4_splat(0x7f80_0000));
    let nan_inf = v128_or(
        v128_or(u32x4_splat(0x7c00), v128_and(is_nan, u32x4_splat(0x0200))),
        u32x4_shr(v128_and(f, u32x4_splat(0x007f_ffff)), 13),
    );
    // Results below the smallest normal half: let the FPU round by adding 0.5 (whose ulp is
    // the half subnormal step), then take the low bits.
    let magic = u32x4_splat(126 << 23);
    let sub = i32x4_sub(f32x4_add(f, magic), magic);
    // Normals: rebias, round to nearest even on the 13 dropped bits.
    let odd = v128_and(u32x4_shr(f, 13), u32x4_splat(1));
    let rebias = u32x4_splat(((15u32.wrapping_sub(127)) << 23).wrapping_add(0xfff));
    let normal = u32x4_shr(i32x4_add(i32x4_add(f, rebias), odd), 13);
    let below = u32x4_lt(f, u32x4_splat(113 << 23));
    let mut out = v128_bitselect(sub, normal, below);
    // Finite values from 65520 up round to inf (the normal path carries into exponent 31);
    // anything from 2^16 up must not wrap.
    let overflow = u32x4_ge(f, u32x4_splat(143 << 23));
    out = v128_bitselect(u32x4_splat(0x7c00), out, overflow);
    let is_inf_nan = u32x4_ge(f, u32x4_splat(0x7f80_0000));
    out = v128_bitselect(nan_inf, out, is_inf_nan);
    v128_or(out, u32x4_shr(sign, 16))
}

/// A storage dtype that 4 lanes at a time widen to f32.
pub(crate) trait Lanes: Copy {
    /// # Safety
    /// `ptr` valid for reading 4 elements.
    unsafe fn load4(ptr: *const Self) -> v128;
    fn widen(self) -> f32;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load4(ptr: *const f32) -> v128 {
        // SAFETY: caller guarantees 4 readable lanes.
        unsafe { v128_load(ptr as *const v128) }
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load4(ptr: *const f16) -> v128 {
        // SAFETY: caller guarantees 4 readable halves (8 bytes).
        let raw = unsafe { v128_load64_zero(ptr as *const u64) };
        f16_bits_to_f32(u32x4_extend_low_u16x8(raw))
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl Lanes for bf16 {
    #[inline(always)]
    unsafe fn load4(ptr: *const bf16) -> v128 {
        // SAFETY: caller guarantees 4 readable bf16 (8 bytes).
        let raw = unsafe { v128_load64_zero(ptr as *const u64) };
        i32x4_shl(u32x4_extend_low_u16x8(raw), 16)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// e^x for 4 lanes, the same range reduction and polynomial as the other ISAs (separate
/// multiply and add: SIMD128 has no FMA).
#[inline(always)]
pub(crate) fn exp(x: v128) -> v128 {
    use super::exp_consts::*;
    let underflow = f32x4_lt(x, f32x4_splat(LOW));
    let x = f32x4_pmax(f32x4_pmin(x, f32x4_splat(HIGH)), f32x4_splat(LOW));
    let n = f32x4_nearest(f32x4_mul(x, f32x4_splat(core::f32::consts::LOG2_E)));
    let r = f32x4_sub(x, f32x4_mul(n, f32x4_splat(LN2_HI)));
    let r = f32x4_sub(r, f32x4_mul(n, f32x4_splat(LN2_LO)));
    let mut poly = f32x4_splat(P[0]);
    for &c in &P[1..] {
        poly = f32x4_add(f32x4_mul(poly, r), f32x4_splat(c));
    }
    let r2 = f32x4_mul(r, r);
    let er = f32x4_add(f32x4_add(f32x4_mul(poly, r2), r), f32x4_splat(1.0));
    let two_n = i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23);
    v128_andnot(f32x4_mul(er, two_n), underflow)
}
