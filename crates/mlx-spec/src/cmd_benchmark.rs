//! `mlx-spec benchmark`: prompt and generation speed and peak memory over
//! timed trials, as `mlx_lm.benchmark` measures them (random prompt ids
//! drawn as it draws them, no end-of-sequence stop, a warm-up run first,
//! `--batch-size` requests at once). With `--draft` every trial runs the
//! same requests plainly and speculated, side by side on one engine, and
//! fails if speculation changed a token.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serve_loop::{Engine, PrefixCacheConfig, ProviderChoice, Request};
use spec_core::SpecStats;
use spec_text::{Message, RenderOptions, Tokenizer};

use crate::local_engine::{Local, Setup};
use crate::model_source;

/// Arguments of `benchmark` (mlx-lm's names and defaults).
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (mlx-lm / Hugging Face) or GGUF file; default:
    /// SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens of each prompt: ids drawn uniformly from the vocabulary by
    /// MLX's generator seeded 0 (mlx-lm's draw: the same ids).
    #[arg(long, short = 'p', default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    prompt_tokens: u64,
    /// Tokens each request generates (end-of-sequence tokens do not stop it).
    #[arg(long, short = 'g', default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    generation_tokens: u64,
    /// Requests run together (each its own prompt).
    #[arg(long, short = 'b', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: u64,
    /// Timed trials, after one warm-up run.
    #[arg(long, short = 'n', default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    num_trials: u64,
    /// Seconds to wait before each trial.
    #[arg(long, default_value_t = 0)]
    delay: u64,
    /// Every request's prompt: this file's text as a user message through
    /// the chat template (raw without one) instead of random ids; what
    /// speculation drafts from, where random ids give a drafter little.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_tokens")]
    prompt_file: Option<PathBuf>,
    /// Run the file's dtype and quantization (see `generate --keep-dtype`).
    #[arg(long)]
    keep_dtype: bool,
    #[command(flatten)]
    prefill: crate::prefill_args::PrefillArgs,
    #[command(flatten)]
    speculation: crate::draft_args::DraftArgs,
    #[command(flatten)]
    load: crate::load_args::LoadArgs,
}

pub fn run(args: Args) -> Result<()> {
    let path = model_source::resolve(args.model.clone())?;
    let tokenizer = Arc::new(model_source::tokenizer(&path)?);
    let batch = usize::try_from(args.batch_size).context("--batch-size")?;
    let generation = usize::try_from(args.generation_tokens).context("--generation-tokens")?;
    // Trials repeat their prompts: nothing may come from a cache.
    let config = serve_loop::EngineConfig {
        prefix_cache: PrefixCacheConfig::off(),
        shared_prefill: false,
        schedule: args.prefill.schedule(batch),
        max_queue: 0,
        ..serve_loop::EngineConfig::default()
    };
    let local = Local::start(
        config,
        Setup::planned(
            path,
            args.keep_dtype,
            &args.load,
            Some(&args.speculation),
            Arc::clone(&tokenizer),
        )?,
    )?;
    let prompts = match &args.prompt_file {
        Some(file) => vec![file_prompt(&tokenizer, file)?; batch],
        None => random_prompts(batch, args.prompt_tokens, local.vocab_size)?,
    };
    let speculation = local.speculation(&args.speculation, 0);
    let result = Bench {
        engine: &local.engine,
        prompts: &prompts,
        generation,
        speculation,
    }
    .trials(&args);
    local.engine.shutdown()?;
    result
}

/// `batch` prompts of `tokens` ids below `vocab`: mlx-lm's draw
/// (`mx.random.seed(0)`, then one `randint` of shape `[batch, tokens]`).
fn random_prompts(batch: usize, tokens: u64, vocab: usize) -> Result<Vec<Vec<u32>>> {
    let shape = [
        i32::try_from(batch).context("--batch-size")?,
        i32::try_from(tokens).context("--prompt-tokens")?,
    ];
    let upper = i32::try_from(vocab).context("the vocabulary size")?;
    mlx_rs::random::seed(0)?;
    let ids = mlx_rs::random::randint::<_, i32>(0, upper, &shape[..], None)?;
    ids.eval()?;
    let flat: Vec<u32> = ids
        .as_slice::<i32>()
        .iter()
        .map(|&id| u32::try_from(id).unwrap_or(0))
        .collect();
    Ok(flat
        .chunks(shape[1] as usize)
        .map(<[u32]>::to_vec)
        .collect())
}

/// `--prompt-file`'s text as a user turn (the chat template's rendering,
/// or the raw text for a model without one).
fn file_prompt(tokenizer: &Tokenizer, file: &std::path::Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--prompt-file: reading {}", file.display()))?;
    if tokenizer.chat_template_source().is_none() {
        return Ok(tokenizer.encode(&text, true)?);
    }
    let options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let rendered = tokenizer
        .chat_template()?
        .render_with(&[Message::user(text)], &options)?;
    Ok(tokenizer.encode(&rendered, false)?)
}

/// One run of the batch: its speeds, memory, tokens and speculation.
struct Run {
    prompt_tps: f64,
    generation_tps: f64,
    peak_gb: f64,
    total: Duration,
    tokens: Vec<Vec<u32>>,
    stats: SpecStats,
}

impl Run {
    fn line(&self) -> String {
        format!(
            "prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}, total_time={:.3}",
            self.prompt_tps,
            self.generation_tps,
            self.peak_gb,
            self.total.as_secs_f64()
        )
    }
}

/// What every trial runs.
struct Bench<'a> {
    engine: &'a Engine,
    prompts: &'a [Vec<u32>],
    generation: usize,
    speculation: Option<ProviderChoice>,
}

impl Bench<'_> {
    fn trials(&self, args: &Args) -> Result<()> {
        println!("Running warmup..");
        self.run(None)?;
        if self.speculation.is_some() {
            self.run(self.speculation.as_ref())?;
        }
        let prompt_tokens = self.prompts.first().map_or(0, Vec::len);
        println!(
            "Timing with prompt_tokens={prompt_tokens}, generation_tokens={}, batch_size={}.",
            self.generation,
            self.prompts.len()
        );
        let mut plain = Vec::new();
        let mut drafted = Vec::new();
        for trial in 1..=args.num_trials {
            std::thread::sleep(Duration::from_secs(args.delay));
            let run = self.run(None)?;
            let Some(choice) = &self.speculation else {
                println!("Trial {trial}:  {}", run.line());
                plain.push(run);
                continue;
            };
            println!("Trial {trial} plain:  {}", run.line());
            let spec = self.run(Some(choice))?;
            println!(
                "Trial {trial} {}:  {}, acceptance={:.3}, tokens_per_forward={:.3}",
                choice.id,
                spec.line(),
                spec.stats.acceptance_rate(),
                spec.stats.tokens_per_forward()
            );
            if spec.tokens != run.tokens {
                bail!(
                    "trial {trial}: speculation by {} changed the tokens (a bug: please report it with this command)",
                    choice.id
                );
            }
            plain.push(run);
            drafted.push(spec);
        }
        let Some(choice) = &self.speculation else {
            println!("Averages: {}", averages(&plain));
            return Ok(());
        };
        println!("Averages plain: {}", averages(&plain));
        println!("Averages {}: {}", choice.id, averages(&drafted));
        let sum = |runs: &[Run]| runs.iter().map(|r| r.generation_tps).sum::<f64>();
        println!(
            "Speculation by {}: {:.2}x plain's generation tokens per second; every trial's tokens equal plain's",
            choice.id,
            sum(&drafted) / sum(&plain).max(f64::MIN_POSITIVE)
        );
        Ok(())
    }

    /// Submits every prompt at once and waits for them all.
    fn run(&self, speculation: Option<&ProviderChoice>) -> Result<Run> {
        mlx_rs::memory::reset_peak_memory()?;
        let start = Instant::now();
        let handles = self
            .prompts
            .iter()
            .map(|prompt| {
                self.engine.submit(Request {
                    speculation: speculation.cloned(),
                    ..Request::new(prompt.clone(), self.generation)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut dones = Vec::new();
        for handle in handles {
            dones.push(handle.wait()?);
        }
        let total = start.elapsed();
        let first = dones
            .iter()
            .filter_map(|d| d.first_token_seconds)
            .fold(0.0, f64::max);
        let prompt_tokens: usize = self.prompts.iter().map(Vec::len).sum();
        let generated: usize = dones.iter().map(|d| d.output.tokens.len()).sum();
        let mut stats = SpecStats::default();
        for done in &dones {
            stats.absorb(&done.output.stats);
        }
        Ok(Run {
            prompt_tps: prompt_tokens as f64 / first.max(1e-9),
            generation_tps: generated as f64 / (total.as_secs_f64() - first).max(1e-9),
            peak_gb: mlx_rs::memory::peak_memory()? as f64 / 1e9,
            total,
            tokens: dones.into_iter().map(|d| d.output.tokens).collect(),
            stats,
        })
    }
}

/// The runs' mean speeds and memory, as mlx-lm's `Averages:` line.
fn averages(runs: &[Run]) -> String {
    let n = runs.len().max(1) as f64;
    let mean = |f: fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / n;
    format!(
        "prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
        mean(|r| r.prompt_tps),
        mean(|r| r.generation_tps),
        mean(|r| r.peak_gb)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mlx-lm's draw on the same libmlx: `mx.random.seed(0);
    /// mx.random.randint(0, 49152, (2, 6)).tolist()` printed these (mlx
    /// 0.32.2, the oracle environment).
    #[test]
    fn random_prompts_are_mlx_lms_draw() {
        let drawn = random_prompts(2, 6, 49152).expect("draw");
        assert_eq!(
            drawn,
            [
                [21759, 40040, 15857, 26631, 11197, 40063],
                [31996, 26874, 42112, 28981, 265, 47951]
            ]
        );
    }
}
