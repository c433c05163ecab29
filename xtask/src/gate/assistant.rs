//! `cargo xtask gate assistant`: the `gemma4-assistant` provider against
//! optiq 0.7.7 (`xtask/python/oracle_assistant.py`) and transformers 5.24
//! (`xtask/python/reference_assistant.py`, in the reference environment),
//! on the synthetic `gemma4-shared` target and both synthetic assistants
//! (centroid and tied head):
//!
//! - step: one drafter step on random inputs (donor lengths inside and past
//!   the window, 1 and 2 full-donor key heads) gives optiq's
//!   `GemmaAssistantDrafter.forward` logits and next hidden bit for bit;
//! - spec: at gamma 1, 2 and 3, on prompts shorter and longer than the
//!   sliding window, our emitted tokens and drafted / accepted counts equal
//!   optiq's `spec_generate`, and our target calls plus the prefill equal
//!   its target calls (our `advancing` position mode: optiq advances the
//!   query position one per step);
//! - reference: after a full prefill of each prompt, a round of our drafts
//!   in the default `constant` mode equals the drafts of transformers'
//!   `SinglePositionMultiTokenCandidateGenerator` for the same target state
//!   (prompt, pending token, donor keys and values): two frameworks, so the
//!   logits may differ by float rounding (at most [`LOGIT_TOLERANCE`]) and a
//!   token may differ only where its margin is that small.

use std::path::Path;

use anyhow::{bail, Context, Result};
use run_protocol::assistant::{Positions, Round, RoundRequest, StepRequest};
use run_protocol::providers::GEMMA4_ASSISTANT;
use run_protocol::spec::{PromptFile, SpecRequest};
use run_protocol::Dtype;
use serde::Deserialize;

use super::compare;
use super::suite;
use super::Counts;
use crate::{reference_env, runs, shell, synth, synth_assistant, venv};

const ORACLE: &str = "xtask/python/oracle_assistant.py";
const REFERENCE: &str = "xtask/python/reference_assistant.py";
/// Drafter steps of each reference round.
const REFERENCE_STEPS: usize = 4;
/// Largest logit difference float rounding explains between our drafter
/// and transformers' (measured: below 1e-6; a query one position off moves
/// them by 1e-3 to 1).
const LOGIT_TOLERANCE: f32 = 1e-4;
const GAMMAS: [usize; 3] = [1, 2, 3];
const MAX_TOKENS: usize = 32;
const PROMPTS: usize = 8;
const STEP_CASES: usize = 6;
const ASSISTANTS: [&str; 2] = ["gemma4-assistant", "gemma4-assistant-tied"];

/// optiq's `spec_generate` runs (`oracle_assistant.py spec`).
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
    // assistant_step and assistant_round (debug).
    shell::build()?;
    suite::build_runner()?;
    let mut counts = Counts::default();
    for name in ASSISTANTS {
        let assistant = dir_of(name)?;
        counts += step(&python, &assistant, &work.join(name))?;
        counts += spec(&python, &target, &assistant, &work.join(name))?;
    }
    let reference_python = reference_env::ensure()?;
    for name in ASSISTANTS {
        counts += reference(&reference_python, &target, &dir_of(name)?, &work.join(name))?;
    }
    println!(
        "assistant: {} of {} checks equal optiq and transformers",
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
    let request = StepRequest {
        assistant: assistant.to_owned(),
        cases: STEP_CASES,
        inputs: inputs.clone(),
        outputs: ours.clone(),
    };
    let report = runs::example(&request, &work.join("step"), &[])?;
    if report.cases != STEP_CASES {
        bail!("assistant_step ran {} cases of {STEP_CASES}", report.cases);
    }
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
                    let diff = compare::max_difference(x, y);
                    if diff != 0.0 {
                        eprintln!(
                            "assistant step {}: case {i} {k}: max |diff| {diff:e}",
                            assistant.display()
                        );
                    }
                    diff == 0.0
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
        counts.count(same);
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
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    if !lens.iter().any(|&l| l > window) || !lens.iter().any(|&l| l + MAX_TOKENS > 2 * window) {
        bail!("the assistant prompts ({lens:?}) must run past the sliding window ({window})");
    }
    let oracle_prompts = work.join("optiq-prompts.json");
    std::fs::write(
        &oracle_prompts,
        serde_json::to_string(&PromptFile {
            prompts: suite::ids(&prompts),
        })?,
    )?;
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
    let mut request = SpecRequest::new(
        target.to_owned(),
        Dtype::F32,
        suite::ids(&prompts),
        MAX_TOKENS,
        vec![GEMMA4_ASSISTANT.to_owned()],
    );
    // optiq advances the query position one per step.
    request
        .option(GEMMA4_ASSISTANT, "model", assistant.display().to_string())
        .option(GEMMA4_ASSISTANT, "positions", "advancing");
    request.adaptive = false;
    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:>5} {:>8} {:>9} {:>9} {:>12}",
        "gamma", "prompts", "identical", "accepted", "target calls"
    )];
    let mut any_accepted = false;
    for gamma in GAMMAS {
        request.num_draft = Some(gamma);
        let report = suite::spec_run(&request, work, &format!("gamma{gamma}"), &[])?;
        let ours = report.alone(GEMMA4_ASSISTANT);
        if ours.is_empty() {
            bail!("spec_run returned no gemma4-assistant runs");
        }
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

/// How one of our rounds compares with transformers'.
#[derive(Debug, PartialEq)]
struct Agreement {
    /// Largest logit difference over the steps compared (the candidates of
    /// a centroid head; every token otherwise).
    max_diff: f32,
    /// The first step whose tokens differ, with the larger of the two
    /// frameworks' margins between the two tokens; later steps are not
    /// compared (they draft from different tokens).
    flip: Option<(usize, f32)>,
}

impl Agreement {
    fn holds(&self) -> bool {
        self.max_diff <= LOGIT_TOLERANCE
            && self
                .flip
                .is_none_or(|(_, margin)| margin <= LOGIT_TOLERANCE)
    }
}

/// Compares two rounds step by step; an error when they are not comparable.
fn agreement(ours: &Round, theirs: &Round) -> Result<Agreement, String> {
    if ours.tokens.len() != theirs.tokens.len() || ours.logits.len() != ours.tokens.len() {
        return Err(format!(
            "{} drafts ({} logit rows) against {}",
            ours.tokens.len(),
            ours.logits.len(),
            theirs.tokens.len()
        ));
    }
    let mut result = Agreement {
        max_diff: 0.0,
        flip: None,
    };
    for (step, ((a, b), (x, y))) in ours
        .tokens
        .iter()
        .zip(&theirs.tokens)
        .zip(ours.logits.iter().zip(&theirs.logits))
        .enumerate()
    {
        if x.len() != y.len() {
            return Err(format!(
                "step {step}: {} logits against {}",
                x.len(),
                y.len()
            ));
        }
        // A centroid head scores only its candidates (ours -1e30 elsewhere,
        // transformers' the lowest candidate score minus one).
        let diff = x
            .iter()
            .zip(y)
            .filter(|(p, _)| **p > -1e29)
            .map(|(p, q)| compare::float_difference(*p, *q))
            .fold(0f32, f32::max);
        result.max_diff = result.max_diff.max(diff);
        if a != b {
            let at = |l: &[f32], t: u32| l.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY);
            let margin = (at(x, *a) - at(x, *b)).max(at(y, *b) - at(y, *a));
            result.flip = Some((step, margin));
            break;
        }
    }
    Ok(result)
}

/// The spec prompts (all longer than the sliding window) and the first
/// tokens of two of them (shorter than it).
fn reference_prompts() -> Vec<Vec<u32>> {
    let mut prompts = suite::id_prompts(320, PROMPTS);
    let window = crate::synth_gemma4::SLIDING_WINDOW;
    let short: Vec<Vec<u32>> = prompts
        .iter()
        .take(2)
        .enumerate()
        .map(|(i, ids)| ids[..(window / 2 + i).min(ids.len())].to_vec())
        .collect();
    prompts.extend(short);
    prompts
}

/// Our `constant` rounds against transformers' candidate generator.
fn reference(python: &Path, target: &Path, assistant: &Path, work: &Path) -> Result<Counts> {
    std::fs::create_dir_all(work)?;
    let prompts = reference_prompts();
    let count = prompts.len();
    let (prompts_file, ours_stem, theirs_file) = (
        work.join("reference-prompts.json"),
        work.join("reference-ours"),
        work.join("reference-transformers.json"),
    );
    std::fs::write(
        &prompts_file,
        serde_json::to_string(&PromptFile {
            prompts: suite::ids(&prompts),
        })?,
    )?;
    let request = RoundRequest {
        target: target.to_owned(),
        assistant: assistant.to_owned(),
        prompts: prompts.clone(),
        steps: REFERENCE_STEPS,
        positions: Positions::Constant,
    };
    let ours = runs::example(&request, &ours_stem, &[])?.rounds;
    shell::run(
        reference_env::python_command(python)
            .arg(shell::root().join(REFERENCE))
            .arg("--target")
            .arg(target)
            .arg("--assistant")
            .arg(assistant)
            .arg("--prompts")
            .arg(&prompts_file)
            .arg("--ours")
            .arg(runs::report_file(&ours_stem))
            .args(["--steps", &REFERENCE_STEPS.to_string()])
            .arg("--out")
            .arg(&theirs_file),
    )?;
    // transformers writes our rounds' form.
    let theirs = runs::read_report::<RoundRequest>(&theirs_file)?.rounds;
    if ours.len() != count || theirs.len() != count {
        bail!(
            "{} of our rounds and {} of transformers' for {count} prompts",
            ours.len(),
            theirs.len()
        );
    }
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:>6} {:>7} {:<22} {:<22} {:>12} {:>12}",
        "prompt", "length", "ours", "transformers", "max |dlogit|", "|dhidden|"
    )];
    let (mut raw_differs, mut pending_differs) = (0, 0);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        let hidden_diff = compare::max_difference(&a.hidden, &b.hidden);
        raw_differs += usize::from(!b.raw_tokens.is_empty() && b.raw_tokens != a.tokens);
        pending_differs += usize::from(b.target_pending.is_some_and(|p| p != a.pending));
        let verdict = agreement(a, b);
        let holds = matches!(&verdict, Ok(v) if v.holds());
        match &verdict {
            Ok(v) => {
                if let Some((step, margin)) = v.flip {
                    eprintln!(
                        "assistant reference {}: prompt {i}: step {step} drafts {} (ours) against {} (transformers), margin {margin:e}{}",
                        assistant.display(),
                        a.tokens[step],
                        b.tokens[step],
                        if margin <= LOGIT_TOLERANCE { ": float rounding" } else { "" }
                    );
                }
                table.push(format!(
                    "{i:>6} {:>7} {:<22} {:<22} {:>12.3e} {:>12.3e}",
                    lens.get(i).copied().unwrap_or(0),
                    format!("{:?}", a.tokens),
                    format!("{:?}", b.tokens),
                    v.max_diff,
                    hidden_diff
                ));
            }
            Err(e) => eprintln!(
                "assistant reference {}: prompt {i}: {e}",
                assistant.display()
            ),
        }
        counts.count(holds);
    }
    println!(
        "assistant reference {} (constant positions, {REFERENCE_STEPS} steps, tolerance {LOGIT_TOLERANCE:e}) vs transformers' SinglePositionMultiTokenCandidateGenerator: {} of {count} rounds agree\n{}",
        assistant.display(),
        counts.passed,
        table.join("\n")
    );
    println!(
        "  transformers' own greedy pending token differs on {pending_differs} prompts; over the prefill's uncut sliding donor (its mask reaches window + 1 positions) its drafts differ on {raw_differs}"
    );
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(tokens: &[u32], logits: &[[f32; 3]]) -> Round {
        Round {
            pending: 0,
            target_pending: None,
            hidden: Vec::new(),
            tokens: tokens.to_vec(),
            logits: logits.iter().map(|l| l.to_vec()).collect(),
            raw_tokens: Vec::new(),
        }
    }

    #[test]
    fn flips_hold_only_on_a_float_margin() {
        let ours = round(&[2, 1], &[[0.0, 1.0, 3.0], [0.0, 2.0, 1.0]]);
        let same = round(&[2, 1], &[[0.0, 1.0, 3.0 + 5e-5], [0.0, 2.0, 1.0]]);
        let v = agreement(&ours, &same).expect("comparable");
        assert!(v.holds() && v.flip.is_none(), "{v:?}");
        let moved = round(&[2, 1], &[[0.0, 1.0, 3.0], [0.0, 2.5, 1.0]]);
        assert!(!agreement(&ours, &moved).expect("comparable").holds());
        let close = round(&[2, 1], &[[0.0, 1.0, 3.0], [0.0, 1.0 + 5e-5, 1.0]]);
        let tie = round(&[2, 2], &[[0.0, 1.0, 3.0], [0.0, 1.0, 1.0 + 5e-5]]);
        let v = agreement(&close, &tie).expect("comparable");
        assert_eq!(v.flip.map(|f| f.0), Some(1));
        assert!(v.holds(), "{v:?}");
        let far = round(&[2, 2], &[[0.0, 1.0, 3.0], [0.0, 2.0, 1.0]]);
        assert!(!agreement(&ours, &far).expect("comparable").holds());
        assert!(agreement(&ours, &round(&[2], &[[0.0, 1.0, 3.0]])).is_err());
    }
}
