//! `mlx-spec generate`: stream a completion of a prompt, optionally with
//! speculative decoding by one draft provider.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serve_loop::{
    AdaptiveConfig, Finish, Request, SpecConfig, Speculation, StopMatcher, VerifyMode,
};
use spec_core::{LogitsProcessor, ProviderOptions, RepetitionPenalty, SamplerConfig, Target};
use spec_models::prompt_cache::{self, ModelIdentity};
use spec_text::Message;

use crate::{cmd_cache_prompt, model_source, pipeline_rank};

/// The stand-in user message whose place in the rendered template marks
/// where a cached prompt's continuation starts (mlx-lm's).
const QUERY: &str = "<query>";

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
    /// Stop when the text contains this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    no_chat_template: bool,
    /// Run the file's dtype and quantization instead of float32 weights.
    #[arg(long)]
    keep_dtype: bool,
    /// Speculate with this draft provider (see `mlx-spec providers`).
    #[arg(long)]
    draft: Option<String>,
    /// Most draft tokens per round (default: the provider's, 3 for most,
    /// 16 for prompt-lookup).
    #[arg(long)]
    num_draft: Option<usize>,
    /// The drafter model of `--draft draft-model`.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// A provider option `key=value` (repeatable).
    #[arg(long = "draft-option", value_name = "KEY=VALUE")]
    draft_options: Vec<String>,
    /// Verification: `exact` (mlx-lm's exact match) or `rejection` (lossless
    /// rejection sampling for temperature > 0).
    #[arg(long, default_value = "exact")]
    verify: String,
    /// Fixed draft length, never paused (mlx-lm's behaviour).
    #[arg(long)]
    no_adaptive: bool,
    /// After the text, list each generated token with its log-probability.
    #[arg(long)]
    logprobs: bool,
    /// Start from a prompt cache (`cache-prompt`, or mlx-lm's
    /// `cache_prompt`): the prompt continues the cached one.
    #[arg(long)]
    prompt_cache_file: Option<PathBuf>,
    #[command(flatten)]
    pipeline: pipeline_rank::PipelineArgs,
}

fn provider_options(args: &Args) -> Result<ProviderOptions> {
    let mut options = ProviderOptions::new();
    if let Some(path) = &args.draft_model {
        options.insert("model".into(), path.to_string_lossy().into_owned());
    }
    for kv in &args.draft_options {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--draft-option `{kv}`: expected KEY=VALUE"))?;
        options.insert(k.to_owned(), v.to_owned());
    }
    Ok(options)
}

pub fn run(args: Args) -> Result<()> {
    if args.num_draft == Some(0) {
        bail!("--num-draft must be at least 1");
    }
    let verify = match args.verify.as_str() {
        "exact" => VerifyMode::ExactMatch,
        "rejection" => VerifyMode::Rejection,
        other => bail!("--verify {other}: expected exact or rejection"),
    };
    // As mlx-lm: without --model, the model the cache file names.
    let model_arg = match (&args.model, &args.prompt_cache_file) {
        (None, Some(file)) => prompt_cache::file_model(file)?.map(PathBuf::from),
        (m, _) => m.clone(),
    };
    let path = model_source::resolve(model_arg.clone())?;
    let tokenizer = model_source::tokenizer(&path)?;
    let policy = cmd_cache_prompt::dtype(args.keep_dtype);
    let identity = match &args.prompt_cache_file {
        Some(file) => {
            let name = cmd_cache_prompt::model_name(model_arg.as_deref(), &path);
            let identity = ModelIdentity::new(name, &path, policy)?;
            // Another model's file is refused before the model loads.
            prompt_cache::check_model(file, &identity)?;
            Some(identity)
        }
        None => None,
    };
    if args.pipeline.pipeline && args.prompt_cache_file.is_some() {
        bail!("--prompt-cache-file is not supported with --pipeline (the other ranks hold no copy of the cached prompt)");
    }
    let head = if args.pipeline.pipeline {
        match pipeline_rank::start(&path, policy, &args.pipeline)? {
            Some(h) => Some(h),
            // A follower rank: it served the head until the head ended.
            None => return Ok(()),
        }
    } else {
        None
    };
    let plain;
    let model: &dyn Target = match &head {
        Some(h) => h,
        None => {
            plain = model_source::load(&path, policy)?;
            &plain
        }
    };
    tokenizer
        .check_vocab(model.info().vocab_size)
        .with_context(|| format!("tokenizer of {}", path.display()))?;
    let provider = match &args.draft {
        Some(id) => Some(serve_loop::build_provider(
            id,
            model,
            &provider_options(&args)?,
        )?),
        None => None,
    };

    let cached = match (&args.prompt_cache_file, &identity) {
        (Some(file), Some(identity)) => {
            Some(prompt_cache::load_prompt_cache(file, model, identity)?)
        }
        _ => None,
    };
    let new_ids = if args.no_chat_template {
        tokenizer.encode(&args.prompt, true)?
    } else {
        let template = tokenizer
            .chat_template()
            .context("the model has no usable chat template (use --no-chat-template)")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::system(system.clone()));
        }
        messages.push(Message::user(args.prompt.clone()));
        let mut text = template.render(&messages, true)?;
        if cached.is_some() {
            // As mlx-lm: the cached prompt is an open user turn; what follows
            // starts where this turn's text starts.
            if let Some(last) = messages.last_mut() {
                last.content = QUERY.to_owned();
            }
            let probe = template.render(&messages, true)?;
            let at = probe
                .find(QUERY)
                .context("the chat template drops the user's message")?;
            text = text.get(at..).unwrap_or_default().to_owned();
        }
        tokenizer.encode(&text, false)?
    };
    let (prompt_ids, prefix) = match cached {
        None => (new_ids, None),
        Some(c) => {
            let known = match c.tokens {
                Some(t) => t,
                None => {
                    if args.draft.is_some() || args.repetition_penalty.is_some() {
                        bail!(
                            "{}: the file does not record its prompt's tokens (mlx-lm wrote it); --draft and --repetition-penalty need them: recreate it with `mlx-spec cache-prompt`",
                            args.prompt_cache_file.as_deref().unwrap_or(Path::new("")).display()
                        );
                    }
                    // Without a provider or a logits processor the serve loop
                    // never reads the cached positions' ids.
                    vec![0; c.caches.offset()]
                }
            };
            ([known, new_ids].concat(), Some(c.caches))
        }
    };
    let cached_len = prefix.as_ref().map_or(0, spec_core::CacheSet::offset);

    let config = SamplerConfig {
        temperature: args.temp,
        top_p: args.top_p,
        min_p: args.min_p,
        top_k: args.top_k,
        seed: args.seed,
    };
    let mut sampler = config.build(model.info().vocab_size)?;
    let mut processors: Vec<Box<dyn LogitsProcessor>> = Vec::new();
    if let Some(p) = args.repetition_penalty {
        processors.push(Box::new(RepetitionPenalty::new(p, 20)?));
    }
    let adaptive = if args.no_adaptive {
        AdaptiveConfig::off()
    } else {
        AdaptiveConfig::default()
    };
    let speculation = provider.as_deref().map(|provider| Speculation {
        provider,
        config: SpecConfig {
            num_draft: args
                .num_draft
                .unwrap_or_else(|| provider.default_num_draft()),
            verify,
            adaptive,
            seed: args.seed,
        },
    });
    mlx_rs::memory::reset_peak_memory()?;
    let mut stream = tokenizer.stream_decoder(true);
    let mut stops = StopMatcher::new(args.stop.iter().cloned());
    let mut stdout = std::io::stdout();
    let mut failure: Option<anyhow::Error> = None;
    let is_eos = |t: u32| tokenizer.is_eos(t);
    let request = Request {
        prompt: &prompt_ids,
        max_tokens: args.max_tokens,
        is_eos: &is_eos,
        sampler: sampler.as_mut(),
        processors: &mut processors,
        speculation,
        cancel: None,
        tenant: None,
        prefix,
    };
    let output = serve_loop::generate(model, request, |token| {
        let piece = match stream.step(token) {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e.into());
                return ControlFlow::Break(());
            }
        };
        let (text, stopped) = stops.push(&piece);
        if let Err(e) = stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
        {
            failure = Some(e.into());
            return ControlFlow::Break(());
        }
        if stopped {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if output.finish != Finish::Stopped {
        let (tail, _) = stops.push(&stream.finish()?);
        print!("{tail}{}", stops.finish());
    }
    println!();
    if args.logprobs {
        println!("==========");
        for (&token, lp) in output.tokens.iter().zip(&output.logprobs) {
            println!(
                "{lp:>10.4}\t{token:>6}\t{:?}",
                tokenizer.decode(&[token], false)?
            );
        }
    }
    let peak = mlx_rs::memory::peak_memory()? as f64 / 1e9;
    let s = &output.stats;
    let processed = prompt_ids.len() - cached_len;
    let prompt_tps = processed as f64 / output.prompt_seconds.max(1e-9);
    let gen_tps = output.tokens.len() as f64 / output.generation_seconds.max(1e-9);
    println!("==========");
    let mut line = format!(
        "Prompt: {} tokens{}, {:.3} tokens-per-sec | Generation: {} tokens, {:.3} tokens-per-sec | Peak memory: {:.3} GB",
        processed,
        if cached_len > 0 {
            format!(" (+{cached_len} cached)")
        } else {
            String::new()
        },
        prompt_tps,
        output.tokens.len(),
        gen_tps,
        peak
    );
    if let Some(id) = &args.draft {
        line.push_str(&format!(
            " | Draft {id}: acceptance {:.1}% ({} of {}), mean accepted length {:.2}, tokens per target forward {:.2}",
            100.0 * s.acceptance_rate(),
            s.accepted,
            s.drafted,
            s.mean_accepted_length(),
            s.tokens_per_forward()
        ));
    }
    println!("{line}");
    if let Some(head) = &head {
        println!("{}", pipeline_rank::report(head, output.tokens.len()));
        head.shutdown()?;
    }
    Ok(())
}
