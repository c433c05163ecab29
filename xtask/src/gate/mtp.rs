//! `cargo xtask gate mtp`: the `glm52-native-mtp` source against a
//! project-written oracle (`xtask/python/oracle_mtp.py`: mlx-lm's GLM target
//! and decoder layer, the MTP glue in mlx ops) on the synthetic GLM
//! checkpoints. Both run the same scripted rounds (partial, full and no
//! acceptance; see `crates/draft-glm52-mtp/examples/mtp_trace.rs`): every
//! round's drafts and next token must be equal, and the MTP cache (latent
//! and rope rows, and the MTP indexer's keys where the row has an indexer)
//! bit for bit equal after every round. The GLM-5.2-schema models (IndexShare,
//! the MTP row's own indexer, `index_topk` below the contexts) run with
//! `index_share_for_mtp_iteration` as published (on) and, for the float
//! one, off (`glm52-noshare`, the same weights).
//!
//! The `qwen3-native-mtp` source the same way against
//! `xtask/python/oracle_qwen_mtp.py` (mlx-lm's hybrid target and decoder
//! layer, the head's glue in mlx ops) on the synthetic `qwen3_5` checkpoints
//! that carry an MTP head (float, 4-bit, with experts): drafts and next
//! tokens equal, the head's key/value rows bit for bit equal after the
//! prefill and after every round.
//!
//! Then the GLM checkpoints whose MTP experts are stored at 8 bits
//! ([`STREAMED`]) again, ours with the target's routed experts streamed
//! from disk through a tier of one layer's experts and the MTP row's
//! experts in their 8-bit tier, against the same oracle runs.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use run_protocol::mtp::{MtpRequest, MtpSchedule, QwenMtpRequest};
use run_protocol::ExpertOptions;
use serde_json::{json, Value};

use super::compare;
use super::Counts;
use crate::runs::{self, with_suffix};
use crate::{shell, synth, synth_glm, venv};
use spec_fixtures::rng::SplitMix64;

const ORACLE: &str = "xtask/python/oracle_mtp.py";
const QWEN_ORACLE: &str = "xtask/python/oracle_qwen_mtp.py";
/// The synthetic hybrid checkpoints with an MTP head.
const QWEN_MODELS: &[&str] = &["qwen3-5", "qwen3-5-q4g32", "qwen3-5-moe"];

/// `(drafted, accepted)` per round: none, all, partial, single-token rounds.
const ROUNDS: &[(usize, usize)] = &[
    (3, 0),
    (3, 3),
    (2, 1),
    (3, 2),
    (1, 1),
    (4, 4),
    (2, 0),
    (3, 1),
    (1, 0),
    (3, 3),
    (4, 2),
    (2, 2),
];
/// The GLM checkpoints that run again with their routed experts streamed
/// through a tier of one layer's experts and the MTP row's experts in their
/// 8-bit tier (`--mtp-expert-bits 8`): stored at 8 bits (`mxfp8`, affine),
/// they stay as the oracle reads them, so every round must still equal its.
const STREAMED: &[&str] = &["glm52-mxfp4", "glm-q8g32"];
/// Longer than the checkpoints' `index_topk`: the target runs sparse.
const PROMPT_LEN: usize = 30;

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let mut models: Vec<synth::Checkpoint> = synth::ensure(&python)?
        .into_iter()
        .filter(|c| c.name.starts_with(synth_glm::NAME))
        .collect();
    if models.is_empty() {
        bail!("no GLM checkpoints");
    }
    let work = shell::root().join("target").join("gate-mtp");
    if let Some(glm52) = models.iter().find(|c| c.name == "glm52") {
        models.push(without_mtp_share(glm52, &work)?);
    }
    let qwen: Vec<synth::Checkpoint> =
        crate::synth_qwen3_next::ensure(&synth::models_dir(), &python)?
            .into_iter()
            .filter(|c| QWEN_MODELS.contains(&c.name.as_str()))
            .collect();
    if qwen.len() != QWEN_MODELS.len() {
        bail!("the synthetic hybrid checkpoints lack one of {QWEN_MODELS:?}");
    }
    shell::build().context("our runners (examples mtp_trace, qwen_mtp_trace) do not build")?;
    std::fs::create_dir_all(&work)?;
    let mut rng = SplitMix64::keyed(0x006d_7470, "mtp prompt");
    let schedule = MtpSchedule {
        prompt: (0..PROMPT_LEN).map(|_| rng.below(320) as u32).collect(),
        rounds: ROUNDS.to_vec(),
    };

    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<20} {:>7} {:>15} {:>14} {:>9}",
        "model", "rounds", "drafts equal", "cache bitwise", "seconds"
    )];
    let streamed = models
        .iter()
        .filter(|m| STREAMED.contains(&m.name.as_str()))
        .map(|m| {
            let tier = synth_glm::routed_experts(&m.dir)?;
            eprintln!(
                "mtp: {}'s routed experts {} bytes in {} layers, tier {} bytes (one layer's): {:.1}x the tier",
                m.name,
                tier.bytes,
                tier.layers,
                tier.layer_bytes(),
                tier.bytes as f64 / tier.layer_bytes() as f64
            );
            let experts = ExpertOptions {
                cache_bytes: Some(usize::try_from(tier.layer_bytes())?),
                mtp_expert_bits: Some(8),
            };
            Ok((m, Family::Glm, experts))
        })
        .collect::<Result<Vec<_>>>()?;
    if streamed.len() != STREAMED.len() {
        bail!("the synthetic GLM checkpoints lack one of {STREAMED:?}");
    }
    let runs = models
        .iter()
        .map(|m| (m, Family::Glm, ExpertOptions::default()))
        .chain(
            qwen.iter()
                .map(|m| (m, Family::Qwen, ExpertOptions::default())),
        )
        .chain(streamed);
    for (model, family, experts) in runs {
        let t = Instant::now();
        let streams = experts.cache_bytes.is_some();
        let name = if streams {
            format!("{}+streamed", model.name)
        } else {
            model.name.clone()
        };
        let outcome = check(
            &python,
            family,
            &model.dir,
            &schedule,
            &work.join(&model.name),
            experts,
        );
        let seconds = t.elapsed().as_secs_f64();
        match outcome {
            Ok((drafts, caches)) => {
                let pass = drafts == ROUNDS.len() && caches == ROUNDS.len();
                counts.count(pass);
                table.push(format!(
                    "{name:<20} {:>7} {:>15} {:>14} {seconds:>9.1}",
                    ROUNDS.len(),
                    drafts,
                    caches
                ));
            }
            Err(e) => {
                counts.failed += 1;
                eprintln!("mtp: {name}: {e:#}");
                table.push(format!(
                    "{name:<20} {:>7} {:>15} {:>14} {seconds:>9.1}",
                    ROUNDS.len(),
                    "error",
                    "-"
                ));
            }
        }
    }
    println!("\n{}", table.join("\n"));
    println!(
        "mtp: {} of {} checkpoints equal the oracle in every round",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// A copy of `model` with `index_share_for_mtp_iteration` false (its
/// weights linked, not copied).
fn without_mtp_share(model: &synth::Checkpoint, work: &Path) -> Result<synth::Checkpoint> {
    let dir = work.join("glm52-noshare-model");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let config_path = model.dir.join("config.json");
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| config_path.display().to_string())?,
    )?;
    config["index_share_for_mtp_iteration"] = json!(false);
    std::fs::write(dir.join("config.json"), config.to_string())?;
    for entry in std::fs::read_dir(&model.dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            if let Some(name) = path.file_name() {
                std::os::unix::fs::symlink(&path, dir.join(name))?;
            }
        }
    }
    Ok(synth::Checkpoint {
        name: "glm52-noshare".to_owned(),
        dir,
    })
}

/// Which MTP source and oracle a checkpoint takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Glm,
    Qwen,
}

/// Rounds whose drafts (and next token, offset) match, and rounds whose MTP
/// cache matches bit for bit (a Qwen head's cache after the prefill too).
/// With `experts` streaming the target's, ours runs again, against the
/// oracle's report that the resident run left in `work`.
fn check(
    python: &Path,
    family: Family,
    model: &Path,
    schedule: &MtpSchedule,
    work: &Path,
    experts: ExpertOptions,
) -> Result<(usize, usize)> {
    std::fs::create_dir_all(work)?;
    let oracle = work.join("oracle");
    let streams = experts.cache_bytes.is_some();
    if !streams {
        // The oracle's `--schedule` file.
        let schedule_file = work.join("schedule.json");
        std::fs::write(&schedule_file, serde_json::to_string(schedule)?)?;
        shell::run(
            venv::python_command(python)
                .arg(shell::root().join(match family {
                    Family::Glm => ORACLE,
                    Family::Qwen => QWEN_ORACLE,
                }))
                .arg("--model")
                .arg(model)
                .arg("--schedule")
                .arg(&schedule_file)
                .arg("--out")
                .arg(&oracle),
        )
        .context("the MTP oracle failed")?;
    }
    let ours = work.join(if streams { "ours-streamed" } else { "ours" });
    let request = MtpRequest {
        model: model.to_owned(),
        schedule: schedule.clone(),
        tensors: with_suffix(&ours, ".safetensors"),
        experts,
    };
    // The oracle writes our report's form.
    let b = match family {
        Family::Glm => runs::example(&request, &ours, &[]).context("mtp_trace failed")?,
        Family::Qwen => {
            runs::example(&QwenMtpRequest(request), &ours, &[]).context("qwen_mtp_trace failed")?
        }
    }
    .rounds;
    let a = runs::read_report::<MtpRequest>(&with_suffix(&oracle, ".json"))?.rounds;
    if a.len() != ROUNDS.len() || b.len() != ROUNDS.len() {
        bail!(
            "{} oracle rounds, {} of ours, for {}",
            a.len(),
            b.len(),
            ROUNDS.len()
        );
    }
    let drafts = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    if let Some((r, (x, y))) = a.iter().zip(&b).enumerate().find(|(_, (x, y))| x != y) {
        eprintln!("mtp: round {r} differs: oracle {x:?} vs ours {y:?}");
    }
    let (ta, tb) = (
        std::fs::read(with_suffix(&oracle, ".safetensors"))?,
        std::fs::read(with_suffix(&ours, ".safetensors"))?,
    );
    let (sa, sb) = (
        safetensors::SafeTensors::deserialize(&ta)?,
        safetensors::SafeTensors::deserialize(&tb)?,
    );
    let mut caches = 0;
    let names = |s: &safetensors::SafeTensors<'_>| -> Vec<String> {
        let mut n: Vec<String> = s.names().into_iter().map(str::to_owned).collect();
        n.sort();
        n
    };
    if names(&sa) != names(&sb) {
        bail!(
            "the oracle saved {:?}, we saved {:?}",
            names(&sa),
            names(&sb)
        );
    }
    // Every tensor of round r is named `*_{r}`; a Qwen head's prefill rows
    // (`*_prefill`) must match too.
    let all = names(&sa);
    let same = |suffix: &str| {
        let parts: Vec<&String> = all.iter().filter(|n| n.ends_with(suffix)).collect();
        !parts.is_empty()
            && parts.iter().all(|name| {
                match (synth::read_f32(&sa, name), synth::read_f32(&sb, name)) {
                    (Ok((s1, v1)), Ok((s2, v2))) => {
                        s1 == s2 && compare::max_difference(&v1, &v2) == 0.0
                    }
                    _ => false,
                }
            })
    };
    if family == Family::Qwen && !same("_prefill") {
        bail!("the MTP cache differs after the prefill");
    }
    for r in 0..ROUNDS.len() {
        if same(&format!("_{r}")) {
            caches += 1;
        } else {
            eprintln!("mtp: MTP cache differs after round {r}");
        }
    }
    Ok((drafts, caches))
}
