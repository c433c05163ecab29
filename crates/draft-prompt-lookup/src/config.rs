//! The provider's settings and their parsing from `ProviderOptions`.

use spec_core::{OptionRange, ProviderOptions, RequestOption, SpecError};

use crate::ID;

/// The option keys `PromptLookupConfig::from_options` accepts, sorted.
pub const OPTION_KEYS: [&str; 3] = ["max_ngram", "min_ngram", "num_draft"];

/// The options a request may set (each size of the n-gram index is
/// bounded; nothing here names a file or sizes shared state).
pub const REQUEST_OPTIONS: &[RequestOption] = &[
    RequestOption {
        key: "min_ngram",
        range: OptionRange::Whole {
            min: 1,
            max: MAX_NGRAM_LIMIT as u64,
        },
    },
    RequestOption {
        key: "max_ngram",
        range: OptionRange::Whole {
            min: 1,
            max: MAX_NGRAM_LIMIT as u64,
        },
    },
    RequestOption {
        key: "num_draft",
        range: OptionRange::Whole { min: 1, max: 64 },
    },
];

/// The largest `max_ngram` accepted. Every token indexes one n-gram per
/// size, each stored as its own key, so memory and hashing grow with
/// `max_ngram²` per token; beyond a few tokens a longer match almost never
/// picks a different occurrence, so a huge value is a typo, not a setting.
pub const MAX_NGRAM_LIMIT: usize = 32;

/// Settings of prompt lookup decoding.
///
/// Defaults: `min_ngram = 2`, `max_ngram = 4`, no `num_draft` cap.
///
/// - `min_ngram = 2`: a single matching token is weak evidence. With a
///   vocabulary of tens of thousands, frequent tokens (spaces, newlines,
///   punctuation, "the") recur all over any context, so unigram matches
///   draft nearly every round and are mostly rejected. Rejected drafts
///   widen the verify window for nothing and, worse, drag the serve loop's
///   acceptance rate down until its adaptive controller pauses drafting for
///   the rest of the request. Two tokens in a row are far more specific.
/// - `max_ngram = 4`: once four tokens match, a longer match rarely selects
///   a different earlier occurrence, while each extra size costs one more
///   hash insert per token. Common practice sits at 3 to 4.
/// - `num_draft`: unset, the serve loop's per-round length (its
///   `num_draft` and adaptive controller) decides alone; set, drafts never
///   exceed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookupConfig {
    /// Shortest suffix n-gram that may produce a draft (at least 1).
    pub min_ngram: usize,
    /// Longest suffix n-gram tried first (at least `min_ngram`, at most
    /// `MAX_NGRAM_LIMIT`).
    pub max_ngram: usize,
    /// Most tokens per draft, on top of the serve loop's limit (`None`:
    /// the loop's limit only).
    pub num_draft: Option<usize>,
}

impl Default for PromptLookupConfig {
    fn default() -> Self {
        Self {
            min_ngram: 2,
            max_ngram: 4,
            num_draft: None,
        }
    }
}

fn provider_error(message: String) -> SpecError {
    SpecError::Provider {
        id: ID.to_owned(),
        message,
    }
}

impl PromptLookupConfig {
    /// Parses the options (every key optional; see `OPTION_KEYS`) over the
    /// defaults and validates the result. Unknown keys and unparsable
    /// values are errors naming the key and the value.
    pub fn from_options(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, &OPTION_KEYS)?;
        let defaults = Self::default();
        let config = Self {
            min_ngram: options.positive("min_ngram")?.unwrap_or(defaults.min_ngram),
            max_ngram: options.positive("max_ngram")?.unwrap_or(defaults.max_ngram),
            num_draft: options.positive("num_draft")?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks `1 <= min_ngram <= max_ngram <= MAX_NGRAM_LIMIT` and
    /// `num_draft >= 1`.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.min_ngram == 0 {
            return Err(provider_error(
                "`min_ngram` must be at least 1, got 0".to_owned(),
            ));
        }
        if self.max_ngram < self.min_ngram {
            return Err(provider_error(format!(
                "`max_ngram` ({}) must be at least `min_ngram` ({})",
                self.max_ngram, self.min_ngram
            )));
        }
        if self.max_ngram > MAX_NGRAM_LIMIT {
            return Err(provider_error(format!(
                "`max_ngram` ({}) exceeds the limit of {MAX_NGRAM_LIMIT}",
                self.max_ngram
            )));
        }
        if self.num_draft == Some(0) {
            return Err(provider_error(
                "`num_draft` must be at least 1, got 0".to_owned(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> ProviderOptions {
        pairs.iter().copied().collect()
    }

    /// `expected`: the config, or a fragment every part of which the error
    /// message must contain (split on `|`).
    fn check(pairs: &[(&str, &str)], expected: Result<PromptLookupConfig, &str>) {
        let got = PromptLookupConfig::from_options(&options(pairs));
        match (got, expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "options {pairs:?}"),
            (Err(SpecError::Provider { id, message }), Err(fragments)) => {
                assert_eq!(id, ID);
                for fragment in fragments.split('|') {
                    assert!(
                        message.contains(fragment),
                        "options {pairs:?}: `{message}` lacks `{fragment}`"
                    );
                }
            }
            (got, want) => panic!("options {pairs:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn empty_options_give_the_defaults() {
        check(
            &[],
            Ok(PromptLookupConfig {
                min_ngram: 2,
                max_ngram: 4,
                num_draft: None,
            }),
        );
    }

    #[test]
    fn every_option_is_parsed() {
        check(
            &[("min_ngram", "1")],
            Ok(PromptLookupConfig {
                min_ngram: 1,
                ..Default::default()
            }),
        );
        check(
            &[("max_ngram", "3")],
            Ok(PromptLookupConfig {
                max_ngram: 3,
                ..Default::default()
            }),
        );
        check(
            &[("num_draft", "5")],
            Ok(PromptLookupConfig {
                num_draft: Some(5),
                ..Default::default()
            }),
        );
        check(
            &[("min_ngram", "3"), ("max_ngram", "3"), ("num_draft", "1")],
            Ok(PromptLookupConfig {
                min_ngram: 3,
                max_ngram: 3,
                num_draft: Some(1),
            }),
        );
        check(
            &[("max_ngram", "32")],
            Ok(PromptLookupConfig {
                max_ngram: 32,
                ..Default::default()
            }),
        );
    }

    #[test]
    fn bad_values_name_the_key_and_the_value() {
        check(&[("min_ngram", "two")], Err("`min_ngram`|`two`"));
        check(&[("max_ngram", "-1")], Err("`max_ngram`|`-1`"));
        check(&[("num_draft", "")], Err("`num_draft`|``"));
        check(&[("num_draft", " 3")], Err("`num_draft`|` 3`"));
        check(&[("min_ngram", "0")], Err("`min_ngram`|`0`|at least 1"));
        check(&[("num_draft", "0")], Err("`num_draft`|`0`"));
        check(
            &[("max_ngram", "99999999999999999999999")],
            Err("`max_ngram`|`99999999999999999999999`"),
        );
    }

    #[test]
    fn unknown_keys_list_the_known_ones() {
        check(
            &[("model", "x.gguf")],
            Err("unknown option `model`|`x.gguf`|max_ngram, min_ngram, num_draft"),
        );
        check(
            &[("min_ngram", "2"), ("ngram", "3")],
            Err("unknown option `ngram`"),
        );
    }

    #[test]
    fn inconsistent_sizes_are_errors() {
        check(
            &[("max_ngram", "1")],
            Err("`max_ngram` (1) must be at least `min_ngram` (2)"),
        );
        check(
            &[("min_ngram", "5"), ("max_ngram", "4")],
            Err("`max_ngram` (4) must be at least `min_ngram` (5)"),
        );
        check(
            &[("max_ngram", "33")],
            Err("`max_ngram` (33) exceeds the limit of 32"),
        );
    }

    #[test]
    fn validate_rejects_what_options_cannot_express() {
        let zero_min = PromptLookupConfig {
            min_ngram: 0,
            ..Default::default()
        };
        assert!(matches!(
            zero_min.validate(),
            Err(SpecError::Provider { .. })
        ));
        let zero_cap = PromptLookupConfig {
            num_draft: Some(0),
            ..Default::default()
        };
        assert!(matches!(
            zero_cap.validate(),
            Err(SpecError::Provider { .. })
        ));
        assert!(PromptLookupConfig::default().validate().is_ok());
    }
}
