//! Process-wide runtime switches: instruction set and thread count.

use pyo3::prelude::*;
use spinkv_kernels::Isa;

use crate::errors::{guarded, invalid_input};

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
    spinkv_kernels::select_isa(name)
        .map(|_| ())
        .map_err(|e| invalid_input(e.to_string()))
}

/// The kernel benchmark cases (spinkv_kernels::bench: matvec, key/value scans from fp16 and
/// turbo codes, encoding) on one ISA, one line per case; the ISA in use is restored after.
#[pyfunction]
fn kernel_bench(py: Python<'_>, name: &str) -> PyResult<Vec<String>> {
    let before = spinkv_kernels::active_isa();
    let isa = spinkv_kernels::select_isa(name).map_err(|e| invalid_input(e.to_string()))?;
    let lines = py.detach(|| {
        guarded(|| {
            let origin = std::time::Instant::now();
            let now = move || origin.elapsed().as_secs_f64() * 1e3;
            Ok(spinkv_kernels::bench::run(isa, &now))
        })
    });
    spinkv_kernels::set_isa(before).map_err(|e| invalid_input(e.to_string()))?;
    lines
}

#[pyfunction]
fn set_threads(n: i64) -> PyResult<()> {
    if n < 1 {
        return Err(invalid_input(format!("threads must be >= 1, got {n}")));
    }
    spinkv_model::set_threads(n as usize);
    Ok(())
}

#[pyfunction]
fn threads() -> usize {
    spinkv_model::threads()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(isa, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(set_isa, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_bench, m)?)?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads, m)?)?;
    Ok(())
}
