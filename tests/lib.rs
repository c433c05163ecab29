//! Helpers of the cross-crate scenarios in `tests/tests/`: locating built
//! binaries, and writing a tiny random llama checkpoint to run requests on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;

/// `target/<profile>/` of the running test binary (which sits in `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors().nth(2).map(PathBuf::from).unwrap_or_default()
}

/// Writes a 2-layer llama with random weights (fixed seed) into `dir`: large
/// enough weights that greedy continuations vary, small enough to run fast.
pub fn write_tiny_llama(dir: &Path, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    write_tiny_llama_with(dir, seed, None)
}

/// As `write_tiny_llama`, with the first layer a sliding-window layer of
/// `window` positions when given.
pub fn write_tiny_llama_with(dir: &Path, seed: u64, window: Option<usize>) -> Result<(), Box<dyn std::error::Error>> {
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
    tensors.insert("model.embed_tokens.weight".into(), normal(&[vocab, h], 0.5)?);
    tensors.insert("model.norm.weight".into(), normal(&[h], 0.1)?.add(Array::from_f32(1.0))?);
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj", [h, h]), ("self_attn.k_proj", [kv, h]), ("self_attn.v_proj", [kv, h]),
            ("self_attn.o_proj", [h, h]), ("mlp.gate_proj", [inter, h]), ("mlp.up_proj", [inter, h]), ("mlp.down_proj", [h, inter]),
        ] {
            tensors.insert(format!("{p}.{name}.weight"), normal(&shape, 0.25)?);
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            tensors.insert(format!("{p}.{norm}.weight"), normal(&[h], 0.1)?.add(Array::from_f32(1.0))?);
        }
    }
    Array::save_safetensors(&tensors, None, dir.join("model.safetensors"))?;
    Ok(())
}
