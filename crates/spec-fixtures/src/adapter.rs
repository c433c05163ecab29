//! A LoRA / DoRA adapter for a llama-family fixture, as `mlx_lm.lora` writes
//! one (`adapter_config.json`, `adapters.safetensors`): `lora_a` `[in,
//! rank]`, `lora_b` `[rank, out]` and, for DoRA, `m` `[out]` for every
//! linear layer of the last blocks, under mlx-lm's module names.

use std::path::Path;

use serde_json::json;

use crate::llama::Llama;
use crate::{write_tensors, Error, Init, TensorSpec};

/// One adapter of a [`Llama`] checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraAdapter {
    /// Whether it is DoRA (else LoRA).
    pub dora: bool,
    /// Blocks adapted, counted from the last.
    pub layers: usize,
    /// `lora_parameters.rank`.
    pub rank: usize,
    /// `lora_parameters.scale`.
    pub scale: f64,
    /// PRNG seed of its values.
    pub seed: u64,
}

impl LoraAdapter {
    /// A LoRA of rank 4 on the last `layers` blocks.
    pub fn lora(layers: usize, seed: u64) -> Self {
        Self {
            dora: false,
            layers,
            rank: 4,
            scale: 2.0,
            seed,
        }
    }

    /// Its tensors for `model`: every projection of each adapted block.
    pub fn tensors(&self, model: &Llama) -> Vec<TensorSpec> {
        let head_dim = model.head_dim.unwrap_or(model.hidden / model.heads);
        let (h, inter, r) = (model.hidden, model.intermediate, self.rank);
        let (q, kv) = (model.heads * head_dim, model.kv_heads * head_dim);
        let projections = [
            ("self_attn.q_proj", h, q),
            ("self_attn.k_proj", h, kv),
            ("self_attn.v_proj", h, kv),
            ("self_attn.o_proj", q, h),
            ("mlp.gate_proj", h, inter),
            ("mlp.up_proj", h, inter),
            ("mlp.down_proj", inter, h),
        ];
        let first = model.layers.saturating_sub(self.layers);
        let mut t = Vec::new();
        for i in first..model.layers {
            for (name, input, output) in projections {
                let p = format!("model.layers.{i}.{name}");
                t.push(TensorSpec::new(
                    format!("{p}.lora_a"),
                    vec![input, r],
                    Init::Normal(0.1),
                ));
                t.push(TensorSpec::new(
                    format!("{p}.lora_b"),
                    vec![r, output],
                    Init::Normal(0.05),
                ));
                if self.dora {
                    t.push(TensorSpec::new(
                        format!("{p}.m"),
                        vec![output],
                        Init::OnePlusNormal(0.1),
                    ));
                }
            }
        }
        t
    }

    /// Writes the adapter for `model` into `dir` (which must exist).
    pub fn write(&self, dir: &Path, model: &Llama) -> Result<(), Error> {
        self.write_tensors(dir, &self.tensors(model))
    }

    /// Writes this adapter's config and `tensors` (another family's
    /// modules, drawn from its seed) into `dir`.
    pub fn write_tensors(&self, dir: &Path, tensors: &[TensorSpec]) -> Result<(), Error> {
        let config = json!({
            "fine_tune_type": if self.dora { "dora" } else { "lora" },
            "num_layers": self.layers,
            "lora_parameters": {"rank": self.rank, "dropout": 0.0, "scale": self.scale},
        });
        let path = dir.join("adapter_config.json");
        let text = serde_json::to_string_pretty(&config)? + "\n";
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })?;
        let tensors: Vec<_> = tensors
            .iter()
            .map(|s| s.draw(self.seed, "adapter"))
            .collect();
        write_tensors(&dir.join("adapters.safetensors"), &tensors)
    }
}
