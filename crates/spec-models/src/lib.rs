//! Target model architectures, one module per family (`llama`: llama,
//! mistral, qwen2, qwen3; `glm`: glm_moe_dsa, with its MTP row; `gemma4`:
//! gemma4_text and the gemma4 wrapper's text model; `qwen3_next`: the
//! hybrid Gated DeltaNet / gated attention stack), the one table that
//! names them (`architectures`: loading, pipeline stages, the supported
//! list), what a checkpoint takes in memory per dtype policy, from its
//! headers (`footprint`), `load_model` (a directory or a GGUF file) and `pipeline`, which
//! splits a model's layers across the ranks of a pipeline. The shared
//! runtime is `spec-runtime`; files and tools are `spec-formats`.
#![warn(missing_docs)]

pub mod architectures;
mod family;
pub mod footprint;
pub mod gemma4;
pub mod glm;
pub mod llama;
pub mod load;
pub mod pipeline;
pub mod qwen3_next;
mod sparse_moe;

#[cfg(test)]
mod batch_check;
#[cfg(test)]
mod batch_llama_tests;
#[cfg(test)]
mod streamed_check;

// The runtime's modules under the names the architectures' files use.
#[cfg(test)]
pub(crate) use spec_formats::quantize;
pub(crate) use spec_runtime::{
    adapter, batch, cache, config, layers, mask, rope, sdpa, stacked, switch_glu, weights,
};

pub use load::{expert_store, load_gguf, load_model, mtp_expert_tier, LoadedModel};
pub use spec_runtime::{DtypePolicy, LoadOptions, ModelError};
