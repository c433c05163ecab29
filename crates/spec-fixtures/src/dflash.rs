//! The DFlash drafter layout (z-lab's `DFlashDraftModel` and
//! `DFlash2DraftModel`, as `dflash` 0.1.0's `model_mlx.py` loads them): a
//! Qwen3-style `config.json` plus `dflash_config` and `num_target_layers`,
//! and the drafter's own tensors only (the embeddings and the head are the
//! target's). DFlash2 adds per layer `attention_conv` / `mlp_conv`
//! (`base_kernel [2, K, H]`, `kernel_projection.weight [2 K H / group, H]`)
//! and `candidate_selector` (`predecessor_codebook` / `successor_codebook`
//! `[V, R]`, without `.weight`, and `hidden_projection.weight [R, H]`).

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Init, TensorSpec, FULL, NORM_STD, SLIDING, WEIGHT_STD};

/// Spread of the selector's codebooks: wide enough that the chained edge
/// scores overturn the logits' order on some positions.
const CODEBOOK_STD: f64 = 1.0;

/// DFlash2's `dflash_config` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dflash2 {
    /// `conv_kernel_size`.
    pub conv_kernel: usize,
    /// `conv_group_size` (divides `hidden_size`).
    pub conv_group: usize,
    /// `selector_rank`.
    pub selector_rank: usize,
    /// `selector_top_k`.
    pub selector_top_k: usize,
}

/// Sliding-window layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sliding {
    /// `sliding_window`.
    pub window: usize,
    /// The layers marked `sliding_attention` in `layer_types`.
    pub layers: &'static [usize],
}

/// Seed of the gates' DFlash drafters.
pub const GATE_SEED: u64 = 0x6466_6C61_7368_0001;

/// One DFlash drafter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dflash {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// `hidden_size` (the target's).
    pub hidden: usize,
    /// `num_hidden_layers` of the drafter.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `vocab_size` (the target's).
    pub vocab: usize,
    /// `block_size`: the anchor and `block_size - 1` masks.
    pub block_size: usize,
    /// `dflash_config.mask_token_id`.
    pub mask_token: usize,
    /// `dflash_config.target_layer_ids`.
    pub taps: &'static [usize],
    /// `num_target_layers`.
    pub target_layers: usize,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// Writes the config as z-lab ships it (`block_size` at the top level,
    /// the Qwen3 bookkeeping keys: `attention_bias`, `hidden_act`,
    /// `layer_types`, `model_type`, `auto_map`, ...); without, `block_size`
    /// sits in `dflash_config` and only the keys the loader reads are written.
    pub hub_extras: bool,
    /// A `DFlash2DraftModel` with these keys.
    pub dflash2: Option<Dflash2>,
    /// Sliding layers (`layer_types` and `sliding_window` are then written).
    pub sliding: Option<Sliding>,
    /// `is_causal`, written when set.
    pub is_causal: Option<bool>,
}

/// A small DFlash2 configuration for the test and gate drafters (hidden 64).
pub const SMALL_DFLASH2: Dflash2 = Dflash2 {
    conv_kernel: 3,
    conv_group: 16,
    selector_rank: 8,
    selector_top_k: 4,
};

/// The gates' drafter for the synthetic `llama` target (2 layers, taps 0, 1).
pub const GATE_LLAMA: Dflash = Dflash {
    name: "dflash-llama",
    seed: GATE_SEED,
    hidden: 64,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    intermediate: 128,
    vocab: 320,
    block_size: 5,
    mask_token: 7,
    taps: &[0, 1],
    target_layers: 2,
    rope_theta: 1_000_000.0,
    hub_extras: true,
    dflash2: None,
    sliding: None,
    is_causal: None,
};

impl Dflash {
    /// A tiny drafter for tests, for `Llama::tiny` targets (hidden 64,
    /// vocabulary 96, 2 layers): one layer, block 4, taps 0 and 1.
    pub const fn tiny() -> Self {
        Self {
            name: "tiny-dflash",
            seed: 2000,
            layers: 1,
            head_dim: 16,
            intermediate: 64,
            vocab: 96,
            block_size: 4,
            mask_token: 3,
            hub_extras: false,
            ..GATE_LLAMA
        }
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        let mut dflash = json!({
            "mask_token_id": self.mask_token,
            "target_layer_ids": self.taps,
        });
        if let Some(d) = self.dflash2 {
            dflash["conv_kernel_size"] = json!(d.conv_kernel);
            dflash["conv_group_size"] = json!(d.conv_group);
            dflash["selector_rank"] = json!(d.selector_rank);
            dflash["selector_top_k"] = json!(d.selector_top_k);
        }
        let architecture = if self.dflash2.is_some() {
            "DFlash2DraftModel"
        } else {
            "DFlashDraftModel"
        };
        let mut c = json!({
            "architectures": [architecture],
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": 4096,
            "num_target_layers": self.target_layers,
        });
        let Some(map) = c.as_object_mut() else {
            return c;
        };
        if self.hub_extras {
            map.insert("block_size".into(), json!(self.block_size));
            map.insert("model_type".into(), json!("qwen3"));
            map.insert("attention_bias".into(), json!(false));
            map.insert("attention_dropout".into(), json!(0.0));
            map.insert("hidden_act".into(), json!("silu"));
            map.insert("layer_types".into(), json!(vec![FULL; self.layers]));
            map.insert("rope_scaling".into(), Value::Null);
            map.insert("sliding_window".into(), Value::Null);
            map.insert("use_sliding_window".into(), json!(false));
            map.insert("tie_word_embeddings".into(), json!(false));
            map.insert("torch_dtype".into(), json!("float32"));
            map.insert(
                "auto_map".into(),
                json!({"AutoModel": "dflash.DFlashDraftModel"}),
            );
        } else {
            dflash["block_size"] = json!(self.block_size);
        }
        if let Some(s) = self.sliding {
            let types: Vec<&str> = (0..self.layers)
                .map(|i| if s.layers.contains(&i) { SLIDING } else { FULL })
                .collect();
            map.insert("layer_types".into(), json!(types));
            map.insert("sliding_window".into(), json!(s.window));
        }
        if let Some(b) = self.is_causal {
            map.insert("is_causal".into(), json!(b));
        }
        map.insert("dflash_config".into(), dflash);
        c
    }

    /// Every tensor, named as `DFlashDraftModel`'s parameters are.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (w, norm) = (Init::Normal(WEIGHT_STD), Init::OnePlusNormal(NORM_STD));
        let (h, inter) = (self.hidden, self.intermediate);
        let (q_out, kv_out) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut t = vec![
            TensorSpec::new("fc.weight", vec![h, self.taps.len() * h], w),
            TensorSpec::new("hidden_norm.weight", vec![h], norm),
        ];
        for i in 0..self.layers {
            let p = format!("layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{p}.{name}"), shape, init))
            };
            add("self_attn.q_proj.weight", vec![q_out, h], w);
            add("self_attn.k_proj.weight", vec![kv_out, h], w);
            add("self_attn.v_proj.weight", vec![kv_out, h], w);
            add("self_attn.o_proj.weight", vec![h, q_out], w);
            add("self_attn.q_norm.weight", vec![self.head_dim], norm);
            add("self_attn.k_norm.weight", vec![self.head_dim], norm);
            add("input_layernorm.weight", vec![h], norm);
            add("post_attention_layernorm.weight", vec![h], norm);
            add("mlp.gate_proj.weight", vec![inter, h], w);
            add("mlp.up_proj.weight", vec![inter, h], w);
            add("mlp.down_proj.weight", vec![h, inter], w);
            if let Some(d) = self.dflash2 {
                let dynamic = 2 * d.conv_kernel * (h / d.conv_group);
                for conv in ["attention_conv", "mlp_conv"] {
                    add(&format!("{conv}.base_kernel"), vec![2, d.conv_kernel, h], w);
                    add(
                        &format!("{conv}.kernel_projection.weight"),
                        vec![dynamic, h],
                        w,
                    );
                }
            }
        }
        t.push(TensorSpec::new("norm.weight", vec![h], norm));
        if let Some(d) = self.dflash2 {
            let (v, r) = (self.vocab, d.selector_rank);
            let codebook = Init::Normal(CODEBOOK_STD);
            for (name, shape, init) in [
                ("predecessor_codebook", vec![v, r], codebook),
                ("successor_codebook", vec![v, r], codebook),
                ("hidden_projection.weight", vec![r, h], w),
            ] {
                t.push(TensorSpec::new(
                    format!("candidate_selector.{name}"),
                    shape,
                    init,
                ));
            }
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

    /// Shapes re-derived from the config alone, as `model_mlx.py` builds
    /// its modules; no embedding or head of its own.
    #[test]
    fn tensors_match_what_the_config_implies() {
        for spec in [GATE_LLAMA, Dflash::tiny()] {
            let c = spec.config();
            let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
            let (h, hd) = (n("hidden_size"), n("head_dim"));
            let taps = c["dflash_config"]["target_layer_ids"]
                .as_array()
                .expect("taps")
                .len();
            let shapes: std::collections::HashMap<String, Vec<usize>> = spec
                .tensors()
                .into_iter()
                .map(|s| (s.name, s.shape))
                .collect();
            assert_eq!(shapes["fc.weight"], vec![h, taps * h]);
            for i in 0..n("num_hidden_layers") {
                let shape = |name: &str| &shapes[&format!("layers.{i}.{name}.weight")];
                assert_eq!(
                    shape("self_attn.q_proj"),
                    &vec![n("num_attention_heads") * hd, h]
                );
                assert_eq!(
                    shape("self_attn.v_proj"),
                    &vec![n("num_key_value_heads") * hd, h]
                );
                assert_eq!(shape("mlp.down_proj"), &vec![h, n("intermediate_size")]);
            }
            assert!(!shapes.contains_key("embed_tokens.weight"));
            assert!(!shapes.contains_key("lm_head.weight"));
            assert_eq!(shapes.len(), 3 + 11 * n("num_hidden_layers"));
        }
    }

    /// DFlash2's keys and tensors, shaped as `model_mlx.py` builds
    /// `GroupedDynamicCausalConv` and `CandidateSelector`; sliding layers in
    /// `layer_types`.
    #[test]
    fn dflash2_and_sliding_layers_are_written_as_the_config_implies() {
        let spec = Dflash {
            layers: 2,
            dflash2: Some(SMALL_DFLASH2),
            sliding: Some(Sliding {
                window: 5,
                layers: &[1],
            }),
            ..GATE_LLAMA
        };
        let c = spec.config();
        assert_eq!(c["architectures"][0], "DFlash2DraftModel");
        assert_eq!(c["layer_types"], json!([FULL, SLIDING]));
        assert_eq!(c["sliding_window"], 5);
        let d = &c["dflash_config"];
        let n = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
        let (h, v) = (spec.hidden, spec.vocab);
        let groups = h / n("conv_group_size");
        let shapes: std::collections::HashMap<String, Vec<usize>> = spec
            .tensors()
            .into_iter()
            .map(|s| (s.name, s.shape))
            .collect();
        for conv in ["attention_conv", "mlp_conv"] {
            assert_eq!(
                shapes[&format!("layers.1.{conv}.base_kernel")],
                vec![2, n("conv_kernel_size"), h]
            );
            assert_eq!(
                shapes[&format!("layers.1.{conv}.kernel_projection.weight")],
                vec![2 * n("conv_kernel_size") * groups, h]
            );
        }
        let r = n("selector_rank");
        assert_eq!(
            shapes["candidate_selector.predecessor_codebook"],
            vec![v, r]
        );
        assert_eq!(shapes["candidate_selector.successor_codebook"], vec![v, r]);
        assert_eq!(
            shapes["candidate_selector.hidden_projection.weight"],
            vec![r, h]
        );
        assert_eq!(shapes.len(), 3 + 15 * 2 + 3);
    }
}
