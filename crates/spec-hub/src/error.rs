//! The crate's error type.

use std::path::PathBuf;

/// Why a model could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// None of the variables that locate the cache is set.
    #[error("no cache directory: neither MLX_SPEC_CACHE_DIR, XDG_CACHE_HOME nor HOME is set; set MLX_SPEC_CACHE_DIR to a writable directory")]
    NoCacheDir,

    /// `python3` could not be started.
    #[error("cannot run python3 to fetch {requirement} ({source}); install it with `apt-get install python3 python3-pip`")]
    PythonMissing {
        /// The package requirement being fetched.
        requirement: String,
        /// Why the process did not start.
        source: std::io::Error,
    },

    /// `python3 -m pip` is not available.
    #[error("pip is not available to fetch {requirement}; install it with `apt-get install python3-pip`")]
    PipMissing {
        /// The package requirement being fetched.
        requirement: String,
    },

    /// `pip download` failed.
    #[error(
        "`pip download {requirement}` failed ({status}); is PyPI reachable? pip said:\n{output}"
    )]
    DownloadFailed {
        /// The package requirement being fetched.
        requirement: String,
        /// pip's exit status.
        status: std::process::ExitStatus,
        /// The end of pip's output.
        output: String,
    },

    /// pip succeeded but left no wheel behind.
    #[error("`pip download {requirement}` left no wheel in {dir}")]
    NoWheel {
        /// The package requirement being fetched.
        requirement: String,
        /// Where the wheel was expected.
        dir: PathBuf,
    },

    /// The wheel is not a readable zip archive.
    #[error("reading wheel {wheel}: {source}")]
    BadWheel {
        /// The wheel file.
        wheel: PathBuf,
        /// What the zip reader reported.
        source: zip::result::ZipError,
    },

    /// The wheel does not hold the model file.
    #[error("wheel {wheel} has no member {member}")]
    MemberMissing {
        /// The wheel file.
        wheel: PathBuf,
        /// The member that was looked for.
        member: String,
    },

    /// The extracted (or cached) model file does not have the expected size.
    #[error("{path} has {actual} bytes, expected {expected}")]
    SizeMismatch {
        /// The model file.
        path: PathBuf,
        /// The size the package is known to hold.
        expected: u64,
        /// The size found.
        actual: u64,
    },

    /// A repo id that the local Hugging Face cache does not hold.
    #[error("`{repo_id}` is not a local directory or file, and the Hugging Face cache {cache} has no usable snapshot of it ({why}); mlx-spec does not download models: fetch it with `hf download {repo_id}` (or `huggingface-cli download {repo_id}`), or pass a directory")]
    NotInHfCache {
        /// The repo id asked for.
        repo_id: String,
        /// The hub cache looked in.
        cache: PathBuf,
        /// What was missing.
        why: String,
    },

    /// A file-system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "creating".
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }
}
