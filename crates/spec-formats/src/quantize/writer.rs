//! The output side: shards of at most a size limit (`model.safetensors`, or
//! `model-0000i-of-0000n.safetensors`), each with mlx's `{"format": "mlx"}`
//! metadata, and `model.safetensors.index.json` with the totals and a sorted
//! weight map, as `mlx_lm.utils.save_model` writes them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde_json::json;

use super::QuantizeError;

/// The name of the shard index, read by mlx-lm and by our loader.
pub(crate) const INDEX: &str = "model.safetensors.index.json";

/// Collects tensors and writes a shard whenever the next one would pass the
/// limit (a tensor larger than the limit gets a shard of its own).
pub(crate) struct ShardWriter {
    dir: PathBuf,
    max_bytes: u64,
    current: Vec<(String, Array)>,
    current_bytes: u64,
    /// Temporary file of each written shard, with its tensor names.
    written: Vec<(PathBuf, Vec<String>)>,
    total_size: u64,
}

/// What the writer produced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    pub shards: usize,
    pub total_size: u64,
}

impl ShardWriter {
    pub(crate) fn new(dir: &Path, max_bytes: u64) -> Self {
        Self {
            dir: dir.to_path_buf(),
            max_bytes,
            current: Vec::new(),
            current_bytes: 0,
            written: Vec::new(),
            total_size: 0,
        }
    }

    /// Adds one tensor (evaluated by the caller, so memory stays bounded by
    /// the shard being filled).
    pub(crate) fn push(&mut self, name: String, array: Array) -> Result<(), QuantizeError> {
        let bytes = array.nbytes() as u64;
        if !self.current.is_empty() && self.current_bytes + bytes > self.max_bytes {
            self.flush()?;
        }
        self.current_bytes += bytes;
        self.total_size += bytes;
        self.current.push((name, array));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), QuantizeError> {
        let path = self
            .dir
            .join(format!("partial-{:05}.safetensors", self.written.len() + 1));
        let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);
        let tensors = std::mem::take(&mut self.current);
        Array::save_safetensors(
            tensors.iter().map(|(n, a)| (n.as_str(), a)),
            &metadata,
            &path,
        )
        .map_err(|source| QuantizeError::Save {
            path: path.clone(),
            source,
        })?;
        self.written
            .push((path, tensors.into_iter().map(|(n, _)| n).collect()));
        self.current_bytes = 0;
        Ok(())
    }

    /// Writes the last shard, gives every shard its final name and writes
    /// the index with `total_parameters` (counted by the caller as mlx-lm
    /// counts the unquantized model's).
    pub(crate) fn finish(mut self, total_parameters: u64) -> Result<Written, QuantizeError> {
        if !self.current.is_empty() || self.written.is_empty() {
            self.flush()?;
        }
        let count = self.written.len();
        let mut weight_map = BTreeMap::new();
        for (i, (tmp, names)) in self.written.iter().enumerate() {
            let file = if count == 1 {
                "model.safetensors".to_owned()
            } else {
                format!("model-{:05}-of-{count:05}.safetensors", i + 1)
            };
            let path = self.dir.join(&file);
            std::fs::rename(tmp, &path).map_err(|source| QuantizeError::Io {
                path: path.clone(),
                source,
            })?;
            for name in names {
                weight_map.insert(name.clone(), file.clone());
            }
        }
        let index = json!({
            "metadata": { "total_size": self.total_size, "total_parameters": total_parameters },
            "weight_map": weight_map,
        });
        super::write_json(&self.dir.join(INDEX), &index)?;
        Ok(Written {
            shards: count,
            total_size: self.total_size,
        })
    }
}
