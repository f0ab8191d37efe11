//! Hot loops for spinkv.
//!
//! Every operation lives in its own module with a `scalar` reference implementation and one
//! file per SIMD instruction set: `avx2` and `avx512` on x86_64, `neon` on aarch64, `simd128` in
//! wasm32 builds with `+simd128`. The module's top-level function dispatches at run time on
//! [`active_isa`], so one build runs on any CPU of its architecture: no `target-cpu=native`
//! anywhere. Float kernels follow one canonical operation order (`canon`), so every ISA with a
//! fused multiply-add returns bit-identical results. [`parity`] (tests, or the `parity` feature)
//! checks every SIMD version against the scalar one. See README.md for the ISA × op matrix.
//!
//! Kernels work on row ranges / single vectors; threading is the caller's job, done on a
//! [`team`] of threads.

mod canon;
mod isa;
mod round;
mod simd;

#[doc(hidden)]
pub mod bench;
pub mod codes;
pub mod convert;
pub mod experiment;
pub mod fwht;
pub mod kv_accumulate;
pub mod kv_score;
pub mod matmul;
pub mod matvec;
pub mod prefetch;
pub mod q8dot;
pub mod quantize;
pub mod rmsnorm;
pub mod rope;
pub mod scales;
pub mod scratch;
pub mod softmax;
mod splitmix;
pub mod swiglu;
pub mod team;
pub mod vec_f16;
pub mod vec_f32;
mod weight;

pub use codes::{CodeLayout, Levels, MAX_CODED_DIM};
pub use convert::{f16_to_f32, f32_to_f16};
pub use half::{bf16, f16};
pub use isa::{
    active_isa, cpu_features, detected_isa, env_isa_override, runnable_isas, select_isa, set_isa,
    Isa, IsaError,
};
pub use matmul::matmul;
pub use matvec::matvec;
pub use rmsnorm::rmsnorm;
pub use rope::{rope, rope_tables};
pub use softmax::{blocks_reaching, exp_sub_sum, exp_sub_sum_capped, max_f32, softmax_inplace};
pub use splitmix::splitmix64;
pub use swiglu::swiglu;
pub use vec_f16::{axpy_f16, dot_f16};
pub use vec_f32::{axpy_f32, dot_f32, mul_f32, scale_f32};
pub use weight::{Q8Weights, WeightDtype, WeightRef, Q8_BLOCK};

#[cfg(any(test, feature = "parity"))]
pub mod parity;
#[cfg(any(test, feature = "parity"))]
mod test_util;
