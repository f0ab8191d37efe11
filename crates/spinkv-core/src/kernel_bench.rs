//! The kernel benchmark (spinkv_kernels::bench) on a chosen ISA, leaving the process on the
//! ISA it was using.

use spinkv_kernels::{Isa, IsaError};

/// Puts the ISA back when dropped, so a panicking benchmark cannot leave the whole process on
/// the ISA it was forcing.
struct RestoreIsa(Isa);

impl Drop for RestoreIsa {
    fn drop(&mut self) {
        // It was active a moment ago, so the CPU supports it.
        let _ = spinkv_kernels::set_isa(self.0);
    }
}

/// One line per benchmark case, run on the ISA `name`.
pub fn kernel_bench(name: &str) -> Result<Vec<String>, IsaError> {
    let _restore = RestoreIsa(spinkv_kernels::active_isa());
    let isa = spinkv_kernels::select_isa(name)?;
    let origin = std::time::Instant::now();
    let now = move || origin.elapsed().as_secs_f64() * 1e3;
    Ok(spinkv_kernels::bench::run(isa, &now))
}
