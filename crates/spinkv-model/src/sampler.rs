//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty.
//!
//! Order of operations (as llama.cpp / HF): repetition penalty on raw logits → greedy if
//! temperature is 0 → temperature → top-k → softmax → min-p → top-p → draw. Deterministic for a
//! given seed: the only randomness is one xoshiro256** draw per sampled token.

use crate::error::ModelError;
use std::collections::HashSet;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 = greedy (argmax). Must be finite and >= 0.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Nucleus: keep the smallest set with cumulative probability >= top_p; in (0, 1], 1 = off.
    pub top_p: f32,
    /// Drop tokens with probability < min_p · p(most likely); in [0, 1), 0 = off.
    pub min_p: f32,
    /// > 1 discourages tokens seen in the last `repeat_last_n` history tokens; 1 = off.
    pub repetition_penalty: f32,
    /// History window for the penalty; 0 = off.
    pub repeat_last_n: usize,
    /// `None` seeds from the clock (not reproducible).
    pub seed: Option<u64>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            seed: None,
        }
    }
}

impl SamplerParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::InvalidSampling(msg));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            return bad(format!("min_p must be in [0, 1), got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition_penalty must be a finite number > 0, got {}",
                self.repetition_penalty
            ));
        }
        Ok(())
    }
}

pub struct Sampler {
    params: SamplerParams,
    rng: Xoshiro256,
    /// Reused per call: penalised logits, then (token, score) candidates.
    logits: Vec<f32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Result<Sampler, ModelError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(crate::platform::entropy_seed);
        Ok(Sampler {
            params,
            rng: Xoshiro256::new(seed),
            logits: Vec::new(),
            candidates: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Pick the next token from `logits` (`[vocab]`); `history` is the context so far (only its
    /// last `repeat_last_n` tokens matter). NaN logits count as -inf; an all -inf row yields 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        self.logits.clear();
        self.logits.extend(
            logits
                .iter()
                .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l }),
        );
        if p.repetition_penalty != 1.0 && p.repeat_last_n > 0 {
            let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
            let seen: HashSet<u32> = window.iter().copied().collect();
            for token in seen {
                if let Some(l) = self.logits.get_mut(token as usize) {
                    // CTRL-style: shrink positive logits, push negative ones further down.
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.temperature == 0.0 || p.top_k == 1 {
            return argmax(&self.logits);
        }

        let inv_t = 1.0 / p.temperature;
        self.candidates.clear();
        self.candidates.extend(
            self.logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l * inv_t)),
        );
        if self.candidates.is_empty() {
            return 0;
        }
        let by_score_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < self.candidates.len() {
            self.candidates
                .select_nth_unstable_by(p.top_k - 1, by_score_desc);
            self.candidates.truncate(p.top_k);
        }
        // min-p in log space: p_i >= min_p · p_max  <=>  s_i >= s_max + ln(min_p).
        let max_score = self
            .candidates
            .iter()
            .map(|c| c.1)
            .fold(f32::NEG_INFINITY, f32::max);
        if p.min_p > 0.0 {
            let floor = max_score + p.min_p.ln();
            self.candidates.retain(|c| c.1 >= floor);
        }
        // Softmax weights (unnormalised; the draw scales by the total).
        for c in self.candidates.iter_mut() {
            c.1 = (c.1 - max_score).exp();
        }
        if p.top_p < 1.0 {
            let total: f32 = self.candidates.iter().map(|c| c.1).sum();
            let kept = nucleus_len(&mut self.candidates, p.top_p * total);
            self.candidates.truncate(kept);
        } else {
            // Fixed order so a given seed always maps to the same token.
            self.candidates.sort_unstable_by_key(|c| c.0);
        }
        let total: f32 = self.candidates.iter().map(|c| c.1).sum();
        let mut target = self.rng.next_f64() as f32 * total;
        for c in &self.candidates {
            target -= c.1;
            if target < 0.0 {
                return c.0;
            }
        }
        self.candidates.last().map_or(0, |c| c.0)
    }
}

/// Sort by weight (descending, ties by id) just far enough to find the smallest prefix whose
/// weight reaches `mass`; returns its length. Sorting a growing prefix keeps the common case
/// (a peaked distribution over a 50k vocabulary) far cheaper than a full sort.
fn nucleus_len(candidates: &mut [(u32, f32)], mass: f32) -> usize {
    let by_weight_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut prefix = 64.min(candidates.len());
    loop {
        if prefix < candidates.len() {
            candidates.select_nth_unstable_by(prefix - 1, by_weight_desc);
        }
        candidates[..prefix].sort_unstable_by(by_weight_desc);
        let mut cumulative = 0.0;
        for (i, c) in candidates[..prefix].iter().enumerate() {
            cumulative += c.1;
            if cumulative >= mass {
                return i + 1;
            }
        }
        if prefix == candidates.len() {
            return prefix;
        }
        prefix = (prefix * 4).min(candidates.len());
    }
}

/// First index of the largest value (NaN already mapped to -inf by the caller).
fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// xoshiro256** (Blackman & Vigna), seeded through splitmix64.
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256 {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect()
    }

    fn params(seed: u64) -> SamplerParams {
        SamplerParams {
            temperature: 1.0,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.01,
            repetition_penalty: 1.1,
            repeat_last_n: 8,
            seed: Some(seed),
        }
    }

    fn draw(p: SamplerParams, n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p).unwrap();
        let l = logits();
        let mut history = vec![];
        for _ in 0..n {
            let t = s.sample(&l, &history);
            history.push(t);
        }
        history
    }

    #[test]
    fn same_seed_same_tokens() {
        assert_eq!(draw(params(42), 50), draw(params(42), 50));
        assert_ne!(draw(params(42), 50), draw(params(43), 50));
        let plain = SamplerParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..params(5)
        };
        assert_eq!(draw(plain.clone(), 50), draw(plain, 50));
    }

    #[test]
    fn greedy_is_argmax_and_penalty_applies() {
        let mut s = Sampler::new(SamplerParams::default()).unwrap();
        let l = [0.5, 2.0, f32::NAN, 1.9];
        assert_eq!(s.sample(&l, &[]), 1);
        let mut penalised = Sampler::new(SamplerParams {
            repetition_penalty: 2.0,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(penalised.sample(&l, &[1]), 3);
        // Outside the window the penalty no longer applies.
        let mut narrow = Sampler::new(SamplerParams {
            repetition_penalty: 2.0,
            repeat_last_n: 1,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(narrow.sample(&l, &[1, 0]), 1);
    }

    #[test]
    fn filters_restrict_the_support() {
        let l = logits();
        let top: Vec<u32> = {
            let mut idx: Vec<u32> = (0..l.len() as u32).collect();
            idx.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
            idx[..3].to_vec()
        };
        let mut s = Sampler::new(SamplerParams {
            temperature: 5.0,
            top_k: 3,
            seed: Some(1),
            ..Default::default()
        })
        .unwrap();
        for _ in 0..200 {
            assert!(top.contains(&s.sample(&l, &[])));
        }
        // A tiny top_p keeps only the most likely token.
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_p: 1e-6,
            seed: Some(1),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.sample(&l, &[]), top[0]);
        // min_p near 1 keeps only the most likely token too.
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            min_p: 0.999,
            seed: Some(1),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.sample(&l, &[]), top[0]);
    }

    #[test]
    fn invalid_values_are_errors() {
        for p in [
            SamplerParams {
                temperature: -0.1,
                ..Default::default()
            },
            SamplerParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            SamplerParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplerParams {
                top_p: 1.5,
                ..Default::default()
            },
            SamplerParams {
                min_p: 1.0,
                ..Default::default()
            },
            SamplerParams {
                min_p: -0.5,
                ..Default::default()
            },
            SamplerParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
        ] {
            assert!(matches!(
                Sampler::new(p),
                Err(ModelError::InvalidSampling(_))
            ));
        }
    }

    #[test]
    fn degenerate_rows_do_not_panic() {
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            seed: Some(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 4], &[]), 0);
        assert_eq!(s.sample(&[], &[]), 0);
        assert_eq!(s.sample(&[f32::NAN, 1.0], &[7, 99]), 1);
    }
}
