//! One round of drafts after a full prefill, for the gate's comparison with
//! transformers' `SinglePositionMultiTokenCandidateGenerator`
//! (`xtask/python/reference_assistant.py`).
//!
//! `assistant_round REQUEST.json`: a `run_protocol::assistant::RoundRequest`.
//! For each prompt the target prefills every token; the pending token is the
//! greedy token of the last position and the anchor the post-norm hidden
//! there; the source drafts `steps` tokens. The report (`Rounds`, on
//! standard output) holds, per prompt, `pending`, `hidden` (the anchor),
//! `tokens` and `logits` (one row per step).

use std::rc::Rc;

use anyhow::Result;
use draft_gemma4_assistant::donors;
use draft_gemma4_assistant::{AssistantModel, AssistantSource, PositionMode};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use run_protocol::assistant::{Positions, Round, RoundRequest, Rounds};
use spec_core::Target;
use spec_models::{load_model, DtypePolicy, LoadOptions};

fn floats(a: &Array) -> Result<Vec<f32>> {
    let a = a.as_dtype(mlx_rs::Dtype::Float32)?;
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

fn main() -> Result<()> {
    let a: RoundRequest = run_protocol::read_request()?;
    let positions = match a.positions {
        Positions::Constant => PositionMode::Constant,
        Positions::Advancing => PositionMode::Advancing,
        Positions::AdvancingFromLastCached => PositionMode::AdvancingFromLastCached,
    };
    let target = load_model(&a.target, &LoadOptions::default())?;
    let model = AssistantModel::load(&a.assistant, DtypePolicy::Float32)?;
    let gemma = donors::check_target(target.as_ref(), model.config())?;
    let source = AssistantSource::new(Rc::new(model), target.as_ref(), gemma, positions);
    let mut rounds = Vec::new();
    for prompt in &a.prompts {
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let mut caches = target.make_caches();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let hidden = target.forward(&tokens, &mut caches, &[])?.hidden;
        let last = ids.len() as i32 - 1;
        let anchor = hidden.index((.., last..last + 1, ..));
        let logits = target.logits(&anchor)?;
        let pending = argmax_axis(&logits.reshape(&[-1])?, 0, None)?.try_item_cast::<u32>()?;
        let round = source.round(pending, &anchor, &caches, a.steps)?;
        rounds.push(Round {
            pending,
            target_pending: None,
            hidden: floats(&anchor)?,
            tokens: round.tokens,
            logits: round
                .logits
                .iter()
                .map(floats)
                .collect::<Result<Vec<_>>>()?,
            raw_tokens: Vec::new(),
        });
    }
    run_protocol::write_report::<RoundRequest>(&Rounds { rounds })?;
    Ok(())
}
