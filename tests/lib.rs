//! Helpers of the cross-crate scenarios in `tests/tests/`: locating built
//! binaries, and writing tiny random llama and Gemma-4 checkpoints to run
//! requests on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;

/// `target/<profile>/` of the running test binary (which sits in `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .nth(2)
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Writes a 2-layer llama with random weights (fixed seed) into `dir`: large
/// enough weights that greedy continuations vary, small enough to run fast.
pub fn write_tiny_llama(dir: &Path, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    write_tiny_llama_with(dir, seed, None)
}

/// As `write_tiny_llama`, with the first layer a sliding-window layer of
/// `window` positions when given.
pub fn write_tiny_llama_with(
    dir: &Path,
    seed: u64,
    window: Option<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let (h, inter, vocab, layers, kv) = (64, 128, 96, 2, 32);
    let mut config = serde_json::json!({
        "model_type": "llama", "hidden_size": h, "num_hidden_layers": layers, "intermediate_size": inter,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": vocab,
        "tie_word_embeddings": true, "rope_theta": 10000.0
    });
    if let Some(w) = window {
        config["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"]);
        config["sliding_window"] = serde_json::json!(w);
    }
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let mut tensors: HashMap<String, Array> = HashMap::new();
    let mut n = 0u64;
    let mut normal = |shape: &[i32], std: f32| -> Result<Array, Box<dyn std::error::Error>> {
        n += 1;
        let k = mlx_rs::random::key(seed.wrapping_mul(1_000_003).wrapping_add(n))?;
        Ok(mlx_rs::random::normal::<f32>(shape, None, None, &k)?.multiply(Array::from_f32(std))?)
    };
    tensors.insert(
        "model.embed_tokens.weight".into(),
        normal(&[vocab, h], 0.5)?,
    );
    tensors.insert(
        "model.norm.weight".into(),
        normal(&[h], 0.1)?.add(Array::from_f32(1.0))?,
    );
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj", [h, h]),
            ("self_attn.k_proj", [kv, h]),
            ("self_attn.v_proj", [kv, h]),
            ("self_attn.o_proj", [h, h]),
            ("mlp.gate_proj", [inter, h]),
            ("mlp.up_proj", [inter, h]),
            ("mlp.down_proj", [h, inter]),
        ] {
            tensors.insert(format!("{p}.{name}.weight"), normal(&shape, 0.25)?);
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            tensors.insert(
                format!("{p}.{norm}.weight"),
                normal(&[h], 0.1)?.add(Array::from_f32(1.0))?,
            );
        }
    }
    Array::save_safetensors(&tensors, None, dir.join("model.safetensors"))?;
    Ok(())
}

/// Which tiny Gemma-4 to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gemma4Variant {
    /// `gemma4_text`: sliding and full layers, untied head.
    Text,
    /// The `gemma4` wrapper (tensors under `model.language_model.`) with
    /// KV-shared layers, per-layer inputs, `attention_k_eq_v`, double-wide
    /// MLPs and a tied head.
    Shared,
    /// `gemma4_text` with a mixture-of-experts block on every layer (4
    /// experts, top 2, fused `experts.gate_up_proj` as Hugging Face stores it).
    Moe,
}

/// Writes a tiny random Gemma-4 (fixed seed) with a sliding window of
/// `window` positions into `dir`.
pub fn write_tiny_gemma4(
    dir: &Path,
    seed: u64,
    variant: Gemma4Variant,
    window: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (h, inter, vocab, heads, kv, hd, ghd) = (64, 128, 96, 4, 2, 16, 32);
    let shared = variant == Gemma4Variant::Shared;
    let moe = variant == Gemma4Variant::Moe;
    let (experts, top_k, expert_width) = (4, 2, 32);
    let types: &[&str] = match variant {
        Gemma4Variant::Shared => &[
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
        Gemma4Variant::Text => &[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        Gemma4Variant::Moe => &["sliding_attention", "full_attention", "sliding_attention"],
    };
    let n = types.len();
    let (kv_shared, per_layer, embed_std) = if shared { (2, 16, 0.05) } else { (0, 0, 0.5) };
    let text = serde_json::json!({
        "model_type": "gemma4_text", "hidden_size": h, "num_hidden_layers": n, "intermediate_size": inter,
        "num_attention_heads": heads, "num_key_value_heads": kv, "num_global_key_value_heads": if shared { Some(1) } else { None },
        "head_dim": hd, "global_head_dim": ghd, "rms_norm_eps": 1e-6, "vocab_size": vocab, "vocab_size_per_layer_input": vocab,
        "num_kv_shared_layers": kv_shared, "hidden_size_per_layer_input": per_layer, "sliding_window": window,
        "layer_types": types, "attention_k_eq_v": shared, "final_logit_softcapping": 30.0, "use_double_wide_mlp": shared,
        "tie_word_embeddings": shared, "max_position_embeddings": 512,
        "enable_moe_block": moe, "num_experts": moe.then_some(experts), "top_k_experts": moe.then_some(top_k),
        "moe_intermediate_size": moe.then_some(expert_width),
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"}
        }
    });
    let config = if shared {
        serde_json::json!({"model_type": "gemma4", "vocab_size": vocab, "text_config": text})
    } else {
        text
    };
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let p = if shared {
        "model.language_model"
    } else {
        "model"
    };
    let mut tensors: HashMap<String, Array> = HashMap::new();
    let mut count = 0u64;
    let mut normal =
        |shape: &[i32], std: f32, offset: f32| -> Result<Array, Box<dyn std::error::Error>> {
            count += 1;
            let k = mlx_rs::random::key(seed.wrapping_mul(1_000_003).wrapping_add(count))?;
            Ok(mlx_rs::random::normal::<f32>(shape, None, None, &k)?
                .multiply(Array::from_f32(std))?
                .add(Array::from_f32(offset))?)
        };
    tensors.insert(
        format!("{p}.embed_tokens.weight"),
        normal(&[vocab, h], embed_std, 0.0)?,
    );
    tensors.insert(format!("{p}.norm.weight"), normal(&[h], 0.1, 1.0)?);
    if shared {
        tensors.insert(
            format!("{p}.embed_tokens_per_layer.weight"),
            normal(&[vocab, n as i32 * per_layer], embed_std, 0.0)?,
        );
        tensors.insert(
            format!("{p}.per_layer_model_projection.weight"),
            normal(&[n as i32 * per_layer, h], 0.25, 0.0)?,
        );
        tensors.insert(
            format!("{p}.per_layer_projection_norm.weight"),
            normal(&[per_layer], 0.1, 1.0)?,
        );
    } else {
        tensors.insert("lm_head.weight".into(), normal(&[vocab, h], 0.25, 0.0)?);
    }
    for (i, kind) in types.iter().enumerate() {
        let l = format!("{p}.layers.{i}");
        let full = *kind == "full_attention";
        let d = if full { ghd } else { hd };
        let k_eq_v = shared && full;
        let kv_heads = if k_eq_v { 1 } else { kv };
        let wide = if shared && i >= n - kv_shared { 2 } else { 1 };
        let mut put = |name: &str,
                       shape: &[i32],
                       std: f32,
                       offset: f32|
         -> Result<(), Box<dyn std::error::Error>> {
            tensors.insert(format!("{l}.{name}"), normal(shape, std, offset)?);
            Ok(())
        };
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            put(&format!("{norm}.weight"), &[h], 0.1, 1.0)?;
        }
        put("self_attn.q_proj.weight", &[heads * d, h], 0.25, 0.0)?;
        put("self_attn.q_norm.weight", &[d], 0.1, 1.0)?;
        put("self_attn.k_proj.weight", &[kv_heads * d, h], 0.25, 0.0)?;
        put("self_attn.k_norm.weight", &[d], 0.1, 1.0)?;
        if !k_eq_v {
            put("self_attn.v_proj.weight", &[kv_heads * d, h], 0.25, 0.0)?;
        }
        put("self_attn.o_proj.weight", &[h, heads * d], 0.25, 0.0)?;
        put("mlp.gate_proj.weight", &[wide * inter, h], 0.25, 0.0)?;
        put("mlp.up_proj.weight", &[wide * inter, h], 0.25, 0.0)?;
        put("mlp.down_proj.weight", &[h, wide * inter], 0.25, 0.0)?;
        if shared {
            put("per_layer_input_gate.weight", &[per_layer, h], 0.25, 0.0)?;
            put("per_layer_projection.weight", &[h, per_layer], 0.25, 0.0)?;
            put("post_per_layer_input_norm.weight", &[h], 0.1, 1.0)?;
        }
        if moe {
            put("router.proj.weight", &[experts, h], 0.25, 0.0)?;
            put("router.scale", &[h], 0.1, 1.0)?;
            put("router.per_expert_scale", &[experts], 0.1, 1.0)?;
            put(
                "experts.gate_up_proj",
                &[experts, 2 * expert_width, h],
                0.25,
                0.0,
            )?;
            put("experts.down_proj", &[experts, h, expert_width], 0.25, 0.0)?;
            for norm in [
                "post_feedforward_layernorm_1",
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_2",
            ] {
                put(&format!("{norm}.weight"), &[h], 0.1, 1.0)?;
            }
        }
        put("layer_scalar", &[1], 0.1, 1.0)?;
    }
    Array::save_safetensors(&tensors, None, dir.join("model.safetensors"))?;
    Ok(())
}

/// Which output head a tiny Gemma-4 assistant carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssistantHead {
    /// `gemma4_unified_assistant` with the tied head.
    Tied,
    /// `gemma4_assistant` with the centroid head (8 centroids, top 2, an
    /// int64 `token_ordering`).
    Centroid,
}

/// Writes a 4-block Gemma-4 assistant with random weights (fixed seed) for
/// the tiny Gemma-4 targets of [`write_tiny_gemma4`]: backbone `backbone`,
/// vocabulary `vocab`, their head widths and `window`.
pub fn write_tiny_assistant(
    dir: &Path,
    seed: u64,
    head: AssistantHead,
    backbone: i32,
    vocab: i32,
    window: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (h, inter, heads, kv, hd, ghd, centroids, top_k) = (32, 64, 4, 2, 16, 32, 8, 2);
    let types = [
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ];
    let centroid = head == AssistantHead::Centroid;
    let config = serde_json::json!({
        "model_type": if centroid { "gemma4_assistant" } else { "gemma4_unified_assistant" },
        "backbone_hidden_size": backbone, "use_ordered_embeddings": centroid, "num_centroids": centroids,
        "centroid_intermediate_top_k": top_k, "tie_word_embeddings": true,
        "text_config": {
            "model_type": "gemma4_text", "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": types.len(),
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "global_head_dim": ghd,
            "rms_norm_eps": 1e-6, "layer_types": types, "sliding_window": window, "vocab_size": vocab,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"}
            }
        }
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let mut tensors: HashMap<String, Array> = HashMap::new();
    let mut count = 0u64;
    let mut normal =
        |shape: &[i32], std: f32, offset: f32| -> Result<Array, Box<dyn std::error::Error>> {
            count += 1;
            let k = mlx_rs::random::key(seed.wrapping_mul(1_000_033).wrapping_add(count))?;
            Ok(mlx_rs::random::normal::<f32>(shape, None, None, &k)?
                .multiply(Array::from_f32(std))?
                .add(Array::from_f32(offset))?)
        };
    // Small embeddings: a tied head over large ones proposes the same token
    // whatever the input.
    tensors.insert(
        "model.embed_tokens.weight".into(),
        normal(&[vocab, h], 0.05, 0.0)?,
    );
    tensors.insert("model.norm.weight".into(), normal(&[h], 0.1, 1.0)?);
    // The scaled target embedding is large (sqrt(backbone) times the table):
    // a quieter embedding half lets the chained hidden steer the drafts too.
    let embedding_half = normal(&[h, backbone], 0.02, 0.0)?;
    let hidden_half = normal(&[h, backbone], 0.5, 0.0)?;
    tensors.insert(
        "pre_projection.weight".into(),
        mlx_rs::ops::concatenate(&[embedding_half, hidden_half], 1)?,
    );
    tensors.insert(
        "post_projection.weight".into(),
        normal(&[backbone, h], 0.25, 0.0)?,
    );
    for (i, kind) in types.iter().enumerate() {
        let d = if *kind == "full_attention" { ghd } else { hd };
        let l = format!("model.layers.{i}");
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            tensors.insert(format!("{l}.{norm}.weight"), normal(&[h], 0.1, 1.0)?);
        }
        tensors.insert(
            format!("{l}.self_attn.q_proj.weight"),
            normal(&[heads * d, h], 0.25, 0.0)?,
        );
        tensors.insert(
            format!("{l}.self_attn.q_norm.weight"),
            normal(&[d], 0.1, 1.0)?,
        );
        tensors.insert(
            format!("{l}.self_attn.o_proj.weight"),
            normal(&[h, heads * d], 0.25, 0.0)?,
        );
        tensors.insert(
            format!("{l}.mlp.gate_proj.weight"),
            normal(&[inter, h], 0.25, 0.0)?,
        );
        tensors.insert(
            format!("{l}.mlp.up_proj.weight"),
            normal(&[inter, h], 0.25, 0.0)?,
        );
        tensors.insert(
            format!("{l}.mlp.down_proj.weight"),
            normal(&[h, inter], 0.25, 0.0)?,
        );
        tensors.insert(format!("{l}.layer_scalar"), normal(&[1], 0.1, 1.0)?);
    }
    if centroid {
        tensors.insert(
            "masked_embedding.centroids.weight".into(),
            normal(&[centroids, h], 0.5, 0.0)?,
        );
        // A permutation of the vocabulary: 7 is coprime with the test vocabularies.
        let ordering: Vec<i64> = (0..i64::from(vocab))
            .map(|i| (7 * i + 3) % i64::from(vocab))
            .collect();
        tensors.insert(
            "masked_embedding.token_ordering".into(),
            Array::from_slice(&ordering, &[vocab]),
        );
    }
    Array::save_safetensors(&tensors, None, dir.join("model.safetensors"))?;
    Ok(())
}

/// A greedy request of 20 tokens, speculating with `provider` (3 drafts, no
/// adaptation) when given; `on_token` sees every emitted token.
pub fn greedy_run(
    target: &dyn spec_core::Target,
    prompt: &[u32],
    provider: Option<&dyn spec_core::DraftProvider>,
    on_token: impl FnMut(u32) -> std::ops::ControlFlow<()>,
) -> Result<serve_loop::Output, serve_loop::ServeError> {
    use serve_loop::{AdaptiveConfig, Request, SpecConfig, Speculation};
    let mut sampler = spec_core::GreedySampler;
    let speculation = provider.map(|provider| Speculation {
        provider,
        config: SpecConfig {
            num_draft: 3,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        },
    });
    let request = Request {
        prompt,
        max_tokens: 20,
        is_eos: &|_| false,
        sampler: &mut sampler,
        processors: &mut [],
        speculation,
        cancel: None,
    };
    serve_loop::generate(target, request, on_token)
}

/// The tokens of `greedy_run`, which must succeed.
pub fn greedy_tokens(
    target: &dyn spec_core::Target,
    prompt: &[u32],
    provider: Option<&dyn spec_core::DraftProvider>,
) -> Vec<u32> {
    greedy_run(target, prompt, provider, |_| {
        std::ops::ControlFlow::Continue(())
    })
    .expect("generate")
    .tokens
}
