//! WASM SIMD128 cut of a code row into int16 levels, for the integer key scan
//! (`kv_score::int_dot`) and the integer-grid value scan (`kv_accumulate`).
//!
//! Each group of 8 codes is cut from a 16-byte load of its row that holds the group's bytes:
//! a swizzle (its control planned once per call for that group's offset in the load) gives
//! each code its one or two bytes in a 16-bit lane, a multiply and a shift stand in for the
//! per-lane shift SIMD128 lacks, a mask keeps the code. Two groups' codes are narrowed into
//! 16 byte indices, looked up in one `i8x16.swizzle` of the group's int8 levels and widened
//! back to two vectors of int16 levels.

use core::arch::wasm32::*;

use super::windows::WINDOWS_16;

/// Groups of 8 codes a channel group holds at most (head dim 256).
const MAX_GROUPS: usize = 32;

/// One channel group's constants: where its codes sit, its level table, where its levels go.
pub(crate) struct Plan {
    /// Groups of 8 codes (the last may be partial: its extra lanes meet zero query lanes).
    pub(crate) groups: usize,
    /// Per group of 8 codes: the row offset of its 16-byte load and the swizzle control that
    /// cuts the group's bytes out of that load.
    loads: [(usize, v128); MAX_GROUPS],
    mul: v128,
    mask: v128,
    /// The group's int8 levels, 16 bytes (entries past `2^width` unused).
    table: v128,
    /// The group's first vector in the query's padded layout.
    first_vector: usize,
}

impl Plan {
    /// `None` when a row is shorter than one 16-byte load. `table` holds the group's levels
    /// as int8; its levels go to vectors `first_channel / 8` on.
    pub(crate) fn new(
        len: usize,
        width: u32,
        byte: usize,
        row_bytes: usize,
        table: &[i8; 16],
        first_channel: usize,
    ) -> Option<Self> {
        if row_bytes < 16 || !first_channel.is_multiple_of(8) || len.div_ceil(8) > MAX_GROUPS {
            return None;
        }
        let (ctrl, shift) = &WINDOWS_16[width as usize];
        let mul: [u16; 8] = core::array::from_fn(|k| 1u16 << (8 - shift[k]));
        let table: [u8; 16] = table.map(|v| v as u8);
        let groups = len.div_ceil(8);
        let mut loads = [(0usize, u8x16_splat(0)); MAX_GROUPS];
        for (g, load) in loads.iter_mut().enumerate().take(groups) {
            let at = byte + g * width as usize;
            let start = at.min(row_bytes - 16);
            // Zero-filling entries (0x80) stay at or above 16 and still select 0.
            let shifted: [u8; 16] = core::array::from_fn(|i| ctrl[i] + (at - start) as u8);
            // SAFETY: reads the 16 bytes of a local array.
            *load = (start, unsafe { v128_load(shifted.as_ptr() as *const v128) });
        }
        // SAFETY: each load reads 16 bytes of a local array.
        unsafe {
            Some(Plan {
                groups,
                loads,
                mul: v128_load(mul.as_ptr() as *const v128),
                mask: u16x8_splat((1u16 << width) - 1),
                table: v128_load(table.as_ptr() as *const v128),
                first_vector: first_channel / 8,
            })
        }
    }

    /// Codes of group `g` of `row` in 16-bit lanes.
    #[inline(always)]
    fn codes8(&self, row: &[u8], g: usize) -> v128 {
        let (start, ctrl) = self.loads[g];
        let bytes = &row[start..start + 16];
        // SAFETY: `bytes` is 16 bytes long.
        let word = unsafe { v128_load(bytes.as_ptr() as *const v128) };
        let windows = i8x16_swizzle(word, ctrl);
        v128_and(u16x8_shr(i16x8_mul(windows, self.mul), 8), self.mask)
    }

    /// Writes the group's int16 levels of `row` into `levels`, from `first_vector` on.
    #[inline(always)]
    pub(crate) fn place(&self, row: &[u8], levels: &mut [v128]) {
        let levels = &mut levels[self.first_vector..self.first_vector + self.groups];
        let mut g = 0;
        while g + 1 < self.groups {
            // Codes are below 16: narrowing keeps them, and each is its level's index.
            let idx = u8x16_narrow_i16x8(self.codes8(row, g), self.codes8(row, g + 1));
            let bytes = i8x16_swizzle(self.table, idx);
            levels[g] = i16x8_extend_low_i8x16(bytes);
            levels[g + 1] = i16x8_extend_high_i8x16(bytes);
            g += 2;
        }
        if g < self.groups {
            let codes = self.codes8(row, g);
            let bytes = i8x16_swizzle(self.table, u8x16_narrow_i16x8(codes, codes));
            levels[g] = i16x8_extend_low_i8x16(bytes);
        }
    }
}
