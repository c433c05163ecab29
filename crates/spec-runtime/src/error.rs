//! Errors of model loading and execution, each naming the file or tensor.

use std::path::PathBuf;

/// What went wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not valid or describes an impossible model.
    #[error("{path}: invalid config: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `config.json` failed a parser or a check of another crate (serde's,
    /// a quantization mode's); the error stays the `source()`.
    #[error("{path}: invalid config: {context}{source}")]
    ConfigParse {
        /// The config file.
        path: PathBuf,
        /// Where in the config, as a prefix of the message (may be empty).
        context: String,
        /// The parser's or check's error.
        source: spec_core::error::BoxError,
    },
    /// The checkpoint's architecture is not one we implement.
    #[error("{path}: unsupported model_type `{model_type}` (supported: {supported})")]
    UnsupportedArchitecture {
        /// The config file.
        path: PathBuf,
        /// Its model_type.
        model_type: String,
        /// What we support.
        supported: String,
    },
    /// A weights file could not be parsed.
    #[error("{path}: invalid weights file: {message}")]
    WeightsFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A weights file failed a reader or a check of another crate (the
    /// header check of `weights-guard`, MLX's reader, the shard index's
    /// JSON); the error stays the `source()`.
    #[error("{path}: invalid weights file: {context}{source}")]
    WeightsCheck {
        /// The file.
        path: PathBuf,
        /// What was being read, as a prefix of the message (may be empty).
        context: &'static str,
        /// The error of the reader or check.
        source: spec_core::error::BoxError,
    },
    /// A tensor the architecture needs is absent.
    #[error("missing tensor `{name}` in {dir}")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// The model directory.
        dir: PathBuf,
    },
    /// A tensor has the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape in the file.
        found: Vec<i32>,
        /// Shape the config implies.
        expected: Vec<i32>,
    },
    /// A fine-tuned adapter (`--adapter-path`) that cannot be applied.
    #[error("{path}: adapter: {message}")]
    Adapter {
        /// The adapter's directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Tensors no part of the architecture uses.
    #[error("unexpected tensors in {dir}: {names:?}")]
    UnexpectedTensors {
        /// The model directory.
        dir: PathBuf,
        /// Their names (first few).
        names: Vec<String>,
    },
    /// A module stored quantized whose tensors or parameters do not fit
    /// together (an unknown or mismatched mode, scales of the wrong dtype,
    /// biases where the mode has none, or none where it needs them).
    #[error("`{module}`: {message}")]
    Quantized {
        /// The module path.
        module: String,
        /// What is wrong.
        message: String,
    },
    /// A module stored quantized whose parameters or tensors a check of
    /// `mlx-ext` refused; its error stays the `source()`.
    #[error("`{module}`: {source}")]
    QuantizedCheck {
        /// The module path.
        module: String,
        /// The check's error.
        source: mlx_ext::quant::QuantError,
    },
    /// An expert's bytes could not be read from its shard (a short read, a
    /// file whose size changed since it was opened, a header that
    /// disagrees with the tensor).
    #[error("{path}: tensor `{tensor}`: {message}")]
    ExpertRead {
        /// The shard.
        path: PathBuf,
        /// The checkpoint tensor the expert lies in.
        tensor: String,
        /// What went wrong.
        message: String,
    },
    /// The resident expert tier cannot hold one expert.
    #[error("`{option}` {capacity} is smaller than one expert of `{module}` ({needed} bytes)")]
    ExpertTier {
        /// The option that sizes the tier.
        option: &'static str,
        /// The tier's budget in bytes.
        capacity: u64,
        /// Bytes one expert needs.
        needed: u64,
        /// The experts' module path.
        module: String,
    },
    /// A load option this model cannot take.
    #[error("`{option}`: {message}")]
    LoadOption {
        /// The option.
        option: &'static str,
        /// Why not.
        message: String,
    },
    /// A router picked an expert the layer does not have.
    #[error("`{module}`: expert {expert} picked, the layer has {experts}")]
    ExpertPick {
        /// The experts' module path.
        module: String,
        /// The id picked.
        expert: u32,
        /// Experts in the layer.
        experts: i32,
    },
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// A quantized MLX operation (any mode) refused its inputs.
    #[error("MLX: {0}")]
    QuantOp(#[from] mlx_ext::quant::QuantError),
    /// RoPE with per-row offsets refused its inputs.
    #[error("MLX: {0}")]
    RopeOp(#[from] mlx_ext::rope::RopeError),
    /// A pipeline split this model cannot take.
    #[error(transparent)]
    Pipeline(#[from] SplitError),
    /// An error from the shared interfaces.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
}

impl ModelError {
    /// A parser's or check's `error` on the config at `path`, kept as the
    /// `source()`; `context` says where in the config.
    pub fn config_parse(
        path: &std::path::Path,
        context: impl Into<String>,
        error: impl Into<spec_core::error::BoxError>,
    ) -> Self {
        Self::ConfigParse {
            path: path.to_path_buf(),
            context: context.into(),
            source: error.into(),
        }
    }
}

/// Why a model cannot be split into the pipeline asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// The rank is not below the pipeline's size.
    #[error("pipeline rank {rank} is not a rank of a pipeline of {size}")]
    NotARank {
        /// The rank asked for.
        rank: usize,
        /// Ranks in the pipeline.
        size: usize,
    },
    /// Fewer decoder layers than ranks.
    #[error(
        "a pipeline of {size} ranks needs at least {size} decoder layers, the model has {layers}"
    )]
    TooFewLayers {
        /// Ranks in the pipeline.
        size: usize,
        /// The model's decoder layers.
        layers: usize,
    },
    /// No layer in the range a rank's start may move to can start a rank.
    #[error("no layer between {from} and {to} may start pipeline rank {rank} of {size}")]
    NoStart {
        /// The rank.
        rank: usize,
        /// Ranks in the pipeline.
        size: usize,
        /// The lowest layer it could start at.
        from: usize,
        /// Its start in the even split.
        to: usize,
    },
    /// A sliding-window layer would fall outside rank 0 (a pipeline keeps
    /// them there).
    #[error(
        "layer {layer} is a sliding-window layer outside rank 0's layers {start}..{end}: \
         a pipeline keeps sliding layers on rank 0"
    )]
    SlidingOffHead {
        /// The layer.
        layer: usize,
        /// Rank 0's first layer.
        start: usize,
        /// One past rank 0's last layer.
        end: usize,
    },
    /// Rank 0 would hold no recurrent layer of a model whose other ranks
    /// hold some (rank 0's caches decide how far a round may roll back,
    /// and only a recurrent cache knows its limit).
    #[error(
        "rank 0's layers {start}..{end} hold no recurrent (Gated DeltaNet) layer: a pipeline of this hybrid model keeps one on rank 0, which decides how far the others roll back"
    )]
    NoRecurrentOnHead {
        /// Rank 0's first layer.
        start: usize,
        /// One past rank 0's last layer.
        end: usize,
    },
}

impl From<ModelError> for spec_core::SpecError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Spec(inner) => inner,
            ModelError::Mlx(inner) => spec_core::SpecError::Mlx(inner),
            other => spec_core::SpecError::Model(Box::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_model_error_stays_the_source_of_its_spec_error() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = spec_core::SpecError::from(ModelError::Io {
            path: PathBuf::from("/m/config.json"),
            source: io,
        });
        assert!(matches!(e, spec_core::SpecError::Model(_)));
        assert_eq!(e.to_string(), "/m/config.json: gone");
        let model = e.source().expect("the model error");
        assert!(matches!(
            model.downcast_ref::<ModelError>(),
            Some(ModelError::Io { .. })
        ));
        let io = model.source().expect("the OS error");
        assert_eq!(
            io.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound)
        );
        assert_eq!(spec_core::error::report(&e), "/m/config.json: gone");
    }

    #[test]
    fn a_weights_guard_error_stays_the_source_of_the_load_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A header length pointing past the end of the file.
        std::fs::write(dir.path().join("model.safetensors"), 4096u64.to_le_bytes()).expect("write");
        let e = crate::weights::Weights::from_dir(dir.path()).expect_err("a truncated file");
        assert!(e.to_string().contains("invalid weights file"), "{e}");
        let guard = e.source().expect("the header check's error");
        assert!(
            guard.downcast_ref::<weights_guard::GuardError>().is_some(),
            "{guard:?}"
        );
    }
}
