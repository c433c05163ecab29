//! `serve --prompt-cache-dir`: the prefix cache's entries as prompt-cache
//! files (`spec_models::prompt_cache`, mlx-lm's format with our
//! fingerprint and tokens), one per entry, named by a hash of its tokens,
//! bounded in bytes on disk: least recently used files (by modification
//! time, which a hit renews) go first.
//!
//! The engine thread only copies an entry's evaluated bytes out of MLX
//! (`encode_prompt_cache`); a writer thread writes them (to a partial file
//! renamed into place, so no reader sees half a file) and enforces the
//! budget. Its queue is bounded: an entry that finds it full is not
//! persisted (a warning says so) rather than holding up the engine.
//! Dropping the store (the engine's shutdown) writes what is queued.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::SystemTime;

use serve_loop::{Boundaries, PrefixStore};
use spec_core::{CacheSet, Target};
use spec_models::prompt_cache::{self, EncodedPromptCache, ModelIdentity};

/// Metadata key of the boundary rule an entry was taken under.
const RULE_KEY: &str = "mlx_spec_boundaries";
const SUFFIX: &str = ".safetensors";
const PARTIAL: &str = prompt_cache::PARTIAL_SUFFIX;
/// Entries waiting for the writer at most (each holds its bytes).
const WRITE_QUEUE: usize = 2;

/// Bytes the directory may hold by default (8 GiB).
pub const DEFAULT_DIR_BYTES: u64 = 8 << 30;

/// A directory of prompt-cache files for one model.
#[derive(Debug)]
pub struct DirStore {
    files: Files,
    identity: ModelIdentity,
    writer: Option<Writer>,
}

/// The directory and its budget (shared by the engine thread, which loads
/// and renews, and the writer, which writes and evicts).
#[derive(Debug, Clone)]
struct Files {
    dir: PathBuf,
    max_bytes: u64,
}

#[derive(Debug)]
struct Writer {
    queue: SyncSender<EncodedPromptCache>,
    thread: JoinHandle<()>,
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
    /// names, holding at most `max_bytes` of files. Partial files a killed
    /// process left behind are removed.
    pub fn open(dir: &Path, max_bytes: u64, identity: ModelIdentity) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let files = Files {
            dir: dir.to_path_buf(),
            max_bytes,
        };
        files.remove_partials();
        let (queue, pending) = mpsc::sync_channel::<EncodedPromptCache>(WRITE_QUEUE);
        let writer_files = files.clone();
        let thread = std::thread::Builder::new()
            .name("prompt-cache-writer".into())
            .spawn(move || {
                for entry in pending {
                    writer_files.write(&entry);
                }
            })?;
        Ok(Self {
            files,
            identity,
            writer: Some(Writer { queue, thread }),
        })
    }
}

impl Drop for DirStore {
    /// Writes the queued entries, then returns.
    fn drop(&mut self) {
        if let Some(Writer { queue, thread }) = self.writer.take() {
            drop(queue);
            if thread.join().is_err() {
                tracing::error!("the prompt-cache writer panicked");
            }
        }
    }
}

impl Files {
    fn path_of(&self, tokens: &[u32]) -> PathBuf {
        self.dir.join(name_of(tokens))
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

    fn remove_partials(&self) {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in read.filter_map(Result::ok) {
            if e.file_name().to_string_lossy().ends_with(PARTIAL) {
                let path = e.path();
                match std::fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(file = %path.display(), "removed a partial prompt-cache file")
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "cannot remove a partial prompt-cache file")
                    }
                }
            }
        }
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

    /// Writes `entry` (on the writer thread) unless its file already holds
    /// the same content (the same metadata: model, rule, tokens, whose
    /// caches are then the same bits), which is only renewed.
    fn write(&self, entry: &EncodedPromptCache) {
        let path = entry.path();
        if same_header(path, entry.metadata()) {
            renew(path);
            return;
        }
        match entry.write() {
            Ok(()) => self.enforce_budget(),
            Err(e) => tracing::warn!(
                file = %path.display(),
                error = %spec_core::error::report(&e),
                "cannot save a prefix-cache entry"
            ),
        }
    }
}

/// Whether the file at `path` exists with exactly `metadata` in its header.
fn same_header(path: &Path, metadata: &std::collections::HashMap<String, String>) -> bool {
    if !path.exists() {
        return false;
    }
    prompt_cache::file_metadata(path).is_ok_and(|found| {
        found.len() == metadata.len() && metadata.iter().all(|(k, v)| found.get(k) == Some(v))
    })
}

/// Renews the file's modification time (least recently used goes first).
fn renew(path: &Path) {
    let renewed = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = renewed {
        tracing::debug!(file = %path.display(), error = %e, "prompt-cache file not renewed");
    }
}

impl PrefixStore for DirStore {
    fn load(&mut self, target: &dyn Target, rule: Boundaries) -> Vec<(Vec<u32>, CacheSet)> {
        self.files.enforce_budget();
        let mut out = Vec::new();
        for (path, _, _) in self.files.files() {
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
        let path = self.files.path_of(tokens);
        let metadata = BTreeMap::from([(RULE_KEY.to_owned(), rule.tag())]);
        let entry = match prompt_cache::encode_prompt_cache(
            &path,
            caches,
            tokens,
            &self.identity,
            &metadata,
        ) {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(
                    file = %path.display(),
                    error = %spec_core::error::report(&e),
                    "cannot save a prefix-cache entry"
                );
                return;
            }
        };
        let Some(writer) = &self.writer else {
            return;
        };
        match writer.queue.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(entry)) => tracing::warn!(
                file = %entry.path().display(),
                bytes = entry.nbytes(),
                "prompt-cache writer busy: entry kept in memory only"
            ),
            Err(TrySendError::Disconnected(entry)) => tracing::warn!(
                file = %entry.path().display(),
                "prompt-cache writer gone: entry kept in memory only"
            ),
        }
    }

    fn touch(&mut self, tokens: &[u32]) {
        renew(&self.files.path_of(tokens));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Array;
    use spec_models::{load_model, DtypePolicy, LoadOptions};

    fn caches_of(target: &dyn Target, tokens: &[u32]) -> CacheSet {
        let mut caches = target.make_caches();
        let ids = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        target
            .forward(&ids, &mut caches, &[])
            .expect("forward")
            .hidden
            .eval()
            .expect("eval");
        caches
    }

    /// A file under an entry's name whose content differs (here: taken
    /// under another boundary rule) is rewritten, not only renewed; one
    /// with the same content is left as it is.
    #[test]
    fn a_same_named_file_with_other_content_is_rewritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model_dir = dir.path().join("model");
        std::fs::create_dir(&model_dir).expect("mkdir");
        spec_fixtures::llama::Llama::tiny(5)
            .write(&model_dir)
            .expect("write the model");
        let model = load_model(&model_dir, &LoadOptions::default()).expect("load");
        let identity =
            ModelIdentity::new("tiny".into(), &model_dir, DtypePolicy::Float32).expect("identity");
        let store_dir = dir.path().join("store");
        let tokens = [3u32, 9, 4, 7, 1];
        let caches = caches_of(model.as_ref(), &tokens);

        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        store.save(&tokens, &caches, Boundaries::Grid(512));
        drop(store);
        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        assert!(store.load(model.as_ref(), Boundaries::Any).is_empty());
        store.save(&tokens, &caches, Boundaries::Any);
        drop(store);
        let file = store_dir.join(name_of(&tokens));
        let written = std::fs::metadata(&file)
            .and_then(|m| m.modified())
            .expect("mtime");

        let mut store = DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity).expect("open");
        let loaded = store.load(model.as_ref(), Boundaries::Any);
        assert_eq!(
            loaded.len(),
            1,
            "the entry was rewritten under the new rule"
        );
        assert_eq!(loaded[0].0, tokens);
        // The same content again: renewed in place (same inode), not rewritten.
        let inode = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).expect("stat").ino()
        };
        let before = inode(&file);
        store.save(&tokens, &caches, Boundaries::Any);
        drop(store);
        assert_eq!(inode(&file), before, "an equal file is not rewritten");
        let renewed = std::fs::metadata(&file)
            .and_then(|m| m.modified())
            .expect("mtime");
        assert!(renewed >= written);
        let left: Vec<_> = std::fs::read_dir(&store_dir)
            .expect("read")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, [name_of(&tokens)], "one file, no partial one");
    }
}
