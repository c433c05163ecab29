//! Synthetic checkpoints of every layout the gates and tests run: per layout a
//! spec struct whose `config()` is the `config.json` and whose `tensors()` lists
//! every tensor (name, shape, initialisation), and one seeded writer.
//!
//! The gates (`cargo xtask`) write them at gate sizes, unit and scenario tests
//! at tiny sizes; both go through the same code, so a layout changes in one
//! place. No MLX: values come from our own PRNG ([`rng`]), files are written
//! with the `safetensors` crate, so a checkpoint is bit-identical on every
//! machine.

#![warn(missing_docs)]

pub mod adapter;
pub mod assistant;
pub mod dflash;
pub mod dspark;
pub mod eagle3;
pub mod gemma4;
pub mod gguf;
pub mod glm;
pub mod llama;
pub mod qwen3_next;
pub mod rng;
mod write;

pub use write::{
    read_f32, values, write_checkpoint, write_config, write_tensors, Data, Init, Tensor, TensorSpec,
};

// Initialisation scales shared by every layout. Measured with mlx-lm on the
// gate dimensions: at std 0.02 greedy decoding collapses (tied models repeat
// one token forever); with these, 64 greedy steps visit 45-55 distinct tokens
// and the top-2 logit gap stays well above float32 noise.
const WEIGHT_STD: f64 = 0.25;
const EMBED_STD: f64 = 0.5;
const NORM_STD: f64 = 0.1;
/// Biases and small heads.
const BIAS_STD: f64 = 0.1;

/// Seed of the gates' synthetic targets (and their Gemma-4 assistants).
pub const GATE_SEED: u64 = 0x6D6C_7873_7065_6301;

/// `layer_types` value of a sliding-window attention layer.
pub const SLIDING: &str = "sliding_attention";
/// `layer_types` value of a full (global) attention layer.
pub const FULL: &str = "full_attention";

/// Errors of writing or reading a synthetic checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A config could not be serialised.
    #[error("serialising config.json: {0}")]
    Json(#[from] serde_json::Error),
    /// The safetensors crate refused a tensor or a file.
    #[error("{context}: {source}")]
    Safetensors {
        /// What was being written or read (a tensor or a file).
        context: String,
        /// The cause.
        source: safetensors::SafeTensorError,
    },
    /// A tensor has the wrong dtype or shape.
    #[error("tensor `{name}`: {message}")]
    Tensor {
        /// The tensor.
        name: String,
        /// What is wrong.
        message: String,
    },
}
