//! The provider's settings and their parsing from `ProviderOptions`.

use spec_core::{OptionRange, ProviderOptions, RequestOption, SpecError};

use crate::trie::SpecLimits;
use crate::ID;

/// The option keys `SuffixConfig::from_options` accepts, sorted.
pub const OPTION_KEYS: [&str; 8] = [
    "global_per_tenant",
    "max_depth",
    "max_spec_factor",
    "max_spec_offset",
    "max_tree_tokens",
    "min_token_prob",
    "num_draft",
    "prompt_in_global",
];

/// The options a request may set: how much a match proposes. The tree's
/// depth and budget, and which requests share a global tree
/// (`prompt_in_global`, `global_per_tenant`), are the operator's.
pub const REQUEST_OPTIONS: &[RequestOption] = &[
    RequestOption {
        key: "max_spec_factor",
        range: OptionRange::Number {
            min: 0.0,
            max: 16.0,
        },
    },
    RequestOption {
        key: "max_spec_offset",
        range: OptionRange::Number {
            min: -64.0,
            max: 64.0,
        },
    },
    RequestOption {
        key: "min_token_prob",
        range: OptionRange::Number { min: 0.0, max: 1.0 },
    },
    RequestOption {
        key: "num_draft",
        range: OptionRange::Whole { min: 1, max: 64 },
    },
];

/// The largest `max_depth` accepted: the trie holds up to `max_depth`
/// nodes per token, so a huge depth is a memory bomb, not a setting.
pub const MAX_DEPTH_LIMIT: usize = 256;

/// Settings of suffix decoding.
///
/// Defaults: `max_depth = 24`, `max_tree_tokens = 100000`,
/// `max_spec_factor = 1.0`, `max_spec_offset = 0.0`,
/// `min_token_prob = 0.1`, `prompt_in_global = false`,
/// `global_per_tenant = true`, no `num_draft` cap.
///
/// - `max_depth`: suffixes are indexed up to this many tokens, so a match
///   is at most `max_depth - 1` tokens and a match plus its continuation at
///   most `max_depth` (ArcticInference's `max_tree_depth`; 24 is vLLM's
///   default for its `suffix` method, the library's own is 64).
/// - `max_tree_tokens`: the global tree's budget in tokens. When a
///   finished request would exceed it, whole requests are evicted, least
///   recently used first (a request is used when it joins and when a draft
///   from the global tree continues a match found in it); a request longer than the budget keeps only its last
///   `max_tree_tokens` tokens; 0 disables the global tree. (The reference
///   bounds the number of requests, `max_cached_requests`, instead.)
///   Memory: the trie is uncompressed, so it holds up to `max_depth` nodes
///   per token; 100000 tokens with no repeats at depth 24 measured 184 MB
///   resident (157 MB for agent-like text with repeated phrases).
/// - `max_spec_factor`, `max_spec_offset`: a match of `m` tokens proposes
///   at most `floor(m * factor + offset)` tokens.
/// - `min_token_prob`: the proposal stops before the first token whose
///   estimated probability (the product of frequency ratios along the
///   path) is below it.
/// - `prompt_in_global`: whether a finished request's prompt joins the
///   global tree with its output (the reference caches outputs only).
/// - `global_per_tenant`: one global tree per tenant (the host's
///   `OpenContext::tenant`; the server's API key identity), each with its
///   own `max_tree_tokens` budget, so nothing one tenant's requests
///   produced is drafted for another's; requests without a tenant share one
///   more tree. Off (an operator's choice): one tree for every request the
///   provider serves, so one tenant's outputs can be drafted for another.
/// - `num_draft`: unset, the serve loop's per-round length decides alone;
///   set, drafts never exceed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuffixConfig {
    /// Longest suffix indexed (1..=`MAX_DEPTH_LIMIT`).
    pub max_depth: usize,
    /// Global tree budget in tokens (0: no global tree).
    pub max_tree_tokens: usize,
    /// Tokens proposed per matched token (finite, at least 0).
    pub max_spec_factor: f32,
    /// Tokens proposed on top of the factor's (finite).
    pub max_spec_offset: f32,
    /// Cut-off probability (0..=1).
    pub min_token_prob: f32,
    /// Whether finished prompts join the global tree.
    pub prompt_in_global: bool,
    /// One global tree per tenant.
    pub global_per_tenant: bool,
    /// Most tokens per draft, on top of the serve loop's limit.
    pub num_draft: Option<usize>,
}

impl Default for SuffixConfig {
    fn default() -> Self {
        Self {
            max_depth: 24,
            max_tree_tokens: 100_000,
            max_spec_factor: 1.0,
            max_spec_offset: 0.0,
            min_token_prob: 0.1,
            prompt_in_global: false,
            global_per_tenant: true,
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

impl SuffixConfig {
    /// Parses the options (every key optional; see `OPTION_KEYS`) over the
    /// defaults and validates the result. Unknown keys and unparsable
    /// values are errors naming the key and the value.
    pub fn from_options(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, &OPTION_KEYS)?;
        let d = Self::default();
        let config = Self {
            max_depth: options.positive("max_depth")?.unwrap_or(d.max_depth),
            max_tree_tokens: options
                .get::<usize>("max_tree_tokens")?
                .unwrap_or(d.max_tree_tokens),
            max_spec_factor: options
                .get::<f32>("max_spec_factor")?
                .unwrap_or(d.max_spec_factor),
            max_spec_offset: options
                .get::<f32>("max_spec_offset")?
                .unwrap_or(d.max_spec_offset),
            min_token_prob: options
                .get::<f32>("min_token_prob")?
                .unwrap_or(d.min_token_prob),
            prompt_in_global: options
                .choice("prompt_in_global", &[("true", true), ("false", false)])?
                .unwrap_or(d.prompt_in_global),
            global_per_tenant: options
                .choice("global_per_tenant", &[("true", true), ("false", false)])?
                .unwrap_or(d.global_per_tenant),
            num_draft: options.positive("num_draft")?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the ranges documented on each field.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.max_depth == 0 || self.max_depth > MAX_DEPTH_LIMIT {
            return Err(provider_error(format!(
                "`max_depth` must be 1..={MAX_DEPTH_LIMIT}, got {}",
                self.max_depth
            )));
        }
        if !(self.max_spec_factor.is_finite() && self.max_spec_factor >= 0.0) {
            return Err(provider_error(format!(
                "`max_spec_factor` must be a finite number of at least 0, got {}",
                self.max_spec_factor
            )));
        }
        if !self.max_spec_offset.is_finite() {
            return Err(provider_error(format!(
                "`max_spec_offset` must be finite, got {}",
                self.max_spec_offset
            )));
        }
        if !(0.0..=1.0).contains(&self.min_token_prob) {
            return Err(provider_error(format!(
                "`min_token_prob` must be in 0..=1, got {}",
                self.min_token_prob
            )));
        }
        if self.num_draft == Some(0) {
            return Err(provider_error(
                "`num_draft` must be at least 1, got 0".to_owned(),
            ));
        }
        Ok(())
    }

    /// The proposal limits for a round allowing `max_tokens`.
    pub fn limits(&self, max_tokens: usize) -> SpecLimits {
        SpecLimits {
            max_tokens: self.num_draft.map_or(max_tokens, |n| n.min(max_tokens)),
            max_spec_factor: self.max_spec_factor,
            max_spec_offset: self.max_spec_offset,
            min_token_prob: self.min_token_prob,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<SuffixConfig, String> {
        let options: ProviderOptions = pairs.iter().copied().collect();
        SuffixConfig::from_options(&options).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_every_option() {
        assert_eq!(parse(&[]), Ok(SuffixConfig::default()));
        assert_eq!(
            parse(&[
                ("max_depth", "8"),
                ("max_tree_tokens", "0"),
                ("max_spec_factor", "2.5"),
                ("max_spec_offset", "-1"),
                ("min_token_prob", "0"),
                ("prompt_in_global", "true"),
                ("global_per_tenant", "false"),
                ("num_draft", "5"),
            ]),
            Ok(SuffixConfig {
                max_depth: 8,
                max_tree_tokens: 0,
                max_spec_factor: 2.5,
                max_spec_offset: -1.0,
                min_token_prob: 0.0,
                prompt_in_global: true,
                global_per_tenant: false,
                num_draft: Some(5),
            })
        );
    }

    #[test]
    fn bad_values_name_the_key_and_the_value() {
        let cases: [(&[(&str, &str)], &str); 9] = [
            (&[("max_depth", "0")], "`max_depth` = `0`"),
            (
                &[("max_depth", "257")],
                "`max_depth` must be 1..=256, got 257",
            ),
            (&[("max_tree_tokens", "-3")], "`max_tree_tokens` = `-3`"),
            (&[("max_spec_factor", "-1")], "`max_spec_factor` must be"),
            (&[("max_spec_factor", "inf")], "`max_spec_factor` must be"),
            (
                &[("max_spec_offset", "NaN")],
                "`max_spec_offset` must be finite",
            ),
            (
                &[("min_token_prob", "1.5")],
                "`min_token_prob` must be in 0..=1",
            ),
            (&[("prompt_in_global", "yes")], "expected true or false"),
            (&[("per_key", "true")], "unknown option `per_key`"),
        ];
        for (pairs, fragment) in cases {
            let message = parse(pairs).expect_err("invalid");
            assert!(message.contains("`suffix`"), "{message}");
            assert!(message.contains(fragment), "{pairs:?}: `{message}`");
        }
    }

    #[test]
    fn limits_apply_the_num_draft_cap() {
        let capped = SuffixConfig {
            num_draft: Some(4),
            ..Default::default()
        };
        assert_eq!(capped.limits(10).max_tokens, 4);
        assert_eq!(capped.limits(2).max_tokens, 2);
        assert_eq!(SuffixConfig::default().limits(10).max_tokens, 10);
    }
}
