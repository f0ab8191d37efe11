//! Reference packing, unpacking and decoding: a plain bit stream.

use super::{CodeLayout, Levels};

pub fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    let mut acc: u64 = 0;
    let mut filled = 0u32;
    let mut at = 0;
    for (c, &code) in codes.iter().enumerate() {
        let width = layout.width(c);
        acc |= ((code as u64) & ((1 << width) - 1)) << filled;
        filled += width;
        while filled >= 8 {
            out[at] = acc as u8;
            at += 1;
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        out[at] = acc as u8;
        at += 1;
    }
    out[at..].fill(0);
}

pub fn unpack(bytes: &[u8], layout: &CodeLayout, codes: &mut [u8]) {
    let mut acc: u64 = 0;
    let mut have = 0u32;
    let mut at = 0;
    for (c, code) in codes.iter_mut().enumerate() {
        let width = layout.width(c);
        while have < width {
            acc |= (bytes[at] as u64) << have;
            at += 1;
            have += 8;
        }
        *code = (acc & ((1 << width) - 1)) as u8;
        acc >>= width;
        have -= width;
    }
}

pub fn dequantize(bytes: &[u8], layout: &CodeLayout, levels: Levels<'_>, out: &mut [f32]) {
    let (d, stride) = (layout.d, layout.bytes());
    let mut codes = [0u8; super::MAX_CODED_DIM];
    let codes = &mut codes[..d];
    for (j, row) in out.chunks_exact_mut(d.max(1)).enumerate() {
        unpack(&bytes[j * stride..(j + 1) * stride], layout, codes);
        for (c, (r, &code)) in row.iter_mut().zip(codes.iter()).enumerate() {
            *r = levels.table(layout, c)[code as usize];
        }
    }
}
