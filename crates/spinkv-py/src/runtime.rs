//! Process-wide runtime switches (instruction set, thread count) and the memory bandwidth probe.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_kernels::Isa;

use crate::errors::{guarded, invalid_input, model_error};

/// The instruction set the kernels use now ("scalar", "avx2", ...).
#[pyfunction]
fn isa() -> &'static str {
    spinkv_kernels::active_isa().name()
}

/// Instruction sets this CPU can run, best last.
#[pyfunction]
fn cpu_features() -> Vec<&'static str> {
    Isa::ALL
        .into_iter()
        .filter(|isa| isa.cpu_supports())
        .map(Isa::name)
        .collect()
}

/// Forces an instruction set (benchmarking, parity checks); errors if the CPU lacks it.
#[pyfunction]
fn set_isa(name: &str) -> PyResult<()> {
    guarded(|| {
        spinkv_kernels::select_isa(name)
            .map(|_| ())
            .map_err(|e| invalid_input(e.to_string()))
    })
}

/// The kernel benchmark cases (spinkv_kernels::bench: matvec, key/value scans from fp16 and
/// turbo codes, encoding) on one ISA, one line per case; the ISA in use is restored after.
#[pyfunction]
fn kernel_bench(py: Python<'_>, name: &str) -> PyResult<Vec<String>> {
    py.detach(|| {
        guarded(|| spinkv_core::kernel_bench(name).map_err(|e| invalid_input(e.to_string())))
    })
}

/// The compute pool's memory read bandwidth: a `mib`-MiB buffer summed `passes` times (see
/// spinkv_model::read_bandwidth); a dict of the median and best GB/s, threads, buffer bytes.
#[pyfunction]
#[pyo3(signature = (mib = None, passes = None))]
fn read_bandwidth<'py>(
    py: Python<'py>,
    mib: Option<&Bound<'py, PyAny>>,
    passes: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let count = |v: Option<&Bound<'py, PyAny>>, what: &str, default: usize| match v {
        None => Ok(default),
        Some(v) => v
            .extract::<i64>()
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                invalid_input(format!("{what} must be a non-negative integer, got {v}"))
            }),
    };
    let (mib, passes) = (count(mib, "mib", 256)?, count(passes, "passes", 5)?);
    let r =
        py.detach(|| guarded(|| spinkv_core::read_bandwidth(mib, passes).map_err(model_error)))?;
    let d = PyDict::new(py);
    d.set_item("gb_per_s", r.bytes_per_second / 1e9)?;
    d.set_item("best_gb_per_s", r.best_bytes_per_second / 1e9)?;
    d.set_item("threads", r.threads)?;
    d.set_item("buffer_bytes", r.buffer_bytes)?;
    d.set_item("passes", r.passes)?;
    Ok(d)
}

/// Threads of the compute pool, 1..=MAX_THREADS (256); the old pool stays on any error.
#[pyfunction]
fn set_threads(py: Python<'_>, n: &Bound<'_, PyAny>) -> PyResult<()> {
    let max = spinkv_core::MAX_THREADS;
    let n = n
        .extract::<i64>()
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            invalid_input(format!("threads must be an integer in 1..={max}, got {n}"))
        })?;
    py.detach(|| guarded(|| spinkv_core::set_threads(n).map_err(model_error)))
}

#[pyfunction]
fn threads() -> PyResult<usize> {
    guarded(|| Ok(spinkv_core::threads()))
}

/// Panics inside `guarded`, for tests of the panic path (InternalError, nothing on stderr).
#[pyfunction]
fn _panic_for_tests(message: &str) -> PyResult<()> {
    guarded(|| panic!("{message}"))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(isa, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(set_isa, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_bench, m)?)?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads, m)?)?;
    m.add_function(wrap_pyfunction!(read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    Ok(())
}
