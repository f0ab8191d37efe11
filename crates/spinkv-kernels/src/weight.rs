//! Borrowed weight matrices in their storage dtype.

use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    F16,
    Bf16,
    F32,
    /// 8-bit codes with one f16 scale per block of [`Q8_BLOCK`] weights (llama.cpp's Q8_0).
    Q8_0,
}

/// Weights per Q8_0 scale.
pub const Q8_BLOCK: usize = 32;

impl WeightDtype {
    pub const fn size_bytes(self) -> usize {
        match self {
            WeightDtype::F16 | WeightDtype::Bf16 => 2,
            WeightDtype::F32 => 4,
            WeightDtype::Q8_0 => 1,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            WeightDtype::F16 => "f16",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F32 => "f32",
            WeightDtype::Q8_0 => "q8_0",
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
    Q8_0(Q8Weights<'a>),
}

/// A Q8_0 matrix `[n_rows, k]` (`k` a multiple of [`Q8_BLOCK`]): weight `i` of the row-major
/// order is `codes[i] · scales[i / Q8_BLOCK]`. Codes and scales are separate arrays (not
/// GGUF's interleaved 34-byte blocks) so both load aligned.
#[derive(Clone, Copy, Debug)]
pub struct Q8Weights<'a> {
    pub codes: &'a [i8],
    pub scales: &'a [f16],
}

impl<'a> Q8Weights<'a> {
    /// None unless there is one scale per block of codes.
    pub fn new(codes: &'a [i8], scales: &'a [f16]) -> Option<Self> {
        (codes.len() == scales.len() * Q8_BLOCK).then_some(Q8Weights { codes, scales })
    }

    /// Weight `i`, exactly (an 8-bit code times an f16 scale fits f32's mantissa).
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        self.codes[i] as f32 * self.scales[i / Q8_BLOCK].to_f32()
    }

    /// Rows `rows` (of `k` weights, `k` a multiple of [`Q8_BLOCK`]) dequantized into `out`
    /// (`rows.len() * k` floats): each scale widened once, its 32 products vectorised.
    pub fn dequantize_rows(&self, k: usize, rows: std::ops::Range<usize>, out: &mut [f32]) {
        let (start, end) = (rows.start * k, rows.end * k);
        let codes = self.codes[start..end].chunks_exact(Q8_BLOCK);
        let scales = &self.scales[start / Q8_BLOCK..end / Q8_BLOCK];
        let out = out[..end - start].chunks_exact_mut(Q8_BLOCK);
        for ((block, &scale), out) in codes.zip(scales).zip(out) {
            let scale = scale.to_f32();
            for (o, &c) in out.iter_mut().zip(block) {
                *o = c as f32 * scale;
            }
        }
    }
}

impl<'a> WeightRef<'a> {
    pub fn len(&self) -> usize {
        match self {
            WeightRef::F16(w) => w.len(),
            WeightRef::Bf16(w) => w.len(),
            WeightRef::F32(w) => w.len(),
            WeightRef::Q8_0(w) => w.codes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the matrix occupies as stored (Q8_0: codes and their f16 scales).
    pub fn byte_len(&self) -> usize {
        match self {
            WeightRef::F16(w) => std::mem::size_of_val(*w),
            WeightRef::Bf16(w) => std::mem::size_of_val(*w),
            WeightRef::F32(w) => std::mem::size_of_val(*w),
            WeightRef::Q8_0(q) => std::mem::size_of_val(q.codes) + std::mem::size_of_val(q.scales),
        }
    }

    pub fn dtype(&self) -> WeightDtype {
        match self {
            WeightRef::F16(_) => WeightDtype::F16,
            WeightRef::Bf16(_) => WeightDtype::Bf16,
            WeightRef::F32(_) => WeightDtype::F32,
            WeightRef::Q8_0(_) => WeightDtype::Q8_0,
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
            WeightRef::Q8_0(w) => w.dequantize_rows(k, row..row + 1, out),
        }
    }
}

/// `$body` with `$s` bound to the weight's slice, instantiated once per storage dtype (the
/// SIMD kernels are generic over `crate::simd::Lanes`). Q8_0 weights take `$q8` (bound to
/// the `Q8Weights`) instead.
macro_rules! with_slice {
    ($w:expr, |$s:ident| $body:expr, |$q:ident| $q8:expr) => {
        match $w {
            $crate::WeightRef::F16($s) => $body,
            $crate::WeightRef::Bf16($s) => $body,
            $crate::WeightRef::F32($s) => $body,
            $crate::WeightRef::Q8_0($q) => $q8,
        }
    };
}
pub(crate) use with_slice;
