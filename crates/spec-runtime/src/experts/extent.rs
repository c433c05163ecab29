//! Where one expert's tensor lies in a checkpoint shard, and reading it by
//! byte range: the shard's size is recorded at open and checked before each
//! read, a short read is an error naming the file and the tensor.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use crate::ModelError;

/// A shard opened for range reads.
#[derive(Debug)]
pub(super) struct Shard {
    pub path: PathBuf,
    file: File,
    /// The size the header check saw.
    len: u64,
}

impl Shard {
    /// Opens `path`, whose header check saw `len` bytes.
    pub fn open(path: &Path, len: u64) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let shard = Self {
            path: path.to_path_buf(),
            file,
            len,
        };
        shard.check_len("")?;
        Ok(shard)
    }

    fn check_len(&self, tensor: &str) -> Result<(), ModelError> {
        let now = self
            .file
            .metadata()
            .map_err(|source| ModelError::Io {
                path: self.path.clone(),
                source,
            })?
            .len();
        if now == self.len {
            return Ok(());
        }
        Err(self.error(
            tensor,
            format!(
                "the file is now {now} bytes, it was {} when opened",
                self.len
            ),
        ))
    }

    fn error(&self, tensor: &str, message: String) -> ModelError {
        ModelError::ExpertRead {
            path: self.path.clone(),
            tensor: tensor.to_owned(),
            message,
        }
    }
}

/// One expert's slice of one tensor: `len` bytes at `offset` of shard
/// `shard`, read as `dtype` of `shape` (the expert's own, a leading 1
/// included).
#[derive(Debug, Clone)]
pub(super) struct Extent {
    pub shard: usize,
    pub offset: u64,
    pub len: u64,
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    /// The checkpoint tensor it lies in, for errors.
    pub tensor: String,
}

impl Extent {
    /// Reads the bytes (on any thread).
    pub fn read_bytes(&self, shards: &[Shard]) -> Result<Vec<u8>, ModelError> {
        let shard = shards
            .get(self.shard)
            .ok_or_else(|| ModelError::ExpertRead {
                path: PathBuf::new(),
                tensor: self.tensor.clone(),
                message: format!("no shard {}", self.shard),
            })?;
        shard.check_len(&self.tensor)?;
        let len = usize::try_from(self.len)
            .map_err(|_| shard.error(&self.tensor, format!("{} bytes do not fit", self.len)))?;
        let mut bytes = vec![0_u8; len];
        shard
            .file
            .read_exact_at(&mut bytes, self.offset)
            .map_err(|e| {
                shard.error(
                    &self.tensor,
                    format!("reading {} bytes at {}: {e}", self.len, self.offset),
                )
            })?;
        Ok(bytes)
    }

    /// `bytes` (what [`Extent::read_bytes`] gave) as an array of the
    /// extent's dtype and shape (not yet evaluated beyond the copy).
    pub fn to_array(&self, bytes: &[u8]) -> Result<Array, ModelError> {
        let n = i32::try_from(bytes.len()).map_err(|_| ModelError::ExpertRead {
            path: PathBuf::new(),
            tensor: self.tensor.clone(),
            message: format!("{} bytes exceed one array", bytes.len()),
        })?;
        let raw = Array::from_slice(bytes, &[n]);
        Ok(raw.view_dtype(self.dtype)?.reshape(&self.shape)?)
    }
}
