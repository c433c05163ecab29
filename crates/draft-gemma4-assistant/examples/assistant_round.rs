//! One round of drafts after a full prefill, for the gate's comparison with
//! transformers' `SinglePositionMultiTokenCandidateGenerator`
//! (`xtask/python/reference_assistant.py`).
//!
//! ```text
//! assistant_round --target DIR --assistant DIR --prompts PROMPTS.json --steps N
//!                 [--positions constant|advancing|advancing-from-last-cached] --out OUT.json
//! ```
//! `PROMPTS.json` is `{"prompts": [{"ids": [...]}, ...]}`. For each prompt
//! the target prefills every token; the pending token is the greedy token
//! of the last position and the anchor the post-norm hidden there; the
//! source drafts `N` tokens. `OUT.json` holds, per prompt, `pending`,
//! `hidden` (the anchor), `tokens` and `logits` (one row per step).

use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use draft_gemma4_assistant::donors;
use draft_gemma4_assistant::{AssistantModel, AssistantSource, PositionMode};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use serde_json::{json, Value};
use spec_core::Target;
use spec_models::{load_model, DtypePolicy, LoadOptions};

struct Args {
    target: PathBuf,
    assistant: PathBuf,
    prompts: PathBuf,
    steps: usize,
    positions: PositionMode,
    out: PathBuf,
}

fn args() -> Result<Args> {
    let (mut target, mut assistant, mut prompts, mut out) = (None, None, None, None);
    let (mut steps, mut positions) = (4usize, PositionMode::default());
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--target" => target = Some(PathBuf::from(value()?)),
            "--assistant" => assistant = Some(PathBuf::from(value()?)),
            "--prompts" => prompts = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--steps" => steps = value()?.parse()?,
            "--positions" => {
                let name = value()?;
                positions = PositionMode::CHOICES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, m)| *m)
                    .with_context(|| format!("unknown position mode {name}"))?;
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let (Some(target), Some(assistant), Some(prompts), Some(out)) =
        (target, assistant, prompts, out)
    else {
        bail!("--target, --assistant, --prompts and --out are required")
    };
    Ok(Args {
        target,
        assistant,
        prompts,
        steps,
        positions,
        out,
    })
}

fn floats(a: &Array) -> Result<Vec<f32>> {
    let a = a.as_dtype(mlx_rs::Dtype::Float32)?;
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

fn main() -> Result<()> {
    let a = args()?;
    let target = load_model(&a.target, &LoadOptions::default())?;
    let model = AssistantModel::load(&a.assistant, DtypePolicy::Float32)?;
    let gemma = donors::check_target(target.as_ref(), model.config())?;
    let source = AssistantSource::new(Rc::new(model), target.as_ref(), gemma, a.positions);
    let prompts: Value = serde_json::from_str(&std::fs::read_to_string(&a.prompts)?)?;
    let mut out = Vec::new();
    for p in prompts["prompts"].as_array().context("no prompts")? {
        let ids: Vec<i32> = p["ids"]
            .as_array()
            .context("a prompt without ids")?
            .iter()
            .map(|v| v.as_i64().map(|i| i as i32).context("a non-integer id"))
            .collect::<Result<_>>()?;
        let mut caches = target.make_caches();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let hidden = target.forward(&tokens, &mut caches, &[])?.hidden;
        let last = ids.len() as i32 - 1;
        let anchor = hidden.index((.., last..last + 1, ..));
        let logits = target.logits(&anchor)?;
        let pending = argmax_axis(&logits.reshape(&[-1])?, 0, None)?.try_item_cast::<u32>()?;
        let round = source.round(pending, &anchor, &caches, a.steps)?;
        out.push(json!({
            "pending": pending,
            "hidden": floats(&anchor)?,
            "tokens": round.tokens,
            "logits": round.logits.iter().map(floats).collect::<Result<Vec<_>>>()?,
        }));
    }
    std::fs::write(&a.out, serde_json::to_string(&json!({ "rounds": out }))?)?;
    Ok(())
}
