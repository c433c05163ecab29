//! Comparing two frameworks' greedy runs. Unlike gate `parity` (same
//! libmlx on both sides, 0.0 expected), torch and MLX round differently, so
//! logits differ by float32 rounding, and a step whose two best tokens are
//! nearly tied may pick different tokens. Such a flip is explained only
//! when its top-2 margin is tiny on both sides; after it the two runs
//! continue from different tokens and are not compared further.

use super::super::compare::{first_difference, float_difference};
use super::super::parity::Output;

/// Largest logit difference two float32 implementations of the same model
/// may show. Measured here on logits of unit spread: about 2e-5, and 2.7e-4
/// at one ill-conditioned step of the Gemma-4 MoE model, where transformers
/// in float64 differs from each side by 1.4e-4 (rounding amplified by the
/// model, not a difference of computation). The Qwen3.5 MoE model has a
/// worse step (prompt 0, step 35): 1.2e-3 between the two sides, where
/// transformers in float64 is 2.2e-4 from ours and 1.4e-3 from its own
/// float32 run (chunked or recurrent Gated DeltaNet alike).
pub(super) const LOGIT_TOLERANCE: f32 = 2e-3;

/// Largest top-2 margin at which a token flip counts as rounding.
pub(super) const FLIP_MARGIN: f32 = 1e-4;

/// The first step of a run where the two sides chose different tokens, and
/// how close each side was to choosing the other's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Flip {
    pub run: usize,
    pub step: usize,
    pub reference: u32,
    pub ours: u32,
    /// Reference logits: its token's minus ours.
    pub reference_margin: f32,
    /// Our logits: our token's minus the reference's.
    pub our_margin: f32,
}

impl Flip {
    /// Both sides were within `FLIP_MARGIN` of choosing the other token.
    pub fn explained(&self) -> bool {
        self.reference_margin.abs() <= FLIP_MARGIN && self.our_margin.abs() <= FLIP_MARGIN
    }
}

#[derive(Debug, PartialEq)]
pub(super) struct Comparison {
    pub runs: usize,
    pub runs_equal: usize,
    pub flips: Vec<Flip>,
    /// Over every step both sides reached from the same tokens (a run's
    /// steps up to and including its flip).
    pub max_abs_diff: f32,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.max_abs_diff <= LOGIT_TOLERANCE && self.flips.iter().all(Flip::explained)
    }
}

/// Outputs come validated by `parity::read_output` with the same prompt
/// count, step count and vocabulary, so rows line up.
pub(super) fn compare(reference: &Output, ours: &Output, vocab: usize) -> Comparison {
    let mut flips = Vec::new();
    let mut max_abs_diff = 0.0f32;
    for (run, (a, b)) in reference.tokens.iter().zip(&ours.tokens).enumerate() {
        let (la, lb) = (&reference.logits[run], &ours.logits[run]);
        let flip_at = first_difference(a, b);
        let steps = flip_at.map_or(a.len(), |s| s + 1);
        for (&x, &y) in la.iter().zip(lb).take(steps * vocab) {
            max_abs_diff = max_abs_diff.max(float_difference(x, y));
        }
        if let Some(step) = flip_at {
            let row = |l: &[f32], t: u32| l[step * vocab + t as usize];
            let (r, o) = (a[step], b[step]);
            flips.push(Flip {
                run,
                step,
                reference: r,
                ours: o,
                reference_margin: row(la, r) - row(la, o),
                our_margin: row(lb, o) - row(lb, r),
            });
        }
    }
    Comparison {
        runs: reference.tokens.len(),
        runs_equal: reference.tokens.len() - flips.len(),
        flips,
        max_abs_diff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs over a vocabulary of 3.
    fn output(tokens: [[u32; 2]; 2], logits: [[f32; 6]; 2]) -> Output {
        Output {
            tokens: tokens.iter().map(|t| t.to_vec()).collect(),
            logits: logits.iter().map(|l| l.to_vec()).collect(),
        }
    }

    #[test]
    fn equal_tokens_pass_with_the_rounding_difference_reported() {
        let a = output([[0, 1], [2, 2]], [[3.0, 1.0, 0.0, 0.0, 2.0, 1.0]; 2]);
        let b = output([[0, 1], [2, 2]], [[3.0, 1.0, 0.0, 0.0, 2.0, 1.00002]; 2]);
        let c = compare(&a, &b, 3);
        assert_eq!((c.runs, c.runs_equal), (2, 2));
        assert!(c.flips.is_empty());
        assert!((c.max_abs_diff - 2e-5).abs() < 1e-6);
        assert!(c.passed());
    }

    #[test]
    fn a_near_tie_flip_is_explained_and_later_steps_are_not_compared() {
        // Run 1, step 0: tokens 1 and 2 nearly tied on both sides; the
        // step after it differs wildly (different history) and is ignored.
        let a = output(
            [[0, 1], [1, 0]],
            [
                [3.0, 0.0, 0.0, 0.0, 3.0, 0.0],
                [0.0, 2.0, 1.99999, 9.0, 0.0, 0.0],
            ],
        );
        let b = output(
            [[0, 1], [2, 2]],
            [
                [3.0, 0.0, 0.0, 0.0, 3.0, 0.0],
                [0.0, 1.99999, 2.0, 0.0, 0.0, 9.0],
            ],
        );
        let c = compare(&a, &b, 3);
        assert_eq!(c.runs_equal, 1);
        let flip = c.flips[0];
        assert_eq!(
            (flip.run, flip.step, flip.reference, flip.ours),
            (1, 0, 1, 2)
        );
        assert!(flip.explained(), "{flip:?}");
        assert!(c.max_abs_diff < 2e-5, "{}", c.max_abs_diff);
        assert!(c.passed());
    }

    #[test]
    fn a_flip_with_a_real_margin_or_a_large_difference_fails() {
        let a = output(
            [[0, 1], [1, 0]],
            [
                [3.0, 0.0, 0.0, 0.0, 3.0, 0.0],
                [0.0, 2.0, 1.5, 0.0, 0.0, 0.0],
            ],
        );
        let b = output(
            [[0, 1], [2, 2]],
            [
                [3.0, 0.0, 0.0, 0.0, 3.0, 0.0],
                [0.0, 1.5, 2.0, 0.0, 0.0, 0.0],
            ],
        );
        let c = compare(&a, &b, 3);
        assert!(!c.flips[0].explained());
        assert_eq!(c.flips[0].reference_margin, 0.5);
        assert!(!c.passed());

        let shifted = output([[0, 1], [2, 2]], [[3.0, 1.0, 0.0, 0.0, 2.01, 1.0]; 2]);
        let same = output([[0, 1], [2, 2]], [[3.0, 1.0, 0.0, 0.0, 2.0, 1.0]; 2]);
        let c = compare(&same, &shifted, 3);
        assert!(c.flips.is_empty() && !c.passed(), "{c:?}");
        let nan = output([[0, 1], [2, 2]], [[3.0, 1.0, 0.0, 0.0, f32::NAN, 1.0]; 2]);
        assert_eq!(compare(&same, &nan, 3).max_abs_diff, f32::INFINITY);
    }
}
