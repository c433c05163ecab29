//! Acceptance estimates that outlive a request: per provider, what its
//! finished requests measured per draft position, as the starting
//! estimates of its next requests.
//!
//! A request of a hundred tokens lives a handful of rounds, too few for its
//! own estimates to leave the constant priors ([`crate::adaptive`]); its
//! provider's previous requests on this server have measured how far such
//! drafts go. Only draft lengths follow from them: never a token.

use std::collections::HashMap;

/// Weight of a finished request in its provider's estimates (one short
/// request's few rounds are noisy: the last few requests together set a
/// new one's start).
const FOLD_RATE: f64 = 0.2;
/// Providers remembered at most (ids come from requests).
const PROVIDERS: usize = 64;

/// Per-position acceptance estimates and how far rounds reached them, as
/// [`crate::adaptive::DraftController`] keeps them: `[after any other
/// round, after a fully accepted round]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    /// `accept[hot][m]`: chance the draft at position `m + 1` is accepted
    /// once the ones before it were.
    pub accept: [Vec<f64>; 2],
    /// How many leading positions of each a round reached.
    pub reached: [usize; 2],
}

/// The estimates finished requests left, per provider id.
#[derive(Debug, Clone, Default)]
pub struct ProviderPriors {
    by_provider: HashMap<String, Learned>,
}

impl ProviderPriors {
    /// What `provider`'s finished requests measured, if any did.
    pub fn get(&self, provider: &str) -> Option<&Learned> {
        self.by_provider.get(provider)
    }

    /// Folds a finished request's estimates into its provider's: each
    /// position it reached moves toward its value; the others keep theirs.
    pub fn absorb(&mut self, provider: &str, request: &Learned) {
        if let Some(prior) = self.by_provider.get_mut(provider) {
            for state in 0..2 {
                let reached = request.reached[state].min(request.accept[state].len());
                let accept = &mut prior.accept[state];
                if accept.len() < reached {
                    let last = accept.last().copied();
                    let fill = |m: usize| last.unwrap_or(request.accept[state][m]);
                    let from = accept.len();
                    accept.extend((from..reached).map(fill));
                }
                for (a, r) in accept.iter_mut().zip(&request.accept[state][..reached]) {
                    if r.is_finite() {
                        *a += FOLD_RATE * (r.clamp(0.0, 1.0) - *a);
                    }
                }
                prior.reached[state] = prior.reached[state].max(reached);
            }
            return;
        }
        if self.by_provider.len() >= PROVIDERS {
            return;
        }
        let mut first = request.clone();
        for state in 0..2 {
            for a in &mut first.accept[state] {
                *a = if a.is_finite() {
                    a.clamp(0.0, 1.0)
                } else {
                    0.5
                };
            }
        }
        self.by_provider.insert(provider.to_owned(), first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned(cold: &[f64], hot: &[f64], reached: [usize; 2]) -> Learned {
        Learned {
            accept: [cold.to_vec(), hot.to_vec()],
            reached,
        }
    }

    #[test]
    fn requests_fold_into_their_providers_estimates() {
        let mut p = ProviderPriors::default();
        assert!(p.get("prompt-lookup").is_none());
        p.absorb(
            "prompt-lookup",
            &learned(&[0.9, 0.5, 0.5], &[0.8; 3], [1, 0]),
        );
        let first = p.get("prompt-lookup").expect("absorbed");
        assert_eq!(first.reached, [1, 0]);
        assert_eq!(first.accept[0][0], 0.9);
        // A second request reaching two positions after a full round.
        p.absorb(
            "prompt-lookup",
            &learned(&[0.5, 0.2], &[1.0, 0.6, 0.8], [0, 2]),
        );
        let both = p.get("prompt-lookup").expect("absorbed");
        assert_eq!(
            both.accept[0][0], 0.9,
            "a position it did not reach keeps its value"
        );
        // The first request's hot estimates (0.8) moved towards [1.0, 0.6].
        let folded = [0.8 + FOLD_RATE * 0.2, 0.8 - FOLD_RATE * 0.2];
        assert_eq!(both.accept[1][..2], folded);
        assert_eq!(both.reached, [1, 2]);
        // Another provider is apart; nonsense values are bounded.
        p.absorb("suffix", &learned(&[f64::NAN, 7.0], &[0.8; 2], [2, 0]));
        let other = p.get("suffix").expect("absorbed");
        assert_eq!(other.accept[0], vec![0.5, 1.0]);
        assert_eq!(p.get("prompt-lookup").expect("kept").reached, [1, 2]);
    }

    #[test]
    fn a_longer_request_extends_the_estimates() {
        let mut p = ProviderPriors::default();
        p.absorb("x", &learned(&[0.7, 0.6], &[0.8; 2], [2, 0]));
        p.absorb("x", &learned(&[0.9, 0.8, 0.7, 0.6], &[0.8; 4], [4, 0]));
        let x = p.get("x").expect("absorbed");
        assert_eq!(x.accept[0].len(), 4);
        assert_eq!(x.reached[0], 4);
        // The new positions start from the deepest known, then move.
        assert!((x.accept[0][3] - (0.6 + FOLD_RATE * (0.6 - 0.6))).abs() < 1e-12);
        assert!((x.accept[0][2] - (0.6 + FOLD_RATE * (0.7 - 0.6))).abs() < 1e-12);
    }
}
