//! `spinkv._native`: the PyO3 binding. It converts arguments and results, releases the GIL
//! around every long computation, and maps errors to Python exceptions in one place
//! (`errors`). Every rule and format is spinkv-core's; none lives here.

mod errors;
mod inspect;
mod kv_options;
mod model;
mod persist;
mod runtime;
mod sampler;
mod session;
mod stats;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    runtime::register(m)?;
    persist::register(m)?;
    kv_options::register(m)?;
    inspect::register(m)?;
    stats::register(m)?;
    m.add_class::<model::PyModel>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<sampler::PySampler>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
