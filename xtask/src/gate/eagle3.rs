//! `cargo xtask gate eagle3`: the `eagle3` provider against SpecForge
//! 0.2.0's EAGLE-3 draft model (`xtask/python/reference_eagle3.py`, torch
//! on the CPU in the reference environment).
//!
//! `eagle3_trace` runs scripted rounds (partial, full and no acceptance) of
//! a synthetic head with the published schema (`spec_fixtures::eagle3`:
//! `fc`, `midlayer.*`, a 96-token draft vocabulary mapped by `d2t`) on its
//! four-layer llama target, recording the target features the head read;
//! the reference replays the rounds from those features. Per head: every
//! round's drafts equal, and every draft logit within float32 rounding of
//! SpecForge's (torch and MLX order sums differently). Two heads: plain,
//! and with `fc_norm` and an embedding of its own. Losslessness through
//! the serve loop is `cargo test -p draft-eagle3`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;

use anyhow::{bail, Context, Result};
use run_protocol::eagle3::Eagle3Request;
use run_protocol::mtp::{MtpReport, MtpSchedule};
use spec_fixtures::rng::SplitMix64;

use super::compare;
use super::Counts;
use crate::runs::{self, with_suffix};
use crate::{reference_env, shell, synth, synth_eagle3};

const REFERENCE: &str = "xtask/python/reference_eagle3.py";

/// `(drafted, accepted)` per round.
const ROUNDS: &[(usize, usize)] = &[
    (3, 0),
    (3, 3),
    (2, 1),
    (4, 2),
    (1, 1),
    (4, 4),
    (2, 0),
    (3, 2),
];
const PROMPT_LEN: usize = 24;
/// Largest logit difference allowed, relative to the largest logit.
const LOGIT_TOLERANCE: f32 = 1e-5;
pub fn run() -> Result<Counts> {
    let python = reference_env::ensure()?;
    let (target, heads) = synth_eagle3::ensure()?;
    shell::build().context("our runner (draft-eagle3 example eagle3_trace) does not build")?;
    let work = shell::root().join("target").join("gate-eagle3");
    std::fs::create_dir_all(&work)?;
    let mut rng = SplitMix64::keyed(0x6561_676c, "eagle3 prompt");
    let schedule = MtpSchedule {
        prompt: (0..PROMPT_LEN).map(|_| rng.below(320) as u32).collect(),
        rounds: ROUNDS.to_vec(),
    };
    // Ours per head, then SpecForge over every head in one process.
    let t = Instant::now();
    let mut runs = Vec::new();
    for (name, head) in &heads {
        runs.push(trace(&target, head, &schedule, &work.join(name)));
    }
    let plan: Vec<_> = runs
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|r| &r.job)
        .collect();
    let plan_file = work.join("plan.json");
    std::fs::write(&plan_file, json!({ "run": plan }).to_string())?;
    let reference = shell::run(
        reference_env::python_command(&python)
            .arg(shell::root().join(REFERENCE))
            .arg(&plan_file),
    )
    .context("the SpecForge reference failed");
    let seconds = t.elapsed().as_secs_f64();
    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<22} {:>7} {:>13} {:>14}",
        "head", "rounds", "drafts equal", "max logit diff"
    )];
    for ((name, _), run) in heads.iter().zip(runs) {
        let outcome = match (&reference, run) {
            (Err(e), _) => Err(anyhow::anyhow!("{e:#}")),
            (_, Err(e)) => Err(e),
            (Ok(()), Ok(run)) => compare_run(&run),
        };
        match outcome {
            Ok((drafts, diff)) => {
                counts.count(drafts == ROUNDS.len() && diff <= LOGIT_TOLERANCE);
                table.push(format!(
                    "{name:<22} {:>7} {drafts:>13} {diff:>14.2e}",
                    ROUNDS.len()
                ));
            }
            Err(e) => {
                counts.failed += 1;
                eprintln!("eagle3: {name}: {e:#}");
                table.push(format!(
                    "{name:<22} {:>7} {:>13} {:>14}",
                    ROUNDS.len(),
                    "error",
                    "-"
                ));
            }
        }
    }
    println!("\n{}\n({seconds:.1} s)", table.join("\n"));
    println!(
        "eagle3: {} of {} heads equal SpecForge's drafts, logits within {LOGIT_TOLERANCE:e} of the largest",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// One head's trace: our report and the reference's job.
struct Run {
    ours: MtpReport,
    tensors: PathBuf,
    reference: PathBuf,
    job: serde_json::Value,
}

/// Runs `eagle3_trace` for `head` and prepares the reference's job.
fn trace(target: &Path, head: &Path, schedule: &MtpSchedule, work: &Path) -> Result<Run> {
    std::fs::create_dir_all(work)?;
    let ours_stem = work.join("ours");
    let tensors = with_suffix(&ours_stem, ".safetensors");
    let request = Eagle3Request {
        target: target.to_owned(),
        head: head.to_owned(),
        schedule: schedule.clone(),
        tensors: tensors.clone(),
    };
    let ours: MtpReport =
        runs::example(&request, &ours_stem, &[]).context("eagle3_trace failed")?;
    let schedule_file = work.join("schedule.json");
    std::fs::write(&schedule_file, serde_json::to_string(schedule)?)?;
    let report_file = work.join("ours-report.json");
    std::fs::write(&report_file, serde_json::to_string(&ours)?)?;
    let reference = work.join("specforge");
    let _ = std::fs::remove_file(with_suffix(&reference, ".json"));
    let job = json!({
        "head": head, "target": target, "schedule": schedule_file,
        "tensors": tensors, "report": report_file, "out": reference,
    });
    Ok(Run {
        ours,
        tensors,
        reference,
        job,
    })
}

/// Rounds whose drafts match, and the largest logit difference relative to
/// the largest logit.
fn compare_run(run: &Run) -> Result<(usize, f32)> {
    let (a, tensors, reference) = (&run.ours, &run.tensors, &run.reference);
    let b = runs::read_report::<Eagle3Request>(&with_suffix(reference, ".json"))?.rounds;
    if a.rounds.len() != ROUNDS.len() || b.len() != ROUNDS.len() {
        bail!(
            "{} rounds of ours, {} of the reference, for {}",
            a.rounds.len(),
            b.len(),
            ROUNDS.len()
        );
    }
    let equal = a
        .rounds
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.drafts == y.drafts && x.offset == y.offset)
        .count();
    if let Some((r, (x, y))) = a
        .rounds
        .iter()
        .zip(&b)
        .enumerate()
        .find(|(_, (x, y))| x.drafts != y.drafts)
    {
        eprintln!("eagle3: round {r} differs: ours {x:?} vs SpecForge {y:?}");
    }
    let (ta, tb) = (
        std::fs::read(tensors)?,
        std::fs::read(with_suffix(reference, ".safetensors"))?,
    );
    let (sa, sb) = (
        safetensors::SafeTensors::deserialize(&ta)?,
        safetensors::SafeTensors::deserialize(&tb)?,
    );
    let mut worst = 0.0f32;
    for r in 0..ROUNDS.len() {
        let name = format!("logits_{r}");
        let (s1, v1) = synth::read_f32(&sa, &name)?;
        let (s2, v2) = synth::read_f32(&sb, &name)?;
        if s1 != s2 {
            bail!("{name}: shape {s1:?} ours, {s2:?} SpecForge's");
        }
        let scale = v2.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        worst = worst.max(compare::max_difference(&v1, &v2) / scale);
    }
    Ok((equal, worst))
}
