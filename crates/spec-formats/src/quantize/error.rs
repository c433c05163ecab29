//! Errors of quantizing a model directory, each naming the file, tensor or
//! value at fault.

use std::path::PathBuf;

use crate::ModelError;

/// What went wrong quantizing a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// A mode, group size and bit width MLX does not quantize with.
    #[error("{what}: {source}")]
    UnsupportedParams {
        /// The whole model, or the module a predicate gave its own parameters.
        what: String,
        /// What MLX's mode accepts instead.
        source: mlx_ext::quant::QuantError,
    },
    /// Settings a policy (the drafter's) does not offer.
    #[error("{what}: {params} is not offered (choose {allowed})")]
    PolicyParams {
        /// The policy.
        what: String,
        /// What was asked for.
        params: crate::config::QuantParams,
        /// What the policy offers.
        allowed: String,
    },
    /// The source checkpoint is quantized already.
    #[error(
        "{path} is already quantized ({reason}); quantize its full-precision original instead"
    )]
    AlreadyQuantized {
        /// The checkpoint directory.
        path: PathBuf,
        /// What gave it away.
        reason: String,
    },
    /// The checkpoint is not one this command is for.
    #[error("{path}: {message}")]
    WrongCheckpoint {
        /// The config file.
        path: PathBuf,
        /// What it is and which command to use instead.
        message: String,
    },
    /// The output path exists; we never write into or over a directory.
    #[error("{path} already exists; choose a new output directory")]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },
    /// A module a predicate gave its own group size cannot be grouped by it.
    #[error(
        "`{module}`: input dimension {columns} is not a multiple of its group size {group_size}"
    )]
    GroupSizeMismatch {
        /// The module path.
        module: String,
        /// The weight's last dimension.
        columns: i32,
        /// The module's group size.
        group_size: i32,
    },
    /// Writing the output failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Saving a shard failed.
    #[error("{path}: writing safetensors: {source}")]
    Save {
        /// The shard file.
        path: PathBuf,
        /// MLX's error.
        source: mlx_rs::error::IoError,
    },
    /// The quantized checkpoint was written but its load smoke test failed.
    #[error("{path}: written, but the reload smoke test failed: {message}")]
    Smoke {
        /// The output directory.
        path: PathBuf,
        /// What the smoke test reported.
        message: String,
    },
    /// Reading the source checkpoint (config or weights) failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// MLX's quantize refused a tensor.
    #[error("`{tensor}`: {source}")]
    Quantize {
        /// The source tensor.
        tensor: String,
        /// Why.
        source: mlx_ext::quant::QuantError,
    },
}
