//! The llama family layout (`llama`, `qwen2`, `qwen3`, `mistral`,
//! `qwen3_moe`, `gpt_oss`) in mlx-lm / Hugging Face form: `config.json`
//! keys and tensor names as mlx-lm's model files read them (a `qwen3_moe`
//! expert block per expert, as Hugging Face stores it, or stacked, as
//! mlx-lm saves it; `gpt_oss` in mlx-lm's saved layout: attention biases
//! and sinks, sliding and full layers in turn, a biased router and biased
//! stacked experts).

use std::path::Path;

use serde_json::{json, Value};

use crate::{
    Error, Init, TensorSpec, BIAS_STD, EMBED_STD, FULL, GATE_SEED, NORM_STD, SLIDING, WEIGHT_STD,
};

/// One llama-family checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// `model_type`.
    pub model_type: &'static str,
    /// `architectures[0]` (written with the Hub keys only).
    pub architecture: &'static str,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// Written as `head_dim` when set; otherwise hidden / heads.
    pub head_dim: Option<usize>,
    /// Biases on the q/k/v projections (qwen2).
    pub qkv_bias: bool,
    /// RMSNorm on queries and keys (qwen3).
    pub qk_norm: bool,
    /// `tie_word_embeddings`: no `lm_head`.
    pub tied: bool,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// A llama3 `rope_scaling` block.
    pub llama3_rope: bool,
    /// A YaRN `rope_scaling` block (factor 4 over an original context of
    /// 64, as Qwen3's long-context configs write it at their sizes).
    pub yarn_rope: bool,
    /// Makes the first layer a sliding-window layer of this many positions
    /// (`layer_types` + `sliding_window`).
    pub sliding_window: Option<usize>,
    /// Writes what a Hub checkpoint carries beyond what a loader needs:
    /// `architectures`, `max_position_embeddings` (512), `hidden_act`,
    /// `torch_dtype` and the bos / eos token ids (1, 2).
    pub hub_extras: bool,
    /// `qwen3_moe`'s expert blocks.
    pub experts: Option<Experts>,
}

/// A `qwen3_moe` checkpoint's expert blocks (`Qwen3MoeSparseMoeBlock`: a
/// router `mlp.gate` and SwiGLU experts, no shared expert).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experts {
    /// `num_experts`.
    pub count: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `moe_intermediate_size` (gpt-oss's experts are `intermediate_size`
    /// wide).
    pub intermediate: usize,
    /// `decoder_sparse_step`.
    pub sparse_step: usize,
    /// `mlp_only_layers`: dense layers among the sparse ones.
    pub mlp_only: &'static [usize],
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// Hugging Face's per-expert tensors (`mlp.experts.{e}.*_proj`);
    /// otherwise mlx-lm's stacked `mlp.switch_mlp.*_proj`.
    pub per_expert: bool,
}

impl Experts {
    /// Whether layer `i` is an expert block (mlx-lm's rule).
    pub fn sparse(&self, i: usize) -> bool {
        !self.mlp_only.contains(&i) && self.count > 0 && (i + 1) % self.sparse_step == 0
    }
}

/// The gates' `llama`: 2 layers, hidden 64, GQA 4/2, vocabulary 320 (above
/// 256, for group-64 quantization), untied.
pub const GATE_LLAMA: Llama = Llama {
    name: "llama",
    seed: GATE_SEED,
    model_type: "llama",
    architecture: "LlamaForCausalLM",
    hidden: 64,
    layers: 2,
    vocab: 320,
    intermediate: 128,
    heads: 4,
    kv_heads: 2,
    head_dim: None,
    qkv_bias: false,
    qk_norm: false,
    tied: false,
    rope_theta: 10000.0,
    rms_norm_eps: 1e-5,
    llama3_rope: false,
    yarn_rope: false,
    sliding_window: None,
    hub_extras: true,
    experts: None,
};

/// Every float llama-family checkpoint of the gates.
pub const GATE: &[Llama] = &[
    GATE_LLAMA,
    Llama {
        name: "llama3",
        tied: true,
        rope_theta: 500000.0,
        llama3_rope: true,
        ..GATE_LLAMA
    },
    Llama {
        name: "qwen2",
        model_type: "qwen2",
        architecture: "Qwen2ForCausalLM",
        qkv_bias: true,
        tied: true,
        rope_theta: 1000000.0,
        rms_norm_eps: 1e-6,
        ..GATE_LLAMA
    },
    Llama {
        name: "qwen3",
        model_type: "qwen3",
        architecture: "Qwen3ForCausalLM",
        head_dim: Some(32),
        qk_norm: true,
        rope_theta: 1000000.0,
        rms_norm_eps: 1e-6,
        ..GATE_LLAMA
    },
    GATE_QWEN3_MOE,
    GATE_GPT_OSS,
    // YaRN: frequencies blended over a correction range, inputs scaled.
    Llama {
        name: "mistral",
        model_type: "mistral",
        architecture: "MistralForCausalLM",
        head_dim: Some(32),
        rope_theta: 1000000.0,
        yarn_rope: true,
        ..GATE_LLAMA
    },
];

/// The gates' `gpt_oss`: sliding (window 8) and full layers in turn, YaRN
/// RoPE as gpt-oss's config gives it, 8 experts of width 32 picking 4,
/// untied.
pub const GATE_GPT_OSS: Llama = Llama {
    name: "gpt-oss",
    model_type: "gpt_oss",
    architecture: "GptOssForCausalLM",
    head_dim: Some(16),
    intermediate: 32,
    qkv_bias: true,
    rope_theta: 150000.0,
    sliding_window: Some(8),
    experts: Some(Experts {
        count: 8,
        top_k: 4,
        intermediate: 32,
        sparse_step: 1,
        mlp_only: &[],
        norm_topk_prob: false,
        per_expert: false,
    }),
    ..GATE_LLAMA
};

/// The gates' `qwen3_moe`: `qwen3`'s attention, layer 0 dense
/// (`mlp_only_layers`), layer 1 an expert block of 8 experts picking 4
/// (a window of 16 tokens or more makes 64 picks: mlx-lm's sorted form),
/// in Hugging Face's per-expert layout, untied.
pub const GATE_QWEN3_MOE: Llama = Llama {
    name: "qwen3-moe",
    model_type: "qwen3_moe",
    architecture: "Qwen3MoeForCausalLM",
    head_dim: Some(32),
    qk_norm: true,
    rope_theta: 1000000.0,
    rms_norm_eps: 1e-6,
    experts: Some(QWEN3_MOE_EXPERTS),
    ..GATE_LLAMA
};

/// [`GATE_QWEN3_MOE`]'s expert blocks.
const QWEN3_MOE_EXPERTS: Experts = Experts {
    count: 8,
    top_k: 4,
    intermediate: 32,
    sparse_step: 1,
    mlp_only: &[0],
    norm_topk_prob: true,
    per_expert: true,
};

/// Gate `gguf`'s `qwen3_moe`: [`GATE_QWEN3_MOE`] with every layer an
/// expert block, the only form llama.cpp's `qwen3moe` holds.
pub const GGUF_QWEN3_MOE: Llama = Llama {
    name: "qwen3-moe-all",
    experts: Some(Experts {
        mlp_only: &[],
        ..QWEN3_MOE_EXPERTS
    }),
    ..GATE_QWEN3_MOE
};

/// Gate `gguf`'s k-quant `llama`: [`GATE_LLAMA`] with rows of 256 values
/// and more (a k-quant super-block holds 256): hidden 256, head dimension
/// 64, MLP 512.
pub const GGUF_K_LLAMA: Llama = Llama {
    name: "llama-k",
    hidden: 256,
    intermediate: 512,
    ..GATE_LLAMA
};

/// Gate `gguf`'s k-quant `qwen3_moe`: [`GGUF_QWEN3_MOE`] with rows of 256:
/// hidden 256, head dimension 64, experts 256 wide.
pub const GGUF_K_QWEN3_MOE: Llama = Llama {
    name: "qwen3-moe-k",
    hidden: 256,
    head_dim: Some(64),
    experts: Some(Experts {
        intermediate: 256,
        mlp_only: &[],
        ..QWEN3_MOE_EXPERTS
    }),
    ..GATE_QWEN3_MOE
};

impl Llama {
    /// A tiny tied llama for tests: the gate llama's widths, vocabulary 96,
    /// no Hub keys.
    pub const fn tiny(seed: u64) -> Self {
        Self {
            name: "tiny-llama",
            seed,
            vocab: 96,
            tied: true,
            hub_extras: false,
            ..GATE_LLAMA
        }
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        let mut c = json!({
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tied,
        });
        let Some(map) = c.as_object_mut() else {
            return c;
        };
        if self.hub_extras {
            map.insert("architectures".into(), json!([self.architecture]));
            map.insert("max_position_embeddings".into(), json!(512));
            map.insert("hidden_act".into(), json!("silu"));
            map.insert("torch_dtype".into(), json!("float32"));
            map.insert("bos_token_id".into(), json!(1));
            map.insert("eos_token_id".into(), json!(2));
        }
        if let Some(head_dim) = self.head_dim {
            map.insert("head_dim".into(), json!(head_dim));
        }
        if let (Some(e), true) = (self.experts, self.gpt_oss()) {
            map.insert("num_local_experts".into(), json!(e.count));
            map.insert("num_experts_per_tok".into(), json!(e.top_k));
            map.insert("attention_bias".into(), json!(true));
            map.insert("swiglu_limit".into(), json!(7.0));
            map.insert(
                "rope_scaling".into(),
                json!({
                    "rope_type": "yarn",
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "original_max_position_embeddings": 4096,
                    "truncate": false,
                }),
            );
        } else if let Some(e) = self.experts {
            map.insert("num_experts".into(), json!(e.count));
            map.insert("num_experts_per_tok".into(), json!(e.top_k));
            map.insert("moe_intermediate_size".into(), json!(e.intermediate));
            map.insert("decoder_sparse_step".into(), json!(e.sparse_step));
            map.insert("mlp_only_layers".into(), json!(e.mlp_only));
            map.insert("norm_topk_prob".into(), json!(e.norm_topk_prob));
        }
        match self.model_type {
            "llama" | "qwen3" | "qwen3_moe" => {
                map.insert("attention_bias".into(), json!(false));
            }
            "mistral" => {
                map.insert("sliding_window".into(), Value::Null);
            }
            _ => {}
        }
        if self.model_type == "llama" {
            map.insert("mlp_bias".into(), json!(false));
        }
        if let Some(w) = self.sliding_window {
            let types: Vec<&str> = (0..self.layers)
                .map(|i| if self.sliding(i) { SLIDING } else { FULL })
                .collect();
            map.insert("layer_types".into(), json!(types));
            map.insert("sliding_window".into(), json!(w));
        }
        if self.yarn_rope {
            // With head_dim 32 and theta 1e6 the correction range is
            // dimensions 0 to 3: a ramp, and an input scale of 1.139.
            map.insert(
                "rope_scaling".into(),
                json!({
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                }),
            );
        }
        if self.llama3_rope {
            // With head_dim 16 and theta 5e5 the wavelengths span 6 to ~6e5, so
            // an original context of 256 puts frequencies in all three bands
            // (kept, smoothed, divided by `factor`).
            map.insert(
                "rope_scaling".into(),
                json!({
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                }),
            );
        }
        c
    }

    /// Whether this is a `gpt_oss` checkpoint.
    fn gpt_oss(&self) -> bool {
        self.model_type == "gpt_oss"
    }

    /// Whether layer `i` is a sliding layer: the first one, or every
    /// second from the first in `gpt_oss`.
    pub fn sliding(&self, i: usize) -> bool {
        self.sliding_window.is_some() && if self.gpt_oss() { i % 2 == 0 } else { i == 0 }
    }

    /// Every tensor, named as mlx-lm's model files name them.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (w, norm, bias) = (
            Init::Normal(WEIGHT_STD),
            Init::OnePlusNormal(NORM_STD),
            Init::Normal(BIAS_STD),
        );
        let (h, inter) = (self.hidden, self.intermediate);
        let head_dim = self.head_dim.unwrap_or(h / self.heads);
        let (q_out, kv_out) = (self.heads * head_dim, self.kv_heads * head_dim);
        let mut t = vec![TensorSpec::new(
            "model.embed_tokens.weight",
            vec![self.vocab, h],
            Init::Normal(EMBED_STD),
        )];
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{p}.{name}"), shape, init))
            };
            add("input_layernorm.weight", vec![h], norm);
            add("self_attn.q_proj.weight", vec![q_out, h], w);
            add("self_attn.k_proj.weight", vec![kv_out, h], w);
            add("self_attn.v_proj.weight", vec![kv_out, h], w);
            if self.qkv_bias {
                add("self_attn.q_proj.bias", vec![q_out], bias);
                add("self_attn.k_proj.bias", vec![kv_out], bias);
                add("self_attn.v_proj.bias", vec![kv_out], bias);
            }
            if self.gpt_oss() {
                add("self_attn.o_proj.bias", vec![h], bias);
                add("self_attn.sinks", vec![self.heads], Init::Normal(1.0));
            }
            if self.qk_norm {
                add("self_attn.q_norm.weight", vec![head_dim], norm);
                add("self_attn.k_norm.weight", vec![head_dim], norm);
            }
            add("self_attn.o_proj.weight", vec![h, q_out], w);
            add("post_attention_layernorm.weight", vec![h], norm);
            match self.experts.filter(|e| e.sparse(i)) {
                Some(e) if self.gpt_oss() => {
                    // gpt-oss's experts are `intermediate_size` wide.
                    let (n, mi) = (e.count, inter);
                    add("mlp.router.weight", vec![n, h], w);
                    add("mlp.router.bias", vec![n], bias);
                    for (m, out, inp) in [
                        ("gate_proj", mi, h),
                        ("up_proj", mi, h),
                        ("down_proj", h, mi),
                    ] {
                        add(&format!("mlp.experts.{m}.weight"), vec![n, out, inp], w);
                        add(&format!("mlp.experts.{m}.bias"), vec![n, out], bias);
                    }
                }
                Some(e) => {
                    let (n, mi) = (e.count, e.intermediate);
                    add("mlp.gate.weight", vec![n, h], w);
                    if e.per_expert {
                        for x in 0..n {
                            add(&format!("mlp.experts.{x}.gate_proj.weight"), vec![mi, h], w);
                            add(&format!("mlp.experts.{x}.up_proj.weight"), vec![mi, h], w);
                            add(&format!("mlp.experts.{x}.down_proj.weight"), vec![h, mi], w);
                        }
                    } else {
                        add("mlp.switch_mlp.gate_proj.weight", vec![n, mi, h], w);
                        add("mlp.switch_mlp.up_proj.weight", vec![n, mi, h], w);
                        add("mlp.switch_mlp.down_proj.weight", vec![n, h, mi], w);
                    }
                }
                None => {
                    add("mlp.gate_proj.weight", vec![inter, h], w);
                    add("mlp.up_proj.weight", vec![inter, h], w);
                    add("mlp.down_proj.weight", vec![h, inter], w);
                }
            }
        }
        t.push(TensorSpec::new("model.norm.weight", vec![h], norm));
        if !self.tied {
            t.push(TensorSpec::new("lm_head.weight", vec![self.vocab, h], w));
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
    use std::collections::HashMap;

    use super::*;
    use crate::write::tests::tempdir;

    fn get(c: &Value, key: &str) -> usize {
        c[key]
            .as_u64()
            .unwrap_or_else(|| panic!("config key {key}")) as usize
    }

    fn n_heads_dim(c: &Value, head_dim: usize) -> usize {
        get(c, "num_attention_heads") * head_dim
    }

    /// Shapes re-derived from config.json alone, the way mlx-lm's model files
    /// read it, independently of `tensors()`.
    fn expected_from_config(c: &Value) -> HashMap<String, Vec<usize>> {
        let (h, n, kv, v, inter) = (
            get(c, "hidden_size"),
            get(c, "num_attention_heads"),
            get(c, "num_key_value_heads"),
            get(c, "vocab_size"),
            get(c, "intermediate_size"),
        );
        let hd = c
            .get("head_dim")
            .and_then(Value::as_u64)
            .map_or(h / n, |x| x as usize);
        let model_type = c["model_type"].as_str().expect("model_type");
        let mut e = HashMap::new();
        e.insert("model.embed_tokens.weight".to_owned(), vec![v, h]);
        e.insert("model.norm.weight".to_owned(), vec![h]);
        if !c["tie_word_embeddings"]
            .as_bool()
            .expect("tie_word_embeddings")
        {
            e.insert("lm_head.weight".to_owned(), vec![v, h]);
        }
        for i in 0..get(c, "num_hidden_layers") {
            let p = format!("model.layers.{i}");
            for (name, shape) in [
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
                ("self_attn.q_proj.weight", vec![n * hd, h]),
                ("self_attn.k_proj.weight", vec![kv * hd, h]),
                ("self_attn.v_proj.weight", vec![kv * hd, h]),
                ("self_attn.o_proj.weight", vec![h, n * hd]),
            ] {
                e.insert(format!("{p}.{name}"), shape);
            }
            if model_type == "gpt_oss" {
                // Every layer: biased attention with sinks, a biased router
                // and biased stacked experts of width `intermediate_size`.
                let n = get(c, "num_local_experts");
                for (name, shape) in [
                    ("self_attn.q_proj.bias", vec![n_heads_dim(c, hd)]),
                    ("self_attn.k_proj.bias", vec![kv * hd]),
                    ("self_attn.v_proj.bias", vec![kv * hd]),
                    ("self_attn.o_proj.bias", vec![h]),
                    ("self_attn.sinks", vec![get(c, "num_attention_heads")]),
                    ("mlp.router.weight", vec![n, h]),
                    ("mlp.router.bias", vec![n]),
                    ("mlp.experts.gate_proj.weight", vec![n, inter, h]),
                    ("mlp.experts.gate_proj.bias", vec![n, inter]),
                    ("mlp.experts.up_proj.weight", vec![n, inter, h]),
                    ("mlp.experts.up_proj.bias", vec![n, inter]),
                    ("mlp.experts.down_proj.weight", vec![n, h, inter]),
                    ("mlp.experts.down_proj.bias", vec![n, h]),
                ] {
                    e.insert(format!("{p}.{name}"), shape);
                }
                continue;
            }
            let experts = c.get("num_experts").and_then(Value::as_u64).unwrap_or(0) as usize;
            let only: Vec<u64> = c
                .get("mlp_only_layers")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let step = c
                .get("decoder_sparse_step")
                .and_then(Value::as_u64)
                .unwrap_or(1) as usize;
            if experts > 0 && !only.contains(&(i as u64)) && (i + 1) % step == 0 {
                let mi = get(c, "moe_intermediate_size");
                e.insert(format!("{p}.mlp.gate.weight"), vec![experts, h]);
                for x in 0..experts {
                    for (name, shape) in [
                        ("gate_proj", vec![mi, h]),
                        ("up_proj", vec![mi, h]),
                        ("down_proj", vec![h, mi]),
                    ] {
                        e.insert(format!("{p}.mlp.experts.{x}.{name}.weight"), shape);
                    }
                }
            } else {
                for (name, shape) in [
                    ("gate_proj", vec![inter, h]),
                    ("up_proj", vec![inter, h]),
                    ("down_proj", vec![h, inter]),
                ] {
                    e.insert(format!("{p}.mlp.{name}.weight"), shape);
                }
            }
            if model_type == "qwen2" {
                for (name, out) in [("q", n * hd), ("k", kv * hd), ("v", kv * hd)] {
                    e.insert(format!("{p}.self_attn.{name}_proj.bias"), vec![out]);
                }
            }
            if model_type == "qwen3" || model_type == "qwen3_moe" {
                e.insert(format!("{p}.self_attn.q_norm.weight"), vec![hd]);
                e.insert(format!("{p}.self_attn.k_norm.weight"), vec![hd]);
            }
        }
        e
    }

    #[test]
    fn checkpoints_hold_exactly_the_tensors_their_config_implies() {
        for spec in GATE.iter().chain([&Llama::tiny(1)]) {
            let dir = tempdir(spec.name);
            spec.write(&dir).expect("write");
            let c: Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join("config.json")).expect("config"),
            )
            .expect("config json");
            let bytes = std::fs::read(dir.join("model.safetensors")).expect("weights");
            let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
            let expected = expected_from_config(&c);
            let mut names: Vec<&str> = st.names();
            names.sort_unstable();
            let mut want: Vec<&str> = expected.keys().map(String::as_str).collect();
            want.sort_unstable();
            assert_eq!(names, want, "{}", spec.name);
            for (name, shape) in &expected {
                let (got, v) = crate::read_f32(&st, name).expect("f32 tensor");
                assert_eq!(&got, shape, "{}: {name}", spec.name);
                assert!(v.iter().all(|x| x.is_finite()));
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn generation_is_deterministic_and_distinct_per_model() {
        let (a, b) = (tempdir("det-a"), tempdir("det-b"));
        GATE[0].write(&a).expect("write a");
        GATE[0].write(&b).expect("write b");
        let read = |d: &Path| std::fs::read(d.join("model.safetensors")).expect("weights");
        assert_eq!(read(&a), read(&b));
        let x = crate::values(
            GATE_SEED,
            "llama",
            "model.embed_tokens.weight",
            8,
            Init::Normal(1.0),
        );
        let y = crate::values(
            GATE_SEED,
            "qwen2",
            "model.embed_tokens.weight",
            8,
            Init::Normal(1.0),
        );
        assert_ne!(x, y);
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }

    #[test]
    fn a_sliding_window_makes_the_first_layer_sliding() {
        let c = Llama {
            sliding_window: Some(4),
            ..Llama::tiny(1)
        }
        .config();
        assert_eq!(c["layer_types"], json!([SLIDING, FULL]));
        assert_eq!(c["sliding_window"], 4);
    }
}
