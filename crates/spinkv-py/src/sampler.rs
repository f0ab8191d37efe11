//! `Sampler`: the Rust sampler, with its seeded random state.

use pyo3::prelude::*;
use spinkv_model::{Sampler, SamplerParams};

use crate::errors::{guarded, invalid_input, model_error};

#[pyclass(name = "Sampler", module = "spinkv._native")]
pub struct PySampler {
    pub(crate) inner: Sampler,
}

#[pymethods]
impl PySampler {
    #[new]
    #[pyo3(signature = (temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                        repetition_penalty=1.0, repeat_last_n=64, seed=None))]
    fn new(
        temperature: f32,
        top_k: i64,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        repeat_last_n: i64,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let seed = seed
            .filter(|s| !s.is_none())
            .map(|s| {
                s.extract::<u64>().map_err(|_| {
                    invalid_input(format!("seed must be an integer in 0..2^64, got {s}"))
                })
            })
            .transpose()?;
        let count = |name: &str, n: i64| {
            usize::try_from(n).map_err(|_| invalid_input(format!("{name} must be >= 0, got {n}")))
        };
        let params = SamplerParams {
            temperature,
            top_k: count("top_k", top_k)?,
            top_p,
            min_p,
            repetition_penalty,
            repeat_last_n: count("repeat_last_n", repeat_last_n)?,
            seed,
        };
        let inner = guarded(|| Sampler::new(params).map_err(model_error))?;
        Ok(PySampler { inner })
    }
}
