//! Prompt-cache files in mlx-lm's format (`save_prompt_cache` /
//! `load_prompt_cache` of mlx-lm 0.32.2): one safetensors file whose
//! tensors are the flattened states of a request's caches and whose
//! metadata holds a free-form map (`model`, `tokenizer_config`), the class
//! of each cache and the list of non-array leaves (`tree`). The classes and
//! state layouts are mlx-lm's for the same architecture (`layout`), so a
//! file written by either tool loads in the other.
//!
//! Ours add two keys to the free-form map, which mlx-lm carries without
//! reading: [`FINGERPRINT_KEY`] (the model's [`fingerprint`]) and
//! [`TOKENS_KEY`] (the cached prompt's token ids, a JSON list). A file whose
//! fingerprint names another model is refused naming both; a file without
//! one (mlx-lm's) is checked structurally. Every file goes through the
//! weights guard before MLX reads it.

mod fingerprint;
mod layout;
mod recurrent;
mod tree;

#[cfg(test)]
mod recurrent_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use spec_core::{CacheSet, SpecError, Target};

pub use fingerprint::fingerprint;

use crate::{DtypePolicy, ModelError};

/// Metadata key of our model fingerprint.
pub const FINGERPRINT_KEY: &str = "mlx_spec_fingerprint";
/// Metadata key of the cached prompt's token ids (a JSON list).
pub const TOKENS_KEY: &str = "mlx_spec_tokens";
/// Metadata key mlx-lm names the model under (its `--model` argument).
pub const MODEL_KEY: &str = "model";

/// Why a prompt-cache file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum PromptCacheError {
    /// The file is missing, or the weights guard or MLX's reader refused it
    /// (truncated, corrupt).
    #[error("prompt cache file: {0}")]
    Read(#[source] ModelError),
    /// Writing the file failed.
    #[error("writing prompt cache file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// MLX's or the file system's error.
        source: spec_core::error::BoxError,
    },
    /// The file's fingerprint names another model.
    #[error("prompt cache file {path} was written for model `{file_model}` ({file_fingerprint}), not for `{model}` ({fingerprint})")]
    OtherModel {
        /// The file.
        path: PathBuf,
        /// The model the file names.
        file_model: String,
        /// The file's fingerprint.
        file_fingerprint: String,
        /// The model given.
        model: String,
        /// Its fingerprint.
        fingerprint: String,
    },
    /// The file's caches were computed in another dtype.
    #[error("prompt cache file {path}: entry {entry} holds {found} caches, model `{model}` computes {expected}")]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The entry.
        entry: usize,
        /// The file's dtype.
        found: String,
        /// The model's.
        expected: String,
        /// The model given.
        model: String,
    },
    /// The file's caches do not fit the model (count, classes, shapes).
    #[error("prompt cache file {path} does not fit model `{model}`: {detail}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The model given.
        model: String,
        /// What differs.
        detail: String,
    },
    /// The file's offsets lie (negative, past the stored rows, different
    /// between caches, not the prompt's length).
    #[error("prompt cache file {path}: inconsistent offsets: {detail}")]
    Offsets {
        /// The file.
        path: PathBuf,
        /// Which offset and why.
        detail: String,
    },
    /// The file's recorded tokens are not a list of token ids.
    #[error("prompt cache file {path} is malformed: its token list does not parse")]
    Tokens {
        /// The file.
        path: PathBuf,
        /// The JSON parser's error.
        source: serde_json::Error,
    },
    /// A cache tensor has a dtype the file format cannot hold.
    #[error("cannot save these caches to a prompt cache file: tensor `{name}` ({dtype})")]
    Tensor {
        /// The tensor's name in the file.
        name: String,
        /// Its dtype.
        dtype: String,
        /// MLX's conversion error.
        source: mlx_rs::error::ConversionError,
    },
    /// The file is not a prompt cache (metadata or tensor names).
    #[error("prompt cache file {path} is malformed: {detail}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// These caches have no file form (a cache type mlx-lm does not have, or
    /// a state its layout cannot express).
    #[error("cannot save these caches to a prompt cache file: {0}")]
    Unsupported(String),
    /// The model failed while probing its caches' shapes.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// A problem found inside the format code, given its file by the caller.
#[derive(Debug)]
pub(crate) enum Problem {
    Malformed(String),
    Mismatch(String),
    Offsets(String),
    Dtype {
        entry: usize,
        found: String,
        expected: String,
    },
    Unsupported(String),
    Tensor {
        name: String,
        dtype: String,
        source: mlx_rs::error::ConversionError,
    },
    Spec(SpecError),
}

impl From<SpecError> for Problem {
    fn from(e: SpecError) -> Self {
        Self::Spec(e)
    }
}

impl From<mlx_rs::error::Exception> for Problem {
    fn from(e: mlx_rs::error::Exception) -> Self {
        Self::Spec(e.into())
    }
}

impl Problem {
    fn at(self, path: &Path, model: &str) -> PromptCacheError {
        let path = path.to_path_buf();
        match self {
            Self::Malformed(detail) => PromptCacheError::Malformed { path, detail },
            Self::Mismatch(detail) => PromptCacheError::Mismatch {
                path,
                model: model.to_owned(),
                detail,
            },
            Self::Offsets(detail) => PromptCacheError::Offsets { path, detail },
            Self::Dtype {
                entry,
                found,
                expected,
            } => PromptCacheError::Dtype {
                path,
                entry,
                found,
                expected,
                model: model.to_owned(),
            },
            Self::Unsupported(m) => PromptCacheError::Unsupported(m),
            Self::Tensor {
                name,
                dtype,
                source,
            } => PromptCacheError::Tensor {
                name,
                dtype,
                source,
            },
            Self::Spec(e) => PromptCacheError::Spec(e),
        }
    }
}

/// A model as prompt-cache files name it: `name` as mlx-lm's `model` entry
/// (the `--model` argument as given: mlx-lm's `generate` refuses a file
/// whose entry differs from its own argument) and its [`fingerprint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The model as named on the command line.
    pub name: String,
    /// [`fingerprint`] of the model.
    pub fingerprint: String,
}

impl ModelIdentity {
    /// The identity of the model at `path`, run under `dtype` with the
    /// fine-tuned adapter at `adapter` applied, named `name`.
    pub fn new(
        name: String,
        path: &Path,
        dtype: DtypePolicy,
        adapter: Option<&Path>,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            name,
            fingerprint: fingerprint(path, dtype, adapter)?,
        })
    }
}

/// A prompt cache read from a file.
#[derive(Debug)]
pub struct PromptCache {
    /// The caches, holding `offset` positions.
    pub caches: CacheSet,
    /// The cached prompt's tokens (our files; mlx-lm's do not record them).
    pub tokens: Option<Vec<u32>>,
    /// The file's free-form metadata (`model`, `tokenizer_config`, ...),
    /// our two keys left out.
    pub metadata: BTreeMap<String, String>,
    /// The file's fingerprint (our files).
    pub fingerprint: Option<String>,
}

/// Writes `caches`, holding `tokens`, to `path` (a `.safetensors` file;
/// replaced atomically) with `metadata` (mlx-lm's `cache_prompt` writes
/// `model` and `tokenizer_config`) plus our fingerprint and tokens:
/// [`encode_prompt_cache`], then [`EncodedPromptCache::write`].
pub fn save_prompt_cache(
    path: &Path,
    caches: &CacheSet,
    tokens: &[u32],
    identity: &ModelIdentity,
    metadata: &BTreeMap<String, String>,
) -> Result<(), PromptCacheError> {
    encode_prompt_cache(path, caches, tokens, identity, metadata)?.write()
}

/// One tensor of an [`EncodedPromptCache`]: its bytes out of MLX.
#[derive(Debug)]
struct HostTensor {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &HostTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// A prompt-cache file's content as plain bytes, no MLX array in it: made
/// by [`encode_prompt_cache`] on the thread that owns the caches (MLX
/// arrays belong to the thread whose stream made them), written by
/// [`EncodedPromptCache::write`] from any thread.
#[derive(Debug)]
pub struct EncodedPromptCache {
    path: PathBuf,
    tensors: Vec<(String, HostTensor)>,
    metadata: std::collections::HashMap<String, String>,
    tokens: usize,
}

impl EncodedPromptCache {
    /// The file it is for.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of tensor data it holds.
    pub fn nbytes(&self) -> usize {
        self.tensors.iter().map(|(_, t)| t.data.len()).sum()
    }

    /// The safetensors metadata the file gets (mlx-lm's flattened tree).
    pub fn metadata(&self) -> &std::collections::HashMap<String, String> {
        &self.metadata
    }

    /// Writes the file: to `<path>.partial.safetensors`, then renamed over
    /// `path`, so a reader (or a process killed mid-write) never sees half a
    /// file under the entry's name.
    pub fn write(&self) -> Result<(), PromptCacheError> {
        self.write_to(&self.path)
    }

    /// [`EncodedPromptCache::write`] to another file than the one it was
    /// encoded for. Durable: the partial file (mode 0600 on unix) is
    /// written and synced, renamed onto `path`, then the directory is
    /// synced. On any error the partial file is removed.
    pub fn write_to(&self, path: &Path) -> Result<(), PromptCacheError> {
        let partial = partial_path(path);
        if let Err(source) = self.write_partial(&partial, path) {
            // Best effort: the partial file is garbage either way.
            let _ = std::fs::remove_file(&partial);
            return Err(PromptCacheError::Write {
                path: path.to_path_buf(),
                source,
            });
        }
        tracing::info!(path = %path.display(), tensors = self.tensors.len(), tokens = self.tokens, "prompt cache saved");
        Ok(())
    }

    /// Serializes into `partial` (streamed, not built in memory; the
    /// serializer writes a private temporary file beside it and renames it
    /// there), syncs it, renames it onto `path` and syncs the directory
    /// holding `path`.
    fn write_partial(&self, partial: &Path, path: &Path) -> Result<(), spec_core::error::BoxError> {
        let pairs = self.tensors.iter().map(|(k, t)| (k.as_str(), t));
        safetensors::serialize_to_file(pairs, Some(self.metadata.clone()), partial)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(partial, std::fs::Permissions::from_mode(0o600))?;
        }
        std::fs::File::open(partial)?.sync_all()?;
        std::fs::rename(partial, path)?;
        #[cfg(unix)]
        {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Where [`EncodedPromptCache::write`] writes before renaming onto `path`.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut partial = path.as_os_str().to_owned();
    partial.push(PARTIAL_SUFFIX);
    PathBuf::from(partial)
}

/// Suffix of a file being written (never a complete prompt cache).
pub const PARTIAL_SUFFIX: &str = ".partial.safetensors";

/// The content [`save_prompt_cache`] writes to `path`, evaluated and copied
/// out of MLX on this thread (the caches' arrays are shared, not changed).
pub fn encode_prompt_cache(
    path: &Path,
    caches: &CacheSet,
    tokens: &[u32],
    identity: &ModelIdentity,
    metadata: &BTreeMap<String, String>,
) -> Result<EncodedPromptCache, PromptCacheError> {
    if tokens.len() != caches.offset() {
        return Err(PromptCacheError::Unsupported(format!(
            "{} tokens given for caches holding {}",
            tokens.len(),
            caches.offset()
        )));
    }
    let at = |p: Problem| p.at(path, &identity.name);
    let entries = layout::entries_of(caches).map_err(at)?;
    let states: Vec<_> = entries.iter().map(|e| e.state.clone()).collect();
    let classes: Vec<&str> = entries.iter().map(|e| e.class.as_str()).collect();
    let (tensors, scalars) = tree::flatten(&states).map_err(at)?;
    let mut user = metadata.clone();
    user.insert(MODEL_KEY.into(), identity.name.clone());
    user.insert(FINGERPRINT_KEY.into(), identity.fingerprint.clone());
    let tokens_json = serde_json::to_string(tokens).map_err(|e| PromptCacheError::Write {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    user.insert(TOKENS_KEY.into(), tokens_json);
    let meta = tree::metadata(&user, &classes, &scalars);
    let tensors = host_tensors(tensors).map_err(at)?;
    Ok(EncodedPromptCache {
        path: path.to_path_buf(),
        tensors,
        metadata: meta,
        tokens: tokens.len(),
    })
}

/// Row-contiguous copies of `arrays`, evaluated together, their bytes
/// copied out (a view of a larger buffer becomes its own rows only).
fn host_tensors(arrays: Vec<(String, Array)>) -> Result<Vec<(String, HostTensor)>, Problem> {
    let dense = arrays
        .iter()
        .map(|(_, a)| a.contiguous())
        .collect::<Result<Vec<_>, _>>()?;
    mlx_rs::transforms::eval(&dense)?;
    arrays
        .into_iter()
        .zip(&dense)
        .map(|((name, _), a)| {
            // Python's `None` is an empty float32 array, which MLX backs
            // with no buffer at all.
            if a.size() == 0 && a.dtype() == mlx_rs::Dtype::Float32 {
                let tensor = HostTensor {
                    dtype: safetensors::Dtype::F32,
                    shape: a.shape().iter().map(|&d| d as usize).collect(),
                    data: Vec::new(),
                };
                return Ok((name, tensor));
            }
            let view =
                safetensors::tensor::TensorView::try_from(a).map_err(|source| Problem::Tensor {
                    name: name.clone(),
                    dtype: format!("{:?}", a.dtype()),
                    source,
                })?;
            let tensor = HostTensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            };
            Ok((name, tensor))
        })
        .collect()
}

/// Reads the prompt cache at `path` for `target` (named by `identity`):
/// the weights guard checks the file, a fingerprint naming another model is
/// refused, and every cache is checked against the model's own (classes,
/// head shapes, dtype, offsets).
pub fn load_prompt_cache(
    path: &Path,
    target: &dyn Target,
    identity: &ModelIdentity,
) -> Result<PromptCache, PromptCacheError> {
    let at = |p: Problem| p.at(path, &identity.name);
    let (tensors, meta) =
        crate::weights::load_file_with_metadata(path).map_err(PromptCacheError::Read)?;
    let header = tree::parse_metadata(&meta).map_err(at)?;
    let mut user = header.user;
    let fingerprint = user.remove(FINGERPRINT_KEY);
    same_model(path, &user, fingerprint.as_deref(), identity)?;
    let tokens = match user.remove(TOKENS_KEY) {
        Some(json) => Some(serde_json::from_str::<Vec<u32>>(&json).map_err(|source| {
            PromptCacheError::Tokens {
                path: path.to_path_buf(),
                source,
            }
        })?),
        None => None,
    };
    let states = tree::unflatten(tensors, &header.scalars).map_err(at)?;
    if states.len() != header.classes.len() {
        return Err(at(Problem::Malformed(format!(
            "{} cache states but {} class names",
            states.len(),
            header.classes.len()
        ))));
    }
    let entries = header
        .classes
        .into_iter()
        .zip(states)
        .map(|(class, state)| layout::Entry { class, state })
        .collect();
    let mut probe = target.make_caches();
    target
        .forward(&Array::from_slice(&[0u32], &[1, 1]), &mut probe, &[])?
        .hidden
        .eval()
        .map_err(SpecError::from)?;
    let caches = layout::caches_from(entries, target.make_caches(), &probe).map_err(at)?;
    if let Some(t) = &tokens {
        if t.len() != caches.offset() {
            return Err(at(Problem::Offsets(format!(
                "{} prompt tokens recorded for caches holding {}",
                t.len(),
                caches.offset()
            ))));
        }
    }
    tracing::info!(path = %path.display(), offset = caches.offset(), ours = fingerprint.is_some(), "prompt cache loaded");
    Ok(PromptCache {
        caches,
        tokens,
        metadata: user,
        fingerprint,
    })
}

/// Positions per prefill forward (mlx-lm's `prefill_step_size`); row
/// invariance makes the bits independent of it.
const PREFILL_STEP: usize = 2048;

/// Caches holding all of `tokens`, as mlx-lm's `cache_prompt` leaves them:
/// `tokens[..len-1]` in steps of 2048, then the last token alone (the
/// forward generation's first step makes).
pub fn prefill(target: &dyn Target, tokens: &[u32]) -> Result<CacheSet, SpecError> {
    let mut caches = target.make_caches();
    let Some((last, body)) = tokens.split_last() else {
        return Err(spec_core::InputError::NoTokens { what: "prefill" }.into());
    };
    for chunk in body
        .chunks(PREFILL_STEP)
        .chain([std::slice::from_ref(last)])
    {
        let ids = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        target.forward(&ids, &mut caches, &[])?.hidden.eval()?;
    }
    Ok(caches)
}

/// Refuses a file whose fingerprint names another model than `identity`
/// (a file without one passes).
fn same_model(
    path: &Path,
    user: &BTreeMap<String, String>,
    fingerprint: Option<&str>,
    identity: &ModelIdentity,
) -> Result<(), PromptCacheError> {
    match fingerprint {
        Some(f) if f != identity.fingerprint => Err(PromptCacheError::OtherModel {
            path: path.to_path_buf(),
            file_model: user.get(MODEL_KEY).cloned().unwrap_or_default(),
            file_fingerprint: f.to_owned(),
            model: identity.name.clone(),
            fingerprint: identity.fingerprint.clone(),
        }),
        _ => Ok(()),
    }
}

/// [`load_prompt_cache`]'s fingerprint check alone, from the file's header
/// (through the weights guard): a host can refuse another model's file
/// before loading its own model.
pub fn check_model(path: &Path, identity: &ModelIdentity) -> Result<(), PromptCacheError> {
    let meta = header_metadata(path)?;
    let header = tree::parse_metadata(&meta).map_err(|p| p.at(path, &identity.name))?;
    same_model(
        path,
        &header.user,
        header.user.get(FINGERPRINT_KEY).map(String::as_str),
        identity,
    )
}

/// A prompt-cache file's raw safetensors metadata (mlx-lm's flattened
/// tree, as [`EncodedPromptCache::metadata`] holds it), read from the
/// header through the weights guard.
pub fn file_metadata(path: &Path) -> Result<BTreeMap<String, String>, PromptCacheError> {
    header_metadata(path)
}

fn header_metadata(path: &Path) -> Result<BTreeMap<String, String>, PromptCacheError> {
    weights_guard::check_safetensors(path, &weights_guard::Limits::default())
        .map(|summary| summary.metadata)
        .map_err(|e| {
            PromptCacheError::Read(ModelError::WeightsCheck {
                path: path.to_path_buf(),
                context: "",
                source: e.into(),
            })
        })
}

/// The `model` entry of a prompt-cache file's metadata (mlx-lm's
/// `generate` loads that model when `--model` is absent), read from the
/// header through the weights guard.
pub fn file_model(path: &Path) -> Result<Option<String>, PromptCacheError> {
    Ok(header_metadata(path)?.remove(&format!("0.{MODEL_KEY}")))
}
