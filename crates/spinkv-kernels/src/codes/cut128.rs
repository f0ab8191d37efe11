//! The cut of a code row into int16 levels that the 4-lane integer scans share (the key scan
//! `kv_score::int_dot` and the integer-grid value scan `kv_accumulate`, on NEON and SIMD128).
//! The plan — which 16-byte load and which byte shuffle each group of 8 codes takes — is
//! worked out here once per call, for both ISAs; the ISA file (`neon.rs`, `simd128.rs`)
//! supplies the byte shuffle (`tbl`, `i8x16.swizzle`: an index of 16 or more gives 0), the
//! per-lane shift and the widening.
//!
//! Each group of 8 codes is cut from a 16-byte load of its row that holds the group's bytes:
//! the shuffle gives each code its one or two bytes in a 16-bit lane, a shift and a mask keep
//! the code. Two groups' codes are narrowed into 16 byte indices, looked up in one shuffle of
//! the group's int8 levels and widened back to two vectors of int16 levels.

use super::isa::{
    code_mask, cut, lane_shifts, levels16, load16, Bytes16, Codes, LaneShifts, Levels8,
};
use crate::codes::windows::WINDOWS_16;

/// Groups of 8 codes a channel group holds at most (head dim 256).
const MAX_GROUPS: usize = 32;

/// One channel group's constants: where its codes sit, its level table, where its levels go.
pub(crate) struct Plan {
    /// Groups of 8 codes (the last may be partial: its extra lanes meet zero query lanes).
    pub(crate) groups: usize,
    /// Per group of 8 codes: the row offset of its 16-byte load and the byte shuffle that cuts
    /// the group's bytes out of that load.
    loads: [(usize, Bytes16); MAX_GROUPS],
    shifts: LaneShifts,
    mask: Codes,
    /// The group's int8 levels, 16 bytes (entries past `2^width` unused).
    table: Bytes16,
    /// The group's first vector of 8 levels in the caller's layout.
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
        let groups = len.div_ceil(8);
        let mut loads = [(0usize, load16(&[0; 16])); MAX_GROUPS];
        for (g, load) in loads.iter_mut().enumerate().take(groups) {
            let at = byte + g * width as usize;
            let start = at.min(row_bytes - 16);
            // Zero-filling entries (0x80) stay at or above 16 and still select 0.
            let shifted: [u8; 16] = core::array::from_fn(|i| ctrl[i] + (at - start) as u8);
            *load = (start, load16(&shifted));
        }
        Some(Plan {
            groups,
            loads,
            shifts: lane_shifts(shift),
            mask: code_mask(width),
            table: load16(&table.map(|v| v as u8)),
            first_vector: first_channel / 8,
        })
    }

    /// Codes of group `g` of `row` in 16-bit lanes.
    #[inline(always)]
    fn codes8(&self, row: &[u8], g: usize) -> Codes {
        let (start, ctrl) = self.loads[g];
        let bytes: &[u8; 16] = row[start..start + 16].try_into().expect("16 bytes");
        cut(load16(bytes), ctrl, self.shifts, self.mask)
    }

    /// Writes the group's int16 levels of `row` into `levels`, from `first_vector` on.
    #[inline(always)]
    pub(crate) fn place(&self, row: &[u8], levels: &mut [Levels8]) {
        let levels = &mut levels[self.first_vector..self.first_vector + self.groups];
        let mut g = 0;
        while g + 1 < self.groups {
            let (a, b) = levels16(self.table, self.codes8(row, g), self.codes8(row, g + 1));
            levels[g] = a;
            levels[g + 1] = b;
            g += 2;
        }
        if g < self.groups {
            let codes = self.codes8(row, g);
            levels[g] = levels16(self.table, codes, codes).0;
        }
    }
}
