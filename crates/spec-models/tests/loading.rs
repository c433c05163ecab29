//! Loading checkpoints: single and sharded safetensors load the same model;
//! bad checkpoints fail with errors naming the file and the problem.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;
use spec_core::Target;
use spec_models::{load_model, LoadOptions, ModelError};

const CONFIG: &str = r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
  "intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
  "rms_norm_eps": 1e-5, "vocab_size": 11, "tie_word_embeddings": true}"#;

fn tensors() -> HashMap<String, Array> {
    let mut t = HashMap::new();
    let mut put = |name: &str, shape: &[i32]| {
        let n: i32 = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        t.insert(name.to_owned(), Array::from_slice(&data, shape));
    };
    put("model.embed_tokens.weight", &[11, 8]);
    put("model.norm.weight", &[8]);
    let p = "model.layers.0";
    for (n, s) in [
        ("self_attn.q_proj.weight", [8, 8]),
        ("self_attn.k_proj.weight", [4, 8]),
        ("self_attn.v_proj.weight", [4, 8]),
        ("self_attn.o_proj.weight", [8, 8]),
        ("mlp.gate_proj.weight", [16, 8]),
        ("mlp.up_proj.weight", [16, 8]),
        ("mlp.down_proj.weight", [8, 16]),
    ] {
        put(&format!("{p}.{n}"), &s);
    }
    put(&format!("{p}.input_layernorm.weight"), &[8]);
    put(&format!("{p}.post_attention_layernorm.weight"), &[8]);
    t
}

fn write(dir: &Path, config: &str, t: &HashMap<String, Array>) {
    std::fs::write(dir.join("config.json"), config).expect("config");
    Array::save_safetensors(t, None, dir.join("model.safetensors")).expect("weights");
}

fn load(dir: &Path) -> Result<spec_models::LoadedModel, ModelError> {
    load_model(dir, &LoadOptions::default())
}

#[test]
fn a_good_checkpoint_loads_and_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), CONFIG, &tensors());
    let model = load(dir.path()).expect("load");
    let mut caches = model.make_caches();
    let out = model
        .forward(
            &Array::from_slice(&[1u32, 2, 3], &[1, 3]),
            &mut caches,
            &[0],
        )
        .expect("forward");
    assert_eq!(out.hidden.shape(), &[1, 3, 8]);
    assert_eq!(out.taps.expect("taps").shape(), &[1, 3, 8]);
    assert_eq!(
        model.logits(&out.hidden).expect("logits").shape(),
        &[1, 3, 11]
    );
    assert_eq!(caches.offset(), 3);
}

fn expect_error(config: &str, t: &HashMap<String, Array>, needles: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), config, t);
    let err = load(dir.path()).expect_err("must fail").to_string();
    for needle in needles {
        assert!(err.contains(needle), "`{err}` lacks `{needle}`");
    }
}

#[test]
fn missing_config_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = load(dir.path()).expect_err("must fail").to_string();
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn unknown_architecture_is_named() {
    expect_error(
        &CONFIG.replace("\"llama\"", "\"gpt_neox\""),
        &tensors(),
        &["gpt_neox", "config.json", "supported"],
    );
}

#[test]
fn impossible_shapes_are_rejected() {
    expect_error(
        &CONFIG.replace("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3"),
        &tensors(),
        &["num_key_value_heads 3"],
    );
    expect_error(
        &CONFIG.replace(
            "\"rms_norm_eps\": 1e-5",
            "\"rms_norm_eps\": 1e-5, \"hidden_act\": \"gelu\"",
        ),
        &tensors(),
        &["gelu"],
    );
    expect_error(
        &CONFIG.replace("\"vocab_size\": 11", "\"vocab_size\": 12"),
        &tensors(),
        &["model.embed_tokens.weight", "[11, 8]", "[12, 8]"],
    );
}

#[test]
fn missing_and_unexpected_tensors_are_named() {
    let mut t = tensors();
    t.remove("model.layers.0.mlp.up_proj.weight");
    expect_error(
        CONFIG,
        &t,
        &["missing tensor", "model.layers.0.mlp.up_proj.weight"],
    );
    let mut t = tensors();
    t.insert(
        "model.layers.0.extra.weight".into(),
        Array::from_slice(&[1.0f32], &[1]),
    );
    expect_error(
        CONFIG,
        &t,
        &["unexpected tensors", "model.layers.0.extra.weight"],
    );
}

#[test]
fn truncated_safetensors_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), CONFIG, &tensors());
    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).expect("read");
    std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
    let err = load(dir.path()).expect_err("must fail").to_string();
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn broken_config_json_names_the_file() {
    expect_error("{ not json", &tensors(), &["config.json", "invalid config"]);
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let single = tempfile::tempdir().expect("tempdir");
    write(single.path(), CONFIG, &tensors());
    let sharded = tempfile::tempdir().expect("tempdir");
    std::fs::write(sharded.path().join("config.json"), CONFIG).expect("config");
    let all = tensors();
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
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
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
