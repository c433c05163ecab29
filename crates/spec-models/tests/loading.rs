//! Loading checkpoints: single and sharded safetensors load the same model;
//! bad checkpoints fail with errors naming the file and the problem. Every
//! checkpoint is `spec_fixtures`' tiny llama, written and then altered.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;
use serde_json::{json, Value};
use spec_core::Target;
use spec_fixtures::llama::Llama;
use spec_models::{load_model, LoadOptions, ModelError};

const SPEC: Llama = Llama::tiny(11);
const HIDDEN: i32 = SPEC.hidden as i32;
const VOCAB: i32 = SPEC.vocab as i32;

/// The fixture, as written, in a fresh temporary directory.
fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    SPEC.write(dir.path()).expect("fixture");
    dir
}

/// The tensors of a checkpoint's `model.safetensors`, read into memory (MLX
/// reads lazily, and the tests rewrite or remove the file).
fn tensors(dir: &Path) -> HashMap<String, Array> {
    let t = Array::load_safetensors(dir.join("model.safetensors")).expect("weights");
    for a in t.values() {
        a.eval().expect("eval");
    }
    t
}

fn load(dir: &Path) -> Result<spec_models::LoadedModel, ModelError> {
    load_model(dir, &LoadOptions::default())
}

#[test]
fn a_good_checkpoint_loads_and_runs() {
    let dir = checkpoint();
    let model = load(dir.path()).expect("load");
    let mut caches = model.make_caches();
    let out = model
        .forward(
            &Array::from_slice(&[1u32, 2, 3], &[1, 3]),
            &mut caches,
            &[0],
        )
        .expect("forward");
    assert_eq!(out.hidden.shape(), &[1, 3, HIDDEN]);
    assert_eq!(out.taps.expect("taps").shape(), &[1, 3, HIDDEN]);
    assert_eq!(
        model.logits(&out.hidden).expect("logits").shape(),
        &[1, 3, VOCAB]
    );
    assert_eq!(caches.offset(), 3);
}

/// The fixture, altered by `edit`, fails to load with an error holding
/// every needle.
fn expect_error(edit: impl FnOnce(&Path), needles: &[&str]) {
    let dir = checkpoint();
    edit(dir.path());
    let err = load(dir.path()).expect_err("must fail").to_string();
    for needle in needles {
        assert!(err.contains(needle), "`{err}` lacks `{needle}`");
    }
}

fn expect_config_error(edit: impl FnOnce(&mut Value), needles: &[&str]) {
    expect_error(
        |dir| {
            let mut config = SPEC.config();
            edit(&mut config);
            spec_fixtures::write_config(dir, &config).expect("config");
        },
        needles,
    );
}

fn expect_tensors_error(edit: impl FnOnce(&mut HashMap<String, Array>), needles: &[&str]) {
    expect_error(
        |dir| {
            let mut t = tensors(dir);
            edit(&mut t);
            Array::save_safetensors(t, None, dir.join("model.safetensors")).expect("weights");
        },
        needles,
    );
}

#[test]
fn missing_config_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = load(dir.path()).expect_err("must fail").to_string();
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn unknown_architecture_is_named() {
    expect_config_error(
        |c| c["model_type"] = json!("gpt_neox"),
        &["gpt_neox", "config.json", "supported"],
    );
}

#[test]
fn impossible_shapes_are_rejected() {
    assert_ne!(SPEC.heads % 3, 0, "3 kv heads must not divide the heads");
    expect_config_error(
        |c| c["num_key_value_heads"] = json!(3),
        &["num_key_value_heads 3"],
    );
    expect_config_error(|c| c["hidden_act"] = json!("gelu"), &["gelu"]);
    expect_config_error(
        |c| c["vocab_size"] = json!(VOCAB + 1),
        &[
            "model.embed_tokens.weight",
            &format!("[{VOCAB}, {HIDDEN}]"),
            &format!("[{}, {HIDDEN}]", VOCAB + 1),
        ],
    );
}

#[test]
fn missing_and_unexpected_tensors_are_named() {
    expect_tensors_error(
        |t| {
            t.remove("model.layers.0.mlp.up_proj.weight")
                .expect("the fixture has it");
        },
        &["missing tensor", "model.layers.0.mlp.up_proj.weight"],
    );
    expect_tensors_error(
        |t| {
            t.insert(
                "model.layers.0.extra.weight".into(),
                Array::from_slice(&[1.0f32], &[1]),
            );
        },
        &["unexpected tensors", "model.layers.0.extra.weight"],
    );
}

#[test]
fn truncated_safetensors_names_the_file() {
    expect_error(
        |dir| {
            let file = dir.join("model.safetensors");
            let bytes = std::fs::read(&file).expect("read");
            std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
        },
        &["model.safetensors"],
    );
}

#[test]
fn broken_config_json_names_the_file() {
    expect_error(
        |dir| std::fs::write(dir.join("config.json"), "{ not json").expect("config"),
        &["config.json", "invalid config"],
    );
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let single = checkpoint();
    // The same checkpoint, its tensors split over two shards and an index.
    let sharded = checkpoint();
    let all = tensors(sharded.path());
    std::fs::remove_file(sharded.path().join("model.safetensors")).expect("remove");
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    let (first, second) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        let shard: HashMap<String, Array> = part
            .iter()
            .map(|n| ((*n).clone(), all[*n].clone()))
            .collect();
        Array::save_safetensors(&shard, None, sharded.path().join(file)).expect("shard");
        for n in part {
            weight_map.insert((*n).clone(), file.into());
        }
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .expect("index");

    let run = |dir: &Path| -> Vec<f32> {
        let model = load(dir).expect("load");
        let mut caches = model.make_caches();
        let out = model
            .forward(&Array::from_slice(&[4u32, 2, 9], &[1, 3]), &mut caches, &[])
            .expect("forward");
        let logits = model.logits(&out.hidden).expect("logits");
        logits.eval().expect("eval");
        logits.as_slice::<f32>().to_vec()
    };
    assert_eq!(run(single.path()), run(sharded.path()));

    // A shard the index names but the directory lacks is named in the error.
    std::fs::remove_file(sharded.path().join("model-00002-of-00002.safetensors")).expect("remove");
    let err = load(sharded.path()).expect_err("must fail").to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
}
