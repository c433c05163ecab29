//! GLM-5.2: the released config's key set, IndexShare on tiny checkpoints
//! (shared layers without indexer tensors, both forward forms past
//! `index_topk`), the MTP row's indexer and its reuse across a draft round,
//! and the errors for bad schedules.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde_json::{json, Value};
use spec_core::Target;
use spec_fixtures::glm::IndexShare;

use super::config::{self, ConfigFile};
use super::{IndexerType, Model, MtpRoundSelection};
use crate::config::read_config;
use crate::LoadOptions;
use spec_fixtures::glm::Glm as TinyGlm;

/// Every key of GLM-5.2's released `config.json` (the FP8 release, its
/// `quantization_config` left out), with the published values.
fn glm52_config() -> Value {
    let full = |i: usize| i < 3 || (i >= 6 && (i - 6).is_multiple_of(4));
    let indexer_types: Vec<&str> = (0..78)
        .map(|i| if full(i) { "full" } else { "shared" })
        .collect();
    let mlp_layer_types: Vec<&str> = (0..78)
        .map(|i| if i < 3 { "dense" } else { "sparse" })
        .collect();
    let mut c = json!({
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "eos_token_id": [154820, 154827, 154829],
        "pad_token_id": 154820,
        "first_k_dense_replace": 3,
        "head_dim": 192,
        "hidden_act": "silu",
        "hidden_size": 6144,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "index_share_for_mtp_iteration": true,
        "index_skip_topk_offset": 3,
        "index_topk": 2048,
        "index_topk_freq": 4,
        "index_topk_pattern": null,
        "indexer_rope_interleave": true,
        "indexer_types": indexer_types,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
    });
    let rest = json!({
        "kv_lora_rank": 512,
        "max_position_embeddings": 1048576,
        "mlp_layer_types": mlp_layer_types,
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "moe_router_dtype": "float32",
        "n_group": 1,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "norm_topk_prob": true,
        "num_attention_heads": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 78,
        "num_key_value_heads": 64,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 2048,
        "qk_head_dim": 256,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05,
        "rope_interleave": true,
        "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": false,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "transformers_version": "5.24.0",
        "use_cache": true,
        "v_head_dim": 256,
        "vocab_size": 154880
    });
    if let (Some(map), Value::Object(rest)) = (c.as_object_mut(), rest) {
        map.extend(rest);
    }
    c
}

fn parse(value: &Value) -> Result<config::Config, crate::ModelError> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.json"), value.to_string()).expect("config");
    let (file, path): (ConfigFile, _) = read_config(dir.path())?;
    config::parse(file, &path).map(|(c, _)| c)
}

#[test]
fn the_released_glm52_config_gives_its_schedule() {
    let mut nvfp4 = glm52_config();
    // The NVFP4 release adds these keys.
    for (key, value) in [
        ("layer_types", json!(vec!["deepseek_sparse_attention"; 78])),
        ("num_experts", json!(256)),
        ("mlp_bias", json!(false)),
        ("bos_token_id", json!(0)),
    ] {
        nvfp4[key] = value;
    }
    for value in [glm52_config(), nvfp4] {
        let c = parse(&value).expect("GLM-5.2's config parses");
        let full: Vec<usize> = (0..c.layers).filter(|&i| c.has_indexer(i)).collect();
        let shared = c
            .indexer_types
            .iter()
            .filter(|t| **t == IndexerType::Shared)
            .count();
        let sparse: Vec<usize> = (0..c.layers).filter(|&i| c.is_moe_layer(i)).collect();
        println!(
            "GLM-5.2: {} layers, full indexer on {full:?} ({}), {shared} shared; \
             mlp {} dense + {} sparse; MTP row {} (MoE: {}); indexer key norm eps {:e}; \
             index_share_for_mtp_iteration {}",
            c.layers,
            full.len(),
            c.layers - sparse.len(),
            sparse.len(),
            c.layers,
            c.is_moe_layer(c.layers),
            c.indexer_norm_eps,
            c.index_share_for_mtp
        );
        let mut expected = vec![0, 1, 2];
        expected.extend((6..78).step_by(4));
        assert_eq!(full, expected);
        assert_eq!((full.len(), shared), (21, 57));
        assert_eq!(sparse, (3..78).collect::<Vec<_>>(), "3 dense + 75 sparse");
        assert!(c.is_moe_layer(78), "the MTP row is MoE");
        assert!(
            !c.has_indexer(78),
            "the MTP row's indexer is decided by its tensors"
        );
        assert_eq!(c.moe.as_ref().map(|m| m.experts), Some(256));
        assert_eq!((c.index_topk, c.nextn_layers, c.v_head), (2048, 1, 256));
        assert!(c.index_share_for_mtp);
        assert_eq!(c.indexer_norm_eps, 1e-6, "the reference's epsilon");
        assert_eq!(
            c.scale,
            (256f64).powf(-0.5) as f32,
            "qk_head_dim, not head_dim"
        );
    }
    // The same schedule from freq/offset alone, and from the pattern string.
    let mut derived = glm52_config();
    if let Some(map) = derived.as_object_mut() {
        map.remove("indexer_types");
    }
    let from_freq = parse(&derived).expect("freq/offset");
    derived["index_topk_pattern"] = json!(from_freq
        .indexer_types
        .iter()
        .map(|t| if *t == IndexerType::Full { 'F' } else { 'S' })
        .collect::<String>());
    derived["index_topk_freq"] = json!(1);
    let from_pattern = parse(&derived).expect("pattern");
    let released = parse(&glm52_config()).expect("list");
    assert_eq!(from_freq.indexer_types, released.indexer_types);
    assert_eq!(from_pattern.indexer_types, released.indexer_types);
}

#[test]
fn configs_without_index_share_keys_keep_mlx_lms_indexer() {
    let c = parse(&TinyGlm::default().config()).expect("GLM-5");
    assert!(c.indexer_types.iter().all(|t| *t == IndexerType::Full));
    assert_eq!(
        c.indexer_norm_eps, 1e-5,
        "nn.LayerNorm's default, as mlx-lm"
    );
    assert!(!c.index_share_for_mtp);
}

fn load(spec: &TinyGlm) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("write");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

fn values(a: &Array) -> Vec<f32> {
    a.eval().expect("eval");
    a.as_slice::<f32>().to_vec()
}

/// The same tiny checkpoint with every layer full: the same values for the
/// tensors both have (the generator keys them by name).
fn all_full() -> TinyGlm {
    TinyGlm {
        index_share: Some(IndexShare {
            pattern: "FFFFF",
            share_for_mtp: true,
            mtp_indexer: true,
        }),
        ..TinyGlm::glm52_tiny()
    }
}

#[test]
fn shared_layers_have_no_indexer_and_reuse_the_previous_selection() {
    let (_a, shared) = load(&TinyGlm::glm52_tiny());
    let (_b, full) = load(&all_full());
    assert_eq!(
        shared.make_caches().len(),
        5 + 3,
        "a latent cache per layer, an indexer cache per full layer"
    );
    assert_eq!(full.make_caches().len(), 10);
    assert!(shared.weights_bytes() < full.weights_bytes());
    let logits = |model: &Model, prompt: &[u32]| {
        let mut caches = model.make_caches();
        let out = model
            .forward(&ids(prompt), &mut caches, &[])
            .expect("forward");
        values(&model.logits(&out.hidden).expect("logits"))
    };
    let short = [5, 6, 7, 8];
    assert_eq!(
        logits(&shared, &short),
        logits(&full, &short),
        "within index_topk every layer attends densely"
    );
    let long: Vec<u32> = (1..=14).collect();
    assert_ne!(
        logits(&shared, &long),
        logits(&full, &long),
        "past index_topk the shared layers attend to another selection"
    );
}

/// Past `index_topk`, the single-query form (decode rows) gives every row of
/// a verify window what it gets alone, shared layers included, and the
/// window form runs too.
#[test]
fn both_forward_forms_run_past_index_topk() {
    let (_d, model) = load(&TinyGlm::glm52_tiny());
    let prompt: Vec<u32> = (10..22).collect();
    let window = [3, 9, 27, 40];
    let mut together = model.make_caches();
    model
        .forward(&ids(&prompt), &mut together, &[])
        .expect("prefill");
    let rows = model
        .decode(&ids(&window), &mut together, &[])
        .expect("decode");
    let mut alone = model.make_caches();
    model
        .forward(&ids(&prompt), &mut alone, &[])
        .expect("prefill");
    for (j, t) in window.iter().enumerate() {
        let one = model
            .forward(&ids(&[*t]), &mut alone, &[])
            .expect("one row");
        assert_eq!(
            values(&rows.hidden.index((.., j as i32..j as i32 + 1, ..))),
            values(&one.hidden),
            "row {j}"
        );
    }
    assert_eq!(together.offset(), prompt.len() + window.len());
    together.trim(window.len()).expect("trim");
    let again = model
        .forward(&ids(&window), &mut together, &[])
        .expect("window form");
    assert_eq!(again.hidden.shape(), &[1, 4, 32]);
}

#[test]
fn the_mtp_row_runs_its_indexer_and_shares_it_across_a_round() {
    let (_a, share) = load(&TinyGlm::glm52_tiny());
    let mut own_spec = TinyGlm::glm52_tiny();
    if let Some(s) = &mut own_spec.index_share {
        s.share_for_mtp = false;
    }
    let (_b, own) = load(&own_spec);
    assert!(share.mtp_has_indexer() && own.mtp_has_indexer());
    let (_c, dense) = load(&TinyGlm {
        index_share: Some(IndexShare {
            pattern: "FFSFS",
            share_for_mtp: true,
            mtp_indexer: false,
        }),
        ..TinyGlm::glm52_tiny()
    });
    assert!(
        !dense.mtp_has_indexer(),
        "no tensors: dense, as GLM-5's loader did"
    );
    assert!(!dense.new_mtp_cache().has_indexer());

    // Three draft steps after `absorbed` absorbed pairs; the outputs.
    let round = |model: &Model, absorbed: usize| -> Vec<Vec<f32>> {
        let mut cache = model.new_mtp_cache();
        let h = Array::ones::<f32>(&[1, absorbed as i32, 32]).expect("ones");
        let tokens: Vec<u32> = (1..=absorbed as u32).collect();
        model
            .mtp_forward(&ids(&tokens), &h, &mut cache)
            .expect("absorb");
        let mut selection: Option<MtpRoundSelection> = None;
        let mut hidden = h.index((.., -1.., ..));
        let mut outs = Vec::new();
        for t in [7, 8, 9] {
            let out = model
                .mtp_draft_step(&ids(&[t]), &hidden, &mut cache, &mut selection)
                .expect("step");
            outs.push(values(&out));
            hidden = out;
        }
        assert_eq!(cache.offset(), absorbed + 3);
        assert_eq!(
            cache.indexer_keys().map(|k| k.shape()[2]),
            Some(absorbed as i32 + 3),
            "every step's key enters the indexer cache"
        );
        outs
    };
    let (a, b) = (round(&share, 10), round(&own, 10));
    assert_eq!(a[0], b[0], "the first step runs the indexer either way");
    assert_ne!(a[1..], b[1..], "later steps reuse the first step's picks");
    // Two absorbed rows: the first step sees 3 keys (index_topk 4, dense);
    // the third step's 5 keys are sparse for its own indexer, while the
    // shared selection (the first step's dense one plus the drafted
    // positions) stays dense.
    let (a, b) = (round(&share, 2), round(&own, 2));
    assert_eq!(a[..2], b[..2], "dense either way");
    assert_ne!(a[2], b[2], "a dense first step keeps the round dense");
}

fn load_error(spec: &TinyGlm, edit: impl Fn(&mut Value)) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("write");
    let mut config = spec.config();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    Model::load(dir.path(), &LoadOptions::default())
        .expect_err("refused")
        .to_string()
}

#[test]
fn bad_index_share_inputs_are_errors_naming_the_key_or_tensor() {
    let spec = TinyGlm::glm52_tiny();
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|c| c["indexer_types"] = json!(["full", "shared", "full", "shared"])),
            &["indexer_types", "4 entries", "expected 5"],
        ),
        (
            Box::new(|c| c["indexer_types"][3] = json!("sparse")),
            &["indexer_types[3]", "sparse"],
        ),
        (
            Box::new(|c| c["indexer_types"][0] = json!("shared")),
            &["layer 0", "shared"],
        ),
        (
            Box::new(|c| c["indexer_types"] = json!(vec!["full"; 5])),
            &["model.layers.2.self_attn.indexer.wq_b.weight"],
        ),
        (
            Box::new(|c| {
                if let Some(map) = c.as_object_mut() {
                    map.remove("indexer_types");
                }
                c["index_topk_pattern"] = json!("FFxFS");
            }),
            &["index_topk_pattern[2]", "`x`"],
        ),
        (
            Box::new(|c| c["num_experts"] = json!(8)),
            &["num_experts", "n_routed_experts"],
        ),
        (
            Box::new(|c| c["mlp_layer_types"][1] = json!("moe")),
            &["mlp_layer_types[1]"],
        ),
        (
            Box::new(|c| c["layer_types"] = json!(vec!["sliding_attention"; 5])),
            &["layer_types[0]"],
        ),
        (
            Box::new(|c| c["eos_token_id"] = json!(["</s>"])),
            &["eos_token_id"],
        ),
    ];
    for (edit, needles) in cases {
        let err = load_error(&spec, edit);
        for n in needles {
            assert!(err.contains(n), "{n:?} not in {err:?}");
        }
    }
    // A full layer whose indexer lacks one tensor names it.
    let missing = "model.layers.3.self_attn.indexer.wk.weight";
    let err = load_error(
        &TinyGlm {
            omit: vec![missing.into()],
            ..TinyGlm::glm52_tiny()
        },
        |_| {},
    );
    assert!(err.contains(missing), "{err}");
    // The MTP row's indexer, once present, must be complete.
    let missing = "model.layers.5.self_attn.indexer.k_norm.bias";
    let err = load_error(
        &TinyGlm {
            omit: vec![missing.into()],
            ..TinyGlm::glm52_tiny()
        },
        |_| {},
    );
    assert!(err.contains(missing), "{err}");
}
