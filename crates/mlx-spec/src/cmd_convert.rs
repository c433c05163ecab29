//! `mlx-spec convert`: a GGUF file as an mlx-lm / Hugging Face directory.

use std::path::PathBuf;

use anyhow::{Context, Result};
use spec_models::DtypePolicy;

/// Arguments of `convert`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Keep the file's quantization instead of writing float32 weights:
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K as MLX affine groups of
    /// 32 (float32 scales, ggml's values exactly), F16 and BF16 as they are;
    /// Q2_K, Q3_K and Q6_K (groups of 16) are written as float32.
    #[arg(long)]
    keep_quantization: bool,
}

pub fn run(args: Args) -> Result<()> {
    let gguf = crate::model_source::resolve(args.gguf)?;
    let policy = if args.keep_quantization {
        DtypePolicy::Keep
    } else {
        DtypePolicy::Float32
    };
    spec_formats::gguf::convert_to_dir(&gguf, &args.out, policy)
        .with_context(|| format!("converting {}", gguf.display()))?;
    let tokenizer = crate::model_source::tokenizer(&gguf)?;
    tokenizer
        .save_hf_files(&args.out)
        .context("writing tokenizer files")?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
