//! Hot loops for spinkv.
//!
//! Every operation lives in its own module with a `scalar` reference implementation and one
//! file per SIMD instruction set (`avx2` today; `avx512`, `neon` and `simd128` slot in beside
//! it). The module's top-level function dispatches at run time on [`active_isa`], so one build
//! runs on any CPU of its architecture: no `target-cpu=native` anywhere.
//!
//! Kernels work on row ranges / single vectors; threading is the caller's job.

mod isa;
mod simd;

pub mod convert;
pub mod matmul;
pub mod matvec;
pub mod rmsnorm;
pub mod rope;
pub mod softmax;
pub mod swiglu;
pub mod vec_f16;
pub mod vec_f32;
mod weight;

pub use convert::{f16_to_f32, f32_to_f16};
pub use half::{bf16, f16};
pub use isa::{
    active_isa, cpu_features, detected_isa, env_isa_override, select_isa, set_isa, Isa, IsaError,
};
pub use matmul::matmul;
pub use matvec::matvec;
pub use rmsnorm::rmsnorm;
pub use rope::{rope, rope_tables};
pub use softmax::softmax_inplace;
pub use swiglu::swiglu;
pub use vec_f16::{axpy_f16, dot_f16};
pub use vec_f32::{axpy_f32, dot_f32};
pub use weight::{WeightDtype, WeightRef};

#[cfg(test)]
mod test_util;
