//! The GLM loader, caches and MTP entry points on tiny random checkpoints
//! (bit parity with mlx-lm is the parity gate's job).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::Target;

use super::{GlmOptions, Model, MtpCache};
use crate::LoadOptions;
use spec_fixtures::glm::Glm as TinyGlm;

fn load(spec: &TinyGlm, glm: GlmOptions) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("write");
    let model = Model::load_with(dir.path(), &LoadOptions::default(), glm).expect("load");
    (dir, model)
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

fn last_logits(model: &Model, prompt: &[u32]) -> Vec<f32> {
    let mut caches = model.make_caches();
    let out = model
        .forward(&ids(prompt), &mut caches, &[])
        .expect("forward");
    let logits = model
        .logits(&out.hidden.index((.., -1, ..)))
        .expect("logits");
    logits.eval().expect("eval");
    logits.as_slice::<f32>().to_vec()
}

#[test]
fn the_dsa_indexer_selects_keys_only_past_index_topk() {
    let (_a, sparse) = load(
        &TinyGlm {
            index_topk: 6,
            ..TinyGlm::default()
        },
        GlmOptions::default(),
    );
    let (_b, dense) = load(
        &TinyGlm {
            index_topk: 4096,
            ..TinyGlm::default()
        },
        GlmOptions::default(),
    );
    let short: Vec<u32> = (1..=6).collect();
    assert_eq!(
        last_logits(&sparse, &short),
        last_logits(&dense, &short),
        "within index_topk attention is dense"
    );
    let long: Vec<u32> = (1..=20).collect();
    assert_ne!(
        last_logits(&sparse, &long),
        last_logits(&dense, &long),
        "past index_topk the selection changes the result"
    );
    // One query at a time past index_topk takes the gather path.
    let mut caches = sparse.make_caches();
    sparse
        .forward(&ids(&long), &mut caches, &[])
        .expect("prefill");
    let step = sparse
        .forward(&ids(&[3]), &mut caches, &[])
        .expect("decode");
    assert_eq!(step.hidden.shape(), &[1, 1, 32]);
}

#[test]
fn caches_are_compressed_trimmable_and_sized() {
    let (_d, model) = load(&TinyGlm::default(), GlmOptions::default());
    let mut caches = model.make_caches();
    assert_eq!(caches.len(), 4, "latent + indexer cache per layer");
    model
        .forward(&ids(&[1, 2, 3, 4, 5]), &mut caches, &[])
        .expect("forward");
    assert_eq!(caches.offset(), 5);
    let (rows, rope) = caches.get(0).and_then(|c| c.contents()).expect("rows");
    assert_eq!(
        (rows.shape(), rope.shape()),
        (&[1, 1, 5, 32][..], &[1, 1, 5, 16][..]),
        "latent and rope key, not per-head K/V"
    );
    assert!(caches.nbytes() > 0);
    caches.trim(2).expect("trim");
    assert_eq!(caches.offset(), 3);
    assert!(
        caches.trim(4).is_err() && caches.offset() == 3,
        "a failed trim changes nothing"
    );
}

#[test]
fn capabilities_report_the_mtp_row() {
    let (_a, with) = load(&TinyGlm::default(), GlmOptions::default());
    assert_eq!(
        (
            with.capabilities().mtp_present,
            with.capabilities().mtp_enabled,
            with.capabilities().nextn_layers
        ),
        (true, true, 1)
    );
    assert!(with.mtp_weights_bytes() > 0);
    let (_b, off) = load(&TinyGlm::default(), GlmOptions { load_mtp: false });
    assert_eq!(
        (
            off.capabilities().mtp_present,
            off.capabilities().mtp_enabled
        ),
        (true, false)
    );
    assert_eq!(
        with.weights_bytes() - off.weights_bytes(),
        with.mtp_weights_bytes(),
        "a disabled row holds no memory"
    );
    let mut cache = off.new_mtp_cache();
    let h = Array::zeros::<f32>(&[1, 1, 32]).expect("zeros");
    assert!(off
        .mtp_forward(&ids(&[1]), &h, &mut cache)
        .expect_err("disabled")
        .to_string()
        .contains("no loaded MTP row"));
    let (_c, none) = load(
        &TinyGlm {
            mtp_rows: 0,
            ..TinyGlm::default()
        },
        GlmOptions::default(),
    );
    assert_eq!(
        (
            none.capabilities().mtp_present,
            none.capabilities().mtp_enabled
        ),
        (false, false)
    );
}

#[test]
fn mtp_forward_checks_its_inputs_and_appends_one_row_per_pair() {
    let (_d, model) = load(&TinyGlm::default(), GlmOptions::default());
    let mut cache = model.new_mtp_cache();
    let h = Array::zeros::<f32>(&[1, 3, 32]).expect("zeros");
    let out = model
        .mtp_forward(&ids(&[1, 2, 3]), &h, &mut cache)
        .expect("three pairs");
    assert_eq!((out.shape(), cache.offset()), (&[1, 3, 32][..], 3));
    assert_eq!(model.mtp_logits(&out).expect("logits").shape(), &[1, 3, 96]);
    assert!(
        model.mtp_forward(&ids(&[1, 2]), &h, &mut cache).is_err(),
        "token and hidden counts differ"
    );
    for (mut other, what) in [
        (MtpCache::new(48, 16, true), "another geometry"),
        (
            MtpCache::new(32, 16, false),
            "no indexer cache for a row with an indexer",
        ),
    ] {
        assert!(
            model.mtp_forward(&ids(&[1, 2, 3]), &h, &mut other).is_err(),
            "{what}"
        );
    }
    assert_eq!(cache.offset(), 3, "refused calls append nothing");
}

#[test]
fn bad_configs_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = TinyGlm::default();
    spec.write(dir.path()).expect("write");
    for (key, value, needle) in [
        ("topk_method", serde_json::json!("greedy"), "topk_method"),
        ("scoring_func", serde_json::json!("softmax"), "scoring_func"),
        ("n_group", serde_json::json!(3), "n_group"),
        (
            "num_experts_per_tok",
            serde_json::json!(9),
            "num_experts_per_tok",
        ),
        ("kv_lora_rank", serde_json::json!(0), "kv_lora_rank"),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "default"}),
            "rope_theta",
        ),
    ] {
        let mut config = spec.config();
        config[key] = value;
        std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
        let err = Model::load(dir.path(), &LoadOptions::default())
            .expect_err(key)
            .to_string();
        assert!(err.contains(needle), "{key}: {err}");
    }
    let mut config = spec.config();
    config["num_nextn_predict_layers"] = serde_json::json!(0);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    let err = Model::load(dir.path(), &LoadOptions::default())
        .expect_err("undeclared row")
        .to_string();
    assert!(err.contains("num_nextn_predict_layers"), "{err}");
    let mut config = spec.config();
    config["kv_lora_rank"] = serde_json::json!(48);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    let err = Model::load(dir.path(), &LoadOptions::default())
        .expect_err("shape")
        .to_string();
    assert!(
        err.contains("kv_a_proj_with_mqa"),
        "a mis-shaped tensor is named: {err}"
    );
}

/// The same checkpoint with layer 1 and the MTP row (layer 2) rewritten in
/// Hugging Face's layout (per-expert MLPs, fused `kv_b_proj`) loads to the
/// same model, bit for bit.
#[test]
fn hugging_face_layout_loads_like_mlx_layout() {
    let spec = TinyGlm::default();
    let mlx_dir = tempfile::tempdir().expect("tempdir");
    spec.write(mlx_dir.path()).expect("write");
    let hf_dir = tempfile::tempdir().expect("tempdir");
    spec.write(hf_dir.path()).expect("write");
    let path = hf_dir.path().join("model.safetensors");
    let mut tensors = Array::load_safetensors(&path).expect("load");
    for layer in [1, 2] {
        let p = format!("model.layers.{layer}");
        let wk = tensors
            .remove(&format!("{p}.self_attn.embed_q.weight"))
            .expect("embed_q");
        let wv = tensors
            .remove(&format!("{p}.self_attn.unembed_out.weight"))
            .expect("unembed_out");
        let fused = mlx_rs::ops::concatenate(&[wk.swap_axes(-1, -2).expect("t"), wv], 1)
            .expect("concat")
            .reshape(&[2 * (16 + 16), 32])
            .expect("reshape");
        tensors.insert(format!("{p}.self_attn.kv_b_proj.weight"), fused);
        for m in ["gate_proj", "up_proj", "down_proj"] {
            let stacked = tensors
                .remove(&format!("{p}.mlp.switch_mlp.{m}.weight"))
                .expect("experts");
            for e in 0..4 {
                tensors.insert(format!("{p}.mlp.experts.{e}.{m}.weight"), stacked.index(e));
            }
        }
    }
    // Loaded arrays read their file lazily: write a new file, then drop the old.
    Array::save_safetensors(&tensors, None, hf_dir.path().join("model-hf.safetensors"))
        .expect("save");
    std::fs::remove_file(&path).expect("remove");
    let load = |dir: &std::path::Path| Model::load(dir, &LoadOptions::default()).expect("load");
    let (a, b) = (load(mlx_dir.path()), load(hf_dir.path()));
    let prompt: Vec<u32> = (1..=12).collect();
    assert_eq!(last_logits(&a, &prompt), last_logits(&b, &prompt));
    let h = Array::ones::<f32>(&[1, 2, 32]).expect("ones");
    let (mut ca, mut cb) = (a.new_mtp_cache(), b.new_mtp_cache());
    let oa = a.mtp_forward(&ids(&[4, 5]), &h, &mut ca).expect("mtp a");
    let ob = b.mtp_forward(&ids(&[4, 5]), &h, &mut cb).expect("mtp b");
    assert!(
        oa.eq_values(&ob).expect("compare"),
        "MTP row in Hugging Face layout"
    );
}
