//! Reference integer scan: unpack a row, look its codes up in the int8 tables, one int32 dot
//! product per query head.

use super::{score_unpacked_rows, IntQueries, IntRows};
use crate::codes::scalar::unpack;

pub fn score_codes_int(r: IntRows<'_>, queries: IntQueries<'_>, scores: &mut [f32], stride: usize) {
    score_unpacked_rows(r, queries, scores, stride, |row, codes| {
        unpack(row, r.layout, codes)
    });
}
