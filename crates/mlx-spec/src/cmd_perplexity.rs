//! `mlx-spec perplexity`: a model's perplexity on a local dataset, as
//! `mlx_lm.perplexity` computes it: rows of `--sequence-length` tokens
//! (`perplexity_data`), every token after a row's first scored under the
//! model (the engine's prompt scoring, `--batch-size` rows at once), the
//! perplexity the exponential of the mean loss, with its standard error.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serve_loop::{PrefixCacheConfig, Request};

use crate::local_engine::{Local, Setup};
use crate::model_source;
use crate::perplexity_data::Dataset;

/// Arguments of `perplexity` (mlx-lm's names and defaults).
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (mlx-lm / Hugging Face) or GGUF file; default:
    /// SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The dataset: a JSONL file, or a directory holding `train.jsonl`, of
    /// records in mlx-lm's formats (`text`; `messages`; `prompt` and
    /// `completion`). Hub datasets are not fetched: download one first.
    #[arg(long)]
    data_path: PathBuf,
    /// Rows scored at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: u64,
    /// Tokens of each row.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(2..))]
    sequence_length: u64,
    /// Rows to score; -1 for every whole row the records fill.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    num_samples: i64,
    /// The seed of the records' order (numpy's permutation, as mlx-lm's).
    #[arg(long, default_value_t = 123)]
    seed: u32,
    /// Run the file's dtype and quantization (see `generate --keep-dtype`).
    #[arg(long)]
    keep_dtype: bool,
    #[command(flatten)]
    load: crate::load_args::LoadArgs,
}

/// The scores of the rows: each token's loss (minus its log-probability).
pub struct Scores {
    losses: Vec<f32>,
}

impl Scores {
    /// The perplexity, `exp` of the mean loss.
    pub fn perplexity(&self) -> f64 {
        self.mean().exp()
    }

    fn mean(&self) -> f64 {
        self.losses.iter().map(|&l| f64::from(l)).sum::<f64>() / self.losses.len().max(1) as f64
    }

    /// The perplexity's standard error: the losses' sample standard
    /// deviation over the square root of their count, times the perplexity
    /// (the delta method, as mlx-lm's).
    pub fn standard_error(&self) -> f64 {
        let n = self.losses.len() as f64;
        if n < 2.0 {
            return 0.0;
        }
        let mean = self.mean();
        let variance = self
            .losses
            .iter()
            .map(|&l| (f64::from(l) - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        self.perplexity() * variance.sqrt() / n.sqrt()
    }
}

pub fn run(args: Args) -> Result<()> {
    let length = usize::try_from(args.sequence_length).context("--sequence-length")?;
    let samples = match args.num_samples {
        -1 => None,
        n if n > 0 => Some(usize::try_from(n).context("--num-samples")?),
        n => bail!("--num-samples {n}: a positive count, or -1 for every row"),
    };
    let batch = usize::try_from(args.batch_size).context("--batch-size")?;
    let path = model_source::resolve(args.model.clone())?;
    let tokenizer = Arc::new(model_source::tokenizer(&path)?);
    println!("Loading dataset...");
    println!("  Sequence length: {length}");
    let rows = Dataset::open(&args.data_path, &tokenizer)?.rows(length, samples, args.seed)?;
    if rows.is_empty() {
        bail!(
            "{}: the records hold fewer than {length} tokens, not one row of --sequence-length",
            args.data_path.display()
        );
    }
    println!("  Loaded {} samples", rows.len());
    let config = serve_loop::EngineConfig {
        prefix_cache: PrefixCacheConfig::off(),
        shared_prefill: false,
        // A row is one prefill chunk, as mlx-lm's one forward of it.
        schedule: crate::prefill_args::PrefillArgs {
            prefill_step_size: args.sequence_length,
        }
        .schedule(batch),
        max_queue: 0,
        ..serve_loop::EngineConfig::default()
    };
    let local = Local::start(
        config,
        Setup::planned(
            path.clone(),
            args.keep_dtype,
            &args.load,
            None,
            Arc::clone(&tokenizer),
        )?,
    )?;
    println!("Evaluating perplexity with batch size {batch}...");
    mlx_rs::memory::reset_peak_memory()?;
    let start = Instant::now();
    let scores = score(&local.engine, &rows, batch);
    local.engine.shutdown()?;
    let scores = scores?;
    let seconds = start.elapsed().as_secs_f64();
    let rule = "=".repeat(60);
    println!("\n{rule}\nEVALUATION RESULTS\n{rule}");
    println!("Model: {}", path.display());
    println!(
        "Perplexity: {:.3} ± {:.3}",
        scores.perplexity(),
        scores.standard_error()
    );
    println!("Evaluation time: {seconds:.2} seconds");
    println!(
        "Peak memory: {:.2} GB",
        mlx_rs::memory::peak_memory()? as f64 / 1e9
    );
    println!(
        "Tokens per second: {:.0}",
        scores.losses.len() as f64 / seconds.max(1e-9)
    );
    println!("\nDataset statistics:");
    println!("  Total samples: {}", rows.len());
    println!("  Total tokens: {}", rows.len() * length);
    Ok(())
}

/// Every row's tokens after its first, scored `batch` rows at a time.
fn score(engine: &serve_loop::Engine, rows: &[Vec<u32>], batch: usize) -> Result<Scores> {
    let mut losses = Vec::new();
    for (i, window) in rows.chunks(batch).enumerate() {
        let handles = window
            .iter()
            .map(|row| {
                engine.submit(Request {
                    prompt_logprobs: Some(0),
                    ..Request::new(row.clone(), 0)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for handle in handles {
            let done = handle.wait()?;
            losses.extend(done.output.prompt_logprobs.iter().map(|p| -p.logprob));
        }
        eprint!(
            "  Processed {}/{} batches...\r",
            i + 1,
            rows.len().div_ceil(batch)
        );
    }
    eprintln!();
    Ok(Scores { losses })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_and_its_error_follow_the_losses() {
        let scores = Scores {
            losses: vec![1.0, 2.0, 3.0],
        };
        let ppl = 2f64.exp();
        assert!((scores.perplexity() - ppl).abs() < 1e-12);
        // Sample deviation 1 over sqrt(3), times the perplexity.
        assert!((scores.standard_error() - ppl / 3f64.sqrt()).abs() < 1e-12);
        let one = Scores { losses: vec![0.5] };
        assert_eq!(one.standard_error(), 0.0);
    }
}
