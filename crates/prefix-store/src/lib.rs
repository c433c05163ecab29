//! The prefix cache's entries kept across restarts (`serve
//! --prompt-cache-dir`, `generate --prompt-cache-dir`): a
//! [`serve_loop::PrefixStore`] writing prompt-cache files
//! (`spec_formats::prompt_cache`, mlx-lm's format with our fingerprint and
//! tokens), one per entry, named by a hash of its tokens, bounded in bytes
//! on disk: least recently used files (by modification time, which a hit
//! renews) go first.
//!
//! The engine thread only copies an entry's evaluated bytes out of MLX
//! (`encode_prompt_cache`); a writer thread writes them (to a partial file
//! renamed into place, so no reader sees half a file) and enforces the
//! budget. Its queue is bounded: an entry that finds it full is not
//! persisted (a warning says so) rather than holding up the engine.
//! Dropping the store (the engine's shutdown) writes what is queued.
//!
//! Draft states a provider can persist (`SavedDraft::persist`) go to files
//! beside their entry, `<entry stem>.<provider id>.draft.safetensors`
//! (mlx-lm reads an
//! entry's arrays by position: extra arrays in the entry would break it),
//! written before the entry, counted in its bytes, evicted with it, and
//! read back by the provider of that id (`DraftProvider::load_saved`).
//!
//! The directory holds only what we wrote: a file is ours when its name
//! matches our pattern (`<16 lowercase hex>.safetensors`, its draft states
//! `<16 hex>.<provider id>.draft.safetensors`, partial files of either
//! `<name>.partial.safetensors`) and, for an entry, its header carries
//! [`MARKER_KEY`]. Any other file is never read, counted, renamed or
//! deleted. An exclusive lock on [`LOCK_FILE`] keeps a second process off
//! the directory; a directory we create is 0700, the files we write 0600.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::SystemTime;

use serve_loop::{Boundaries, PrefixStore, StoredEntry};
use spec_core::{CacheSet, DraftProvider, PersistedDraft, SavedDraft, Target};
use spec_formats::prompt_cache::{self, EncodedPromptCache, ModelIdentity};

/// Metadata key of the boundary rule an entry was taken under.
const RULE_KEY: &str = "mlx_spec_boundaries";
/// Metadata key of the prefix-cache partition an entry belongs to
/// (`serve_loop::cache_partition`).
const PARTITION_KEY: &str = "mlx_spec_partition";
/// Metadata key marking an entry file as written by a store (value
/// [`MARKER_VALUE`]); a file without it is never counted or deleted.
const MARKER_KEY: &str = "mlx_spec_prefix_entry";
/// Value of [`MARKER_KEY`].
const MARKER_VALUE: &str = "1";
/// The lock file a store holds (exclusively) while it uses the directory.
pub const LOCK_FILE: &str = ".mlx-spec.lock";
const SUFFIX: &str = ".safetensors";
const PARTIAL: &str = prompt_cache::PARTIAL_SUFFIX;
/// Suffix of a draft state's file, `<entry stem>.<provider id>.draft.safetensors`
/// (MLX reads safetensors by that extension only).
const DRAFT: &str = ".draft.safetensors";
/// Entries waiting for the writer at most (each holds its bytes).
const WRITE_QUEUE: usize = 2;

/// Bytes the directory may hold by default (8 GiB).
pub const DEFAULT_DIR_BYTES: u64 = 8 << 30;

/// A directory of prompt-cache files for one model.
#[derive(Debug)]
pub struct DirStore {
    files: Files,
    /// Holds the exclusive lock on [`LOCK_FILE`] as long as the store lives.
    _lock: std::fs::File,
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
    queue: SyncSender<Job>,
    thread: JoinHandle<()>,
}

/// What the writer writes: draft states' files, then the entry's (none
/// when only draft states were added to a kept entry).
#[derive(Debug)]
struct Job {
    entry: Option<EncodedPromptCache>,
    drafts: Vec<(PathBuf, Box<dyn PersistedDraft>)>,
}

impl Job {
    fn nbytes(&self) -> usize {
        self.entry.as_ref().map_or(0, EncodedPromptCache::nbytes)
            + self.drafts.iter().map(|(_, d)| d.nbytes()).sum::<usize>()
    }
}

/// The file of `provider`'s draft state kept with the entry at `entry`.
fn draft_path(entry: &Path, provider: &str) -> PathBuf {
    let id: String = provider
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    entry.with_file_name(format!("{}.{id}{DRAFT}", stem_of(entry)))
}

/// An entry file's name without [`SUFFIX`].
fn stem_of(entry: &Path) -> String {
    let name = entry
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_suffix(SUFFIX).unwrap_or(&name).to_owned()
}

/// Whether `s` is 16 lowercase hex digits (an entry's stem).
fn is_stem(s: &str) -> bool {
    s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `name` is an entry file's name, `<16 lowercase hex>.safetensors`.
fn is_entry_name(name: &str) -> bool {
    name.strip_suffix(SUFFIX).is_some_and(is_stem)
}

/// Whether `name` is a draft state's file name,
/// `<16 lowercase hex>.<provider id>.draft.safetensors`, the id of
/// `[A-Za-z0-9_-]+`.
fn is_draft_name(name: &str) -> bool {
    let Some((stem, id)) = name.strip_suffix(DRAFT).and_then(|r| r.split_once('.')) else {
        return false;
    };
    is_stem(stem)
        && !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Whether `name` is a partial file of an entry or a draft state.
fn is_partial_name(name: &str) -> bool {
    name.strip_suffix(PARTIAL)
        .is_some_and(|r| is_entry_name(r) || is_draft_name(r))
}

/// Whether the entry file at `path` carries our marker in its header.
fn is_marked(path: &Path) -> bool {
    prompt_cache::file_metadata(path)
        .is_ok_and(|m| m.get(&format!("0.{MARKER_KEY}")).map(String::as_str) == Some(MARKER_VALUE))
}

/// Creates `dir` (and missing parents) 0700 on unix; an existing directory
/// is left as it is.
fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// The lock file could not be locked (not because another process holds
/// it): the file system's error is the source.
#[derive(Debug, thiserror::Error)]
#[error("cannot lock {}", path.display())]
struct LockFailed {
    path: PathBuf,
    source: std::io::Error,
}

/// Takes the exclusive lock on `dir`'s [`LOCK_FILE`]; held by another
/// process, an error saying so.
fn lock_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    let path = dir.join(LOCK_FILE);
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let file = options.open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            format!(
                "prompt-cache directory {} is in use: another mlx-spec process holds its lock {}",
                dir.display(),
                path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(source)) => Err(std::io::Error::new(
            source.kind(),
            LockFailed { path, source },
        )),
    }
}

/// Sets the file at `path` to mode 0600 (unix).
fn restrict(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
            tracing::warn!(file = %path.display(), error = %e, "cannot restrict a prompt-cache file to its owner");
        }
    }
}

/// FNV-1a over the partition's length and bytes, then the tokens'
/// little-endian bytes (the same tokens in two partitions are two files).
fn name_of(partition: &str, tokens: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let head = (partition.len() as u64).to_le_bytes();
    let bytes = head
        .iter()
        .copied()
        .chain(partition.bytes())
        .chain(tokens.iter().flat_map(|t| t.to_le_bytes()));
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}{SUFFIX}")
}

impl DirStore {
    /// A store in `dir` (created if missing) for the model `identity`
    /// names, holding at most `max_bytes` of files. Partial files a killed
    /// process left behind are removed (ours only). Fails when another
    /// process holds the directory's lock.
    pub fn open(dir: &Path, max_bytes: u64, identity: ModelIdentity) -> std::io::Result<Self> {
        create_dir(dir)?;
        let lock = lock_dir(dir)?;
        let files = Files {
            dir: dir.to_path_buf(),
            max_bytes,
        };
        files.remove_partials();
        let (queue, pending) = mpsc::sync_channel::<Job>(WRITE_QUEUE);
        let writer_files = files.clone();
        let thread = std::thread::Builder::new()
            .name("prompt-cache-writer".into())
            .spawn(move || {
                for job in pending {
                    writer_files.write(&job);
                }
            })?;
        Ok(Self {
            files,
            _lock: lock,
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
    fn path_of(&self, partition: &str, tokens: &[u32]) -> PathBuf {
        self.dir.join(name_of(partition, tokens))
    }

    /// The draft-state files kept with the entry at `entry`.
    fn drafts_of(&self, entry: &Path) -> Vec<(PathBuf, u64)> {
        let prefix = format!("{}.", stem_of(entry));
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        read.filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&prefix) && is_draft_name(&name)
            })
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
            .collect()
    }

    /// The entry files, least recently used first, with their sizes (their
    /// draft states' files counted in).
    fn files(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let mut files = self.entry_files();
        let drafts: Vec<(String, u64)> = std::fs::read_dir(&self.dir)
            .map(|read| {
                read.filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let len = e.metadata().ok()?.len();
                        is_draft_name(&name).then_some((name, len))
                    })
                    .collect()
            })
            .unwrap_or_default();
        for f in &mut files {
            let prefix = format!("{}.", stem_of(&f.0));
            f.1 += drafts
                .iter()
                .filter(|(name, _)| name.starts_with(&prefix))
                .map(|(_, len)| len)
                .sum::<u64>();
        }
        files
    }

    /// The entry files (named and marked as ours), least recently used
    /// first, with their own sizes.
    fn entry_files(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let mut files: Vec<_> = self
            .named_entries()
            .into_iter()
            .filter(|f| is_marked(&f.0))
            .collect();
        files.sort_by_key(|f| f.2);
        files
    }

    /// The regular files named as entries (marked or not), least recently
    /// used first, with their own sizes.
    fn named_entries(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<_> = read
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if !is_entry_name(&name) {
                    return None;
                }
                let meta = e.metadata().ok().filter(std::fs::Metadata::is_file)?;
                Some((e.path(), meta.len(), meta.modified().ok()?))
            })
            .collect();
        files.sort_by_key(|f| f.2);
        files
    }

    /// Removes our partial files and our draft-state files whose entry is
    /// gone (a draft beside an entry-named file, marked or not, stays).
    fn remove_partials(&self) {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let entries: Vec<String> = self
            .named_entries()
            .iter()
            .map(|f| format!("{}.", stem_of(&f.0)))
            .collect();
        for e in read.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let orphan = is_draft_name(&name) && !entries.iter().any(|p| name.starts_with(p));
            if is_partial_name(&name) || orphan {
                let path = e.path();
                match std::fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(file = %path.display(), "removed a partial or orphan prompt-cache file")
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "cannot remove a partial or orphan prompt-cache file")
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
            for (draft, _) in self.drafts_of(&path) {
                if let Err(e) = std::fs::remove_file(&draft) {
                    tracing::warn!(file = %draft.display(), error = %e, "cannot evict a draft-state file");
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total = total.saturating_sub(bytes);
                    tracing::debug!(file = %path.display(), bytes, "prompt-cache file evicted");
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot evict a prompt-cache file")
                }
            }
        }
    }

    /// Writes a job (on the writer thread): its draft states, then its
    /// entry unless the entry's file already holds the same content (the
    /// same metadata: model, rule, tokens, whose caches are then the same
    /// bits), which is only renewed; then enforces the budget.
    fn write(&self, job: &Job) {
        let entry_path = job
            .entry
            .as_ref()
            .map(|e| e.path().to_path_buf())
            .or_else(|| {
                let (path, _) = job.drafts.first()?;
                let name = path.file_name()?.to_string_lossy().into_owned();
                let (stem, _) = name.split_once('.')?;
                Some(self.dir.join(format!("{stem}{SUFFIX}")))
            });
        if let Some(path) = entry_path.filter(|p| p.exists() && !is_marked(p)) {
            tracing::warn!(
                file = %path.display(),
                "a file not written by a store holds this entry's name: entry not saved, file left alone"
            );
            return;
        }
        for (path, draft) in &job.drafts {
            match draft.write(path) {
                Ok(()) => restrict(path),
                Err(e) => tracing::warn!(
                    file = %path.display(),
                    error = %spec_core::error::report(&e),
                    "cannot save a draft state"
                ),
            }
        }
        if let Some(entry) = &job.entry {
            let path = entry.path();
            if same_header(path, entry.metadata()) {
                renew(path);
            } else if let Err(e) = entry.write() {
                tracing::warn!(
                    file = %path.display(),
                    error = %spec_core::error::report(&e),
                    "cannot save a prefix-cache entry"
                );
            }
        }
        self.enforce_budget();
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

impl DirStore {
    /// Queues `job` for the writer; a full queue drops it (the engine
    /// never waits on the disk).
    fn send(&self, job: Job) {
        let Some(writer) = &self.writer else {
            return;
        };
        match writer.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) => tracing::warn!(
                bytes = job.nbytes(),
                "prompt-cache writer busy: entry kept in memory only"
            ),
            Err(TrySendError::Disconnected(job)) => tracing::warn!(
                bytes = job.nbytes(),
                "prompt-cache writer gone: entry kept in memory only"
            ),
        }
    }
}

/// The persistent forms of `drafts` (those their provider can persist),
/// each with its file beside the entry at `entry`.
fn persist_drafts(
    entry: &Path,
    drafts: &[(&str, &dyn SavedDraft)],
) -> Vec<(PathBuf, Box<dyn PersistedDraft>)> {
    drafts
        .iter()
        .filter_map(|(id, d)| {
            let path = draft_path(entry, id);
            match d.persist()? {
                Ok(p) => Some((path, p)),
                Err(e) => {
                    tracing::warn!(
                        file = %path.display(),
                        error = %spec_core::error::report(&e),
                        "cannot save a draft state"
                    );
                    None
                }
            }
        })
        .collect()
}

/// The draft states kept with the entry at `entry` (holding `tokens`) that
/// their provider reads back.
fn load_drafts(
    entry: &Path,
    tokens: &[u32],
    providers: &[&dyn DraftProvider],
) -> Vec<(String, Box<dyn SavedDraft>)> {
    let mut out = Vec::new();
    for p in providers {
        let path = draft_path(entry, p.id());
        if !path.exists() {
            continue;
        }
        match p.load_saved(&path, tokens) {
            Ok(Some(d)) => out.push((p.id().to_owned(), d)),
            Ok(None) => {
                tracing::info!(file = %path.display(), "draft state not for this provider: skipped")
            }
            Err(e) => tracing::warn!(
                file = %path.display(),
                error = %spec_core::error::report(&e),
                "skipping draft-state file"
            ),
        }
    }
    out
}

impl PrefixStore for DirStore {
    fn load(
        &mut self,
        target: &dyn Target,
        rule: Boundaries,
        providers: &[&dyn DraftProvider],
    ) -> Vec<StoredEntry> {
        self.files.enforce_budget();
        let mut out = Vec::new();
        for (path, _, _) in self.files.named_entries() {
            let skip = |why: &str| {
                tracing::warn!(file = %path.display(), "skipping prompt-cache file: {why}");
            };
            if !is_marked(&path) {
                skip(&format!(
                    "its header lacks the {MARKER_KEY} marker (not written by a store; left alone)"
                ));
                continue;
            }
            let cache = match prompt_cache::load_prompt_cache(&path, target, &self.identity) {
                Ok(c) => c,
                Err(e) => {
                    skip(&spec_core::error::report(&e));
                    continue;
                }
            };
            let Some(tokens) = cache.tokens else {
                skip("it records no tokens (not written by a store)");
                continue;
            };
            if cache.fingerprint.is_none() {
                skip("it records no model fingerprint");
                continue;
            }
            match cache.metadata.get(RULE_KEY) {
                Some(tag) if *tag == rule.tag() => {
                    let drafts = load_drafts(&path, &tokens, providers);
                    let partition = cache
                        .metadata
                        .get(PARTITION_KEY)
                        .cloned()
                        .unwrap_or_default();
                    out.push(StoredEntry {
                        partition,
                        tokens,
                        caches: cache.caches,
                        drafts,
                    });
                }
                other => skip(&format!(
                    "taken under boundary rule {other:?}, this process reuses under {:?}",
                    rule.tag()
                )),
            }
        }
        out
    }

    fn save(
        &mut self,
        partition: &str,
        tokens: &[u32],
        caches: &CacheSet,
        drafts: &[(&str, &dyn SavedDraft)],
        rule: Boundaries,
    ) {
        let path = self.files.path_of(partition, tokens);
        let metadata = BTreeMap::from([
            (RULE_KEY.to_owned(), rule.tag()),
            (PARTITION_KEY.to_owned(), partition.to_owned()),
            (MARKER_KEY.to_owned(), MARKER_VALUE.to_owned()),
        ]);
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
        let drafts = persist_drafts(&path, drafts);
        self.send(Job {
            entry: Some(entry),
            drafts,
        });
    }

    fn save_drafts(&mut self, partition: &str, tokens: &[u32], drafts: &[(&str, &dyn SavedDraft)]) {
        let drafts = persist_drafts(&self.files.path_of(partition, tokens), drafts);
        if !drafts.is_empty() {
            self.send(Job {
                entry: None,
                drafts,
            });
        }
    }

    fn touch(&mut self, partition: &str, tokens: &[u32]) {
        renew(&self.files.path_of(partition, tokens));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Array;
    use spec_models::{load_model, DtypePolicy, LoadOptions};

    fn tiny_llama(dir: &Path, seed: u64) -> spec_models::LoadedModel {
        std::fs::create_dir(dir).expect("mkdir");
        spec_fixtures::llama::Llama::tiny(seed)
            .write(dir)
            .expect("write the model");
        load_model(dir, &LoadOptions::default()).expect("load")
    }

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
        let identity = ModelIdentity::new("tiny".into(), &model_dir, DtypePolicy::Float32, None)
            .expect("identity");
        let store_dir = dir.path().join("store");
        let tokens = [3u32, 9, 4, 7, 1];
        let caches = caches_of(model.as_ref(), &tokens);

        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        store.save("", &tokens, &caches, &[], Boundaries::Grid(512));
        drop(store);
        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        assert!(store.load(model.as_ref(), Boundaries::Any, &[]).is_empty());
        store.save("", &tokens, &caches, &[], Boundaries::Any);
        drop(store);
        let file = store_dir.join(name_of("", &tokens));
        let written = std::fs::metadata(&file)
            .and_then(|m| m.modified())
            .expect("mtime");

        let mut store = DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity).expect("open");
        let loaded = store.load(model.as_ref(), Boundaries::Any, &[]);
        assert_eq!(
            loaded.len(),
            1,
            "the entry was rewritten under the new rule"
        );
        assert_eq!(loaded[0].tokens, tokens);
        // The same content again: renewed in place (same inode), not rewritten.
        let inode = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).expect("stat").ino()
        };
        let before = inode(&file);
        store.save("", &tokens, &caches, &[], Boundaries::Any);
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
            .filter(|n| n != LOCK_FILE)
            .collect();
        assert_eq!(left, [name_of("", &tokens)], "one file, no partial one");
    }

    /// A `draft-model` state saved with an entry persists beside it (the
    /// drafter's cache as a prompt-cache file of the drafter), comes back
    /// with the entry after a restart for the same drafter, is skipped for
    /// another drafter, and goes when its entry is evicted.
    #[test]
    fn draft_states_persist_beside_their_entry_for_the_same_drafter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = tiny_llama(&dir.path().join("target"), 5);
        let drafter_options = |seed: u64| {
            let path = dir.path().join(format!("drafter-{seed}"));
            tiny_llama(&path, seed);
            draft_model::Options {
                model: path,
                dtype: DtypePolicy::Float32,
            }
        };
        let provider = draft_model::DraftModelProvider::new(target.as_ref(), &drafter_options(6))
            .expect("drafter");
        let other = draft_model::DraftModelProvider::new(target.as_ref(), &drafter_options(7))
            .expect("other drafter");
        let identity = ModelIdentity::new(
            "tiny".into(),
            &dir.path().join("target"),
            DtypePolicy::Float32,
            None,
        )
        .expect("identity");
        let prompt = [3u32, 9, 4, 7, 1, 8, 2];
        let mut source = provider.open(target.as_ref()).expect("open");
        source.prefill(&prompt, None).expect("prefill");
        let saved = source.save_prefill().expect("a saved state");
        let tokens = &prompt[..prompt.len() - 1];
        let caches = caches_of(target.as_ref(), tokens);

        let store_dir = dir.path().join("store");
        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        store.save(
            "",
            tokens,
            &caches,
            &[("draft-model", saved.as_ref())],
            Boundaries::Any,
        );
        drop(store);
        let entry = store_dir.join(name_of("", tokens));
        let draft = draft_path(&entry, "draft-model");
        assert!(
            entry.exists() && draft.exists(),
            "entry and draft state written"
        );

        let direct = provider
            .load_saved(&draft, tokens)
            .map(|d| d.map(|d| d.tokens()));
        assert_eq!(direct.map_err(|e| e.to_string()), Ok(Some(saved.tokens())));
        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        let loaded = store.load(target.as_ref(), Boundaries::Any, &[&provider]);
        assert_eq!(loaded.len(), 1);
        let drafts: Vec<_> = loaded[0]
            .drafts
            .iter()
            .map(|(id, d)| (id.as_str(), d.tokens()))
            .collect();
        assert_eq!(drafts, [("draft-model", saved.tokens())]);
        let loaded = store.load(target.as_ref(), Boundaries::Any, &[&other]);
        assert_eq!(loaded.len(), 1, "the entry itself stays");
        assert!(
            loaded[0].drafts.is_empty(),
            "another drafter's state is skipped"
        );
        drop(store);

        // Evicted with its entry (a budget of one byte keeps nothing).
        let store = DirStore::open(&store_dir, 1, identity).expect("open");
        store.files.enforce_budget();
        drop(store);
        assert!(
            !entry.exists() && !draft.exists(),
            "entry and draft state evicted together"
        );
    }

    #[test]
    fn only_our_names_match_the_pattern() {
        assert!(is_entry_name("0123456789abcdef.safetensors"));
        assert!(is_entry_name(&name_of("p", &[1, 2, 3])));
        assert!(is_draft_name(
            "0123456789abcdef.draft-model.draft.safetensors"
        ));
        assert!(is_draft_name("0123456789abcdef.A_b-9.draft.safetensors"));
        assert!(is_partial_name(
            "0123456789abcdef.safetensors.partial.safetensors"
        ));
        assert!(is_partial_name(
            "0123456789abcdef.draft-model.draft.safetensors.partial.safetensors"
        ));
        for foreign in [
            "model-00001-of-00002.safetensors",
            "ABCDEF0123456789.safetensors",
            "0123.safetensors",
            "x.draft.safetensors",
            "0123456789abcdef0.safetensors",
            "0123456789abcdef.safetensors.bak",
        ] {
            assert!(!is_entry_name(foreign), "{foreign} taken as an entry");
            assert!(!is_draft_name(foreign), "{foreign} taken as a draft state");
            assert!(!is_partial_name(foreign), "{foreign} taken as a partial");
        }
        for foreign in [
            "x.draft.safetensors",
            "0123456789abcdef..draft.safetensors",
            "0123456789abcdef.a.b.draft.safetensors",
            "0123456789ABCDEF.draft-model.draft.safetensors",
        ] {
            assert!(!is_draft_name(foreign), "{foreign} taken as a draft state");
        }
        for foreign in [
            "foo.partial.safetensors",
            "model-00001-of-00002.safetensors.partial.safetensors",
        ] {
            assert!(!is_partial_name(foreign), "{foreign} taken as a partial");
        }
    }

    fn tiny_identity_and_caches(
        dir: &Path,
        tokens: &[u32],
    ) -> (spec_models::LoadedModel, ModelIdentity, CacheSet) {
        let model_dir = dir.join("model");
        let model = tiny_llama(&model_dir, 5);
        let identity = ModelIdentity::new("tiny".into(), &model_dir, DtypePolicy::Float32, None)
            .expect("identity");
        let caches = caches_of(model.as_ref(), tokens);
        (model, identity, caches)
    }

    /// A directory the store creates is 0700, the entry file it writes
    /// 0600; an existing directory keeps its mode.
    #[cfg(unix)]
    #[test]
    fn created_directory_and_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let tokens = [3u32, 9, 4, 7, 1];
        let (_model, identity, caches) = tiny_identity_and_caches(dir.path(), &tokens);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        let store_dir = dir.path().join("new").join("store");
        let mut store =
            DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        store.save("", &tokens, &caches, &[], Boundaries::Any);
        drop(store);
        assert_eq!(mode(&store_dir), 0o700, "the directory we created");
        let entry = store_dir.join(name_of("", &tokens));
        assert_eq!(mode(&entry), 0o600, "the entry file");
        assert!(is_marked(&entry), "the entry carries our marker");

        let existing = dir.path().join("existing");
        std::fs::create_dir(&existing).expect("mkdir");
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        drop(DirStore::open(&existing, DEFAULT_DIR_BYTES, identity).expect("open"));
        assert_eq!(
            mode(&existing),
            0o755,
            "an existing directory is left as it is"
        );
    }

    /// A write that fails (here the rename: the entry's name is taken by
    /// a directory) leaves no partial file and counts nothing.
    #[test]
    fn a_failed_write_leaves_no_partial_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokens = [3u32, 9, 4, 7, 1];
        let (_model, identity, caches) = tiny_identity_and_caches(dir.path(), &tokens);
        let store_dir = dir.path().join("store");
        std::fs::create_dir(&store_dir).expect("mkdir");
        let entry = store_dir.join(name_of("", &tokens));
        std::fs::create_dir(&entry).expect("block the entry's name");
        std::fs::write(entry.join("keep"), b"x").expect("write");
        let encoded = prompt_cache::encode_prompt_cache(
            &entry,
            &caches,
            &tokens,
            &identity,
            &BTreeMap::new(),
        )
        .expect("encode");
        assert!(encoded.write().is_err(), "the rename cannot succeed");
        assert!(!prompt_cache::partial_path(&entry).exists(), "partial left");

        // A parent that is a file: nothing is created.
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let under = file.join(name_of("", &tokens));
        assert!(encoded.write_to(&under).is_err());
        assert!(!prompt_cache::partial_path(&under).exists());

        let store = DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity).expect("open");
        assert!(store.files.files().is_empty(), "nothing counted");
        drop(store);
        let left: Vec<_> = std::fs::read_dir(&store_dir)
            .expect("read")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != LOCK_FILE)
            .collect();
        assert_eq!(left, [name_of("", &tokens)], "only the blocking directory");
    }

    /// A second store on a locked directory is refused, naming it.
    #[test]
    fn a_second_store_on_the_same_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model_dir = dir.path().join("model");
        tiny_llama(&model_dir, 5);
        let identity = ModelIdentity::new("tiny".into(), &model_dir, DtypePolicy::Float32, None)
            .expect("identity");
        let store_dir = dir.path().join("store");
        let first = DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone()).expect("open");
        let err = DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity.clone())
            .expect_err("a second store on a locked directory");
        let text = err.to_string();
        assert!(
            text.contains(&store_dir.display().to_string()) && text.contains("another"),
            "{text}"
        );
        drop(first);
        drop(DirStore::open(&store_dir, DEFAULT_DIR_BYTES, identity).expect("free again"));
    }
}
