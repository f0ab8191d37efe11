//! Small WASM SIMD128 building blocks shared by the per-op `simd128.rs` files. SIMD128 has no
//! FMA and no half-precision conversion: f16 <-> f32 are exact integer/float bit manipulations
//! that round like `half` (to nearest even, NaN payloads kept).

pub(crate) use super::Lanes;
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

/// The fast widening of 8 halves (one load, `h`) that the SIMD128 f16 kernels share: each half
/// goes in the top 16 bits of a 32-bit lane, and an arithmetic shift by 3 and a mask put its
/// sign, exponent and mantissa where an f32's go (the bias 15 read as 127). The lanes then hold
/// each half's value times 2^-112 exactly, for every finite half, subnormals and signed zeros
/// included ([`times_2_pow_112`] makes them the halves' values). An inf or NaN comes out
/// finite: callers fold each load into [`note_halves`] and check [`halves_finite`].
#[inline(always)]
pub(crate) fn halves_times_2_pow_m112(h: v128) -> [v128; 2] {
    let zero = u32x4_splat(0);
    let keep = u32x4_splat(0x8fff_ffff);
    let place = |top: v128| v128_and(i32x4_shr(top, 3), keep);
    [
        place(i16x8_shuffle::<8, 0, 9, 1, 10, 2, 11, 3>(h, zero)),
        place(i16x8_shuffle::<12, 4, 13, 5, 14, 6, 15, 7>(h, zero)),
    ]
}

/// `v · 2^112` (exact for what [`halves_times_2_pow_m112`] gives).
#[inline(always)]
pub(crate) fn times_2_pow_112(v: v128) -> v128 {
    f32x4_mul(v, f32x4_splat(f32::from_bits((127 + 112) << 23)))
}

/// `largest` with the exponent and mantissa bits of `h`'s 8 halves (shifted past the sign)
/// folded in, lane-wise max; start from zero.
#[inline(always)]
pub(crate) fn note_halves(largest: v128, h: v128) -> v128 {
    u16x8_max(largest, i16x8_shl(h, 1))
}

/// Whether every half folded into `largest` by [`note_halves`] is finite.
#[inline(always)]
pub(crate) fn halves_finite(largest: v128) -> bool {
    !v128_any_true(u16x8_ge(largest, u16x8_splat(0x7c00 << 1)))
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

/// A vector of 4 f32.
pub(crate) type F4 = v128;

/// The ISA these 4-lane building blocks are.
pub(crate) const ISA: crate::Isa = crate::Isa::Simd128;

/// # Safety
/// `ptr` valid for reading 4 elements.
#[inline(always)]
pub(crate) unsafe fn load4_f32(ptr: *const f32) -> F4 {
    // SAFETY: caller guarantees 4 readable lanes.
    unsafe { v128_load(ptr as *const v128) }
}

/// # Safety
/// As [`load4_f32`].
#[inline(always)]
pub(crate) unsafe fn load4_f16(ptr: *const f16) -> F4 {
    // SAFETY: caller guarantees 4 readable halves (8 bytes).
    let raw = unsafe { v128_load64_zero(ptr as *const u64) };
    f16_bits_to_f32(u32x4_extend_low_u16x8(raw))
}

/// # Safety
/// As [`load4_f32`].
#[inline(always)]
pub(crate) unsafe fn load4_bf16(ptr: *const bf16) -> F4 {
    // SAFETY: caller guarantees 4 readable bf16 (8 bytes).
    let raw = unsafe { v128_load64_zero(ptr as *const u64) };
    i32x4_shl(u32x4_extend_low_u16x8(raw), 16)
}

/// # Safety
/// As [`load4_f32`].
#[inline(always)]
pub(crate) unsafe fn load4_i8(ptr: *const i8) -> F4 {
    // SAFETY: caller guarantees 4 readable bytes.
    let raw = unsafe { v128_load32_zero(ptr as *const u32) };
    f32x4_convert_i32x4(i32x4_extend_low_i16x8(i16x8_extend_low_i8x16(raw)))
}

/// `ptr` valid for 4 floats.
#[inline(always)]
pub(crate) unsafe fn load(ptr: *const f32) -> F4 {
    // SAFETY: as the caller guarantees.
    unsafe { v128_load(ptr as *const v128) }
}

/// `ptr` valid for writing 4 floats.
#[inline(always)]
pub(crate) unsafe fn store(ptr: *mut f32, v: F4) {
    // SAFETY: as the caller guarantees.
    unsafe { v128_store(ptr as *mut v128, v) }
}

#[inline(always)]
pub(crate) fn splat(v: f32) -> F4 {
    f32x4_splat(v)
}

#[inline(always)]
pub(crate) fn mul(a: F4, b: F4) -> F4 {
    f32x4_mul(a, b)
}

#[inline(always)]
pub(crate) fn add(a: F4, b: F4) -> F4 {
    f32x4_add(a, b)
}

#[inline(always)]
pub(crate) fn sub(a: F4, b: F4) -> F4 {
    f32x4_sub(a, b)
}

/// The FWHT stages with `h` = 1 and 2 inside one vector: `(a+b, a-b)` per pair, then per half.
#[inline(always)]
pub(crate) fn fwht4(v: F4) -> F4 {
    let (odd, upper) = (u32x4(0, !0, 0, !0), u32x4(0, 0, !0, !0));
    let t = i32x4_shuffle::<1, 0, 3, 2>(v, v);
    let v = v128_bitselect(f32x4_sub(t, v), f32x4_add(v, t), odd);
    let t = i32x4_shuffle::<2, 3, 0, 1>(v, v);
    v128_bitselect(f32x4_sub(t, v), f32x4_add(v, t), upper)
}

/// `Σ x[i]²`, unfused: two 4-lane chains over steps of 8, one more step of 4, the chains'
/// sum, then the last `n % 4` squares summed apart and added.
#[inline(always)]
pub(crate) fn sum_squares(x: &[f32]) -> f32 {
    let n = x.len();
    let n4 = n / 4 * 4;
    let xp = x.as_ptr();
    let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    let mut i = 0;
    // SAFETY: every 4-lane load has i + 4 <= n.
    unsafe {
        while i + 8 <= n {
            let (a, b) = (load(xp.add(i)), load(xp.add(i + 4)));
            acc0 = f32x4_add(acc0, f32x4_mul(a, a));
            acc1 = f32x4_add(acc1, f32x4_mul(b, b));
            i += 8;
        }
        if i < n4 {
            let a = load(xp.add(i));
            acc0 = f32x4_add(acc0, f32x4_mul(a, a));
        }
    }
    hsum(f32x4_add(acc0, acc1)) + x[n4..].iter().map(|v| v * v).sum::<f32>()
}

/// `a·b + c`, two roundings (no FMA in SIMD128).
#[inline(always)]
pub(crate) fn mul_add(a: F4, b: F4, c: F4) -> F4 {
    f32x4_add(c, f32x4_mul(a, b))
}

/// `c - a·b`, two roundings.
#[inline(always)]
pub(crate) fn neg_mul_add(a: F4, b: F4, c: F4) -> F4 {
    f32x4_sub(c, f32x4_mul(a, b))
}

/// The scalar step of the tails: `a·b + c`, unfused like the vector lanes.
#[inline(always)]
pub(crate) fn mul_add_f32(a: f32, b: f32, c: f32) -> f32 {
    c + a * b
}

/// `Σ x[i]·y[i]`, unfused: `CHAINS` 4-lane chains over steps of `4·CHAINS`, the rest in
/// chain 0, the chains summed pairwise, then the last `n % 4` products one by one.
///
/// # Safety
/// `x` and `y` valid for `n` elements.
#[inline(always)]
unsafe fn dot_chains<L: Lanes, const CHAINS: usize>(x: *const L, y: *const f32, n: usize) -> f32 {
    let mut acc = [f32x4_splat(0.0); CHAINS];
    let mut i = 0;
    // SAFETY: every 4-lane load covers lanes below n.
    unsafe {
        while i + 4 * CHAINS <= n {
            for (c, acc) in acc.iter_mut().enumerate() {
                let (xv, yv) = (L::load4(x.add(i + 4 * c)), load(y.add(i + 4 * c)));
                *acc = f32x4_add(*acc, f32x4_mul(xv, yv));
            }
            i += 4 * CHAINS;
        }
    }
    // SAFETY: as the caller guarantees; i <= n.
    unsafe { finish_chains(acc, x, y, i, n) }
}

/// The end of [`dot_chains`] from element `i` (the main loop's stop): one more chain-0 step
/// per 4 elements, the chains summed pairwise, then the last `n % 4` products one by one.
///
/// # Safety
/// `x` and `y` valid for `n` elements, `i <= n`.
#[inline(always)]
unsafe fn finish_chains<L: Lanes, const CHAINS: usize>(
    mut acc: [v128; CHAINS],
    x: *const L,
    y: *const f32,
    mut i: usize,
    n: usize,
) -> f32 {
    // SAFETY: every 4-lane load covers lanes below n.
    unsafe {
        while i + 4 <= n {
            acc[0] = f32x4_add(acc[0], f32x4_mul(L::load4(x.add(i)), load(y.add(i))));
            i += 4;
        }
    }
    let mut width = CHAINS;
    while width > 1 {
        for c in 0..width / 2 {
            acc[c] = f32x4_add(acc[2 * c], acc[2 * c + 1]);
        }
        width /= 2;
    }
    let mut sum = hsum(acc[0]);
    for j in i..n {
        // SAFETY: j < n.
        sum += unsafe { (*x.add(j)).widen() * *y.add(j) };
    }
    sum
}

/// `Σ x[i]·y[i]`, unfused: four chains for f32 rows, two for f16 (the orders these kernels
/// have always had, kept so SIMD128 results do not move).
///
/// # Safety
/// `x` and `y` valid for `n` elements.
#[inline(always)]
pub(crate) unsafe fn dot<L: Lanes>(x: *const L, y: *const f32, n: usize) -> f32 {
    // SAFETY: as the caller guarantees.
    unsafe {
        if L::IS_F32 {
            dot_chains::<L, 4>(x, y, n)
        } else {
            dot_chains::<L, 2>(x, y, n)
        }
    }
}

/// `Σ x[i]·y[i]` over steps of 16 elements in four unfused chains (the shape of NEON's
/// canonical `dot16`, without its FMA): matvec's row order.
///
/// # Safety
/// `x` and `y` valid for `n` elements.
#[inline(always)]
pub(crate) unsafe fn dot16<L: Lanes>(x: *const L, y: *const f32, n: usize) -> f32 {
    // SAFETY: as the caller guarantees (an f16 row is read as its bits).
    unsafe {
        if L::IS_F16 {
            if let Some(sum) = dot16_finite_f16::<L, false>(x, y, y, n) {
                return sum;
            }
        }
        dot_chains::<L, 4>(x, y, n)
    }
}

/// [`dot16`] of an f16 row, bit-identical to the general path but about twice as fast: the
/// halves of the 16-element steps are widened by placing their bits in the top of a 32-bit
/// lane, an arithmetic shift by 3 and a mask (the half's sign, exponent and mantissa where an
/// f32's go, exponent bias 15 read as 127), and one exact multiply by 2^112 — right for
/// every finite half, subnormals and signed zeros included. A half with the top exponent
/// (inf, NaN) would come out finite, so the largest exponent seen is tracked and such a row
/// returns `None` for the caller to take the general path. Decode reads every weight once
/// per token through this (SIMD128 has no half conversion instruction).
///
/// With `REBIASED`, the multiply by 2^112 is left out and the steps read `ys = y · 2^112`
/// instead of `y` (see [`rebias`]): a weight times 2^-112 (exact) times `y · 2^112` (exact:
/// every `|y|` is below 2^16) is the same real number as the weight times `y`, so each product
/// rounds to the same bits. The tails read `y`.
///
/// # Safety
/// `x` and `y` valid for `n` elements, `ys` for `n / 16 · 16`; `L` is `half::f16`.
#[inline(always)]
unsafe fn dot16_finite_f16<L: Lanes, const REBIASED: bool>(
    x: *const L,
    ys: *const f32,
    y: *const f32,
    n: usize,
) -> Option<f32> {
    let bits = x as *const u16;
    let widen = |w: v128| if REBIASED { w } else { times_2_pow_112(w) };
    let mut acc = [f32x4_splat(0.0); 4];
    let mut largest = u16x8_splat(0);
    let mut i = 0;
    // SAFETY: the two 8-half loads and four f32 loads cover i..i + 16 <= n.
    unsafe {
        while i + 16 <= n {
            let (lo, hi) = (
                v128_load(bits.add(i) as *const v128),
                v128_load(bits.add(i + 8) as *const v128),
            );
            largest = note_halves(note_halves(largest, lo), hi);
            let ([a, b], [c, d]) = (halves_times_2_pow_m112(lo), halves_times_2_pow_m112(hi));
            for (k, (acc, w)) in acc.iter_mut().zip([a, b, c, d]).enumerate() {
                *acc = f32x4_add(*acc, f32x4_mul(widen(w), load(ys.add(i + 4 * k))));
            }
            i += 16;
        }
    }
    if !halves_finite(largest) {
        return None;
    }
    // SAFETY: as the caller guarantees; i <= n.
    Some(unsafe { finish_chains(acc, x, y, i, n) })
}

thread_local! {
    /// [`dot16_rows`]'s `x · 2^112`.
    static REBIASED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The rows of a matvec: `y[r] = dot16(w + r·k, x, k)` for each `r`, the same bits. When the
/// rows are f16 and every activation is below 2^16 in magnitude, the fast widening's multiply
/// by 2^112 moves onto a copy of `x` made once per call ([`rebias`]), so a widened weight costs
/// a shuffle, a shift and a mask (in node about 6 % less time than [`dot16`]'s path).
///
/// # Safety
/// `w` valid for `y.len()` rows of `k` elements; `x` holds `k`.
#[inline(always)]
pub(crate) unsafe fn dot16_rows<L: Lanes>(w: *const L, k: usize, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), k);
    let mut done = false;
    if L::IS_F16 && k >= 16 && y.len() > 1 {
        done = crate::scratch::with_reused(&REBIASED, |xs| {
            if !rebias(&x[..k / 16 * 16], xs) {
                return false;
            }
            for (r, out) in y.iter_mut().enumerate() {
                // SAFETY: row r lies inside w; xs holds k / 16 · 16 floats, x holds k.
                unsafe {
                    let row = w.add(r * k);
                    *out = match dot16_finite_f16::<L, true>(row, xs.as_ptr(), x.as_ptr(), k) {
                        Some(sum) => sum,
                        None => dot_chains::<L, 4>(row, x.as_ptr(), k),
                    };
                }
            }
            true
        });
    }
    if !done {
        for (r, out) in y.iter_mut().enumerate() {
            // SAFETY: row r lies inside w; x holds k.
            *out = unsafe { dot16(w.add(r * k), x.as_ptr(), k) };
        }
    }
}

/// `ys = y · 2^112` (exact) when every `|y[i]|` is below 2^16, so that no product with a
/// weight times 2^-112 overflows; false otherwise (an inf or NaN included), `ys` then
/// unspecified. `y` is a whole number of 4-lane steps.
fn rebias(y: &[f32], ys: &mut Vec<f32>) -> bool {
    ys.resize(y.len(), 0.0);
    let scale = f32x4_splat(f32::from_bits((127 + 112) << 23));
    let limit = f32x4_splat(65536.0);
    let mut below = u32x4_splat(!0);
    for (src, dst) in y.chunks_exact(4).zip(ys.chunks_exact_mut(4)) {
        // SAFETY: both chunks hold 4 floats.
        unsafe {
            let v = load(src.as_ptr());
            below = v128_and(below, f32x4_lt(f32x4_abs(v), limit));
            store(dst.as_mut_ptr(), f32x4_mul(v, scale));
        }
    }
    u32x4_all_true(below)
}

/// e^x for 4 lanes, the same range reduction and polynomial as the other ISAs (separate
/// multiply and add: SIMD128 has no FMA).
#[inline(always)]
pub(crate) fn exp(x: v128) -> v128 {
    use super::exp_consts::P;
    exp_with(x, &P)
}

/// e^x as [`exp`] with the shorter polynomial softmax weights take (`exp_consts::P_SOFTMAX`).
#[inline(always)]
pub(crate) fn exp_softmax(x: v128) -> v128 {
    use super::exp_consts::P_SOFTMAX;
    exp_with(x, &P_SOFTMAX)
}

/// e^x with the polynomial `p` (highest degree first): every ISA's range reduction and
/// rounding steps.
#[inline(always)]
fn exp_with(x: v128, p: &[f32]) -> v128 {
    use super::exp_consts::*;
    let underflow = f32x4_lt(x, f32x4_splat(LOW));
    let x = f32x4_pmax(f32x4_pmin(x, f32x4_splat(HIGH)), f32x4_splat(LOW));
    let n = f32x4_nearest(f32x4_mul(x, f32x4_splat(core::f32::consts::LOG2_E)));
    let r = f32x4_sub(x, f32x4_mul(n, f32x4_splat(LN2_HI)));
    let r = f32x4_sub(r, f32x4_mul(n, f32x4_splat(LN2_LO)));
    let mut poly = f32x4_splat(p[0]);
    for &c in &p[1..] {
        poly = f32x4_add(f32x4_mul(poly, r), f32x4_splat(c));
    }
    let r2 = f32x4_mul(r, r);
    let er = f32x4_add(f32x4_add(f32x4_mul(poly, r2), r), f32x4_splat(1.0));
    let two_n = i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23);
    v128_andnot(f32x4_mul(er, two_n), underflow)
}
