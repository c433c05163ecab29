//! One drafter step on random inputs, for the oracle gate's bitwise
//! comparison with optiq's `GemmaAssistantDrafter.forward`
//! (`xtask/python/oracle_assistant.py step`).
//!
//! `assistant_step REQUEST.json`: a `run_protocol::assistant::StepRequest`.
//! Writes the inputs it drew (`emb.i`, `hidden.i`, `sk.i`, `sv.i`, `fk.i`,
//! `fv.i`, `pos.i`) and its outputs (`logits.i`, `next_hidden.i`). The cases
//! vary the query position, the donor lengths (one sliding donor longer
//! than the window, so the sliding mask applies) and the full donor's key
//! heads (1 and the config's count).

use std::collections::HashMap;

use anyhow::Result;
use draft_gemma4_assistant::{AssistantModel, DonorKv, DonorPair};
use mlx_rs::Array;
use run_protocol::assistant::{StepReport, StepRequest};
use spec_models::DtypePolicy;

fn main() -> Result<()> {
    let request: StepRequest = run_protocol::read_request()?;
    let (assistant, cases) = (&request.assistant, request.cases);
    let model = AssistantModel::load(assistant, DtypePolicy::Float32)?;
    let c = model.config().clone();
    let key = mlx_rs::random::key(0x5eed)?;
    let mut keys = mlx_rs::random::split(&key, 2)?;
    let mut draw = |shape: &[i32]| -> Result<Array> {
        let (a, b) = mlx_rs::random::split(&keys.1, 2)?;
        keys = (a.clone(), b);
        Ok(mlx_rs::random::normal::<f32>(shape, None, None, &a)?)
    };
    let (mut ins, mut outs): (HashMap<String, Array>, HashMap<String, Array>) =
        (HashMap::new(), HashMap::new());
    for i in 0..cases {
        let position = 3 + 7 * i;
        let sliding_rows = if i == 1 {
            c.sliding_window + 3
        } else {
            position.min(c.sliding_window - 1)
        };
        let full_heads = if i % 2 == 0 { c.kv_heads } else { 1 };
        let emb = draw(&[1, 1, c.backbone_hidden])?;
        let hidden = draw(&[1, 1, c.backbone_hidden])?;
        let sliding = DonorKv {
            keys: draw(&[1, c.kv_heads, sliding_rows as i32, c.head_dim])?,
            values: draw(&[1, c.kv_heads, sliding_rows as i32, c.head_dim])?,
        };
        let full = DonorKv {
            keys: draw(&[1, full_heads, position as i32, c.global_head_dim])?,
            values: draw(&[1, full_heads, position as i32, c.global_head_dim])?,
        };
        let step = model.step(
            &emb,
            &hidden,
            &DonorPair {
                sliding: Some(sliding.clone()),
                full: Some(full.clone()),
            },
            position,
        )?;
        for (name, a) in [
            ("emb", emb),
            ("hidden", hidden),
            ("sk", sliding.keys),
            ("sv", sliding.values),
            ("fk", full.keys),
            ("fv", full.values),
            ("pos", Array::from_int(position as i32)),
        ] {
            ins.insert(format!("{name}.{i}"), a);
        }
        outs.insert(format!("logits.{i}"), step.logits);
        outs.insert(format!("next_hidden.{i}"), step.next_hidden);
    }
    Array::save_safetensors(
        ins.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        &request.inputs,
    )?;
    Array::save_safetensors(
        outs.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        &request.outputs,
    )?;
    run_protocol::write_report::<StepRequest>(&StepReport { cases })?;
    Ok(())
}
