//! Small synthetic checkpoints in mlx-lm / Hugging Face layout (`config.json` +
//! `model.safetensors`, float32) for every architecture the gates cover, plus
//! quantized copies in mlx-lm's saved format. Deterministic: fixed seed, our
//! own PRNG, regenerated only when missing or when the generator changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::rng::{fnv1a64, Normal, SplitMix64};
use crate::shell;

/// Bump when anything below changes what gets written: every checkpoint is
/// then regenerated on the next run.
pub(crate) const GENERATOR_VERSION: u32 = 1;

pub(crate) const SEED: u64 = 0x6D6C_7873_7065_6301;

/// Written last into each checkpoint directory; its content identifies what
/// generated the directory.
pub(crate) const STAMP: &str = "xtask-stamp";

// Dimensions shared by every synthetic model: small enough for a CPU gate in
// seconds, large enough for GQA, group-64 quantization and > 256 vocabulary.
const HIDDEN: usize = 64;
const LAYERS: usize = 2;
const VOCAB: usize = 320;
const INTERMEDIATE: usize = 128;
const MAX_POSITIONS: usize = 512;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

// Initialisation scales. Measured with mlx-lm on these dimensions: at std
// 0.02 greedy decoding collapses (tied models repeat one token forever); with
// these, 64 greedy steps visit 45-55 distinct tokens and the top-2 logit gap
// stays well above float32 noise.
const WEIGHT_STD: f64 = 0.25;
const EMBED_STD: f64 = 0.5;
const NORM_STD: f64 = 0.1;
const BIAS_STD: f64 = 0.1;

/// A synthetic checkpoint on disk.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub name: String,
    pub dir: PathBuf,
}

/// One float32 architecture variant, as its `config.json` spells it.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    model_type: &'static str,
    architecture: &'static str,
    /// Written as `head_dim` when set; otherwise hidden / heads.
    head_dim: Option<usize>,
    qkv_bias: bool,
    qk_norm: bool,
    tied: bool,
    rope_theta: f64,
    rms_norm_eps: f64,
    llama3_rope: bool,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "llama",
        model_type: "llama",
        architecture: "LlamaForCausalLM",
        head_dim: None,
        qkv_bias: false,
        qk_norm: false,
        tied: false,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-5,
        llama3_rope: false,
    },
    Spec {
        name: "llama3",
        model_type: "llama",
        architecture: "LlamaForCausalLM",
        head_dim: None,
        qkv_bias: false,
        qk_norm: false,
        tied: true,
        rope_theta: 500000.0,
        rms_norm_eps: 1e-5,
        llama3_rope: true,
    },
    Spec {
        name: "qwen2",
        model_type: "qwen2",
        architecture: "Qwen2ForCausalLM",
        head_dim: None,
        qkv_bias: true,
        qk_norm: false,
        tied: true,
        rope_theta: 1000000.0,
        rms_norm_eps: 1e-6,
        llama3_rope: false,
    },
    Spec {
        name: "qwen3",
        model_type: "qwen3",
        architecture: "Qwen3ForCausalLM",
        head_dim: Some(32),
        qkv_bias: false,
        qk_norm: true,
        tied: false,
        rope_theta: 1000000.0,
        rms_norm_eps: 1e-6,
        llama3_rope: false,
    },
    Spec {
        name: "mistral",
        model_type: "mistral",
        architecture: "MistralForCausalLM",
        head_dim: Some(32),
        qkv_bias: false,
        qk_norm: false,
        tied: false,
        rope_theta: 1000000.0,
        rms_norm_eps: 1e-5,
        llama3_rope: false,
    },
];

/// A quantized copy of one float checkpoint, made by `quantize_synth.py`.
#[derive(Debug, Clone, Copy)]
struct QuantSpec {
    name: &'static str,
    source: &'static str,
    /// mlx-lm's `quantization` block: defaults, then per-module overrides.
    block: fn() -> Value,
}

const QUANT_SPECS: &[QuantSpec] = &[
    QuantSpec {
        name: "llama-q4g64",
        source: "llama",
        block: || json!({"group_size": 64, "bits": 4, "mode": "affine"}),
    },
    QuantSpec {
        name: "llama-q8g32",
        source: "llama",
        block: || json!({"group_size": 32, "bits": 8, "mode": "affine"}),
    },
    QuantSpec {
        name: "llama-mixed",
        source: "llama",
        // Shaped like `mlx_lm.convert --quant-predicate mixed_*` output: the
        // defaults, then the modules that differ from them.
        block: || {
            json!({
                "group_size": 64, "bits": 4, "mode": "affine",
                "model.embed_tokens": {"group_size": 32, "bits": 6, "mode": "affine"},
                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "affine"},
                "model.layers.1.self_attn.v_proj": {"group_size": 64, "bits": 6, "mode": "affine"},
                "lm_head": {"group_size": 32, "bits": 8, "mode": "affine"},
            })
        },
    },
];

const QUANTIZE_SCRIPT: &str = "xtask/python/quantize_synth.py";

/// Directory holding every synthetic checkpoint.
pub fn models_dir() -> PathBuf {
    shell::root().join("target").join("gate-models")
}

/// Makes sure every synthetic target checkpoint exists and is current;
/// `python` (the project venv's) derives the quantized copies. Drafter
/// checkpoints that are no target (the Gemma-4 assistants) come from
/// `ensure_with_assistants`.
pub fn ensure(python: &Path) -> Result<Vec<Checkpoint>> {
    let base = models_dir();
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let mut out = Vec::new();
    for spec in SPECS {
        let dir = base.join(spec.name);
        let stamp = float_stamp(spec);
        if !is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            replace_dir(&dir, &stamp, |tmp| write_checkpoint(spec, tmp))?;
        }
        out.push(Checkpoint {
            name: spec.name.to_owned(),
            dir,
        });
    }
    let script = shell::root().join(QUANTIZE_SCRIPT);
    let script_text =
        std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?;
    for q in QUANT_SPECS {
        let source = SPECS
            .iter()
            .find(|s| s.name == q.source)
            .context("quantized copy of an unknown checkpoint")?;
        let src = base.join(source.name);
        let dir = base.join(q.name);
        let block = (q.block)();
        let stamp = format!(
            "{}quantized with {block}\nscript fnv1a64 {:016x}\n",
            float_stamp(source),
            fnv1a64(&script_text)
        );
        if !is_current(&dir, &stamp) {
            eprintln!("quantizing {} into {}", src.display(), dir.display());
            replace_dir(&dir, &stamp, |tmp| {
                shell::run(
                    Command::new(python)
                        .arg(&script)
                        .arg("--src")
                        .arg(&src)
                        .arg("--dst")
                        .arg(tmp)
                        .arg("--quantization")
                        .arg(block.to_string()),
                )
            })?;
        }
        out.push(Checkpoint {
            name: q.name.to_owned(),
            dir,
        });
    }
    out.extend(crate::synth_glm::ensure(python)?);
    out.extend(crate::synth_gemma4::ensure(&base, python)?);
    Ok(out)
}

/// The target checkpoints of `ensure` followed by the synthetic Gemma-4
/// assistant drafters written for them.
pub fn ensure_with_assistants(python: &Path) -> Result<Vec<Checkpoint>> {
    let mut out = ensure(python)?;
    let assistants = crate::synth_assistant::ensure(&models_dir(), &out)?;
    out.extend(assistants);
    Ok(out)
}

/// `cargo xtask synth`: makes sure every checkpoint is current, prints
/// `name directory` lines.
pub fn print_all() -> Result<()> {
    let python = crate::venv::ensure()?;
    for c in ensure_with_assistants(&python)? {
        println!("{} {}", c.name, c.dir.display());
    }
    Ok(())
}

fn float_stamp(spec: &Spec) -> String {
    format!(
        "generator {GENERATOR_VERSION}\nseed {SEED:#x}\n{}\n",
        config(spec)
    )
}

pub(crate) fn is_current(dir: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp)
}

/// Fills a fresh temporary directory with `fill`, stamps it and moves it into
/// place, so an interrupted run never leaves a half-written checkpoint.
pub(crate) fn replace_dir(
    dir: &Path,
    stamp: &str,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let name = dir
        .file_name()
        .context("checkpoint directory without a name")?
        .to_string_lossy();
    let tmp = dir.with_file_name(format!(".{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    fill(&tmp)?;
    std::fs::write(tmp.join(STAMP), stamp)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir)
        .with_context(|| format!("moving {} to {}", tmp.display(), dir.display()))
}

/// The `config.json` of `spec`, with the keys mlx-lm's model files read plus
/// the usual Hugging Face bookkeeping keys.
fn config(spec: &Spec) -> Value {
    let mut c = json!({
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tied,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    let map = c.as_object_mut().expect("a JSON object literal");
    if let Some(head_dim) = spec.head_dim {
        map.insert("head_dim".into(), json!(head_dim));
    }
    match spec.model_type {
        "llama" | "qwen3" => {
            map.insert("attention_bias".into(), json!(false));
        }
        "mistral" => {
            map.insert("sliding_window".into(), Value::Null);
        }
        _ => {}
    }
    if spec.model_type == "llama" {
        map.insert("mlp_bias".into(), json!(false));
    }
    if spec.llama3_rope {
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

#[derive(Debug, Clone, Copy)]
pub(crate) enum Init {
    /// N(0, std).
    Normal(f64),
    /// 1 + N(0, std): RMSNorm weights.
    OnePlusNormal(f64),
}

/// Every tensor of `spec`, named as mlx-lm's model files name them.
fn tensors(spec: &Spec) -> Vec<(String, Vec<usize>, Init)> {
    let head_dim = spec.head_dim.unwrap_or(HIDDEN / HEADS);
    let (q_out, kv_out) = (HEADS * head_dim, KV_HEADS * head_dim);
    let mut t = vec![(
        "model.embed_tokens.weight".to_owned(),
        vec![VOCAB, HIDDEN],
        Init::Normal(EMBED_STD),
    )];
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        let mut add =
            |name: &str, shape: Vec<usize>, init| t.push((format!("{p}.{name}"), shape, init));
        add(
            "input_layernorm.weight",
            vec![HIDDEN],
            Init::OnePlusNormal(NORM_STD),
        );
        add(
            "self_attn.q_proj.weight",
            vec![q_out, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.k_proj.weight",
            vec![kv_out, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.v_proj.weight",
            vec![kv_out, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        if spec.qkv_bias {
            add("self_attn.q_proj.bias", vec![q_out], Init::Normal(BIAS_STD));
            add(
                "self_attn.k_proj.bias",
                vec![kv_out],
                Init::Normal(BIAS_STD),
            );
            add(
                "self_attn.v_proj.bias",
                vec![kv_out],
                Init::Normal(BIAS_STD),
            );
        }
        if spec.qk_norm {
            add(
                "self_attn.q_norm.weight",
                vec![head_dim],
                Init::OnePlusNormal(NORM_STD),
            );
            add(
                "self_attn.k_norm.weight",
                vec![head_dim],
                Init::OnePlusNormal(NORM_STD),
            );
        }
        add(
            "self_attn.o_proj.weight",
            vec![HIDDEN, q_out],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "post_attention_layernorm.weight",
            vec![HIDDEN],
            Init::OnePlusNormal(NORM_STD),
        );
        add(
            "mlp.gate_proj.weight",
            vec![INTERMEDIATE, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.up_proj.weight",
            vec![INTERMEDIATE, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.down_proj.weight",
            vec![HIDDEN, INTERMEDIATE],
            Init::Normal(WEIGHT_STD),
        );
    }
    t.push((
        "model.norm.weight".to_owned(),
        vec![HIDDEN],
        Init::OnePlusNormal(NORM_STD),
    ));
    if !spec.tied {
        t.push((
            "lm_head.weight".to_owned(),
            vec![VOCAB, HIDDEN],
            Init::Normal(WEIGHT_STD),
        ));
    }
    t
}

/// Values of one tensor: its own PRNG stream, keyed by model and tensor name.
pub(crate) fn values(model: &str, tensor: &str, len: usize, init: Init) -> Vec<f32> {
    let mut normal = Normal::new(SplitMix64::keyed(SEED, &format!("{model}/{tensor}")));
    let (offset, std) = match init {
        Init::Normal(std) => (0.0, std),
        Init::OnePlusNormal(std) => (1.0, std),
    };
    (0..len)
        .map(|_| (offset + std * normal.sample()) as f32)
        .collect()
}

/// Writes `config.json` and `model.safetensors` of `spec` into `dir`.
fn write_checkpoint(spec: &Spec, dir: &Path) -> Result<()> {
    let config_text = serde_json::to_string_pretty(&config(spec))? + "\n";
    std::fs::write(dir.join("config.json"), config_text)?;
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = tensors(spec)
        .into_iter()
        .map(|(name, shape, init)| {
            let v = values(spec.name, &name, shape.iter().product(), init);
            (name, shape, v)
        })
        .collect();
    write_f32_safetensors(&dir.join("model.safetensors"), &data)
}

/// Writes float32 tensors (little-endian, as safetensors stores them).
pub fn write_f32_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<()> {
    let bytes: Vec<(&str, &[usize], Vec<u8>)> = tensors
        .iter()
        .map(|(name, shape, v)| {
            (
                name.as_str(),
                shape.as_slice(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (name, shape, b) in &bytes {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.to_vec(), b)
            .with_context(|| format!("tensor {name}"))?;
        views.push((*name, view));
    }
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads a float32 tensor as (shape, values); any other dtype is an error.
pub fn read_f32(st: &safetensors::SafeTensors<'_>, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let view = st
        .tensor(name)
        .with_context(|| format!("tensor `{name}`"))?;
    if view.dtype() != safetensors::Dtype::F32 {
        bail!("tensor `{name}` is {:?}, expected F32", view.dtype());
    }
    let values = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((view.shape().to_vec(), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(label: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-synth-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    fn get(c: &Value, key: &str) -> usize {
        c[key]
            .as_u64()
            .unwrap_or_else(|| panic!("config key {key}")) as usize
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
                ("mlp.gate_proj.weight", vec![inter, h]),
                ("mlp.up_proj.weight", vec![inter, h]),
                ("mlp.down_proj.weight", vec![h, inter]),
            ] {
                e.insert(format!("{p}.{name}"), shape);
            }
            if model_type == "qwen2" {
                for (name, out) in [("q", n * hd), ("k", kv * hd), ("v", kv * hd)] {
                    e.insert(format!("{p}.self_attn.{name}_proj.bias"), vec![out]);
                }
            }
            if model_type == "qwen3" {
                e.insert(format!("{p}.self_attn.q_norm.weight"), vec![hd]);
                e.insert(format!("{p}.self_attn.k_norm.weight"), vec![hd]);
            }
        }
        e
    }

    #[test]
    fn checkpoints_hold_exactly_the_tensors_their_config_implies() {
        for spec in SPECS {
            let dir = scratch(spec.name);
            write_checkpoint(spec, &dir).expect("write");
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
                let (got, v) = read_f32(&st, name).expect("f32 tensor");
                assert_eq!(&got, shape, "{}: {name}", spec.name);
                assert!(v.iter().all(|x| x.is_finite()));
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn generation_is_deterministic_and_distinct_per_model() {
        let (a, b) = (scratch("det-a"), scratch("det-b"));
        write_checkpoint(&SPECS[0], &a).expect("write a");
        write_checkpoint(&SPECS[0], &b).expect("write b");
        let read = |d: &Path| std::fs::read(d.join("model.safetensors")).expect("weights");
        assert_eq!(read(&a), read(&b));
        let x = values("llama", "model.embed_tokens.weight", 8, Init::Normal(1.0));
        let y = values("qwen2", "model.embed_tokens.weight", 8, Init::Normal(1.0));
        assert_ne!(x, y);
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }

    #[test]
    fn init_scales_are_as_configured() {
        let w = values("m", "w", 50_000, Init::Normal(WEIGHT_STD));
        let n = values("m", "n", 50_000, Init::OnePlusNormal(NORM_STD));
        let stats = |v: &[f32]| {
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
            let var = v
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / v.len() as f64;
            (mean, var.sqrt())
        };
        let (wm, ws) = stats(&w);
        let (nm, ns) = stats(&n);
        assert!(
            wm.abs() < 0.01 && (ws - WEIGHT_STD).abs() < 0.01,
            "{wm} {ws}"
        );
        assert!(
            (nm - 1.0).abs() < 0.01 && (ns - NORM_STD).abs() < 0.01,
            "{nm} {ns}"
        );
    }

    #[test]
    fn safetensors_writer_round_trips() {
        let dir = scratch("st");
        let path = dir.join("t.safetensors");
        let tensors = vec![
            (
                "a".to_owned(),
                vec![2, 3],
                vec![1.0, -2.5, 3.25, f32::MIN_POSITIVE, 0.0, -0.0],
            ),
            ("b.c".to_owned(), vec![1], vec![7.0]),
        ];
        write_f32_safetensors(&path, &tensors).expect("write");
        let bytes = std::fs::read(&path).expect("read");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("parse");
        for (name, shape, v) in &tensors {
            let (s, got) = read_f32(&st, name).expect("tensor");
            assert_eq!(
                (&s, got.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                (shape, v.iter().map(|x| x.to_bits()).collect())
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
