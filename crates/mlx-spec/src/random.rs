//! Randomness the hosts need that no result depends on being
//! reproducible: the seed of a request that names none (mlx-lm and OpenAI
//! sample afresh each time unless given a seed) and unique ids.

use std::hash::BuildHasher;

/// A fresh random `u64`. Each `RandomState` is keyed from the OS's
/// randomness and differs from the last one this process made.
pub fn fresh_u64() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// The sampler's seed: `seed` when given, else a fresh one.
pub fn seed_or_fresh(seed: Option<u64>) -> u64 {
    seed.unwrap_or_else(fresh_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_values_differ_and_a_given_seed_is_kept() {
        let draws: std::collections::BTreeSet<u64> = (0..64).map(|_| fresh_u64()).collect();
        assert_eq!(draws.len(), 64, "64 draws, 64 values");
        assert_eq!(seed_or_fresh(Some(7)), 7);
        assert_ne!(seed_or_fresh(None), seed_or_fresh(None));
    }
}
