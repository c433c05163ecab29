//! `mlx-spec fuse`: a fine-tuned adapter merged into its base model, with
//! `mlx_lm.fuse`'s flags, over `spec_formats::fuse`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use spec_formats::fuse::{fuse_dir, FuseOptions};

/// Arguments of `fuse`.
#[derive(clap::Args)]
pub struct Args {
    /// The base model: a directory, or a Hugging Face repo id the local
    /// cache holds.
    #[arg(long, default_value = "mlx_model")]
    model: PathBuf,
    /// The new directory to write (must not exist).
    #[arg(long, default_value = "fused_model")]
    save_path: PathBuf,
    /// The adapter directory (`adapter_config.json`, `adapters.safetensors`).
    #[arg(long, default_value = "adapters")]
    adapter_path: PathBuf,
    /// Write every quantized layer dequantized, the config without its
    /// quantization.
    #[arg(long, alias = "de-quantize")]
    dequantize: bool,
}

pub fn run(args: Args) -> Result<()> {
    let model = crate::model_source::local_path(&args.model)?;
    let (bar, progress) = crate::cmd_quantize::progress_bar("fusing", &model);
    let options = FuseOptions {
        dequantize: args.dequantize,
        progress: Some(progress),
        max_shard_bytes: None,
    };
    let report = fuse_dir(&model, &args.adapter_path, &args.save_path, &options);
    bar.finish_and_clear();
    let report = report.with_context(|| {
        format!(
            "fusing {} into {}",
            args.adapter_path.display(),
            model.display()
        )
    })?;
    let what = if report.replaced.is_empty() {
        format!("fused the updates of {} modules", report.fused.len())
    } else {
        format!("replaced {} tensors", report.replaced.len())
    };
    let dequantized = if report.dequantized.is_empty() {
        String::new()
    } else {
        format!(", {} modules dequantized", report.dequantized.len())
    };
    eprintln!(
        "{what}{dequantized}; {} shard(s), {:.1} MB -> {}",
        report.shards,
        report.total_size as f64 / 1e6,
        args.save_path.display()
    );
    Ok(())
}
