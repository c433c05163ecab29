//! The Gemma-4 target layout: `gemma4_text`, and the `gemma4` wrapper
//! (`text_config`, tensors under `model.language_model.`), with Hugging Face
//! tensor names. Variants cover sliding and full layers with proportional
//! partial RoPE, KV-shared layers with double-wide MLPs, per-layer inputs,
//! `attention_k_eq_v`, a tied head, and the mixture-of-experts block (fused
//! `experts.gate_up_proj` as Hugging Face stores it).

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Init, TensorSpec, EMBED_STD, FULL, GATE_SEED, NORM_STD, SLIDING, WEIGHT_STD};

/// A tied head reads the residual stream through the embedding table: with
/// embeddings as large as the layers' outputs (times sqrt(hidden)) greedy
/// decoding repeats the input token.
const TIED_EMBED_STD: f64 = 0.05;

/// The gates' sliding window: shorter than most gate prompts, so the windows
/// rotate.
pub const GATE_SLIDING_WINDOW: usize = 8;

/// One Gemma-4 checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma4 {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// `gemma4` wrapper (tensors under `model.language_model.`) or
    /// `gemma4_text`.
    pub wrapper: bool,
    /// `layer_types`.
    pub layer_types: &'static [&'static str],
    /// `num_kv_shared_layers` (the last layers reuse earlier caches).
    pub kv_shared: usize,
    /// `hidden_size_per_layer_input`, when the model has per-layer inputs.
    pub per_layer_input: Option<usize>,
    /// `attention_k_eq_v`: full layers have no `v_proj`.
    pub k_eq_v: bool,
    /// `num_global_key_value_heads`.
    pub global_kv_heads: Option<usize>,
    /// `tie_word_embeddings`.
    pub tied: bool,
    /// `use_double_wide_mlp` (on the KV-shared layers).
    pub double_wide: bool,
    /// Std of the embedding tables.
    pub embed_std: f64,
    /// Mixture of experts: (experts, top k, expert MLP width).
    pub moe: Option<(usize, usize, usize)>,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (sliding layers).
    pub head_dim: usize,
    /// `global_head_dim` (full layers).
    pub global_head_dim: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `sliding_window`.
    pub sliding_window: usize,
    /// Writes what a Hub checkpoint carries beyond what a loader needs:
    /// `architectures`, `hidden_activation`, `torch_dtype`, pad / eos / bos
    /// ids (0, 1, 2) and, in a wrapper, a vision tower that text loaders drop.
    pub hub_extras: bool,
}

/// `gemma4-text`: a `gemma4_text` model with sliding and full layers, an
/// untied head.
pub const GATE_TEXT: Gemma4 = Gemma4 {
    name: "gemma4-text",
    seed: GATE_SEED,
    wrapper: false,
    layer_types: &[SLIDING, SLIDING, FULL, SLIDING],
    kv_shared: 0,
    per_layer_input: None,
    k_eq_v: false,
    global_kv_heads: None,
    tied: false,
    double_wide: false,
    embed_std: EMBED_STD,
    moe: None,
    hidden: 64,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    global_head_dim: 32,
    intermediate: 128,
    vocab: 320,
    sliding_window: GATE_SLIDING_WINDOW,
    hub_extras: true,
};

/// `gemma4-shared`: the `gemma4` wrapper with KV-shared layers, double-wide
/// MLPs on them, per-layer inputs, `attention_k_eq_v` with its own key/value
/// head count, and a tied head.
pub const GATE_SHARED: Gemma4 = Gemma4 {
    name: "gemma4-shared",
    wrapper: true,
    layer_types: &[SLIDING, FULL, SLIDING, SLIDING, FULL],
    kv_shared: 2,
    per_layer_input: Some(16),
    k_eq_v: true,
    global_kv_heads: Some(1),
    tied: true,
    double_wide: true,
    embed_std: TIED_EMBED_STD,
    ..GATE_TEXT
};

/// `gemma4-moe`: `gemma4_text` with a mixture-of-experts block on every
/// layer (4 experts, top 2).
pub const GATE_MOE: Gemma4 = Gemma4 {
    name: "gemma4-moe",
    layer_types: &[SLIDING, FULL, SLIDING],
    moe: Some((4, 2, 32)),
    ..GATE_TEXT
};

/// Every float Gemma-4 checkpoint of the gates.
pub const GATE: &[Gemma4] = &[GATE_TEXT, GATE_SHARED, GATE_MOE];

impl Gemma4 {
    /// `self` at test size: vocabulary 96, sliding window `window`, seed
    /// `seed`, no Hub extras.
    pub const fn tiny(self, seed: u64, window: usize) -> Self {
        Self {
            seed,
            vocab: 96,
            sliding_window: window,
            hub_extras: false,
            ..self
        }
    }

    fn text_config(&self) -> Value {
        let moe = self.moe;
        let mut c = json!({
            "model_type": "gemma4_text",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layer_types.len(),
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "num_global_key_value_heads": self.global_kv_heads,
            "head_dim": self.head_dim,
            "global_head_dim": self.global_head_dim,
            "rms_norm_eps": 1e-6,
            "vocab_size": self.vocab,
            "vocab_size_per_layer_input": self.vocab,
            "num_kv_shared_layers": self.kv_shared,
            "hidden_size_per_layer_input": self.per_layer_input.unwrap_or(0),
            "sliding_window": self.sliding_window,
            "layer_types": self.layer_types,
            "max_position_embeddings": 512,
            "attention_k_eq_v": self.k_eq_v,
            "final_logit_softcapping": 30.0,
            "use_double_wide_mlp": self.double_wide,
            "enable_moe_block": moe.is_some(),
            "num_experts": moe.map(|m| m.0),
            "top_k_experts": moe.map(|m| m.1),
            "moe_intermediate_size": moe.map(|m| m.2),
            "tie_word_embeddings": self.tied,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
            },
        });
        if let (true, Some(map)) = (self.hub_extras, c.as_object_mut()) {
            map.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
            map.insert("torch_dtype".into(), json!("float32"));
            map.insert("pad_token_id".into(), json!(0));
            map.insert("eos_token_id".into(), json!(1));
            map.insert("bos_token_id".into(), json!(2));
        }
        c
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        let mut text = self.text_config();
        if !self.wrapper {
            if let (true, Some(map)) = (self.hub_extras, text.as_object_mut()) {
                map.insert("architectures".into(), json!(["Gemma4ForCausalLM"]));
            }
            return text;
        }
        let mut c = json!({
            "model_type": "gemma4",
            "text_config": text,
            "vocab_size": self.vocab,
        });
        if let (true, Some(map)) = (self.hub_extras, c.as_object_mut()) {
            map.insert(
                "architectures".into(),
                json!(["Gemma4ForConditionalGeneration"]),
            );
            map.insert("tie_word_embeddings".into(), json!(self.tied));
            map.insert("torch_dtype".into(), json!("float32"));
        }
        c
    }

    /// Every tensor, as a Hugging Face checkpoint names it.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (w, norm) = (Init::Normal(WEIGHT_STD), Init::OnePlusNormal(NORM_STD));
        let h = self.hidden;
        let p = if self.wrapper {
            "model.language_model"
        } else {
            "model"
        };
        let n = self.layer_types.len();
        let first_shared = n - self.kv_shared;
        let embed = Init::Normal(self.embed_std);
        let mut t = vec![TensorSpec::new(
            format!("{p}.embed_tokens.weight"),
            vec![self.vocab, h],
            embed,
        )];
        if let Some(pl) = self.per_layer_input {
            t.push(TensorSpec::new(
                format!("{p}.embed_tokens_per_layer.weight"),
                vec![self.vocab, n * pl],
                embed,
            ));
            t.push(TensorSpec::new(
                format!("{p}.per_layer_model_projection.weight"),
                vec![n * pl, h],
                w,
            ));
            t.push(TensorSpec::new(
                format!("{p}.per_layer_projection_norm.weight"),
                vec![pl],
                norm,
            ));
        }
        for (i, kind) in self.layer_types.iter().enumerate() {
            let full = *kind == FULL;
            let hd = if full {
                self.global_head_dim
            } else {
                self.head_dim
            };
            let k_eq_v = self.k_eq_v && full;
            let kv_heads = if k_eq_v {
                self.global_kv_heads.unwrap_or(self.kv_heads)
            } else {
                self.kv_heads
            };
            let shared = i >= first_shared && first_shared > 0;
            let inter = if self.double_wide && shared {
                2 * self.intermediate
            } else {
                self.intermediate
            };
            let l = format!("{p}.layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{l}.{name}"), shape, init))
            };
            for norm_name in [
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ] {
                add(&format!("{norm_name}.weight"), vec![h], norm);
            }
            add("self_attn.q_proj.weight", vec![self.heads * hd, h], w);
            add("self_attn.q_norm.weight", vec![hd], norm);
            // Hugging Face checkpoints carry key/value weights on KV-shared
            // layers too; loaders drop them.
            add("self_attn.k_proj.weight", vec![kv_heads * hd, h], w);
            add("self_attn.k_norm.weight", vec![hd], norm);
            if !k_eq_v {
                add("self_attn.v_proj.weight", vec![kv_heads * hd, h], w);
            }
            add("self_attn.o_proj.weight", vec![h, self.heads * hd], w);
            add("mlp.gate_proj.weight", vec![inter, h], w);
            add("mlp.up_proj.weight", vec![inter, h], w);
            add("mlp.down_proj.weight", vec![h, inter], w);
            if let Some(pl) = self.per_layer_input {
                add("per_layer_input_gate.weight", vec![pl, h], w);
                add("per_layer_projection.weight", vec![h, pl], w);
                add("post_per_layer_input_norm.weight", vec![h], norm);
            }
            if let Some((experts, _, width)) = self.moe {
                add("router.proj.weight", vec![experts, h], w);
                add("router.scale", vec![h], norm);
                add("router.per_expert_scale", vec![experts], norm);
                // Hugging Face's fused layout; loaders split it.
                add("experts.gate_up_proj", vec![experts, 2 * width, h], w);
                add("experts.down_proj", vec![experts, h, width], w);
                for norm_name in [
                    "post_feedforward_layernorm_1",
                    "pre_feedforward_layernorm_2",
                    "post_feedforward_layernorm_2",
                ] {
                    add(&format!("{norm_name}.weight"), vec![h], norm);
                }
            }
            add("layer_scalar", vec![1], norm);
        }
        t.push(TensorSpec::new(format!("{p}.norm.weight"), vec![h], norm));
        if !self.tied {
            t.push(TensorSpec::new("lm_head.weight", vec![self.vocab, h], w));
        }
        if self.wrapper && self.hub_extras {
            // Multimodal wrappers carry towers a text model drops.
            t.push(TensorSpec::new(
                "model.vision_tower.patch_embedder.weight",
                vec![4, 4],
                w,
            ));
        }
        t
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (which must
    /// exist).
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        crate::write_checkpoint(dir, &self.config(), &self.tensors(), self.seed, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_exercise_what_they_claim() {
        let shared = GATE_SHARED;
        assert!(
            shared.kv_shared > 0
                && shared.per_layer_input.is_some()
                && shared.k_eq_v
                && shared.wrapper
        );
        let names: Vec<String> = shared.tensors().into_iter().map(|t| t.name).collect();
        assert!(
            names.iter().all(|n| n.starts_with("model.")),
            "Hugging Face names: {names:?}"
        );
        assert!(
            names
                .iter()
                .any(|n| n.ends_with("layers.3.self_attn.k_proj.weight")),
            "shared layers carry unused k_proj"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with("layers.1.self_attn.v_proj.weight")),
            "k_eq_v full layers have no v_proj"
        );
        assert_eq!(shared.config()["text_config"]["num_kv_shared_layers"], 2);
        let plain = GATE_TEXT;
        assert!(plain.layer_types.contains(&FULL) && plain.layer_types.contains(&SLIDING));
    }

    #[test]
    fn double_wide_mlps_sit_on_shared_layers_only() {
        let shared = GATE_SHARED;
        for t in shared.tensors() {
            if t.name.ends_with("mlp.gate_proj.weight") {
                let layer: usize = t
                    .name
                    .split("layers.")
                    .nth(1)
                    .and_then(|r| r.split('.').next())
                    .and_then(|i| i.parse().ok())
                    .expect("layer index");
                let wide = layer >= shared.layer_types.len() - shared.kv_shared;
                let inter = shared.intermediate;
                assert_eq!(
                    t.shape[0],
                    if wide { 2 * inter } else { inter },
                    "{}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn tiny_variants_drop_only_the_hub_extras() {
        let tiny = GATE_SHARED.tiny(5, 6);
        let c = tiny.config();
        assert!(c.get("architectures").is_none() && c["text_config"].get("eos_token_id").is_none());
        assert_eq!(c["text_config"]["sliding_window"], 6);
        let names: Vec<String> = tiny.tensors().into_iter().map(|t| t.name).collect();
        assert!(!names.iter().any(|n| n.contains("vision_tower")));
        assert_eq!(names.len() + 1, GATE_SHARED.tensors().len());
    }
}
