//! Small AVX2 building blocks shared by the per-op `avx2.rs` files.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// Sum of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Max of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn hmax(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let m = _mm_max_ps(lo, hi);
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }

    /// A storage dtype that 8 lanes at a time widen to f32.
    pub(crate) trait Lanes: Copy {
        /// # Safety
        /// `ptr` must be valid for reading 8 elements; the CPU must have AVX2+FMA+F16C.
        unsafe fn load8(ptr: *const Self) -> __m256;
        fn widen(self) -> f32;
    }

    impl Lanes for f32 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(ptr: *const f32) -> __m256 {
            _mm256_loadu_ps(ptr)
        }
        #[inline(always)]
        fn widen(self) -> f32 {
            self
        }
    }

    impl Lanes for f16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(ptr: *const f16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(ptr as *const __m128i))
        }
        #[inline(always)]
        fn widen(self) -> f32 {
            self.to_f32()
        }
    }

    impl Lanes for bf16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(ptr: *const bf16) -> __m256 {
            // bf16 is the top half of an f32: zero-extend to 32 bits and shift into place.
            let raw = _mm256_cvtepu16_epi32(_mm_loadu_si128(ptr as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(raw))
        }
        #[inline(always)]
        fn widen(self) -> f32 {
            self.to_f32()
        }
    }

    /// e^x for 8 lanes; inputs below -87.3 flush to 0 (including -inf), so masked scores vanish.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn exp(x: __m256) -> __m256 {
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.3));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.3));
        // x = n·ln2 + r with |r| <= ln2/2, ln2 split in two for precision.
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut poly = _mm256_set1_ps(1.987_569_1e-4);
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.398_199_9e-3));
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.333_452e-3));
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.166_579_6e-2));
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.666_666_5e-1));
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(0.5));
        let r2 = _mm256_mul_ps(r, r);
        let er = _mm256_add_ps(_mm256_fmadd_ps(poly, r2, r), _mm256_set1_ps(1.0));
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(er, two_n))
    }
}
