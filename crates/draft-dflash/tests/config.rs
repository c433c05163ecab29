//! Bad checkpoints and mismatched targets are refused at load or open, with
//! the error naming the key; the shipped schema (both `block_size`
//! placements, the Hub's bookkeeping keys) loads.

#![allow(clippy::unwrap_used)]

mod common;

use draft_dflash::{DFlashError, DFlashModel, DFlashProvider, DrafterError, Options};
use serde_json::{json, Value};
use spec_core::ProviderOptions;
use spec_fixtures::dflash::GATE_LLAMA;
use spec_fixtures::llama::Llama;
use spec_runtime::LoadOptions;

fn load_err(edit: impl FnOnce(&mut Value)) -> DFlashError {
    let dir = common::checkpoint_with(edit);
    DFlashModel::load(dir.path(), &LoadOptions::default()).unwrap_err()
}

/// `check(edit, key)`: the edited config is refused by an error naming `key`.
fn check(edit: impl FnOnce(&mut Value), key: &str) {
    let e = load_err(edit);
    let named = match &e {
        DFlashError::Drafter(DrafterError::MissingKey { key, .. })
        | DFlashError::Drafter(DrafterError::InvalidValue { key, .. })
        | DFlashError::Drafter(DrafterError::Unsupported { key, .. }) => key.clone(),
        other => panic!("expected a key error naming {key}, got {other}"),
    };
    assert_eq!(named, key, "{e}");
    assert!(e.to_string().contains(key), "{e}");
}

#[test]
fn the_shipped_schema_and_the_minimal_one_both_load() {
    let dir = tempfile::tempdir().unwrap();
    GATE_LLAMA.write(dir.path()).unwrap();
    let m = DFlashModel::load(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(
        m.config().block_size,
        GATE_LLAMA.block_size,
        "top-level block_size"
    );
    assert_eq!(m.config().target_layer_ids, GATE_LLAMA.taps);
    let m = common::load(common::checkpoint().path());
    assert_eq!(
        m.config().block_size,
        common::BLOCK,
        "dflash_config.block_size"
    );
    assert_eq!(m.config().mask_token_id, common::LAYOUT.mask_token as u32);
    assert!(m.config().softcap.is_none());
    assert_eq!(m.config().input_embedding_scale, 1.0);
    assert!(m.weights_bytes() > 0);
}

#[test]
fn bad_configs_are_refused_naming_the_key() {
    check(
        |c| c["dflash_config"]["mask_token_id"] = json!(96),
        "dflash_config.mask_token_id",
    );
    check(
        |c| c["dflash_config"]["target_layer_ids"] = json!([0, 2]),
        "dflash_config.target_layer_ids",
    );
    check(
        |c| c["dflash_config"]["target_layer_ids"] = json!([1, 0]),
        "dflash_config.target_layer_ids",
    );
    check(
        |c| c["dflash_config"]["target_layer_ids"] = json!([-1, 1]),
        "dflash_config.target_layer_ids",
    );
    check(
        |c| c["dflash_config"]["block_size"] = json!(1),
        "dflash_config.block_size",
    );
    check(
        |c| {
            c.as_object_mut().unwrap().remove("dflash_config");
        },
        "dflash_config",
    );
    check(
        |c| {
            c["dflash_config"]
                .as_object_mut()
                .unwrap()
                .remove("mask_token_id");
        },
        "dflash_config.mask_token_id",
    );
    for key in [
        "conv_kernel_size",
        "conv_group_size",
        "selector_rank",
        "selector_top_k",
    ] {
        check(
            |c| c["dflash_config"][key] = json!(4),
            &format!("dflash_config.{key}"),
        );
    }
    check(
        |c| c["dflash_config"]["future_knob"] = json!(1),
        "dflash_config.future_knob",
    );
    check(
        |c| c["layer_types"] = json!(["full_attention", "full_attention"]),
        "layer_types",
    );
    check(|c| c["is_causal"] = json!("yes"), "is_causal");
    check(|c| c["hidden_act"] = json!("gelu"), "hidden_act");
    check(
        |c| c["num_key_value_heads"] = json!(3),
        "num_key_value_heads",
    );
    check(|c| c["head_dim"] = json!(0), "head_dim");
}

#[test]
fn missing_and_extra_tensors_are_refused_naming_them() {
    let dir = common::checkpoint();
    let path = dir.path().join("model.safetensors");
    let mut tensors = spec_runtime::weights::load_file(&path).unwrap();
    // Read every tensor before the file is overwritten.
    mlx_rs::transforms::eval(tensors.values()).unwrap();
    let v = tensors.remove("layers.0.self_attn.v_proj.weight").unwrap();
    let save = |t: &std::collections::HashMap<String, mlx_rs::Array>| {
        mlx_rs::Array::save_safetensors(t.iter().map(|(k, v)| (k.as_str(), v)), None, &path)
            .unwrap()
    };
    save(&tensors);
    let e = DFlashModel::load(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("layers.0.self_attn.v_proj.weight"),
        "{e}"
    );
    tensors.insert("layers.0.self_attn.v_proj.weight".into(), v);
    tensors.insert(
        "embed_tokens.weight".into(),
        mlx_rs::Array::zeros::<f32>(&[96, 64]).unwrap(),
    );
    save(&tensors);
    let e = DFlashModel::load(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("embed_tokens.weight"), "{e}");
}

/// A target the drafter was not made for: each difference is refused when
/// the provider is built, naming the key.
#[test]
fn a_target_it_was_not_made_for_is_refused() {
    let drafter = common::checkpoint();
    let base = common::target_specs()[0];
    for (target, key) in [
        (Llama { hidden: 32, ..base }, "hidden_size"),
        (Llama { vocab: 128, ..base }, "vocab_size"),
        (Llama { layers: 3, ..base }, "num_target_layers"),
    ] {
        let (_t, target) = common::load_target(&target);
        let e = DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap_err();
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
}

#[test]
fn options_are_checked_and_the_provider_is_registered() {
    let dir = common::checkpoint();
    let opts = |pairs: &[(&str, &str)]| -> ProviderOptions {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert!(Options::parse(&opts(&[])).is_err(), "model is required");
    assert!(Options::parse(&opts(&[("model", "/x"), ("threshold", "0.5")])).is_err());
    assert!(Options::parse(&opts(&[("model", "/x"), ("dtype", "f16")])).is_err());
    let model = dir.path().display().to_string();
    let o = opts(&[("model", &model)]);
    assert_eq!(Options::parse(&o).unwrap().model, dir.path());
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let reg = spec_core::resolve(draft_dflash::ID).unwrap();
    let provider = (reg.build)(&target, &o).unwrap();
    assert_eq!(provider.id(), "dflash");
    assert_eq!(provider.default_num_draft(), common::BLOCK - 1);
}

/// A config edited into DFlash2 with valid convolution and selector keys.
fn dflash2(c: &mut Value) {
    c["architectures"] = json!(["DFlash2DraftModel"]);
    let d = &mut c["dflash_config"];
    d["conv_kernel_size"] = json!(3);
    d["conv_group_size"] = json!(common::HIDDEN / 2);
    d["selector_rank"] = json!(4);
    d["selector_top_k"] = json!(2);
}

#[test]
fn dflash2_loads_and_its_bad_keys_are_refused_naming_them() {
    let dir = common::checkpoint_with(dflash2);
    // The fixture's tensors are DFlash1's: the first DFlash2 tensor is missing.
    let e = DFlashModel::load(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("layers.0.attention_conv.base_kernel"),
        "{e}"
    );
    let vocab = common::LAYOUT.vocab;
    let bad: [(&str, Value); 7] = [
        ("conv_group_size", json!(common::HIDDEN + 1)),
        ("conv_group_size", json!(common::HIDDEN / 2 - 1)),
        ("conv_group_size", json!(0)),
        ("conv_kernel_size", json!(0)),
        ("selector_rank", json!(-1)),
        ("selector_top_k", json!(0)),
        ("selector_top_k", json!(vocab + 1)),
    ];
    for (key, value) in bad {
        check(
            |c| {
                dflash2(c);
                c["dflash_config"][key] = value;
            },
            &format!("dflash_config.{key}"),
        );
    }
    check(
        |c| {
            dflash2(c);
            c["dflash_config"]
                .as_object_mut()
                .unwrap()
                .remove("selector_rank");
        },
        "dflash_config.selector_rank",
    );
}

#[test]
fn sliding_layers_need_a_window_of_two_and_known_layer_types() {
    let sliding = || json!(vec!["sliding_attention"; common::LAYOUT.layers]);
    check(|c| c["layer_types"] = sliding(), "sliding_window");
    for window in [0, 1] {
        check(
            |c| {
                c["layer_types"] = sliding();
                c["sliding_window"] = json!(window);
            },
            "sliding_window",
        );
    }
    check(
        |c| c["layer_types"] = json!(vec!["linear_attention"; common::LAYOUT.layers]),
        "layer_types",
    );
    let dir = common::checkpoint_with(|c| {
        c["layer_types"] = sliding();
        c["sliding_window"] = json!(8);
    });
    let m = common::load(dir.path());
    assert_eq!(m.config().sliding, vec![true; common::LAYOUT.layers]);
    assert_eq!(m.config().sliding_window, Some(8));
    assert!(m.config().causal(0));
}

/// `is_causal` absent: sliding layers causal, full ones not; set, every
/// layer as it says.
#[test]
fn is_causal_sets_every_layer_and_defaults_to_the_sliding_ones() {
    for (kind, is_causal, want) in [
        ("sliding_attention", None, true),
        ("full_attention", None, false),
        ("sliding_attention", Some(false), false),
        ("full_attention", Some(true), true),
    ] {
        let dir = common::checkpoint_with(|c| {
            c["layer_types"] = json!(vec![kind; common::LAYOUT.layers]);
            c["sliding_window"] = json!(8);
            if let Some(b) = is_causal {
                c["is_causal"] = json!(b);
            }
        });
        let m = common::load(dir.path());
        assert_eq!(
            m.config().causal(0),
            want,
            "{kind}, is_causal {is_causal:?}"
        );
    }
}
