//! Lossless rejection sampling (Leviathan et al., 2023) on one position's
//! distributions, as host-side probability vectors.

use rand::Rng;

/// Outcome at one drafted position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The draft token stands.
    Accept,
    /// The draft token is replaced by this one and the round ends.
    Replace(u32),
}

/// Judges draft token `x` under target probabilities `p` and draft
/// probabilities `q` (`None`: the proposal was deterministic, `q(x) = 1`).
/// Accepts with probability `min(1, p(x) / q(x))`; otherwise samples from
/// the residual `norm(max(p - q, 0))`.
pub fn judge(p: &[f32], q: Option<&[f32]>, x: u32, rng: &mut impl Rng) -> Verdict {
    let xi = x as usize;
    let px = f64::from(p.get(xi).copied().unwrap_or(0.0));
    let qx = match q {
        Some(q) => f64::from(q.get(xi).copied().unwrap_or(0.0)),
        None => 1.0,
    };
    let u: f64 = rng.random();
    if qx > 0.0 && u < (px / qx).min(1.0) {
        return Verdict::Accept;
    }
    let residual: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(i, &pi)| {
            let qi = match q {
                Some(q) => f64::from(q.get(i).copied().unwrap_or(0.0)),
                None => {
                    if i == xi {
                        1.0
                    } else {
                        0.0
                    }
                }
            };
            (f64::from(pi) - qi).max(0.0)
        })
        .collect();
    let total: f64 = residual.iter().sum();
    if total <= 0.0 {
        // p <= q everywhere means p == q: rejection has probability 0; if
        // rounding got here, p itself is the right distribution.
        return Verdict::Replace(sample(p, rng));
    }
    Verdict::Replace(sample_weights(&residual, total, rng))
}

/// Draws an index from probabilities `p`.
pub fn sample(p: &[f32], rng: &mut impl Rng) -> u32 {
    let weights: Vec<f64> = p.iter().map(|&v| f64::from(v.max(0.0))).collect();
    let total = weights.iter().sum();
    sample_weights(&weights, total, rng)
}

fn sample_weights(weights: &[f64], total: f64, rng: &mut impl Rng) -> u32 {
    let mut u: f64 = rng.random::<f64>() * total;
    let mut last_positive = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            last_positive = i;
            if u < w {
                return i as u32;
            }
            u -= w;
        }
    }
    last_positive as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const P: [f32; 5] = [0.05, 0.4, 0.25, 0.2, 0.1];
    const Q: [f32; 5] = [0.3, 0.1, 0.3, 0.1, 0.2];

    /// Pearson's chi-square of observed counts against `p`.
    fn chi_square(counts: &[usize], p: &[f32]) -> f64 {
        let n: usize = counts.iter().sum();
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pi)| {
                let e = n as f64 * f64::from(pi);
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// One speculative step: draw x ~ q, judge it; the emitted token must be
    /// distributed as p whatever q is.
    fn emitted_counts(
        verifier: impl Fn(&[f32], Option<&[f32]>, u32, &mut StdRng) -> Verdict,
        q: Option<&[f32]>,
        draws: usize,
    ) -> Vec<usize> {
        let mut rng = StdRng::seed_from_u64(2024);
        let mut counts = vec![0; P.len()];
        for _ in 0..draws {
            let x = match q {
                Some(q) => sample(q, &mut rng),
                None => 2, // a fixed proposal, as prompt lookup makes
            };
            let token = match verifier(&P, q, x, &mut rng) {
                Verdict::Accept => x,
                Verdict::Replace(t) => t,
            };
            counts[token as usize] += 1;
        }
        counts
    }

    // Chi-square critical value for 4 degrees of freedom at p = 0.001.
    const CRITICAL: f64 = 18.47;

    #[test]
    fn rejection_sampling_preserves_the_target_distribution() {
        let stochastic = emitted_counts(judge, Some(&Q), 20_000);
        assert!(chi_square(&stochastic, &P) < CRITICAL, "{stochastic:?}");
        let point = emitted_counts(judge, None, 20_000);
        assert!(chi_square(&point, &P) < CRITICAL, "{point:?}");
    }

    #[test]
    fn a_wrong_verifier_fails_the_same_test() {
        // Resampling from p instead of the residual on rejection: the classic bug.
        let wrong = |p: &[f32], q: Option<&[f32]>, x: u32, r: &mut StdRng| {
            let px = f64::from(p[x as usize]);
            let qx = q.map_or(1.0, |q| f64::from(q[x as usize]));
            if r.random::<f64>() < (px / qx).min(1.0) {
                Verdict::Accept
            } else {
                Verdict::Replace(sample(p, r))
            }
        };
        let counts = emitted_counts(wrong, Some(&Q), 20_000);
        assert!(chi_square(&counts, &P) > CRITICAL, "{counts:?}");
        // Comparing sampled tokens instead of probabilities (accept iff a
        // fresh target sample equals the draft) also fails.
        let compare_samples = |p: &[f32], _q: Option<&[f32]>, x: u32, r: &mut StdRng| {
            let t = sample(p, r);
            if t == x {
                Verdict::Accept
            } else {
                Verdict::Replace(sample(p, r))
            }
        };
        let counts = emitted_counts(compare_samples, Some(&Q), 20_000);
        assert!(chi_square(&counts, &P) > CRITICAL, "{counts:?}");
    }
}
