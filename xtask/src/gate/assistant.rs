//! `cargo xtask gate assistant`: the `gemma4-assistant` provider against
//! optiq 0.7.7 (`xtask/python/oracle_assistant.py`), on the synthetic
//! `gemma4-shared` target and both synthetic assistants (centroid and tied
//! head):
//!
//! - step: one drafter step on random inputs (donor lengths inside and past
//!   the window, 1 and 2 full-donor key heads) gives optiq's
//!   `GemmaAssistantDrafter.forward` logits and next hidden bit for bit;
//! - spec: at gamma 1, 2 and 3, on prompts shorter and longer than the
//!   sliding window, our emitted tokens and drafted / accepted counts equal
//!   optiq's `spec_generate`, and our target calls plus the prefill equal
//!   its target calls.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::suite::{self, SpecRun};
use super::Counts;
use crate::{shell, synth, synth_assistant, venv};

const ORACLE: &str = "xtask/python/oracle_assistant.py";
const GAMMAS: [usize; 3] = [1, 2, 3];
const MAX_TOKENS: usize = 32;
const PROMPTS: usize = 8;
const STEP_CASES: usize = 6;
const ASSISTANTS: [&str; 2] = ["gemma4-assistant", "gemma4-assistant-tied"];

#[derive(Deserialize)]
struct OracleRuns {
    runs: Vec<OracleRun>,
}

#[derive(Deserialize)]
struct OracleRun {
    gamma: usize,
    prompt: usize,
    tokens: Vec<u32>,
    drafted: usize,
    accepted: usize,
    target_calls: usize,
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let models = synth::ensure_with_assistants(&python)?;
    let dir_of = |name: &str| {
        models
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("no synthetic {name}"))
    };
    let target = dir_of(synth_assistant::TARGET)?;
    let work = shell::root().join("target").join("gate-assistant");
    std::fs::create_dir_all(&work)?;
    shell::run(shell::cargo().args([
        "build",
        "-q",
        "-p",
        "draft-gemma4-assistant",
        "--example",
        "assistant_step",
    ]))?;
    suite::build_runner()?;
    let mut counts = Counts::default();
    for name in ASSISTANTS {
        let assistant = dir_of(name)?;
        counts += step(&python, &assistant, &work.join(name))?;
        counts += spec(&python, &target, &assistant, &work.join(name))?;
    }
    println!(
        "assistant: {} of {} checks equal optiq",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// Reads every float32 tensor of a safetensors file.
fn tensors(path: &Path) -> Result<std::collections::BTreeMap<String, Vec<f32>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("parsing {}", path.display()))?;
    st.names()
        .into_iter()
        .map(|n| Ok((n.to_owned(), synth::read_f32(&st, n)?.1)))
        .collect()
}

fn step(python: &Path, assistant: &Path, work: &Path) -> Result<Counts> {
    std::fs::create_dir_all(work)?;
    let (inputs, ours, theirs) = (
        work.join("step-inputs.safetensors"),
        work.join("step-ours.safetensors"),
        work.join("step-optiq.safetensors"),
    );
    let exe = shell::root()
        .join("target")
        .join("debug")
        .join("examples")
        .join("assistant_step");
    shell::run(
        std::process::Command::new(exe)
            .arg("--assistant")
            .arg(assistant)
            .args(["--cases", &STEP_CASES.to_string()])
            .arg("--inputs")
            .arg(&inputs)
            .arg("--out")
            .arg(&ours),
    )?;
    shell::run(
        venv::python_command(python)
            .arg(shell::root().join(ORACLE))
            .arg("step")
            .arg("--assistant")
            .arg(assistant)
            .arg("--inputs")
            .arg(&inputs)
            .arg("--out")
            .arg(&theirs),
    )?;
    let (a, b) = (tensors(&ours)?, tensors(&theirs)?);
    let mut counts = Counts::default();
    for i in 0..STEP_CASES {
        let same = ["logits", "next_hidden"].iter().all(|k| {
            let key = format!("{k}.{i}");
            match (a.get(&key), b.get(&key)) {
                (Some(x), Some(y)) if x.len() == y.len() => {
                    let diff = x
                        .iter()
                        .zip(y)
                        .map(|(p, q)| (p - q).abs())
                        .fold(0f32, f32::max);
                    let bits = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                    if !bits {
                        eprintln!(
                            "assistant step {}: case {i} {k}: max |diff| {diff:e}",
                            assistant.display()
                        );
                    }
                    bits
                }
                _ => {
                    eprintln!(
                        "assistant step {}: case {i}: {key} missing or misshapen",
                        assistant.display()
                    );
                    false
                }
            }
        });
        if same {
            counts.passed += 1
        } else {
            counts.failed += 1
        }
    }
    println!(
        "assistant step {}: {} of {STEP_CASES} cases bit-identical to optiq",
        assistant.display(),
        counts.passed
    );
    Ok(counts)
}

fn spec(python: &Path, target: &Path, assistant: &Path, work: &Path) -> Result<Counts> {
    let prompts = suite::id_prompts(320, PROMPTS);
    let window = crate::synth_gemma4::SLIDING_WINDOW;
    let lens: Vec<usize> = prompts["prompts"]
        .as_array()
        .map(|p| {
            p.iter()
                .map(|x| x["ids"].as_array().map_or(0, Vec::len))
                .collect()
        })
        .unwrap_or_default();
    if !lens.iter().any(|&l| l > window) || !lens.iter().any(|&l| l + MAX_TOKENS > 2 * window) {
        bail!("the assistant prompts ({lens:?}) must run past the sliding window ({window})");
    }
    let oracle_prompts = work.join("optiq-prompts.json");
    std::fs::write(&oracle_prompts, serde_json::to_string(&prompts)?)?;
    let out = work.join("optiq.json");
    let gammas = GAMMAS
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    shell::run(
        venv::python_command(python)
            .arg(shell::root().join(ORACLE))
            .arg("spec")
            .arg("--target")
            .arg(target)
            .arg("--assistant")
            .arg(assistant)
            .arg("--prompts")
            .arg(&oracle_prompts)
            .args(["--gammas", &gammas, "--max-tokens", &MAX_TOKENS.to_string()])
            .arg("--out")
            .arg(&out),
    )?;
    let theirs: OracleRuns = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let providers = ["gemma4-assistant".to_owned()];
    let options = [format!("gemma4-assistant:model={}", assistant.display())];
    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:>5} {:>8} {:>9} {:>9} {:>12}",
        "gamma", "prompts", "identical", "accepted", "target calls"
    )];
    let mut any_accepted = false;
    for gamma in GAMMAS {
        let g = gamma.to_string();
        let extra = ["--no-adaptive", "--num-draft", g.as_str()];
        let label = format!("gamma{gamma}");
        let ours = suite::spec_run(&SpecRun {
            model: target,
            prompts: &prompts,
            providers: &providers,
            options: &options,
            extra: &extra,
            max_tokens: MAX_TOKENS,
            work,
            label: &label,
            env: &[],
        })?;
        let ours = ours
            .get("gemma4-assistant")
            .context("spec_run returned no gemma4-assistant runs")?;
        let mut identical = 0;
        let (mut accepted, mut calls) = (0, 0);
        for (i, a) in ours.iter().enumerate() {
            let Some(b) = theirs
                .runs
                .iter()
                .find(|r| r.gamma == gamma && r.prompt == i)
            else {
                bail!("optiq has no run for gamma {gamma} prompt {i}")
            };
            let same = a.tokens == b.tokens
                && a.drafted == b.drafted
                && a.accepted == b.accepted
                && a.target_calls + 1 == b.target_calls;
            if same {
                identical += 1;
                counts.passed += 1;
            } else {
                counts.failed += 1;
                eprintln!(
                    "assistant {}: gamma {gamma} prompt {i}: ours drafted {} accepted {} calls {} tokens {:?}\n  optiq drafted {} accepted {} calls {} tokens {:?}",
                    assistant.display(), a.drafted, a.accepted, a.target_calls + 1, a.tokens, b.drafted, b.accepted, b.target_calls, b.tokens
                );
            }
            accepted += a.accepted;
            calls += a.target_calls + 1;
        }
        table.push(format!(
            "{gamma:>5} {:>8} {identical:>9} {accepted:>9} {calls:>12}",
            ours.len()
        ));
        any_accepted |= accepted > 0;
    }
    if !any_accepted {
        // Equal counts of nothing would prove nothing about the rollback paths.
        eprintln!(
            "assistant {}: no draft was accepted at any gamma",
            assistant.display()
        );
        counts.failed += 1;
    }
    println!(
        "assistant spec {} vs optiq spec_generate:\n{}",
        assistant.display(),
        table.join("\n")
    );
    Ok(counts)
}
