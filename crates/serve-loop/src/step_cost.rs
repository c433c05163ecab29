//! The step cost model: what one shared step costs as a function of its
//! rows and the tokens it runs, learned online from the scheduler's own
//! steps.
//!
//! Each step's wall time is fitted as `base + per_row * rows + per_token *
//! tokens` by exponentially weighted least squares (old steps fade, so the
//! model follows the machine as it warms up or gets busier). The rows term
//! is there because measurement asked for it: on the 2-core CPU of
//! docs/PERFORMANCE.md's batched-forward table a row costs about 3 ms of its
//! own beyond its tokens' 3.4 ms each, and a fit on tokens alone put part of
//! that on every draft token. Steps that cannot tell the two apart fall back
//! to fewer terms. A timing far from the model (a stalled step, a clock
//! jump) is rejected; a long run of rejections means the machine really
//! changed, and the model starts over. Timings never change what a request
//! emits, only how long it drafts.

/// Weight each older step keeps per new step (about 64 steps of memory).
const DECAY: f64 = 0.985;
/// Steps the model needs before it is trusted.
const MIN_STEPS: u32 = 8;
/// Timings above this are nonsense (a suspended process): clamped.
const MAX_SECONDS: f64 = 30.0;
/// A timing more than `OUTLIER_FACTOR` times the prediction away from it
/// (either way; plus [`OUTLIER_SLACK`]) is an outlier.
const OUTLIER_FACTOR: f64 = 4.0;
/// Absolute slack of the outlier test, for very short steps.
const OUTLIER_SLACK: f64 = 0.002;
/// Consecutive outliers after which the model restarts from them.
const RESTART_AFTER: u32 = 12;
/// Variance (in squared rows or tokens) under which a term cannot be
/// fitted.
const MIN_SPREAD: f64 = 0.01;

/// A fitted step cost, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Fit {
    /// Of every step.
    pub base: f64,
    /// Of each row of a step.
    pub per_row: f64,
    /// Of each token of a step.
    pub per_token: f64,
}

impl Fit {
    /// The predicted seconds of a step of `rows` rows and `tokens` tokens.
    pub fn seconds(&self, rows: usize, tokens: usize) -> f64 {
        self.base + self.per_row * rows as f64 + self.per_token * tokens as f64
    }
}

/// What the model knows, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCostStats {
    /// Fitted seconds of a step beyond its rows and tokens.
    pub base_seconds: f64,
    /// Fitted seconds per row of a step.
    pub per_row_seconds: f64,
    /// Fitted seconds per token of a step.
    pub per_token_seconds: f64,
    /// Steps the model learned from.
    pub samples: u64,
    /// Timings rejected as outliers.
    pub rejected: u64,
    /// Times the model restarted after a run of outliers.
    pub restarts: u64,
    /// Whether the model has seen enough steps to be used.
    pub ready: bool,
}

/// The online fit of step time against step rows and tokens.
#[derive(Debug, Clone, Default)]
pub struct StepCost {
    /// Weighted sums of 1, r, t, y, r*r, t*t, r*t, r*y, t*y.
    w: f64,
    sr: f64,
    st: f64,
    sy: f64,
    srr: f64,
    stt: f64,
    srt: f64,
    sry: f64,
    sty: f64,
    /// Steps since the last restart.
    fresh: u32,
    /// Consecutive outliers.
    streak: u32,
    samples: u64,
    rejected: u64,
    restarts: u64,
}

impl StepCost {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Learns a step of `rows` rows and `tokens` tokens that took
    /// `seconds`. Returns whether the timing was used (an outlier is not).
    pub fn observe(&mut self, rows: usize, tokens: usize, seconds: f64) -> bool {
        if rows == 0 || tokens < rows || !seconds.is_finite() {
            self.rejected += 1;
            return false;
        }
        let y = seconds.clamp(0.0, MAX_SECONDS);
        if let Some(fit) = self.fit() {
            let predicted = fit.seconds(rows, tokens);
            let outlier = y > predicted * OUTLIER_FACTOR + OUTLIER_SLACK
                || y * OUTLIER_FACTOR + OUTLIER_SLACK < predicted;
            if outlier {
                self.streak += 1;
                self.rejected += 1;
                if self.streak < RESTART_AFTER {
                    return false;
                }
                tracing::debug!(
                    seconds = y,
                    predicted,
                    "step timings moved away from the cost model: it starts over"
                );
                *self = Self {
                    samples: self.samples,
                    rejected: self.rejected,
                    restarts: self.restarts + 1,
                    ..Self::default()
                };
            }
        }
        self.streak = 0;
        let (r, t) = (rows as f64, tokens as f64);
        for (sum, value) in [
            (&mut self.w, 1.0),
            (&mut self.sr, r),
            (&mut self.st, t),
            (&mut self.sy, y),
            (&mut self.srr, r * r),
            (&mut self.stt, t * t),
            (&mut self.srt, r * t),
            (&mut self.sry, r * y),
            (&mut self.sty, t * y),
        ] {
            *sum = *sum * DECAY + value;
        }
        self.fresh = self.fresh.saturating_add(1);
        self.samples += 1;
        true
    }

    /// The fit once enough steps were seen; every term is non-negative. A
    /// term the steps cannot separate (every step the same rows, or rows
    /// and tokens moving together) is left out, its time counted in the
    /// others; steps all alike count wholly as base (drafting then looks
    /// free, which keeps each request's own length).
    pub fn fit(&self) -> Option<Fit> {
        if self.fresh < MIN_STEPS || self.w <= 0.0 {
            return None;
        }
        let w = self.w;
        let (mr, mt, my) = (self.sr / w, self.st / w, self.sy / w);
        let crr = self.srr / w - mr * mr;
        let ctt = self.stt / w - mt * mt;
        let crt = self.srt / w - mr * mt;
        let cry = self.sry / w - mr * my;
        let cty = self.sty / w - mt * my;
        let one = |c: f64, cy: f64| {
            if c > MIN_SPREAD {
                (cy / c).max(0.0)
            } else {
                0.0
            }
        };
        let det = crr * ctt - crt * crt;
        let both = (crr > MIN_SPREAD && ctt > MIN_SPREAD && det > 1e-3 * crr * ctt)
            .then(|| ((ctt * cry - crt * cty) / det, (crr * cty - crt * cry) / det))
            .filter(|&(per_row, per_token)| per_row >= 0.0 && per_token >= 0.0);
        let (per_row, per_token) = match both {
            Some(terms) => terms,
            // Tokens alone (a draft token's cost is what the policy needs),
            // else rows alone.
            None if ctt > MIN_SPREAD && cty > 0.0 => (0.0, one(ctt, cty)),
            None => (one(crr, cry), 0.0),
        };
        let base = (my - per_row * mr - per_token * mt).max(0.0);
        Some(Fit {
            base: base.min(MAX_SECONDS),
            per_row: per_row.min(MAX_SECONDS),
            per_token: per_token.min(MAX_SECONDS),
        })
    }

    /// What the model holds, for metrics.
    pub fn stats(&self) -> StepCostStats {
        let fit = self.fit();
        let f = fit.unwrap_or_default();
        StepCostStats {
            base_seconds: f.base,
            per_row_seconds: f.per_row,
            per_token_seconds: f.per_token,
            samples: self.samples,
            rejected: self.rejected,
            restarts: self.restarts,
            ready: fit.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of 1-8 rows drafting 0-4 tokens each.
    fn feed(model: &mut StepCost, truth: Fit, steps: usize) {
        for i in 0..steps {
            let rows = 1 + (i * 5) % 8;
            let tokens = rows + (i * 7) % (4 * rows + 1);
            model.observe(rows, tokens, truth.seconds(rows, tokens));
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 + 1e-3 * b.abs()
    }

    fn near(got: Fit, want: Fit) -> bool {
        close(got.base, want.base)
            && close(got.per_row, want.per_row)
            && close(got.per_token, want.per_token)
    }

    const CPU: Fit = Fit {
        base: 0.030,
        per_row: 0.003,
        per_token: 0.0034,
    };

    #[test]
    fn learns_base_per_row_and_per_token_from_steps() {
        let mut m = StepCost::new();
        assert_eq!(m.fit(), None, "no steps, no model");
        feed(&mut m, CPU, 7);
        assert_eq!(m.fit(), None, "too few steps");
        feed(&mut m, CPU, 30);
        let fit = m.fit().expect("ready");
        assert!(near(fit, CPU), "{fit:?}");
        assert!(m.stats().ready);
        assert!(close(m.stats().per_row_seconds, CPU.per_row));
    }

    #[test]
    fn terms_the_steps_cannot_separate_are_left_out_and_none_goes_negative() {
        let mut same = StepCost::new();
        for _ in 0..20 {
            same.observe(8, 8, 0.02);
        }
        let fit = same.fit().expect("ready");
        assert!(close(fit.base, 0.02) && fit.per_token == 0.0 && fit.per_row == 0.0);
        // No drafts: tokens and rows move together; the time per token is
        // found, the row term left out.
        let mut lone = StepCost::new();
        for i in 0..20 {
            let n = 1 + i % 6;
            lone.observe(n, n, 0.03 + 0.005 * n as f64);
        }
        let fit = lone.fit().expect("ready");
        assert!(close(fit.base, 0.03) && close(fit.per_token, 0.005) && fit.per_row == 0.0);
        let mut down = StepCost::new();
        for i in 0..20 {
            let tokens = 1 + i % 10;
            down.observe(1, tokens, 0.05 - 0.001 * tokens as f64);
        }
        let fit = down.fit().expect("ready");
        assert!(fit.per_token == 0.0 && fit.per_row == 0.0 && fit.base > 0.0);
    }

    #[test]
    fn outlier_timings_are_bounded_and_the_model_recovers() {
        let mut m = StepCost::new();
        feed(&mut m, CPU, 40);
        let before = m.fit().expect("ready");
        // A stalled step, a clock jump backwards, nonsense values.
        assert!(!m.observe(2, 10, 5.0));
        assert!(!m.observe(2, 10, 0.0));
        assert!(!m.observe(2, 10, f64::NAN));
        assert!(!m.observe(2, 10, f64::INFINITY));
        assert!(!m.observe(0, 0, 0.01));
        assert!(!m.observe(4, 2, 0.01));
        assert_eq!(m.fit(), Some(before), "outliers change nothing");
        assert_eq!(m.stats().rejected, 6);
        // Normal steps go on being learned.
        feed(&mut m, CPU, 5);
        assert!(near(m.fit().expect("ready"), CPU));

        // The machine really got 10x slower: after a run of outliers the
        // model starts over and learns the new costs.
        let slow = Fit {
            base: 0.3,
            per_row: 0.03,
            per_token: 0.034,
        };
        feed(&mut m, slow, 60);
        let fit = m.fit().expect("ready");
        assert!(near(fit, slow), "{fit:?}");
        assert_eq!(m.stats().restarts, 1);

        // Huge timings are clamped before they are learned.
        let mut fresh = StepCost::new();
        for _ in 0..20 {
            fresh.observe(1, 4, 1e9);
        }
        assert!(fresh.fit().expect("ready").seconds(1, 4) <= MAX_SECONDS);
    }
}
