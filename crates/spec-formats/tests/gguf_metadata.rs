//! GGUF metadata our reader turns into a config, on small hand-written
//! files: what each architecture and rope scaling key becomes, and the
//! keys and tensors it refuses by name. (llama.cpp's own conversions of
//! whole checkpoints are gate `gguf`'s.)

use mlx_rs::io::{GgufFile, GgufMetadataValue};
use mlx_rs::Array;
use spec_formats::gguf;
use spec_runtime::DtypePolicy;

type Metadata = Vec<(String, GgufMetadataValue)>;

fn number(v: f32) -> GgufMetadataValue {
    Array::from_slice(&[v], &[1]).into()
}

/// A one-tensor file of architecture `arch` (embeddings only: enough for
/// the config) with `extra` metadata.
fn read(
    arch: &str,
    extra: Metadata,
    tensors: &[(&str, Array)],
) -> Result<serde_json::Value, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    let mut file = GgufFile::new().expect("new GGUF");
    file.insert_array(
        "token_embd.weight",
        &Array::from_slice(&[0.5_f32; 64], &[8, 8]),
    )
    .expect("tensor");
    for (name, array) in tensors {
        file.insert_array(name, array).expect("tensor");
    }
    let mut metadata: Metadata = vec![
        ("general.architecture".into(), arch.into()),
        (format!("{arch}.attention.head_count"), number(2.0)),
        (format!("{arch}.embedding_length"), number(8.0)),
        (format!("{arch}.block_count"), number(0.0)),
        (format!("{arch}.feed_forward_length"), number(16.0)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            number(1e-5),
        ),
    ];
    metadata.extend(extra);
    for (key, value) in metadata {
        file.insert_metadata(&key, value).expect("metadata");
    }
    file.save(&path).expect("save");
    gguf::read(&path, DtypePolicy::Float32)
        .map(|c| c.config)
        .map_err(|e| e.to_string())
}

#[test]
fn architectures_keep_their_model_type_and_head_dimension() {
    for arch in ["llama", "qwen2", "qwen3"] {
        let config = read(
            arch,
            vec![
                (format!("{arch}.attention.key_length"), number(16.0)),
                (format!("{arch}.rope.dimension_count"), number(16.0)),
            ],
            &[],
        )
        .expect(arch);
        assert_eq!(config["model_type"], arch);
        assert_eq!(config["head_dim"], 16);
        assert_eq!(config["attention_bias"], false);
        assert!(config.get("rope_scaling").is_none(), "{config}");
    }
    let moe = read(
        "qwen3moe",
        vec![
            ("qwen3moe.expert_count".into(), number(8.0)),
            ("qwen3moe.expert_used_count".into(), number(2.0)),
            ("qwen3moe.expert_feed_forward_length".into(), number(4.0)),
        ],
        &[],
    )
    .expect("qwen3moe");
    assert_eq!(moe["model_type"], "qwen3_moe");
    assert_eq!(moe["num_experts"], 8);
    assert_eq!(moe["num_experts_per_tok"], 2);
    assert_eq!(moe["moe_intermediate_size"], 4);
    assert_eq!(moe["norm_topk_prob"], true);
    let err = read(
        "qwen3moe",
        vec![("qwen3moe.expert_count".into(), number(8.0))],
        &[],
    )
    .expect_err("no expert_used_count");
    assert!(err.contains("qwen3moe.expert_used_count"), "{err}");
    let err = read("phi3", vec![], &[]).expect_err("unsupported");
    assert!(err.contains("phi3") && err.contains("qwen3"), "{err}");
}

#[test]
fn rope_scaling_keys_become_rope_scaling() {
    let linear = read(
        "llama",
        vec![
            ("llama.rope.scaling.type".into(), "linear".into()),
            ("llama.rope.scaling.factor".into(), number(4.0)),
        ],
        &[],
    )
    .expect("linear");
    assert_eq!(
        linear["rope_scaling"],
        serde_json::json!({"rope_type": "linear", "factor": 4.0})
    );
    let yarn = read(
        "qwen2",
        vec![
            ("qwen2.rope.scaling.type".into(), "yarn".into()),
            ("qwen2.rope.scaling.factor".into(), number(4.0)),
            (
                "qwen2.rope.scaling.original_context_length".into(),
                number(32768.0),
            ),
            ("qwen2.rope.scaling.yarn_beta_fast".into(), number(16.0)),
        ],
        &[],
    )
    .expect("yarn");
    assert_eq!(
        yarn["rope_scaling"],
        serde_json::json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32768.0, "beta_fast": 16.0})
    );
}

#[test]
fn scaling_and_rotation_we_do_not_read_are_refused_by_name() {
    let refused = |extra: Metadata, tensors: &[(&str, Array)], named: &str| {
        let err = read("llama", extra, tensors).expect_err(named);
        assert!(err.contains(named), "{named}: {err}");
    };
    refused(
        vec![
            ("llama.rope.scaling.type".into(), "longrope".into()),
            ("llama.rope.scaling.factor".into(), number(4.0)),
        ],
        &[],
        "longrope",
    );
    refused(
        vec![
            ("llama.rope.scaling.type".into(), "yarn".into()),
            ("llama.rope.scaling.factor".into(), number(4.0)),
            (
                "llama.rope.scaling.original_context_length".into(),
                number(64.0),
            ),
            ("llama.rope.scaling.yarn_log_multiplier".into(), number(0.1)),
        ],
        &[],
        "llama.rope.scaling.yarn_log_multiplier",
    );
    refused(
        vec![("llama.rope.scaling.type".into(), "yarn".into())],
        &[],
        "llama.rope.scaling.factor",
    );
    refused(
        vec![("llama.rope.dimension_count".into(), number(2.0))],
        &[],
        "llama.rope.dimension_count",
    );
    // Llama 3's factors for a head dimension of 4 are two; three are not.
    refused(
        vec![],
        &[(
            "rope_freqs.weight",
            Array::from_slice(&[1.0_f32, 1.0, 8.0], &[3]),
        )],
        "rope_freqs",
    );
}
