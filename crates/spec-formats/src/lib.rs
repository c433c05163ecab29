//! Files and tools around the runtime: mlx-lm's prompt-cache files
//! (`prompt_cache`), quantized checkpoints written in mlx-lm's format
//! (`quantize`), adapters fused into their base model (`fuse`) and llama.cpp's GGUF files read into Hugging Face terms
//! (`gguf`, `gguf_dequant`). It names no architecture: a file's caches
//! describe themselves (`spec_core::CacheState`).
#![warn(missing_docs)]

pub mod fuse;
pub mod gguf;
pub mod gguf_affine;
pub mod gguf_dequant;
pub mod prompt_cache;
pub mod quantize;

// The runtime's modules under the names this crate's files use.
pub(crate) use spec_runtime::{cache, config, weights};
pub(crate) use spec_runtime::{DtypePolicy, ModelError};
