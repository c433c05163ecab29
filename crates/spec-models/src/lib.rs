//! Target model architectures: configuration (`config`), weight loading
//! (`weights`), caches (`cache`), shared layers and numerics (`layers`, `rope`, `mask`) and one
//! file per architecture family (`llama`: llama, mistral, qwen2, qwen3;
//! `glm`: glm_moe_dsa, with its MTP row;
//! `gemma4`: gemma4_text and the gemma4 wrapper's text model); `quantize`
//! writes quantized checkpoints in mlx-lm's format; `prompt_cache` reads and
//! writes mlx-lm's prompt-cache files; `pipeline` splits a model's layers
//! across the ranks of a pipeline.
#![warn(missing_docs)]

pub mod architectures;
mod batch;
pub mod cache;
pub mod config;
pub mod error;
pub mod gemma4;
pub mod gguf;
pub mod gguf_dequant;
pub mod glm;
pub mod layers;
pub mod llama;
pub mod load;
pub mod mask;
pub mod pipeline;
pub mod prompt_cache;
pub mod quantize;
pub mod rope;
mod sdpa;
mod stacked;
pub mod weights;

pub use error::ModelError;
pub use load::{load_model, DtypePolicy, LoadOptions, LoadedModel};
