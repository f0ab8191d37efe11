//! Word reads and per-width byte-shuffle tables of the SIMD code kernels (x86, NEON and
//! SIMD128 alike): a group of 8 codes is read as one word, then cut into lanes.

/// Reads the `n <= 8` bytes at `at` as a little-endian word (bytes above `n` are unspecified):
/// one unaligned load, from `at` or ending at the slice's end and shifted down.
#[inline(always)]
pub(crate) fn read_word(bytes: &[u8], at: usize, n: usize) -> u64 {
    debug_assert!(at + n <= bytes.len() && n <= 8);
    if at + 8 <= bytes.len() {
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    } else if bytes.len() >= 8 {
        let start = bytes.len() - 8;
        u64::from_le_bytes(bytes[start..].try_into().expect("8 bytes")) >> (8 * (at - start))
    } else {
        let mut word = [0u8; 8];
        word[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(word)
    }
}

/// Packed bytes of `n` codes of `width` bits.
#[inline(always)]
pub(crate) fn group_bytes(n: usize, width: u32) -> usize {
    (n * width as usize).div_ceil(8)
}

/// [`window_table`] for every width 1..=8 (index = width), evaluated at compile time: 32-bit
/// lanes, 16 of them (AVX-512) — the first 8 are the AVX2 table.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static WINDOWS_32: [([u8; 64], [u32; 16]); 9] = window_tables(4, 16);

/// [`window_table`] for every width 1..=8, 16-bit lanes, 8 of them (NEON, SIMD128).
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "wasm32")),
    allow(dead_code)
)]
pub(crate) static WINDOWS_16: [([u8; 64], [u32; 16]); 9] = window_tables(2, 8);

/// [`window_table`] for every width 1..=8 (index = width; index 0 unused).
const fn window_tables(lane_bytes: usize, lanes: usize) -> [([u8; 64], [u32; 16]); 9] {
    let mut t = [([0u8; 64], [0u32; 16]); 9];
    let mut w = 1;
    while w <= 8 {
        t[w] = window_table(w as u32, lane_bytes, lanes);
        w += 1;
    }
    t
}

/// Byte-shuffle control and shifts that put code `k` of a group of codes of `width` bits
/// (starting at byte 0) at the bottom of lane `k`, for lanes of `lane_bytes` (2 or 4) bytes:
/// lane `k` receives bytes `(w·k)/8` and, if the code crosses into it, the next one; index
/// 0x80 (zeroing on every ISA's byte shuffle) fills the rest. The shift is `(w·k) % 8`.
pub(crate) const fn window_table(
    width: u32,
    lane_bytes: usize,
    lanes: usize,
) -> ([u8; 64], [u32; 16]) {
    let mut ctrl = [0x80u8; 64];
    let mut shift = [0u32; 16];
    let mut k = 0;
    while k < lanes {
        let bit = width as usize * k;
        let byte = bit / 8;
        let s = bit % 8;
        // Byte indices are relative to a 16-byte lane that holds the group's bytes.
        let base = k * lane_bytes;
        ctrl[base] = (byte % 16) as u8;
        if s + width as usize > 8 {
            ctrl[base + 1] = ((byte + 1) % 16) as u8;
        }
        shift[k] = s as u32;
        k += 1;
    }
    (ctrl, shift)
}
