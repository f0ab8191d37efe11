//! NEON / SIMD128 batched matmul. NEON: register tiles of `ROWS` weight rows × `TOKENS`
//! tokens from `neon.rs` (mounted here as `isa`) in the walk of `super::for_each_tile`.
//! SIMD128 (`simd128.rs`) walks the same tiles over packed copies of its operands.

#[cfg(target_arch = "aarch64")]
use super::TileArgs;
#[cfg(target_arch = "aarch64")]
use crate::simd::quad::Lanes;
use crate::WeightRef;
use std::ops::Range;

#[cfg(target_arch = "aarch64")]
#[path = "neon.rs"]
mod isa;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "simd128.rs"]
mod isa;

#[cfg(target_arch = "aarch64")]
use isa::{tile, ROWS, TOKENS};
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
use isa::matmul as matmul_lanes;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::check_shapes`.
pub unsafe fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    crate::weight::with_slice!(
        w,
        |w| matmul_lanes(w, k, x, rows, y),
        |q| crate::q8dot::matmul_on(crate::simd::quad::ISA, q, k, x, rows, y)
    )
}

#[cfg(target_arch = "aarch64")]
fn matmul_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let first = rows.start;
    super::for_each_tile(rows, n_tokens, k, ROWS, TOKENS, |r, nr, t, nt| {
        // SAFETY: the tile's rows and tokens lie inside w, x and y (checked shapes).
        unsafe {
            let args = TileArgs {
                w: w.as_ptr().add(r * k),
                x: x.as_ptr().add(t * k),
                y: y.as_mut_ptr().add(t * n_out + (r - first)),
                k,
                y_stride: n_out,
            };
            match (nr, nt) {
                (ROWS, TOKENS) => tile::<L, ROWS, TOKENS>(args),
                (ROWS, _) => tile::<L, ROWS, 1>(args),
                (_, TOKENS) => tile::<L, 1, TOKENS>(args),
                _ => tile::<L, 1, 1>(args),
            }
        }
    });
}
