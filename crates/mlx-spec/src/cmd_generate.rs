//! `mlx-spec generate`: stream a completion of a prompt.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use spec_core::{LogitsProcessor, RepetitionPenalty, SamplerConfig, Target};
use spec_models::DtypePolicy;
use spec_text::Message;

use crate::decode::{generate, Request};
use crate::model_source;

/// Arguments of `generate` (sampling flags named as mlx-lm names them).
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (mlx-lm / Hugging Face) or GGUF file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt.
    #[arg(long, default_value = "Hello")]
    prompt: String,
    /// A system message (chat template only).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 100)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 0.0)]
    top_p: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Min-p threshold (0: off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Repetition penalty over the last 20 tokens.
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    no_chat_template: bool,
    /// Run the file's dtype and quantization instead of float32 weights.
    #[arg(long)]
    keep_dtype: bool,
}

pub fn run(args: Args) -> Result<()> {
    let path = model_source::resolve(args.model.clone())?;
    let tokenizer = model_source::tokenizer(&path)?;
    let model = model_source::load(&path, if args.keep_dtype { DtypePolicy::Keep } else { DtypePolicy::Float32 })?;
    tokenizer.check_vocab(model.info().vocab_size).with_context(|| format!("tokenizer of {}", path.display()))?;

    let prompt_ids = if args.no_chat_template {
        tokenizer.encode(&args.prompt, true)?
    } else {
        let template = tokenizer.chat_template().context("the model has no usable chat template (use --no-chat-template)")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::system(system.clone()));
        }
        messages.push(Message::user(args.prompt.clone()));
        tokenizer.encode(&template.render(&messages, true)?, false)?
    };

    let config = SamplerConfig { temperature: args.temp, top_p: args.top_p, min_p: args.min_p, top_k: args.top_k, seed: args.seed };
    let mut sampler = config.build(model.info().vocab_size)?;
    let mut processors: Vec<Box<dyn LogitsProcessor>> = Vec::new();
    if let Some(p) = args.repetition_penalty {
        processors.push(Box::new(RepetitionPenalty::new(p, 20)?));
    }
    mlx_rs::memory::reset_peak_memory()?;
    let mut stream = tokenizer.stream_decoder(true);
    let mut stdout = std::io::stdout();
    let is_eos = |t: u32| tokenizer.is_eos(t);
    let request = Request { prompt: &prompt_ids, max_tokens: args.max_tokens, is_eos: &is_eos, sampler: sampler.as_mut(), processors: &mut processors };
    let stats = generate(&model, request, |token| {
        let text = stream.step(token)?;
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        Ok(())
    })?;
    let tail = stream.finish()?;
    println!("{tail}");
    let peak = mlx_rs::memory::peak_memory()? as f64 / 1e9;
    println!("==========");
    println!(
        "Prompt: {} tokens, {:.3} tokens-per-sec | Generation: {} tokens, {:.3} tokens-per-sec | Peak memory: {:.3} GB",
        stats.prompt_tokens, stats.prompt_tps, stats.generated, stats.generation_tps, peak
    );
    Ok(())
}
