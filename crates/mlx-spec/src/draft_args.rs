//! The speculation flags of `generate` and `chat`: which draft provider,
//! its options, how many drafts a round, how they are verified and how
//! their lengths adapt.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serve_loop::{AdaptiveConfig, DraftPolicy, SpecConfig, VerifyMode};
use spec_core::ProviderOptions;

use crate::model_source;

/// The flags (mlx-lm's `--draft-model` and `--num-draft-tokens` among them).
#[derive(clap::Args, Debug, Clone)]
pub struct DraftArgs {
    /// Speculate with this draft provider (see `mlx-spec providers`).
    #[arg(long)]
    pub draft: Option<String>,
    /// Most draft tokens per round (default: the provider's, 3 for most,
    /// 16 for prompt-lookup).
    #[arg(long, visible_alias = "num-draft-tokens", value_parser = clap::value_parser!(u64).range(1..))]
    pub num_draft: Option<u64>,
    /// The drafter model of `--draft draft-model` (alone, as mlx-lm's, it
    /// selects that provider).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// A provider option `key=value` (repeatable).
    #[arg(long = "draft-option", value_name = "KEY=VALUE")]
    pub draft_options: Vec<String>,
    /// Verification: `exact` (mlx-lm's exact match) or `rejection` (lossless
    /// rejection sampling for temperature > 0).
    #[arg(long, default_value = "exact", value_parser = parse_verify)]
    pub verify: VerifyMode,
    /// Fixed draft length, never paused nor cut (mlx-lm's behaviour).
    #[arg(long)]
    pub no_adaptive: bool,
    /// How the adaptive controller's lengths are chosen: `goodput` (each
    /// step's lengths for the whole batch's tokens per second, within each
    /// request's own) or `per-row` (each request's controller alone).
    #[arg(long, default_value = "goodput", value_parser = parse_policy)]
    pub draft_policy: DraftPolicy,
}

impl DraftArgs {
    /// The provider's id: `--draft`, else `draft-model` when
    /// `--draft-model` names a drafter (mlx-lm's reading), else none.
    pub fn provider(&self) -> Option<&str> {
        match (&self.draft, &self.draft_model) {
            (Some(id), _) => Some(id),
            (None, Some(_)) => Some(draft_model::ID),
            (None, None) => None,
        }
    }

    /// The provider's options: `--draft-model` as `model`, then each
    /// `--draft-option` (model paths resolved as `--model`'s).
    pub fn options(&self) -> Result<ProviderOptions> {
        let mut options = ProviderOptions::new();
        if let Some(path) = &self.draft_model {
            let model = model_source::option_value("model", &path.to_string_lossy())?;
            options.insert("model".into(), model);
        }
        for kv in &self.draft_options {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--draft-option `{kv}`: expected KEY=VALUE"))?;
            options.insert(k.to_owned(), model_source::option_value(k, v)?);
        }
        if self.provider().is_none() && !self.draft_options.is_empty() {
            bail!("--draft-option needs --draft (the provider it is for)");
        }
        Ok(options)
    }

    /// The speculation settings: `--num-draft`, else the provider's own
    /// `default_num_draft`; `seed` seeds rejection sampling's draws.
    pub fn spec(&self, default_num_draft: usize, seed: u64) -> SpecConfig {
        SpecConfig {
            num_draft: self.num_draft.map_or(default_num_draft, |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            }),
            verify: self.verify,
            adaptive: if self.no_adaptive {
                AdaptiveConfig::off()
            } else {
                AdaptiveConfig::with_policy(self.draft_policy)
            },
            seed,
        }
    }
}

fn parse_verify(name: &str) -> std::result::Result<VerifyMode, String> {
    match name {
        "exact" => Ok(VerifyMode::ExactMatch),
        "rejection" => Ok(VerifyMode::Rejection),
        other => Err(format!("`{other}`: expected exact or rejection")),
    }
}

fn parse_policy(name: &str) -> std::result::Result<DraftPolicy, String> {
    DraftPolicy::parse(name)
        .ok_or_else(|| format!("`{name}` is no draft policy (goodput, per-row)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_parse(args: &[&str]) -> std::result::Result<DraftArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            flags: DraftArgs,
        }
        <Cli as clap::Parser>::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map(|c| c.flags)
    }

    #[test]
    fn the_flags_reach_the_speculation_settings() {
        let a = try_parse(&[
            "--draft",
            "suffix",
            "--num-draft-tokens",
            "5",
            "--verify",
            "rejection",
            "--draft-policy",
            "per-row",
        ])
        .expect("parse");
        let spec = a.spec(3, 9);
        assert_eq!(
            (spec.num_draft, spec.verify, spec.seed),
            (5, VerifyMode::Rejection, 9)
        );
        assert_eq!(
            spec.adaptive,
            AdaptiveConfig::with_policy(DraftPolicy::PerRow)
        );
        assert_eq!(a.provider(), Some("suffix"));
        // As mlx-lm: a drafter model alone speculates with it.
        let dir = std::env::temp_dir();
        let dir = dir.to_str().expect("utf-8");
        let drafter =
            try_parse(&["--draft-model", dir, "--draft-option", "dtype=keep"]).expect("parse");
        assert_eq!(drafter.provider(), Some(draft_model::ID));
        let options = drafter.options().expect("the drafter's options");
        assert_eq!(options.get("dtype"), Some("keep"));
        assert_eq!(try_parse(&[]).expect("parse").provider(), None);
        let fixed = try_parse(&["--draft", "suffix", "--no-adaptive"]).expect("parse");
        let spec = fixed.spec(16, 0);
        assert_eq!((spec.num_draft, spec.adaptive), (16, AdaptiveConfig::off()));
    }

    #[test]
    fn bad_values_are_named() {
        for (args, named) in [
            (&["--num-draft", "0"][..], "--num-draft"),
            (&["--verify", "maybe"], "maybe"),
            (&["--draft-policy", "eager"], "eager"),
        ] {
            let e = try_parse(args).expect_err("refused").to_string();
            assert!(e.contains(named), "{e}");
        }
        let orphan = try_parse(&["--draft-option", "k=1"]).expect("parse");
        let e = orphan.options().expect_err("refused").to_string();
        assert!(e.contains("needs --draft"), "{e}");
        let e = try_parse(&["--draft", "x", "--draft-option", "k"])
            .expect("parse")
            .options()
            .expect_err("refused")
            .to_string();
        assert!(e.contains("KEY=VALUE"), "{e}");
    }
}
