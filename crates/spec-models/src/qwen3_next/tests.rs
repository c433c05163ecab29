//! `qwen3_next` on a tiny synthetic checkpoint: batched rows equal rows
//! alone, strict loading names the tensor at fault, the recurrent caches roll
//! back to the bits plain decoding leaves.

use mlx_rs::Array;
use spec_core::{LayerCache, Target, TargetOutput};
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

/// Logits of each position of the decoding window `window`, `[L * vocab]`.
fn window_logits(model: &Model, caches: &mut spec_core::CacheSet, window: &[u32]) -> Vec<f32> {
    let out = model.decode(&ids(window), caches, &[]).expect("window");
    logits(model, &out)
}

#[test]
fn a_rolled_back_window_leaves_the_bits_of_plain_decoding() {
    for spec in [tiny(), tiny_qwen3_5()] {
        let (_d, model) = load(&spec);
        check_rollback(&model);
    }
}

/// Keys and values in 4 bits (`--kv-bits`, head dimension 32): rows in a
/// batch equal rows alone, a rolled-back window leaves plain decoding's
/// bits, and the quantized caches changed the logits.
#[test]
fn kv_quantized_hybrids_keep_batch_and_rollback_exactness() {
    let options = LoadOptions {
        kv_quantization: Some(crate::cache::KvQuantization::new(4, 32, 0).expect("params")),
        ..LoadOptions::default()
    };
    for spec in [tiny(), tiny_qwen3_5()] {
        let spec = Qwen3Next {
            head_dim: 32,
            ..spec
        };
        let dir = tempfile::tempdir().expect("tempdir");
        spec.write(dir.path()).expect("fixture");
        let model = Model::load(dir.path(), &options).expect("load");
        check_rows_alone(&model, &mixed(13), &[0]);
        check_rollback(&model);
        let float = Model::load(dir.path(), &LoadOptions::default()).expect("load");
        let prompt = ids(&[3, 14, 15, 92, 65, 35]);
        let (mut a, mut b) = (model.make_caches(), float.make_caches());
        let quantized = model.forward(&prompt, &mut a, &[]).expect("prefill");
        let plain = float.forward(&prompt, &mut b, &[]).expect("prefill");
        assert_ne!(logits(&model, &quantized), logits(&float, &plain));
    }
}

/// Plain: the prompt, then one token at a time. Speculative: the prompt, a
/// window with three rejected drafts trimmed off, then the same next
/// tokens. Every position's logits are the same bits either way, and the
/// window's own positions equal the one-token steps'.
fn check_rollback(model: &Model) {
    let prompt = [3u32, 14, 15, 92, 65, 35];
    let accepted = [89u32, 79];
    let after = [32u32, 38, 46];
    let mut plain = model.make_caches();
    model
        .forward(&ids(&prompt), &mut plain, &[])
        .expect("prefill");
    let mut plain_logits = Vec::new();
    for t in accepted.iter().chain(&after) {
        plain_logits.push(window_logits(model, &mut plain, &[*t]));
    }
    let mut spec_caches = model.make_caches();
    model
        .forward(&ids(&prompt), &mut spec_caches, &[])
        .expect("prefill");
    spec_caches.commit_to(spec_caches.offset());
    let window = [accepted[0], accepted[1], 7, 7, 7];
    assert!(spec_caches.can_trim_after(window.len(), window.len()));
    let verified = window_logits(model, &mut spec_caches, &window);
    let vocab = plain_logits[0].len();
    for (i, want) in plain_logits.iter().take(2).enumerate() {
        assert_eq!(
            &verified[i * vocab..(i + 1) * vocab],
            &want[..],
            "position {i}"
        );
    }
    spec_caches.trim(3).expect("rollback");
    spec_caches.commit_to(spec_caches.offset());
    assert_eq!(spec_caches.offset(), prompt.len() + 2);
    for (t, want) in after.iter().zip(&plain_logits[2..]) {
        assert_eq!(&window_logits(model, &mut spec_caches, &[*t]), want);
    }
    let err = spec_caches.trim(4).expect_err("rolled back past a commit");
    assert!(err.to_string().contains("cannot roll back"), "{err}");
    assert_eq!(
        spec_caches.offset(),
        prompt.len() + 5,
        "a refused trim changes nothing"
    );
}

#[test]
fn each_rollback_position_holds_the_states_its_geometry_says_until_a_commit() {
    let (_d, model) = load(&tiny());
    let c = model.config();
    let linear = c
        .mixers
        .iter()
        .filter(|m| matches!(m, super::config::Mixer::Linear))
        .count();
    let per_layer = c.linear.state_bytes(4);
    let mut caches = model.make_caches();
    model
        .forward(&ids(&[1, 2, 3]), &mut caches, &[])
        .expect("prefill");
    caches.commit_to(caches.offset());
    let held = |caches: &mut spec_core::CacheSet| -> (usize, usize) {
        let mut out = (0, 0);
        for i in 0..caches.len() {
            let cache = caches.get_mut(i).and_then(|c| c.as_any_mut());
            if let Some(d) = cache.and_then(|c| c.downcast_mut::<super::DeltaCache>()) {
                assert_eq!(d.position_bytes(), per_layer);
                out = (out.0 + d.nbytes(), out.1 + d.rollback_depth());
            }
        }
        out
    };
    assert_eq!(held(&mut caches), (linear * per_layer, 0));
    model
        .decode(&ids(&[4, 5, 6, 7, 8]), &mut caches, &[])
        .expect("window");
    assert_eq!(held(&mut caches), (6 * linear * per_layer, 5 * linear));
    caches.trim(2).expect("trim");
    caches.commit_to(caches.offset());
    assert_eq!(held(&mut caches), (linear * per_layer, 0));
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
