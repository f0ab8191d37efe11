//! Lloyd–Max scalar codebooks for one coordinate of a rotated unit vector.
//!
//! After a random rotation, a unit vector of `R^d` is (close to) uniform on the sphere
//! `S^{d-1}`, and each of its coordinates has the exact marginal density
//! `f(x) ∝ (1 - x²)^((d-3)/2)` on `[-1, 1]` (a symmetric Beta law; variance `1/d`). The codebook
//! minimising the expected squared error of one coordinate under that density is found here by
//! the Lloyd iteration (cells = midpoints between levels, level = conditional mean of its cell),
//! integrating on a fine midpoint grid in the scaled variable `z = x·sqrt(d)`. For large `d`
//! this tends to the Gaussian N(0, 1/d) Lloyd–Max quantiser; the exact law is used throughout.
//!
//! The result depends only on `(d, bits)` and this file; [`CODEBOOK_VERSION`] changes whenever
//! the procedure (density, grid, stopping rule) changes, and is part of the cache identity.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Version 1: exact sphere-coordinate marginal, 32768-point midpoint grid, Lloyd iteration to a
/// 1e-10 level change (at most 10000 rounds), levels stored as f32.
pub const CODEBOOK_VERSION: u8 = 1;

const GRID: usize = 1 << 15;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Codebook {
    pub(crate) bits: u32,
    /// Reconstruction levels in increasing order (unit-vector coordinate units).
    pub(crate) levels: Vec<f32>,
    /// Decision thresholds between consecutive levels (`levels.len() - 1`).
    pub(crate) thresholds: Vec<f32>,
    /// Expected squared error of one coordinate, times `d` (= expected `‖u - û‖²` of a unit
    /// vector whose every coordinate uses this codebook).
    pub(crate) unit_mse: f64,
}

impl Codebook {
    /// Index of the level nearest to `x` (the reference the vectorised quantiser is tested
    /// against).
    #[cfg(test)]
    pub(crate) fn quantize(&self, x: f32) -> u8 {
        // Thresholds are sorted: count those below x (≤ 255 comparisons, usually ≤ 15).
        self.thresholds.partition_point(|&t| t < x) as u8
    }
}

/// The codebook for `bits` (1..=8) bits and dimension `d`, computed once per process.
pub(crate) fn codebook(d: usize, bits: u32) -> Arc<Codebook> {
    type Books = Mutex<HashMap<(usize, u32), Arc<Codebook>>>;
    static CACHE: OnceLock<Books> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(book) = cache
        .lock()
        .expect("codebook cache poisoned")
        .get(&(d, bits))
    {
        return book.clone();
    }
    let book = Arc::new(lloyd_max(d, bits));
    cache
        .lock()
        .expect("codebook cache poisoned")
        .entry((d, bits))
        .or_insert(book)
        .clone()
}

/// Density of `z = x·sqrt(d)` on a midpoint grid of `[-r, r]`, `r = min(sqrt(d), 12)`, normalised.
fn grid_density(d: usize) -> (Vec<f64>, Vec<f64>) {
    let df = d as f64;
    let r = df.sqrt().min(12.0);
    let step = 2.0 * r / GRID as f64;
    let z: Vec<f64> = (0..GRID).map(|i| -r + (i as f64 + 0.5) * step).collect();
    let mut w: Vec<f64> = z
        .iter()
        .map(|&z| {
            let u = 1.0 - z * z / df;
            if d >= 3 {
                ((df - 3.0) / 2.0 * u.ln()).exp()
            } else if d == 2 {
                1.0 / u.sqrt()
            } else {
                // d = 1: the "unit vector" is ±1; put all mass at the grid ends.
                if (z.abs() - r).abs() < step {
                    1.0
                } else {
                    0.0
                }
            }
        })
        .collect();
    let total: f64 = w.iter().sum();
    for wi in &mut w {
        *wi /= total;
    }
    (z, w)
}

fn lloyd_max(d: usize, bits: u32) -> Codebook {
    assert!((1..=8).contains(&bits), "codebooks exist for 1..=8 bits");
    let n_levels = 1usize << bits;
    let (z, w) = grid_density(d);
    // Prefix sums of mass and first moment: cell statistics in O(1).
    let mut mass = vec![0.0f64; GRID + 1];
    let mut moment = vec![0.0f64; GRID + 1];
    for i in 0..GRID {
        mass[i + 1] = mass[i] + w[i];
        moment[i + 1] = moment[i] + w[i] * z[i];
    }
    // Start from equal-mass cells.
    let mut bounds: Vec<usize> = (0..=n_levels)
        .map(|k| {
            mass.partition_point(|&m| m < k as f64 / n_levels as f64)
                .min(GRID)
        })
        .collect();
    bounds[0] = 0;
    bounds[n_levels] = GRID;
    let mut levels = vec![0.0f64; n_levels];
    for _round in 0..10_000 {
        let mut change = 0.0f64;
        for k in 0..n_levels {
            let (a, b) = (bounds[k], bounds[k + 1]);
            let m = mass[b] - mass[a];
            let level = if m > 0.0 {
                (moment[b] - moment[a]) / m
            } else {
                // An empty cell keeps its place between its neighbours' grid points.
                z[a.min(GRID - 1)]
            };
            change = change.max((level - levels[k]).abs());
            levels[k] = level;
        }
        for k in 1..n_levels {
            let t = 0.5 * (levels[k - 1] + levels[k]);
            bounds[k] = z.partition_point(|&zi| zi < t);
        }
        if change < 1e-10 {
            break;
        }
    }
    // Squared error per coordinate in z units (= unit-vector MSE, as there are d coordinates
    // each of variance 1/d).
    let mut mse = 0.0;
    for k in 0..n_levels {
        for i in bounds[k]..bounds[k + 1] {
            mse += w[i] * (z[i] - levels[k]).powi(2);
        }
    }
    let scale = 1.0 / (d as f64).sqrt();
    let levels_x: Vec<f32> = levels.iter().map(|&l| (l * scale) as f32).collect();
    let thresholds = levels_x.windows(2).map(|p| 0.5 * (p[0] + p[1])).collect();
    Codebook {
        bits,
        levels: levels_x,
        thresholds,
        unit_mse: mse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codebooks_are_symmetric_sorted_and_near_gaussian_lloyd_max() {
        // Gaussian Lloyd–Max distortions (Max 1960): the large-d limit.
        let gaussian = [0.3634, 0.1175, 0.03454, 0.009497];
        for d in [64usize, 128, 4096] {
            for bits in 1..=4u32 {
                let book = codebook(d, bits);
                let n = book.levels.len();
                assert_eq!(n, 1 << bits);
                for k in 0..n {
                    assert!((book.levels[k] + book.levels[n - 1 - k]).abs() < 1e-5);
                }
                assert!(book.levels.windows(2).all(|p| p[0] < p[1]));
                let rel = book.unit_mse / gaussian[bits as usize - 1] - 1.0;
                eprintln!(
                    "d={d} bits={bits} unit_mse={:.5} ({rel:+.3})",
                    book.unit_mse
                );
                // The bounded law has lighter tails than the Gaussian: a few % lower at d=64.
                assert!(
                    rel.abs() < 0.05,
                    "d={d} bits={bits}: mse {} ({rel:+.3})",
                    book.unit_mse
                );
            }
        }
        // 1 bit, exact law: ±E|x| = ±sqrt(2/π)·(1 + O(1/d)) / sqrt(d).
        let one = codebook(4096, 1);
        assert!((one.levels[1] as f64 * 64.0 - (2.0 / std::f64::consts::PI).sqrt()).abs() < 1e-3);
    }

    #[test]
    fn quantize_picks_the_nearest_level() {
        let book = codebook(64, 3);
        for i in 0..200 {
            let x = -0.5 + i as f32 * 0.005;
            let q = book.quantize(x) as usize;
            let best = (0..book.levels.len())
                .min_by(|&a, &b| {
                    (book.levels[a] - x)
                        .abs()
                        .total_cmp(&(book.levels[b] - x).abs())
                })
                .unwrap();
            assert!((book.levels[q] - x).abs() <= (book.levels[best] - x).abs() + 1e-7);
        }
    }
}
