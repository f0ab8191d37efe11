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

/// Runs `f` on this thread's reusable buffer in `cell` (what an earlier call left in it: the
/// caller sizes and fills what it reads). A re-entrant call on the same thread (none today)
/// gets a fresh buffer of its own instead of panicking.
#[inline]
pub(crate) fn with_reused<T, R>(
    cell: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    cell.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => f(&mut buffer),
        Err(_) => f(&mut Vec::new()),
    })
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

    thread_local! {
        static CELL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    #[test]
    fn reused_buffers_keep_their_contents_and_nest() {
        super::with_reused(&CELL, |outer| {
            outer.push(7);
            // Nested on the same thread: a fresh buffer, the outer one untouched.
            super::with_reused(&CELL, |inner| {
                assert!(inner.is_empty());
                inner.push(1);
            });
            assert_eq!(outer.as_slice(), [7]);
        });
        super::with_reused(&CELL, |again| assert_eq!(again.as_slice(), [7]));
    }
}
