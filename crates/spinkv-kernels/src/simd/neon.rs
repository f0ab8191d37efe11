//! Small NEON (aarch64 baseline) building blocks shared by the per-op `neon.rs` files.
//!
//! f16 <-> f32 use FCVTL / FCVTN through inline assembly: both are base ARMv8 AdvSIMD (no
//! FEAT_FP16 needed), but the `float16x4_t` intrinsics are not stable in Rust yet.

pub(crate) use super::Lanes;
use core::arch::aarch64::*;
use core::arch::asm;
use half::{bf16, f16};

/// Max of the 4 lanes.
#[inline(always)]
pub(crate) unsafe fn hmax(v: float32x4_t) -> f32 {
    vmaxvq_f32(v)
}

/// Widens 4 halves (as raw bits) to f32, exactly.
#[inline(always)]
pub(crate) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: FCVTL is base AdvSIMD; register-only, no memory or flags touched.
    unsafe {
        asm!("fcvtl {0:v}.4s, {1:v}.4h", out(vreg) out, in(vreg) h,
             options(pure, nomem, nostack, preserves_flags));
    }
    out
}

/// Narrows 4 floats to halves (round to nearest even, as `half::f16::from_f32`).
#[inline(always)]
pub(crate) unsafe fn f32_to_f16x4(v: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: FCVTN is base AdvSIMD; register-only, no memory or flags touched.
    unsafe {
        asm!("fcvtn {0:v}.4h, {1:v}.4s", out(vreg) out, in(vreg) v,
             options(pure, nomem, nostack, preserves_flags));
    }
    out
}

/// A vector of 4 f32.
pub(crate) type F4 = float32x4_t;

/// The ISA these 4-lane building blocks are.
pub(crate) const ISA: crate::Isa = crate::Isa::Neon;

/// # Safety
/// `ptr` valid for reading 4 elements.
#[inline(always)]
pub(crate) unsafe fn load4_f32(ptr: *const f32) -> F4 {
    // SAFETY: caller guarantees 4 readable lanes.
    unsafe { vld1q_f32(ptr) }
}

/// # Safety
/// As [`load4_f32`].
#[inline(always)]
pub(crate) unsafe fn load4_f16(ptr: *const f16) -> F4 {
    // SAFETY: caller guarantees 4 readable halves.
    unsafe { f16x4_to_f32(vld1_u16(ptr as *const u16)) }
}

/// # Safety
/// As [`load4_f32`].
#[inline(always)]
pub(crate) unsafe fn load4_bf16(ptr: *const bf16) -> F4 {
    // SAFETY: caller guarantees 4 readable bf16; bf16 is the top half of an f32.
    unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(ptr as *const u16))) }
}

/// # Safety
/// As [`load4_f32`].
#[inline(always)]
pub(crate) unsafe fn load4_i8(ptr: *const i8) -> F4 {
    // SAFETY: caller guarantees 4 readable bytes; read as one u32, then sign-extended.
    let bytes = unsafe { ptr.cast::<[i8; 4]>().read_unaligned() };
    let words = i32::from_ne_bytes(bytes.map(|b| b as u8));
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let lanes = vreinterpret_s8_s32(vdup_n_s32(words));
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(lanes))))
    }
}

/// `ptr` valid for 4 floats.
#[inline(always)]
pub(crate) unsafe fn load(ptr: *const f32) -> F4 {
    // SAFETY: as the caller guarantees.
    unsafe { vld1q_f32(ptr) }
}

/// `ptr` valid for writing 4 floats.
#[inline(always)]
pub(crate) unsafe fn store(ptr: *mut f32, v: F4) {
    // SAFETY: as the caller guarantees.
    unsafe { vst1q_f32(ptr, v) }
}

#[inline(always)]
pub(crate) fn splat(v: f32) -> F4 {
    // SAFETY: register work only (NEON is baseline on aarch64).
    unsafe { vdupq_n_f32(v) }
}

#[inline(always)]
pub(crate) fn mul(a: F4, b: F4) -> F4 {
    // SAFETY: register work only.
    unsafe { vmulq_f32(a, b) }
}

#[inline(always)]
pub(crate) fn add(a: F4, b: F4) -> F4 {
    // SAFETY: register work only.
    unsafe { vaddq_f32(a, b) }
}

#[inline(always)]
pub(crate) fn sub(a: F4, b: F4) -> F4 {
    // SAFETY: register work only.
    unsafe { vsubq_f32(a, b) }
}

/// The FWHT stages with `h` = 1 and 2 inside one vector: `(a+b, a-b)` per pair, then per half.
#[inline(always)]
pub(crate) fn fwht4(v: F4) -> F4 {
    // SAFETY: register work only; the masks are read from local arrays.
    unsafe {
        let odd = vld1q_u32([0, !0, 0, !0].as_ptr());
        let upper = vld1q_u32([0, 0, !0, !0].as_ptr());
        let t = vrev64q_f32(v);
        let v = vbslq_f32(odd, vsubq_f32(t, v), vaddq_f32(v, t));
        let t = vextq_f32::<2>(v, v);
        vbslq_f32(upper, vsubq_f32(t, v), vaddq_f32(v, t))
    }
}

/// Canonical `Σ x[i]²`.
#[inline(always)]
pub(crate) fn sum_squares(x: &[f32]) -> f32 {
    // SAFETY: x holds x.len() elements.
    unsafe { dot16(x.as_ptr(), x.as_ptr(), x.len()) }
}

/// `a·b + c`, fused (the canonical order).
#[inline(always)]
pub(crate) fn mul_add(a: F4, b: F4, c: F4) -> F4 {
    // SAFETY: register work only.
    unsafe { vfmaq_f32(c, a, b) }
}

/// `c - a·b`, fused.
#[inline(always)]
pub(crate) fn neg_mul_add(a: F4, b: F4, c: F4) -> F4 {
    // SAFETY: register work only.
    unsafe { vfmsq_f32(c, a, b) }
}

/// The scalar step of the tails: `a·b + c`, fused like the vector lanes.
#[inline(always)]
pub(crate) fn mul_add_f32(a: f32, b: f32, c: f32) -> f32 {
    crate::canon::fma(a, b, c)
}

/// Canonical `Σ x[i]·y[i]` (see [`dot16`]).
///
/// # Safety
/// `x` and `y` valid for `n` elements.
#[inline(always)]
pub(crate) unsafe fn dot<L: Lanes>(x: *const L, y: *const f32, n: usize) -> f32 {
    // SAFETY: as the caller guarantees.
    unsafe { dot16(x, y, n) }
}

/// e^x for 4 lanes, the same polynomial and rounding steps as the x86 versions.
#[inline(always)]
pub(crate) unsafe fn exp(x: float32x4_t) -> float32x4_t {
    use super::exp_consts::P;
    // SAFETY: as the caller vouches (NEON).
    unsafe { exp_with(x, &P) }
}

/// e^x as [`exp`] with the shorter polynomial softmax weights take (`exp_consts::P_SOFTMAX`).
#[inline(always)]
pub(crate) unsafe fn exp_softmax(x: float32x4_t) -> float32x4_t {
    use super::exp_consts::P_SOFTMAX;
    // SAFETY: as the caller vouches (NEON).
    unsafe { exp_with(x, &P_SOFTMAX) }
}

/// e^x with the polynomial `p` (highest degree first): every ISA's range reduction and
/// rounding steps.
#[inline(always)]
unsafe fn exp_with(x: float32x4_t, p: &[f32]) -> float32x4_t {
    use super::exp_consts::*;
    let underflow = vcltq_f32(x, vdupq_n_f32(LOW));
    let x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(HIGH)), vdupq_n_f32(LOW));
    let n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(core::f32::consts::LOG2_E)));
    let r = vfmsq_f32(x, n, vdupq_n_f32(LN2_HI));
    let r = vfmsq_f32(r, n, vdupq_n_f32(LN2_LO));
    let mut poly = vdupq_n_f32(p[0]);
    for &c in &p[1..] {
        poly = vfmaq_f32(vdupq_n_f32(c), poly, r);
    }
    let r2 = vmulq_f32(r, r);
    let er = vaddq_f32(vfmaq_f32(r, poly, r2), vdupq_n_f32(1.0));
    let two_n = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(
        vcvtq_s32_f32(n),
        vdupq_n_s32(127),
    )));
    let e = vmulq_f32(er, two_n);
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), underflow))
}

/// The canonical reduction of 16 lanes held as four quads.
#[inline(always)]
pub(crate) unsafe fn reduce16(q: [float32x4_t; 4]) -> f32 {
    // Per quad: (x0 + x2, x1 + x3), then their sum.
    let qs = |v: float32x4_t| {
        let t = vaddq_f32(v, vextq_f32::<2>(v, v));
        vgetq_lane_f32::<0>(t) + vgetq_lane_f32::<1>(t)
    };
    (qs(q[0]) + qs(q[1])) + (qs(q[2]) + qs(q[3]))
}

/// Canonical `Σ x[i]·y[i]` over `n` elements: four 4-lane FMA chains (lanes 0..16).
///
/// # Safety
/// `x` and `y` valid for `n` elements.
#[inline(always)]
pub(crate) unsafe fn dot16<L: Lanes>(x: *const L, y: *const f32, n: usize) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY: loads cover i..i+16 <= n; the tail goes through zero-padded copies.
    unsafe {
        while i + 16 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                *acc = vfmaq_f32(
                    *acc,
                    L::load4(x.add(i + 4 * k)),
                    vld1q_f32(y.add(i + 4 * k)),
                );
            }
            i += 16;
        }
        if i < n {
            let (mut tx, mut ty) = ([0.0f32; 16], [0.0f32; 16]);
            for j in i..n {
                tx[j - i] = (*x.add(j)).widen();
                ty[j - i] = *y.add(j);
            }
            for (k, acc) in acc.iter_mut().enumerate() {
                *acc = vfmaq_f32(
                    *acc,
                    vld1q_f32(tx.as_ptr().add(4 * k)),
                    vld1q_f32(ty.as_ptr().add(4 * k)),
                );
            }
        }
        reduce16(acc)
    }
}
