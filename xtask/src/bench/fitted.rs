//! What the benches of trained synthetic drafters (`bench dflash`, `bench
//! eagle3`) share: their options.

use anyhow::{bail, Context, Result};

/// `--prompts N` (default 24), `--max-tokens N` (default 64), `--steps N`
/// (training steps of the fitted drafter).
pub(super) struct Options {
    pub prompts: usize,
    pub max_tokens: usize,
    pub steps: usize,
}

/// Parses `args`, `steps` the default training steps.
pub(super) fn parse(args: &[String], steps: usize) -> Result<Options> {
    let mut o = Options {
        prompts: 24,
        max_tokens: 64,
        steps,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--prompts" => o.prompts = value()?.parse().context("--prompts")?,
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--steps" => o.steps = value()?.parse().context("--steps")?,
            other => bail!("unknown option {other} (known: --prompts, --max-tokens, --steps)"),
        }
    }
    Ok(o)
}
