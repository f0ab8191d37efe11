//! `Sampler`: the Rust sampler, with its seeded random state.

use pyo3::prelude::*;
use pyo3::types::PyBool;
use spinkv_core::{Sampler, SamplerParams};

use crate::errors::{guarded, invalid_input, model_error};

#[pyclass(name = "Sampler", module = "spinkv._native")]
pub struct PySampler {
    pub(crate) inner: Sampler,
}

#[pymethods]
impl PySampler {
    #[new]
    #[pyo3(signature = (temperature=None, top_k=None, top_p=None, min_p=None,
                        repetition_penalty=None, repeat_last_n=None, seed=None))]
    fn new(
        temperature: Option<&Bound<'_, PyAny>>,
        top_k: Option<&Bound<'_, PyAny>>,
        top_p: Option<&Bound<'_, PyAny>>,
        min_p: Option<&Bound<'_, PyAny>>,
        repetition_penalty: Option<&Bound<'_, PyAny>>,
        repeat_last_n: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let seed = seed
            .filter(|s| !s.is_none())
            .map(|s| {
                integer(s)
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(|| {
                        invalid_input(format!(
                            "invalid seed {s}: must be an integer in [0, 2**64 - 1]"
                        ))
                    })
            })
            .transpose()?;
        let params = SamplerParams {
            temperature: number("temperature", temperature, 0.0)?,
            top_k: count("top_k", top_k, 0)?,
            top_p: number("top_p", top_p, 1.0)?,
            min_p: number("min_p", min_p, 0.0)?,
            repetition_penalty: number("repetition_penalty", repetition_penalty, 1.0)?,
            repeat_last_n: count("repeat_last_n", repeat_last_n, 64)?,
            seed,
        };
        let inner = guarded(|| Sampler::new(params).map_err(model_error))?;
        Ok(PySampler { inner })
    }
}

/// A Python int (not a bool) of any size, as i128 when it fits.
fn integer(value: &Bound<'_, PyAny>) -> Option<i128> {
    if value.is_instance_of::<PyBool>() {
        return None;
    }
    value.extract::<i128>().ok()
}

/// A count in [0, 2**31 - 1] (top_k, repeat_last_n: far beyond any vocabulary or context).
fn count(name: &str, value: Option<&Bound<'_, PyAny>>, default: usize) -> PyResult<usize> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(default);
    };
    integer(value)
        .filter(|n| (0..=i128::from(i32::MAX)).contains(n))
        .map(|n| n as usize)
        .ok_or_else(|| {
            invalid_input(format!(
                "invalid {name} {value}: must be an integer in [0, 2**31 - 1]"
            ))
        })
}

/// A real number (not a bool); the sampler checks its range.
fn number(name: &str, value: Option<&Bound<'_, PyAny>>, default: f32) -> PyResult<f32> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(default);
    };
    if value.is_instance_of::<PyBool>() {
        return Err(invalid_input(format!(
            "invalid {name} {value}: must be a number"
        )));
    }
    value
        .extract::<f64>()
        .map(|x| x as f32)
        .map_err(|_| invalid_input(format!("invalid {name} {value}: must be a number")))
}
