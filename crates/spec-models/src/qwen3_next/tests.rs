//! `qwen3_next` on a tiny synthetic checkpoint: batched rows equal rows
//! alone, strict loading names the tensor at fault, the recurrent caches
//! refuse to roll back.

use mlx_rs::Array;
use spec_core::{Target, TargetOutput};
use spec_fixtures::qwen3_next::{Qwen3Next, GATE, GATE_QWEN3_5};
use spec_fixtures::{write_checkpoint, Init, TensorSpec};

use super::Model;
use crate::batch_check::{check_errors, check_rows_alone, mixed};
use crate::LoadOptions;

fn tiny() -> Qwen3Next {
    Qwen3Next {
        interval: 2,
        ..GATE.tiny(7)
    }
}

fn tiny_qwen3_5() -> Qwen3Next {
    Qwen3Next {
        interval: 2,
        ..GATE_QWEN3_5.tiny(8)
    }
}

fn load(spec: &Qwen3Next) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

fn host(a: &Array) -> Vec<f32> {
    a.eval().expect("eval");
    a.as_slice::<f32>().to_vec()
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

fn logits(model: &Model, out: &TargetOutput) -> Vec<f32> {
    host(&model.logits(&out.hidden).expect("logits"))
}

#[test]
fn hybrid_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&tiny());
    check_rows_alone(&model, &mixed(13), &[0, 3]);
}

#[test]
fn hybrid_batch_errors_are_named_and_touch_no_cache() {
    let (_d, model) = load(&tiny());
    check_errors(&model);
}

#[test]
fn decoding_token_by_token_continues_the_prefill_state() {
    // The recurrent and conv states a prefill leaves are those its tokens
    // leave one at a time: the next token's logits are the same bits.
    let (_d, model) = load(&tiny());
    let prompt = [3u32, 14, 15, 92, 65, 35, 89, 79, 32];
    let mut whole = model.make_caches();
    model
        .forward(&ids(&prompt), &mut whole, &[])
        .expect("prefill");
    let mut steps = model.make_caches();
    for t in prompt {
        model.forward(&ids(&[t]), &mut steps, &[]).expect("step");
    }
    let next = ids(&[38]);
    let a = model
        .forward(&next, &mut whole, &[])
        .expect("after prefill");
    let b = model.forward(&next, &mut steps, &[]).expect("after steps");
    assert_eq!(logits(&model, &a), logits(&model, &b));
    assert_eq!(whole.offset(), prompt.len() + 1);
}

#[test]
fn recurrent_caches_refuse_to_roll_back() {
    let (_d, model) = load(&tiny());
    let mut caches = model.make_caches();
    model
        .forward(&ids(&[1, 2, 3]), &mut caches, &[])
        .expect("prefill");
    assert!(!caches.can_trim_after(2, 1) && caches.can_trim_after(1, 0));
    let err = caches.trim(1).expect_err("rolled back a recurrent state");
    assert!(err.to_string().contains("cannot roll back"), "{err}");
    assert_eq!(caches.offset(), 3, "a refused trim changes nothing");
}

/// Writes `spec`'s checkpoint with its tensor list edited by `edit`, and
/// returns the load error.
fn load_error(edit: impl FnOnce(&mut Vec<TensorSpec>)) -> String {
    let spec = tiny();
    let mut tensors = spec.tensors();
    edit(&mut tensors);
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(dir.path(), &spec.config(), &tensors, spec.seed, spec.name).expect("write");
    match Model::load(dir.path(), &LoadOptions::default()) {
        Ok(_) => panic!("loaded a broken checkpoint"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_unexpected_and_misshapen_tensors_are_named() {
    let conv = "model.layers.0.linear_attn.conv1d.weight";
    let e = load_error(|t| t.retain(|s| s.name != "model.layers.0.linear_attn.A_log"));
    assert!(e.contains("model.layers.0.linear_attn.A_log"), "{e}");
    let e = load_error(|t| {
        t.push(TensorSpec::new(
            "model.layers.0.linear_attn.extra",
            vec![2],
            Init::Normal(0.1),
        ))
    });
    assert!(e.contains("model.layers.0.linear_attn.extra"), "{e}");
    let e = load_error(|t| {
        if let Some(s) = t.iter_mut().find(|s| s.name == conv) {
            // Hugging Face's [channels, 1, kernel], which mlx-lm's dense
            // qwen3_next loads as is (and rejects).
            s.shape = vec![s.shape[0], 1, s.shape[1]];
        }
    });
    assert!(e.contains(conv), "{e}");
}

#[test]
fn a_bad_config_names_its_key() {
    let spec = tiny();
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let mut config = spec.config();
    config["linear_num_key_heads"] = 3.into();
    spec_fixtures::write_config(dir.path(), &config).expect("config");
    let e = Model::load(dir.path(), &LoadOptions::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("linear_num_key_heads"), "{e}");
}

#[test]
fn the_loader_reads_qwen3_next_by_its_model_type() {
    let spec = tiny();
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = crate::load_model(dir.path(), &LoadOptions::default()).expect("load");
    assert_eq!(model.info().model_type, "qwen3_next");
    assert_eq!(model.info().num_layers, spec.layers);
}

#[test]
fn qwen3_5_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&tiny_qwen3_5());
    assert_eq!(model.config().layout, super::config::Layout::Split);
    check_rows_alone(&model, &mixed(13), &[1]);
}

#[test]
fn a_qwen3_5_checkpoint_loads_its_text_model_and_names_a_missing_tensor() {
    let spec = tiny_qwen3_5();
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    // The vision tower and the MTP head are dropped, as mlx-lm drops them.
    let model = crate::load_model(dir.path(), &LoadOptions::default()).expect("load");
    assert_eq!(model.info().model_type, "qwen3_5");
    let mut tensors = spec.tensors();
    tensors.retain(|t| t.name != "model.language_model.layers.0.linear_attn.in_proj_z.weight");
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(dir.path(), &spec.config(), &tensors, spec.seed, spec.name).expect("write");
    let e = Model::load(dir.path(), &LoadOptions::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("layers.0.linear_attn.in_proj_z.weight"), "{e}");
}
