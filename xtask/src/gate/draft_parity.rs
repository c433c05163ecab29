//! `cargo xtask gate draft-parity`: the `draft-model` provider gives exactly
//! the tokens of mlx-lm's speculative decoding (`mlx_lm.generate
//! --draft-model`, i.e. `speculative_generate_step`) with the same target,
//! drafter and draft count. The drafter is the real model's 4-bit copy
//! dequantized to float32 (`suite::real_float_drafter`): it disagrees with
//! the target as the 4-bit one does, at float32's speed; both programs
//! read the same file.

use anyhow::{bail, Result};
use run_protocol::greedy::ParityRequest;
use run_protocol::providers::DRAFT_MODEL;
use run_protocol::spec::{tokens, SpecRequest};
use run_protocol::Dtype;
use serde::Serialize;

use super::compare;
use super::suite;
use super::Counts;
use crate::{real_model, runs, shell, venv};

const ORACLE: &str = "xtask/python/oracle_spec.py";
const NUM_DRAFT: usize = 3;
const MAX_TOKENS: usize = 40;
const PROMPTS: usize = 6;

/// The oracle's prompts file.
#[derive(Serialize)]
struct OraclePrompts<'a> {
    prompts: Vec<&'a [u32]>,
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    suite::build_runner()?;
    let target = real_model::ensure()?;
    let drafter = suite::real_float_drafter(&python)?;
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
    // drafter run in its file's form as mlx-lm runs it.
    let mut request = SpecRequest::new(
        target.clone(),
        Dtype::F32,
        suite::chat_prompts(&texts),
        MAX_TOKENS,
        vec![DRAFT_MODEL.to_owned()],
    );
    request
        .option(DRAFT_MODEL, "model", drafter.display().to_string())
        .option(DRAFT_MODEL, "dtype", Dtype::Keep.as_str());
    request.adaptive = false;
    request.num_draft = Some(NUM_DRAFT);
    let report = suite::spec_run(&request, &work, "ours", &[])?;
    let ours = report.alone(DRAFT_MODEL);
    if ours.is_empty() {
        bail!("spec_run returned no draft-model runs");
    }

    // The same prompt ids through mlx-lm: spec_run tokenized them with our
    // tokenizer and template, so both sides read identical ids.
    let ids_file = work.join("oracle-prompts.json");
    std::fs::write(
        &ids_file,
        serde_json::to_string(&OraclePrompts {
            prompts: ours.iter().map(|r| r.prompt_ids.as_slice()).collect(),
        })?,
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
    // The oracle writes greedy runs as `parity_run` does.
    let theirs = runs::read_report::<ParityRequest>(&out)?.tokens();
    if theirs.len() != ours.len() {
        bail!(
            "mlx-lm returned {} runs for {} prompts",
            theirs.len(),
            ours.len()
        );
    }
    let differing = compare::token_runs(&tokens(ours), &theirs);
    for d in &differing {
        eprintln!(
            "draft-parity: prompt {}: ours {:?}\n  mlx-lm {:?}",
            d.run, ours[d.run].tokens, theirs[d.run]
        );
    }
    let counts = Counts {
        passed: (ours.len() - differing.len()) as u64,
        failed: differing.len() as u64,
    };
    println!(
        "draft-parity: {} of {} prompts give mlx-lm's tokens (draft-model, {NUM_DRAFT} drafts)",
        counts.passed,
        ours.len()
    );
    Ok(counts)
}
