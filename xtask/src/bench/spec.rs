//! `cargo xtask bench spec`: plain decoding against each provider on the
//! real model (SmolLM2-135M, float32), on the input-grounded and the
//! open-ended prompt sets, in one run; then mlx-lm's `--draft-model` against
//! ours on the same target/drafter pair and settings.
//!
//! Options: `--max-tokens N` (default 128), `--prompts K` (per set, default
//! all), `--num-draft N` (most drafts per round of every provider; default:
//! each provider's own, 16 for prompt-lookup and 3 for draft-model).

use std::process::Command;

use anyhow::{bail, Context, Result};

use run_protocol::providers::DRAFT_MODEL;
use run_protocol::spec::{Generation, SpecRequest, PLAIN};
use run_protocol::Dtype;

use crate::gate::suite;
use crate::{real_model, shell, venv};

struct Args {
    max_tokens: usize,
    prompts: Option<usize>,
    num_draft: Option<usize>,
}

fn parse(args: &[String]) -> Result<Args> {
    let (mut max_tokens, mut prompts, mut num_draft) = (128, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--max-tokens" => max_tokens = value()?.parse().context("--max-tokens")?,
            "--prompts" => prompts = Some(value()?.parse().context("--prompts")?),
            "--num-draft" => num_draft = Some(value()?.parse().context("--num-draft")?),
            other => bail!("unknown option {other} (known: --max-tokens, --prompts, --num-draft)"),
        }
    }
    Ok(Args {
        max_tokens,
        prompts,
        num_draft,
    })
}

/// Totals over a set's runs of one provider.
pub(super) struct Summary {
    pub tokens: usize,
    pub seconds: f64,
    pub drafted: usize,
    pub accepted: usize,
    pub drafting_rounds: usize,
    pub target_calls: usize,
}

pub(super) fn summarize(runs: &[Generation]) -> Summary {
    Summary {
        tokens: runs.iter().map(|r| r.tokens.len()).sum(),
        seconds: runs.iter().map(|r| r.generation_seconds).sum(),
        drafted: runs.iter().map(|r| r.drafted).sum(),
        accepted: runs.iter().map(|r| r.accepted).sum(),
        drafting_rounds: runs.iter().map(|r| r.drafting_rounds).sum(),
        target_calls: runs.iter().map(|r| r.target_calls).sum(),
    }
}

/// Generated tokens per second of generation.
pub(super) fn tps(s: &Summary) -> f64 {
    s.tokens as f64 / s.seconds.max(1e-9)
}

/// The generation tokens/s on the final line of `mlx-spec generate` or `mlx_lm generate`.
fn generation_tps(output: &str) -> Option<f64> {
    let at = output.rfind("Generation: ")?;
    output[at..]
        .split(", ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn run(args: &[String]) -> Result<()> {
    let Args {
        max_tokens,
        prompts: limit,
        num_draft,
    } = parse(args)?;
    let python = venv::ensure()?;
    suite::build_runner()?;
    let model = real_model::ensure()?;
    let drafter = suite::real_drafter(&python)?;
    let prompts = suite::suite()?;
    // `deepspec` needs a DSpark checkpoint made for its target: `bench dspark` covers it.
    let ids = suite::providers_for(real_model::NAME);
    let work = shell::root().join("target").join("bench-spec");
    let drafts = num_draft.map_or_else(|| "each provider's default".to_owned(), |n| n.to_string());
    println!("speculative decoding on {} (float32 target; draft-model drafter: 4-bit copy run in float32), {max_tokens} tokens max, drafts per round: {drafts}", real_model::NAME);
    println!(
        "{:<16} {:<15} {:>8} {:>9} {:>7} {:>11} {:>13} {:>14}",
        "prompt set",
        "provider",
        "tokens",
        "tok/s",
        "ratio",
        "acceptance",
        "mean accepted",
        "tok / forward"
    );
    let sets = [
        ("edit-and-return", &prompts.edit_and_return),
        ("input-grounded", &prompts.input_grounded),
        ("open-ended", &prompts.open_ended),
    ];
    for (set, texts) in sets {
        let texts: Vec<String> = texts
            .iter()
            .take(limit.unwrap_or(usize::MAX))
            .cloned()
            .collect();
        let mut request = SpecRequest::new(
            model.clone(),
            Dtype::F32,
            suite::chat_prompts(&texts),
            max_tokens,
            ids.clone(),
        );
        request.option(DRAFT_MODEL, "model", drafter.display().to_string());
        request.num_draft = num_draft;
        let results = suite::spec_run(&request, &work, set, &[])?;
        let plain = summarize(results.alone(PLAIN));
        if plain.tokens == 0 {
            bail!("no plain runs");
        }
        for id in &ids {
            let s = summarize(results.alone(id));
            let mean = if s.drafting_rounds == 0 {
                0.0
            } else {
                s.accepted as f64 / s.drafting_rounds as f64
            };
            let acceptance = if s.drafted == 0 {
                0.0
            } else {
                100.0 * s.accepted as f64 / s.drafted as f64
            };
            println!(
                "{set:<16} {id:<15} {:>8} {:>9.2} {:>6.2}x {:>10.1}% {:>13.2} {:>14.2}",
                s.tokens,
                tps(&s),
                tps(&s) / tps(&plain),
                acceptance,
                mean,
                s.tokens as f64 / s.target_calls.max(1) as f64
            );
        }
    }

    // mlx-lm --draft-model against ours, same pair and settings (drafter run
    // quantized, 3 drafts, no adaptation), one prompt.
    let prompt = prompts.input_grounded.first().cloned().unwrap_or_default();
    let max = max_tokens.to_string();
    let theirs = Command::new(venv::python_command(&python).get_program())
        .envs(
            venv::python_command(&python)
                .get_envs()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
        )
        .args(["-m", "mlx_lm", "generate", "--model"])
        .arg(&model)
        .arg("--draft-model")
        .arg(&drafter)
        .args([
            "--num-draft-tokens",
            "3",
            "--prompt",
            &prompt,
            "--max-tokens",
            &max,
        ])
        .output()
        .context("running mlx_lm generate --draft-model")?;
    let theirs_text = String::from_utf8_lossy(&theirs.stdout).into_owned()
        + &String::from_utf8_lossy(&theirs.stderr);
    let ours = shell::bin("mlx-spec")
        .args(["generate", "--model"])
        .arg(&model)
        .args(["--draft", "draft-model", "--draft-model"])
        .arg(&drafter)
        .args([
            "--draft-option",
            "dtype=keep",
            "--num-draft",
            "3",
            "--no-adaptive",
            "--prompt",
            &prompt,
            "--max-tokens",
            &max,
        ])
        .output()
        .context("running mlx-spec generate --draft draft-model")?;
    let ours_text = String::from_utf8_lossy(&ours.stdout).into_owned();
    match (generation_tps(&theirs_text), generation_tps(&ours_text)) {
        (Some(t), Some(o)) => println!("\nmlx-lm --draft-model vs mlx-spec --draft draft-model (same pair, 3 drafts, drafter quantized): {t:.2} vs {o:.2} tok/s, ratio {:.2}x", o / t),
        _ => bail!("could not read the speeds:\nmlx-lm:\n{theirs_text}\nmlx-spec:\n{ours_text}"),
    }
    Ok(())
}
