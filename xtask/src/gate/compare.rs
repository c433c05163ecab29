//! The one comparison of token and float sequences the gates share: where
//! two token runs first differ, and how far apart two float sequences are
//! (0.0 exactly when every bit agrees).

/// Where run `run` of two lists of token runs first differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// The run's index.
    pub run: usize,
    /// The first position whose tokens differ (or where the shorter run
    /// ends).
    pub position: usize,
    /// The left side's token there (`None`: its run ended).
    pub left: Option<u32>,
    /// The right side's.
    pub right: Option<u32>,
}

/// The first position where `a` and `b` differ, counting the end of the
/// shorter one; `None` when they are equal.
pub fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Compares run `i` of `a` with run `i` of `b` (up to the shorter list);
/// returns each differing run's first divergence.
pub fn token_runs<A: AsRef<[u32]>, B: AsRef<[u32]>>(a: &[A], b: &[B]) -> Vec<Divergence> {
    a.iter()
        .zip(b)
        .enumerate()
        .filter_map(|(run, (x, y))| {
            let (x, y) = (x.as_ref(), y.as_ref());
            first_difference(x, y).map(|position| Divergence {
                run,
                position,
                left: x.get(position).copied(),
                right: y.get(position).copied(),
            })
        })
        .collect()
}

/// |x - y|: 0.0 for equal bits, at least `f32::MIN_POSITIVE` for any other
/// (so `0.0` and `-0.0` differ), infinite where a NaN is involved.
pub fn float_difference(x: f32, y: f32) -> f32 {
    if x.to_bits() == y.to_bits() {
        return 0.0;
    }
    let d = (x - y).abs();
    if d.is_nan() {
        f32::INFINITY
    } else {
        d.max(f32::MIN_POSITIVE)
    }
}

/// The largest [`float_difference`] over two sequences, element by element
/// up to the shorter one: 0.0 exactly when every compared bit agrees.
pub fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| float_difference(x, y))
        .fold(0.0, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_diverge_at_the_first_differing_token_or_where_one_ends() {
        let a = [vec![1, 2, 3], vec![4, 5, 6], vec![7, 8]];
        let b = [vec![1, 2, 3], vec![4, 9, 0], vec![7, 8, 9]];
        assert_eq!(
            token_runs(&a, &b),
            [
                Divergence {
                    run: 1,
                    position: 1,
                    left: Some(5),
                    right: Some(9)
                },
                Divergence {
                    run: 2,
                    position: 2,
                    left: None,
                    right: Some(9)
                }
            ]
        );
        assert_eq!(first_difference(&[1, 2], &[1, 2]), None);
    }

    #[test]
    fn float_differences_are_zero_only_for_equal_bits() {
        assert_eq!(max_difference(&[1.0, f32::NAN], &[1.0, f32::NAN]), 0.0);
        assert_eq!(max_difference(&[1.0, 2.0], &[1.25, 2.5]), 0.5);
        assert_eq!(max_difference(&[1.0], &[f32::NAN]), f32::INFINITY);
        assert!(max_difference(&[0.0], &[-0.0]) > 0.0);
    }
}
