//! Which provider options a request may set. A provider's options split
//! in two: the operator's (paths, model directories, sizes of global
//! state: given once, when the host starts) and the request's (draft
//! lengths, n-gram sizes, thresholds), each declared here with the values
//! it may take. A host checks a request's options against the provider's
//! list ([`check_request_options`]) before anything is built, and merges
//! them over the operator's, never replacing those.

use crate::{ProviderOptions, SpecError};

/// One option a request may set, and the values it may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestOption {
    /// The option's key (as the provider reads it).
    pub key: &'static str,
    /// The values accepted.
    pub range: OptionRange,
}

/// The values a [`RequestOption`] accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptionRange {
    /// A whole number in `min..=max`.
    Whole {
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
    /// A finite number in `min..=max`.
    Number {
        /// Smallest accepted.
        min: f64,
        /// Largest accepted.
        max: f64,
    },
    /// `true` or `false`.
    Flag,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

impl OptionRange {
    /// Whether `value` is in range; the error says what is expected.
    pub fn check(&self, value: &str) -> Result<(), String> {
        let ok = match *self {
            Self::Whole { min, max } => {
                value.parse::<u64>().is_ok_and(|v| (min..=max).contains(&v))
            }
            Self::Number { min, max } => value
                .parse::<f64>()
                .is_ok_and(|v| v.is_finite() && (min..=max).contains(&v)),
            Self::Flag => matches!(value, "true" | "false"),
            Self::OneOf(words) => words.contains(&value),
        };
        if ok {
            Ok(())
        } else {
            Err(format!("expected {}, got `{value}`", self.describe()))
        }
    }

    /// What it accepts, in words.
    pub fn describe(&self) -> String {
        match *self {
            Self::Whole { min, max } => format!("a whole number from {min} to {max}"),
            Self::Number { min, max } => format!("a number from {min} to {max}"),
            Self::Flag => "true or false".to_owned(),
            Self::OneOf(words) => format!("one of {}", words.join(", ")),
        }
    }
}

/// Checks a request's options for `provider`, which accepts `allowed`: a
/// key outside the list, or a value out of its range, is a
/// [`SpecError::RequestOption`] naming the provider and the key.
pub fn check_request_options(
    provider: &str,
    allowed: &[RequestOption],
    options: &ProviderOptions,
) -> Result<(), SpecError> {
    for (key, value) in options.iter() {
        let Some(option) = allowed.iter().find(|o| o.key == key) else {
            let reason = if allowed.is_empty() {
                "a request may set none of this provider's options".to_owned()
            } else {
                let keys: Vec<&str> = allowed.iter().map(|o| o.key).collect();
                format!(
                    "not an option a request may set (those are: {}; the others are the operator's)",
                    keys.join(", ")
                )
            };
            return Err(SpecError::RequestOption {
                provider: provider.to_owned(),
                key: key.to_owned(),
                reason,
            });
        };
        option
            .range
            .check(value)
            .map_err(|reason| SpecError::RequestOption {
                provider: provider.to_owned(),
                key: key.to_owned(),
                reason,
            })?;
    }
    Ok(())
}

/// The operator's options with a request's merged over them: the
/// request's keys (checked by [`check_request_options`]) replace theirs,
/// every other operator option stays.
pub fn merge_request_options(
    operator: &ProviderOptions,
    request: &ProviderOptions,
) -> ProviderOptions {
    let mut merged = operator.clone();
    merged.extend(request.iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOWED: &[RequestOption] = &[
        RequestOption {
            key: "max_ngram",
            range: OptionRange::Whole { min: 1, max: 16 },
        },
        RequestOption {
            key: "min_token_prob",
            range: OptionRange::Number { min: 0.0, max: 1.0 },
        },
        RequestOption {
            key: "greedy",
            range: OptionRange::Flag,
        },
        RequestOption {
            key: "positions",
            range: OptionRange::OneOf(&["constant", "advancing"]),
        },
    ];

    fn check(pairs: &[(&str, &str)]) -> Result<(), (String, String)> {
        let options: ProviderOptions = pairs.iter().copied().collect();
        check_request_options("p", ALLOWED, &options).map_err(|e| match e {
            SpecError::RequestOption {
                provider,
                key,
                reason,
            } => {
                assert_eq!(provider, "p");
                (key, reason)
            }
            other => panic!("expected a request-option error, got {other:?}"),
        })
    }

    #[test]
    fn in_range_values_pass() {
        let ok = [
            ("max_ngram", "1"),
            ("max_ngram", "16"),
            ("min_token_prob", "0.5"),
            ("greedy", "false"),
            ("positions", "advancing"),
        ];
        for pair in ok {
            assert_eq!(check(&[pair]), Ok(()), "{pair:?}");
        }
        assert_eq!(check(&[]), Ok(()));
    }

    #[test]
    fn keys_outside_the_list_and_values_out_of_range_name_the_key() {
        for (pair, fragment) in [
            (("model", "/etc"), "the others are the operator's"),
            (("max_ngram", "17"), "a whole number from 1 to 16"),
            (("max_ngram", "0"), "a whole number from 1 to 16"),
            (("max_ngram", "-1"), "got `-1`"),
            (("min_token_prob", "NaN"), "a number from 0 to 1"),
            (("min_token_prob", "inf"), "a number from 0 to 1"),
            (("greedy", "yes"), "true or false"),
            (("positions", "x"), "one of constant, advancing"),
        ] {
            let (key, reason) = check(&[pair]).expect_err("refused");
            assert_eq!(key, pair.0);
            assert!(reason.contains(fragment), "{pair:?}: {reason}");
        }
        let none = check_request_options("q", &[], &ProviderOptions::from([("threshold", "0.5")]))
            .expect_err("none allowed");
        assert_eq!(
            none.to_string(),
            "draft provider `q`: option `threshold` cannot be set by a request: \
             a request may set none of this provider's options"
        );
    }

    #[test]
    fn a_request_merges_over_the_operator_never_removing_its_keys() {
        let operator = ProviderOptions::from([
            ("model", "/models/drafter"),
            ("global_per_tenant", "true"),
            ("max_ngram", "4"),
        ]);
        let request = ProviderOptions::from([("max_ngram", "6")]);
        let merged = merge_request_options(&operator, &request);
        assert_eq!(
            merged,
            ProviderOptions::from([
                ("model", "/models/drafter"),
                ("global_per_tenant", "true"),
                ("max_ngram", "6"),
            ])
        );
    }
}
