//! `cargo xtask gate draft-parity`: the `draft-model` provider gives exactly
//! the tokens of mlx-lm's speculative decoding (`mlx_lm.generate
//! --draft-model`, i.e. `speculative_generate_step`) with the same target,
//! drafter and draft count.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::suite::{self, SpecRun};
use super::Counts;
use crate::{real_model, shell, venv};

const ORACLE: &str = "xtask/python/oracle_spec.py";
const NUM_DRAFT: usize = 3;
const MAX_TOKENS: usize = 40;
const PROMPTS: usize = 6;

#[derive(Deserialize)]
struct Runs {
    runs: Vec<Run>,
}

#[derive(Deserialize)]
struct Run {
    tokens: Vec<u32>,
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    suite::build_runner()?;
    let target = real_model::ensure()?;
    let drafter = suite::real_drafter(&python)?;
    let suite_prompts = suite::suite()?;
    let texts: Vec<String> = suite_prompts
        .input_grounded
        .iter()
        .take(PROMPTS / 2)
        .chain(suite_prompts.open_ended.iter().take(PROMPTS / 2))
        .cloned()
        .collect();
    let work = shell::root().join("target").join("gate-draft-parity");

    // Ours, with mlx-lm's settings: fixed draft count, no adaptation, the
    // drafter run in its file's (quantized) form as mlx-lm runs it.
    let providers = ["draft-model".to_owned()];
    let options = [
        format!("draft-model:model={}", drafter.display()),
        "draft-model:dtype=keep".to_owned(),
    ];
    let extra = ["--no-adaptive", "--num-draft", "3"];
    let ours = suite::spec_run(&SpecRun {
        model: &target,
        prompts: &suite::chat_prompts(&texts),
        providers: &providers,
        options: &options,
        extra: &extra,
        max_tokens: MAX_TOKENS,
        work: &work,
        label: "ours",
        env: &[],
    })?;
    let ours = ours
        .get("draft-model")
        .context("spec_run returned no draft-model runs")?;

    // The same prompt ids through mlx-lm: spec_run tokenized them; replay
    // them from its prompts file through our tokenizer's output.
    let prompt_ids = prompt_ids(&work, &target)?;
    let ids_file = work.join("oracle-prompts.json");
    std::fs::write(
        &ids_file,
        serde_json::to_string(&serde_json::json!({ "prompts": prompt_ids }))?,
    )?;
    let out = work.join("oracle.json");
    shell::run(
        venv::python_command(&python)
            .arg(shell::root().join(ORACLE))
            .arg("--model")
            .arg(&target)
            .arg("--draft-model")
            .arg(&drafter)
            .arg("--prompts")
            .arg(&ids_file)
            .args([
                "--num-draft",
                &NUM_DRAFT.to_string(),
                "--max-tokens",
                &MAX_TOKENS.to_string(),
            ])
            .args(["--eos", "2"])
            .arg("--out")
            .arg(&out),
    )?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let theirs: Runs = serde_json::from_str(&text)?;
    if theirs.runs.len() != ours.len() {
        bail!(
            "mlx-lm returned {} runs for {} prompts",
            theirs.runs.len(),
            ours.len()
        );
    }
    let mut counts = Counts::default();
    for (i, (a, b)) in ours.iter().zip(&theirs.runs).enumerate() {
        if a.tokens == b.tokens {
            counts.passed += 1;
        } else {
            counts.failed += 1;
            eprintln!(
                "draft-parity: prompt {i}: ours {:?}\n  mlx-lm {:?}",
                a.tokens, b.tokens
            );
        }
    }
    println!(
        "draft-parity: {} of {} prompts give mlx-lm's tokens (draft-model, {NUM_DRAFT} drafts)",
        counts.passed,
        ours.len()
    );
    Ok(counts)
}

/// The token ids spec_run used, re-derived with the same tokenizer and
/// template through `mlx-spec` itself (so both sides read identical ids).
fn prompt_ids(work: &std::path::Path, model: &std::path::Path) -> Result<Vec<Vec<u32>>> {
    let results = work.join("ours-results.json");
    let text = std::fs::read_to_string(&results)?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let runs = v["draft-model"].as_array().context("no draft-model runs")?;
    runs.iter()
        .map(|r| {
            r["prompt_ids"]
                .as_array()
                .map(|ids| {
                    ids.iter()
                        .filter_map(|t| t.as_u64().map(|t| t as u32))
                        .collect()
                })
                .with_context(|| {
                    format!("spec_run output for {} lacks prompt_ids", model.display())
                })
        })
        .collect()
}
