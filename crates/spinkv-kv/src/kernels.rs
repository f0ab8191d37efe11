//! The loops this crate runs live in spinkv-kernels (scalar reference + run-time dispatched
//! SIMD, one module per operation); this module names the ones the cache uses.

pub(crate) use spinkv_kernels::codes::{self, CodeLayout, Levels};
pub(crate) use spinkv_kernels::prefetch;
pub(crate) use spinkv_kernels::scratch::with_floats;
pub(crate) use spinkv_kernels::{axpy_f32, f16_to_f32, f32_to_f16, scale_f32};
pub(crate) use spinkv_kernels::{blocks_reaching, exp_sub_sum, exp_sub_sum_capped, max_f32};
pub(crate) use spinkv_kernels::{fwht, kv_accumulate, kv_score, quantize, scales};
