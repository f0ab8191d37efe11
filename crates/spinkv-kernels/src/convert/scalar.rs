//! Reference conversions through the `half` crate.

use half::f16;

pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(*s);
    }
}

pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}
