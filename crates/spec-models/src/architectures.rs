//! The one table of the architectures this crate implements: which
//! `model_type`s each family reads, how it loads whole, and how one rank's
//! slice of a pipeline loads where the family splits. Loading, pipeline
//! slicing and the supported list all read it; an architecture added here
//! is added everywhere.

use std::path::Path;

use crate::pipeline::{PipelineSlice, Stage};
use crate::{gemma4, glm, llama, qwen3_next, LoadOptions, LoadedModel, ModelError};

/// Loads a whole model of one family.
type LoadFn = fn(&Path, &LoadOptions) -> Result<LoadedModel, ModelError>;
/// Loads one rank's slice of a model of one family.
type StageFn = fn(&Path, &LoadOptions, PipelineSlice) -> Result<Box<dyn Stage>, ModelError>;

/// One family of architectures.
pub struct Architecture {
    /// The `model_type`s of `config.json` it reads.
    pub model_types: &'static [&'static str],
    load: LoadFn,
    stage: Option<StageFn>,
    /// Its `model_type`s whose routed experts can stream from disk
    /// (`expert_cache_bytes`; a checkpoint of one without expert layers
    /// refuses it at load).
    streams_experts: &'static [&'static str],
    /// Its `model_type`s whose attention reads quantized keys and values
    /// (`kv_quantization`; one the family's loader refuses for a reason of
    /// its own, gpt-oss's sinks, is not listed).
    quantizes_kv: &'static [&'static str],
    /// It applies fine-tuned adapters (`adapter`).
    adapts: bool,
    /// Its full-attention caches can be bounded (`max_kv_size`).
    bounds_kv: bool,
}

impl std::fmt::Debug for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Architecture")
            .field("model_types", &self.model_types)
            .field("splits", &self.stage.is_some())
            .field("streams_experts", &self.streams_experts)
            .field("quantizes_kv", &self.quantizes_kv)
            .field("adapts", &self.adapts)
            .field("bounds_kv", &self.bounds_kv)
            .finish()
    }
}

impl Architecture {
    /// Loads the whole model at `dir`.
    pub fn load(&self, dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
        self.check_options(options)?;
        (self.load)(dir, options)
    }

    /// Refuses streamed experts where the family has none to stream, and
    /// quantized keys and values where its attention reads floats only,
    /// adapters where it applies none, and bounded caches where it keeps
    /// its own (or too small a bound).
    pub(crate) fn check_options(&self, options: &LoadOptions) -> Result<(), ModelError> {
        self.check_max_kv_size(options)?;
        if options.adapter.is_some() && !self.adapts {
            return Err(ModelError::LoadOption {
                option: spec_runtime::adapter::ADAPTER_OPTION,
                message: format!(
                    "fine-tuned adapters are applied to {}, not to `{}`",
                    adapting().join(", "),
                    self.model_types.join("` / `")
                ),
            });
        }
        if options.kv_quantization.is_some() && self.quantizes_kv.is_empty() {
            return Err(ModelError::LoadOption {
                option: "--kv-bits",
                message: format!(
                    "quantized keys and values are implemented for {}, not for `{}`",
                    kv_quantizing().join(", "),
                    self.model_types.join("` / `")
                ),
            });
        }
        if options.expert_cache_bytes.is_none() || !self.streams_experts.is_empty() {
            return Ok(());
        }
        Err(ModelError::LoadOption {
            option: spec_runtime::experts::TIER_OPTION,
            message: format!(
                "streams the routed experts of mixture-of-experts families only ({}), not of `{}`",
                streaming().join(", "),
                self.model_types.join("` / `")
            ),
        })
    }

    /// `--max-kv-size`: the full-attention caches of the llama family
    /// (mlx-lm's `make_prompt_cache` bounds the families without a
    /// `make_cache` of their own) and of the Qwen3.5 / Next hybrids (their
    /// attention layers; mlx-lm's `make_cache` there ignores the option);
    /// refused by name for GLM and Gemma-4, which keep caches of their own;
    /// more positions than the four kept, float keys and values (mlx-lm
    /// cannot quantize a `RotatingKVCache`).
    fn check_max_kv_size(&self, options: &LoadOptions) -> Result<(), ModelError> {
        let Some(size) = options.max_kv_size else {
            return Ok(());
        };
        let refuse = |message: String| {
            Err(ModelError::LoadOption {
                option: spec_runtime::cache::MAX_KV_OPTION,
                message,
            })
        };
        if !self.bounds_kv {
            return refuse(format!(
                "bounded caches are implemented for {}; `{}` keeps caches of its own",
                kv_bounding().join(", "),
                self.model_types.join("` / `")
            ));
        }
        let sinks = spec_runtime::cache::MAX_KV_SINKS;
        if size <= sinks {
            return refuse(format!(
                "{size} positions: it keeps the first {sinks}, so it needs at least {}",
                sinks + 1
            ));
        }
        if options.kv_quantization.is_some() {
            return refuse(
                "a bounded cache stays float: it cannot be combined with --kv-bits (mlx-lm cannot quantize a RotatingKVCache either)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Loads rank `slice`'s part of the model at `dir`; `None` where the
    /// family has no pipeline split.
    pub fn load_stage(
        &self,
        dir: &Path,
        options: &LoadOptions,
        slice: PipelineSlice,
    ) -> Option<Result<Box<dyn Stage>, ModelError>> {
        self.stage.map(|stage| {
            self.check_options(options)?;
            stage(dir, options, slice)
        })
    }
}

fn llama_load(dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    Ok(Box::new(llama::Model::load(dir, options)?))
}

fn llama_stage(
    dir: &Path,
    options: &LoadOptions,
    slice: PipelineSlice,
) -> Result<Box<dyn Stage>, ModelError> {
    Ok(Box::new(llama::Model::load_slice(
        dir,
        options,
        Some(slice),
    )?))
}

fn glm_load(dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    Ok(Box::new(glm::Model::load(dir, options)?))
}

fn glm_stage(
    dir: &Path,
    options: &LoadOptions,
    slice: PipelineSlice,
) -> Result<Box<dyn Stage>, ModelError> {
    Ok(Box::new(glm::Model::load_slice(
        dir,
        options,
        glm::GlmOptions::default(),
        Some(slice),
    )?))
}

fn gemma4_load(dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    Ok(Box::new(gemma4::Model::load(dir, options)?))
}

fn qwen3_next_load(dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    Ok(Box::new(qwen3_next::Model::load(dir, options)?))
}

fn qwen3_next_stage(
    dir: &Path,
    options: &LoadOptions,
    slice: PipelineSlice,
) -> Result<Box<dyn Stage>, ModelError> {
    Ok(Box::new(qwen3_next::Model::load_slice(
        dir,
        options,
        Some(slice),
    )?))
}

/// Every family, in the order the supported list names them.
pub const ARCHITECTURES: &[Architecture] = &[
    Architecture {
        model_types: &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss"],
        load: llama_load,
        stage: Some(llama_stage),
        streams_experts: &["qwen3_moe", "gpt_oss"],
        quantizes_kv: &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe"],
        adapts: true,
        bounds_kv: true,
    },
    Architecture {
        model_types: &["glm_moe_dsa"],
        load: glm_load,
        stage: Some(glm_stage),
        streams_experts: &["glm_moe_dsa"],
        quantizes_kv: &[],
        adapts: true,
        bounds_kv: false,
    },
    Architecture {
        model_types: &["gemma4_text", "gemma4"],
        load: gemma4_load,
        stage: None,
        streams_experts: &["gemma4_text", "gemma4"],
        quantizes_kv: &[],
        adapts: true,
        bounds_kv: false,
    },
    Architecture {
        model_types: &["qwen3_next", "qwen3_5", "qwen3_5_moe"],
        load: qwen3_next_load,
        stage: Some(qwen3_next_stage),
        streams_experts: &["qwen3_next", "qwen3_5_moe"],
        quantizes_kv: &["qwen3_next", "qwen3_5", "qwen3_5_moe"],
        adapts: true,
        bounds_kv: true,
    },
];

/// The `model_type`s of the families `has` holds for.
fn model_types_where(has: impl Fn(&Architecture) -> bool) -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .filter(|a| has(a))
        .flat_map(|a| a.model_types.iter().copied())
        .collect()
}

/// The `model_type`s whose routed experts can stream from disk.
pub fn streaming() -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .flat_map(|a| a.streams_experts.iter().copied())
        .collect()
}

/// The `model_type`s that apply fine-tuned adapters.
pub fn adapting() -> Vec<&'static str> {
    model_types_where(|a| a.adapts)
}

/// The `model_type`s whose keys and values can be kept quantized.
pub fn kv_quantizing() -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .flat_map(|a| a.quantizes_kv.iter().copied())
        .collect()
}

/// The `model_type`s whose caches `--max-kv-size` bounds.
pub fn kv_bounding() -> Vec<&'static str> {
    model_types_where(|a| a.bounds_kv)
}

/// The family that reads `model_type`.
pub fn architecture(model_type: &str) -> Option<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .find(|a| a.model_types.contains(&model_type))
}

/// Every `model_type` this crate loads.
pub fn supported() -> Vec<&'static str> {
    model_types_where(|_| true)
}

/// The `model_type`s a pipeline can split.
pub fn splittable() -> Vec<&'static str> {
    model_types_where(|a| a.stage.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--max-kv-size`: the llama family takes a bound past the 4 kept
    /// positions, in float; the other families, a bound of 4 and a bound
    /// with `--kv-bits` are refused naming the option.
    #[test]
    fn the_llama_family_and_the_hybrids_take_a_bound_past_its_kept_positions() {
        let bounded = |size| LoadOptions {
            max_kv_size: Some(size),
            ..LoadOptions::default()
        };
        let llama = architecture("qwen3").expect("qwen3");
        assert!(llama.check_options(&bounded(5)).is_ok());
        let refused = |family: &Architecture, options: &LoadOptions, named: &str| {
            let err = family
                .check_options(options)
                .expect_err("refused")
                .to_string();
            assert!(
                err.contains("--max-kv-size") && err.contains(named),
                "{err}"
            );
        };
        refused(llama, &bounded(4), "at least 5");
        let quantized = LoadOptions {
            kv_quantization: Some(crate::cache::KvQuantization::new(4, 64, 0).expect("params")),
            ..bounded(64)
        };
        refused(llama, &quantized, "--kv-bits");
        for model_type in ["glm_moe_dsa", "gemma4_text", "gemma4"] {
            let family = architecture(model_type).expect("family");
            refused(family, &bounded(64), "keeps caches of its own");
        }
        let hybrid = architecture("qwen3_5").expect("qwen3_5");
        assert!(hybrid.check_options(&bounded(64)).is_ok());
        refused(hybrid, &bounded(3), "at least 5");
        assert_eq!(
            kv_bounding(),
            [
                "llama",
                "mistral",
                "qwen2",
                "qwen3",
                "qwen3_moe",
                "gpt_oss",
                "qwen3_next",
                "qwen3_5",
                "qwen3_5_moe"
            ]
        );
    }

    /// Only mixture-of-experts checkpoints stream their experts; a dense
    /// one refuses the option by name, whole and as a pipeline stage.
    #[test]
    fn families_without_streamed_experts_refuse_the_tier_option() {
        let dir = tempfile::tempdir().expect("tempdir");
        spec_fixtures::llama::Llama::tiny(3)
            .write(dir.path())
            .expect("fixture");
        let options = LoadOptions {
            expert_cache_bytes: Some(1 << 20),
            ..LoadOptions::default()
        };
        let llama = architecture("llama").expect("llama");
        let whole = llama.load(dir.path(), &options).expect_err("refused");
        let stage = llama
            .load_stage(
                dir.path(),
                &options,
                PipelineSlice::new(0, 2).expect("slice"),
            )
            .expect("splits")
            .expect_err("refused");
        for err in [whole.to_string(), stage.to_string()] {
            assert!(
                err.contains("--expert-cache-bytes") && err.contains("llama"),
                "{err}"
            );
        }
        assert_eq!(
            streaming(),
            [
                "qwen3_moe",
                "gpt_oss",
                "glm_moe_dsa",
                "gemma4_text",
                "gemma4",
                "qwen3_next",
                "qwen3_5_moe"
            ]
        );
    }

    /// Families whose attention reads float keys only refuse `--kv-bits`
    /// by name before reading a file, whole and as a stage.
    #[test]
    fn families_without_quantized_attention_refuse_kv_bits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = LoadOptions {
            kv_quantization: Some(crate::cache::KvQuantization::new(4, 64, 0).expect("params")),
            ..LoadOptions::default()
        };
        for model_type in ["glm_moe_dsa", "gemma4_text"] {
            let family = architecture(model_type).expect("family");
            let err = family.load(dir.path(), &options).expect_err("refused");
            let err = err.to_string();
            assert!(
                err.contains("--kv-bits")
                    && err.contains(model_type)
                    && err.contains("qwen2, qwen3"),
                "{err}"
            );
        }
        let stage = architecture("glm_moe_dsa")
            .expect("family")
            .load_stage(
                dir.path(),
                &options,
                PipelineSlice::new(0, 2).expect("slice"),
            )
            .expect("splits")
            .expect_err("refused");
        assert!(stage.to_string().contains("--kv-bits"), "{stage}");
        assert_eq!(
            kv_quantizing(),
            [
                "llama",
                "mistral",
                "qwen2",
                "qwen3",
                "qwen3_moe",
                "qwen3_next",
                "qwen3_5",
                "qwen3_5_moe"
            ]
        );
    }

    /// The logits of a 4-token prompt through the model at `dir`.
    fn prompt_logits(dir: &Path, options: &LoadOptions) -> mlx_rs::Array {
        let target = crate::load_model(dir, options).expect("loads");
        let mut caches = target.make_caches();
        let ids = mlx_rs::Array::from_slice(&[5u32, 9, 2, 7], &[1, 4]);
        let out = target.forward(&ids, &mut caches, &[]).expect("forward");
        target.logits(&out.hidden).expect("logits")
    }

    /// The llama family applies an adapter (LoRA and DoRA change the
    /// logits, whole and as a pipeline stage holding the adapted blocks);
    /// every family takes one.
    #[test]
    fn adapters_apply_to_the_llama_family_and_every_family_takes_one() {
        use spec_fixtures::adapter::LoraAdapter;
        let dir = tempfile::tempdir().expect("tempdir");
        let (model_dir, adapter_dir) = (dir.path().join("model"), dir.path().join("adapter"));
        let model = spec_fixtures::llama::Llama::tiny(3);
        let logits = |options: &LoadOptions| prompt_logits(&model_dir, options);
        for d in [&model_dir, &adapter_dir] {
            std::fs::create_dir(d).expect("mkdir");
        }
        model.write(&model_dir).expect("fixture");
        let plain = logits(&LoadOptions::default());
        for dora in [false, true] {
            let adapter = LoraAdapter {
                dora,
                ..LoraAdapter::lora(1, 9)
            };
            adapter.write(&adapter_dir, &model).expect("adapter");
            let options = LoadOptions {
                adapter: Some(adapter_dir.clone()),
                ..LoadOptions::default()
            };
            let adapted = logits(&options);
            let diff = adapted
                .subtract(&plain)
                .and_then(|d| d.abs())
                .and_then(|d| d.max(None))
                .expect("diff")
                .item_cast::<f32>();
            assert!(
                diff > 1e-3,
                "dora {dora}: the adapter changes nothing ({diff})"
            );
            // The last rank holds the adapted block; the first discards it.
            for rank in 0..2 {
                architecture("llama")
                    .expect("llama")
                    .load_stage(
                        &model_dir,
                        &options,
                        PipelineSlice::new(rank, 2).expect("slice"),
                    )
                    .expect("splits")
                    .expect("a stage loads its share of the adapter");
            }
        }
        assert_eq!(
            adapting(),
            [
                "llama",
                "mistral",
                "qwen2",
                "qwen3",
                "qwen3_moe",
                "gpt_oss",
                "glm_moe_dsa",
                "gemma4_text",
                "gemma4",
                "qwen3_next",
                "qwen3_5",
                "qwen3_5_moe"
            ]
        );
    }

    /// GLM takes an adapter under mlx-lm's module paths (a LoRA on its last
    /// layer's output projection changes the logits), whole and as the
    /// pipeline stages that hold and discard that layer.
    #[test]
    fn glm_applies_an_adapter_whole_and_as_stages() {
        use spec_fixtures::adapter::LoraAdapter;
        use spec_fixtures::{Init, TensorSpec};
        let dir = tempfile::tempdir().expect("tempdir");
        let (model_dir, adapter_dir) = (dir.path().join("model"), dir.path().join("adapter"));
        for d in [&model_dir, &adapter_dir] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let glm = spec_fixtures::glm::Glm::default();
        glm.write(&model_dir).expect("fixture");
        let last = glm.layers - 1;
        let p = format!("model.layers.{last}.self_attn.o_proj");
        let (input, rank) = (glm.heads * glm.v_head, 4);
        LoraAdapter::lora(1, 5)
            .write_tensors(
                &adapter_dir,
                &[
                    TensorSpec::new(format!("{p}.lora_a"), vec![input, rank], Init::Normal(0.1)),
                    TensorSpec::new(
                        format!("{p}.lora_b"),
                        vec![rank, glm.hidden],
                        Init::Normal(0.05),
                    ),
                ],
            )
            .expect("adapter");
        let logits = |options: &LoadOptions| prompt_logits(&model_dir, options);
        let options = LoadOptions {
            adapter: Some(adapter_dir.clone()),
            ..LoadOptions::default()
        };
        let diff = logits(&options)
            .subtract(logits(&LoadOptions::default()))
            .and_then(|d| d.abs())
            .and_then(|d| d.max(None))
            .expect("diff")
            .item_cast::<f32>();
        assert!(diff > 1e-4, "the adapter changes nothing ({diff})");
        for rank in 0..2 {
            architecture("glm_moe_dsa")
                .expect("glm")
                .load_stage(
                    &model_dir,
                    &options,
                    PipelineSlice::new(rank, 2).expect("slice"),
                )
                .expect("splits")
                .expect("a stage loads its share of the adapter");
        }
    }

    #[test]
    fn each_model_type_belongs_to_one_family() {
        let all = supported();
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "{all:?}");
        for t in &all {
            assert!(architecture(t).is_some_and(|a| a.model_types.contains(t)));
        }
        assert!(architecture("qwen3_6_moe").is_none());
        assert_eq!(
            splittable(),
            [
                "llama",
                "mistral",
                "qwen2",
                "qwen3",
                "qwen3_moe",
                "gpt_oss",
                "glm_moe_dsa",
                "qwen3_next",
                "qwen3_5",
                "qwen3_5_moe"
            ]
        );
    }
}
