//! `--prompt-cache-dir` and `--prompt-cache-dir-bytes`, as `serve` and
//! `generate` take them: the prefix cache's entries kept in a directory
//! (`prefix_store`), loaded at start, so they outlive the process.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use prefix_store::DirStore;
use spec_formats::prompt_cache::ModelIdentity;
use spec_models::DtypePolicy;

/// The directory options.
#[derive(Debug, Clone, clap::Args)]
pub struct DirArgs {
    /// Keep the prefix cache's entries as prompt-cache files in DIR too
    /// (loaded at startup: they survive a restart).
    #[arg(long, value_name = "DIR")]
    pub prompt_cache_dir: Option<PathBuf>,
    /// Bytes of files `--prompt-cache-dir` may hold (least recently used
    /// files go first).
    #[arg(long, default_value_t = prefix_store::DEFAULT_DIR_BYTES)]
    pub prompt_cache_dir_bytes: u64,
}

impl DirArgs {
    /// The store `--prompt-cache-dir` names, for the model at `path` (named
    /// `model_arg` on the command line) run with `policy` and the adapter
    /// at `adapter`; `None` without the option.
    pub fn open(
        &self,
        model_arg: Option<&Path>,
        path: &Path,
        policy: DtypePolicy,
        adapter: Option<&Path>,
    ) -> Result<Option<DirStore>> {
        let Some(dir) = &self.prompt_cache_dir else {
            return Ok(None);
        };
        let name = crate::cmd_cache_prompt::model_name(model_arg, path);
        let identity = ModelIdentity::new(name, path, policy, adapter)
            .context("fingerprinting the model for --prompt-cache-dir")?;
        let store = DirStore::open(dir, self.prompt_cache_dir_bytes, identity)
            .with_context(|| format!("--prompt-cache-dir {}", dir.display()))?;
        Ok(Some(store))
    }
}
