//! `serve --prompt-cache-dir`: the prefix cache's entries as prompt-cache
//! files (`spec_models::prompt_cache`, mlx-lm's format with our
//! fingerprint and tokens), one per entry, named by a hash of its tokens,
//! bounded in bytes on disk: least recently used files (by modification
//! time, which a hit renews) go first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serve_loop::{Boundaries, PrefixStore};
use spec_core::{CacheSet, Target};
use spec_models::prompt_cache::{self, ModelIdentity};

/// Metadata key of the boundary rule an entry was taken under.
const RULE_KEY: &str = "mlx_spec_boundaries";
const SUFFIX: &str = ".safetensors";
const PARTIAL: &str = ".partial.safetensors";

/// Bytes the directory may hold by default (8 GiB).
pub const DEFAULT_DIR_BYTES: u64 = 8 << 30;

/// A directory of prompt-cache files for one model.
#[derive(Debug)]
pub struct DirStore {
    dir: PathBuf,
    max_bytes: u64,
    identity: ModelIdentity,
}

/// FNV-1a over the tokens' little-endian bytes.
fn name_of(tokens: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tokens.iter().flat_map(|t| t.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}{SUFFIX}")
}

impl DirStore {
    /// A store in `dir` (created if missing) for the model `identity`
    /// names, holding at most `max_bytes` of files.
    pub fn open(dir: &Path, max_bytes: u64, identity: ModelIdentity) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            max_bytes,
            identity,
        })
    }

    /// The entry files, least recently used first, with their sizes.
    fn files(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<_> = read
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.ends_with(SUFFIX) || name.ends_with(PARTIAL) {
                    return None;
                }
                let meta = e.metadata().ok().filter(std::fs::Metadata::is_file)?;
                Some((e.path(), meta.len(), meta.modified().ok()?))
            })
            .collect();
        files.sort_by_key(|f| f.2);
        files
    }

    /// Removes the least recently used files until the directory holds at
    /// most `max_bytes`.
    fn enforce_budget(&self) {
        let files = self.files();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        for (path, bytes, _) in files {
            if total <= self.max_bytes {
                break;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total -= bytes;
                    tracing::debug!(file = %path.display(), bytes, "prompt-cache file evicted");
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot evict a prompt-cache file")
                }
            }
        }
    }
}

impl PrefixStore for DirStore {
    fn load(&mut self, target: &dyn Target, rule: Boundaries) -> Vec<(Vec<u32>, CacheSet)> {
        self.enforce_budget();
        let mut out = Vec::new();
        for (path, _, _) in self.files() {
            let skip = |why: &str| {
                tracing::warn!(file = %path.display(), "skipping prompt-cache file: {why}");
            };
            let cache = match prompt_cache::load_prompt_cache(&path, target, &self.identity) {
                Ok(c) => c,
                Err(e) => {
                    skip(&spec_core::error::report(&e));
                    continue;
                }
            };
            let Some(tokens) = cache.tokens else {
                skip("it records no tokens (not written by this server)");
                continue;
            };
            if cache.fingerprint.is_none() {
                skip("it records no model fingerprint");
                continue;
            }
            match cache.metadata.get(RULE_KEY) {
                Some(tag) if *tag == rule.tag() => out.push((tokens, cache.caches)),
                other => skip(&format!(
                    "taken under boundary rule {other:?}, this server reuses under {:?}",
                    rule.tag()
                )),
            }
        }
        out
    }

    fn save(&mut self, tokens: &[u32], caches: &CacheSet, rule: Boundaries) {
        let path = self.dir.join(name_of(tokens));
        if path.exists() {
            // The same tokens under the same rule: the same bits.
            self.touch(tokens);
            return;
        }
        let metadata = BTreeMap::from([(RULE_KEY.to_owned(), rule.tag())]);
        match prompt_cache::save_prompt_cache(&path, caches, tokens, &self.identity, &metadata) {
            Ok(()) => self.enforce_budget(),
            Err(e) => tracing::warn!(
                file = %path.display(),
                error = %spec_core::error::report(&e),
                "cannot save a prefix-cache entry"
            ),
        }
    }

    fn touch(&mut self, tokens: &[u32]) {
        let path = self.dir.join(name_of(tokens));
        let renewed = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        if let Err(e) = renewed {
            tracing::debug!(file = %path.display(), error = %e, "prompt-cache file not renewed");
        }
    }
}
