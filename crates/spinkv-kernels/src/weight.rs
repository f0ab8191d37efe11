//! Borrowed weight matrices in their storage dtype.

use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    F16,
    Bf16,
    F32,
}

impl WeightDtype {
    pub const fn size_bytes(self) -> usize {
        match self {
            WeightDtype::F16 | WeightDtype::Bf16 => 2,
            WeightDtype::F32 => 4,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            WeightDtype::F16 => "f16",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F32 => "f32",
        }
    }
}

/// A row-major weight matrix `[n_rows, k]` (the shape is given to each kernel), kept in the
/// dtype it was stored in so decode reads 2 bytes per weight, not 4.
#[derive(Clone, Copy, Debug)]
pub enum WeightRef<'a> {
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    F32(&'a [f32]),
}

impl<'a> WeightRef<'a> {
    pub fn len(&self) -> usize {
        match self {
            WeightRef::F16(w) => w.len(),
            WeightRef::Bf16(w) => w.len(),
            WeightRef::F32(w) => w.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> WeightDtype {
        match self {
            WeightRef::F16(_) => WeightDtype::F16,
            WeightRef::Bf16(_) => WeightDtype::Bf16,
            WeightRef::F32(_) => WeightDtype::F32,
        }
    }

    /// Row `row` of a matrix with `k` columns, widened to f32 (embedding lookup).
    pub fn row_to_f32(&self, row: usize, k: usize, out: &mut [f32]) {
        let range = row * k..(row + 1) * k;
        match self {
            WeightRef::F16(w) => crate::convert::f16_to_f32(&w[range], out),
            WeightRef::Bf16(w) => {
                for (o, v) in out.iter_mut().zip(&w[range]) {
                    *o = v.to_f32();
                }
            }
            WeightRef::F32(w) => out.copy_from_slice(&w[range]),
        }
    }
}

/// `$body` with `$s` bound to the weight's slice, instantiated once per storage dtype (the
/// SIMD kernels are generic over `crate::simd::Lanes`).
macro_rules! with_slice {
    ($w:expr, |$s:ident| $body:expr) => {
        match $w {
            $crate::WeightRef::F16($s) => $body,
            $crate::WeightRef::Bf16($s) => $body,
            $crate::WeightRef::F32($s) => $body,
        }
    };
}
pub(crate) use with_slice;
