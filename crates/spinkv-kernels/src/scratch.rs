//! Small per-call scratch for callers of the kernels (a page's decoded scales): on the stack
//! and zeroed only as far as used, so the attention loop neither allocates nor clears a fixed
//! array per page.

use core::mem::MaybeUninit;

/// Floats that fit on the stack; larger requests allocate.
const STACK_FLOATS: usize = 256;

/// Runs `f` on `n` zeroed floats.
#[inline]
pub fn with_floats<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if n > STACK_FLOATS {
        return f(&mut vec![0.0; n]);
    }
    let mut buf = MaybeUninit::<[f32; STACK_FLOATS]>::uninit();
    let ptr = buf.as_mut_ptr() as *mut f32;
    // SAFETY: n <= STACK_FLOATS; the first n floats are zeroed (so initialised) before the
    // slice over them is formed, and the slice does not outlive `buf`.
    unsafe {
        ptr.write_bytes(0, n);
        f(core::slice::from_raw_parts_mut(ptr, n))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn zeroed_on_both_paths() {
        for n in [0usize, 1, 256, 257, 1000] {
            super::with_floats(n, |x| {
                assert_eq!(x.len(), n);
                assert!(x.iter().all(|&v| v == 0.0));
            });
        }
    }
}
