//! `mlx-spec generate`: stream a completion of a prompt, optionally with
//! speculative decoding by one draft provider. The request runs on the
//! `serve_loop::Engine` facade (a batch of one), as the server's requests
//! do; a pipeline head and a cached prompt's caches are MLX state of this
//! thread, so those requests run `serve_loop::generate` here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serve_loop::{Output, PrefixCacheConfig, ProviderChoice, Request, ScheduleConfig};
use spec_core::{DraftProvider, LogitsProcessor, ProviderOptions, SamplerConfig, Target};
use spec_formats::prompt_cache::{self, ModelIdentity};
use spec_text::{Message, RenderOptions, Tokenizer};

use crate::answer_printer::{self, Printer};
use crate::grammar::GrammarSpec;
use crate::local_engine::{self, Local, Setup};
use crate::memory_plan::MemoryPlan;
use crate::sampling_args::SamplingArgs;
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
    /// The prompt, as mlx-lm reads it: `\n` and `\t` written out become a
    /// newline and a tab; `-` reads standard input.
    #[arg(long, short = 'p', default_value = "Hello")]
    prompt: String,
    /// A system message (chat template only).
    #[arg(long, visible_alias = "system-prompt")]
    system: Option<String>,
    /// The start of the answer, which the model continues (chat template
    /// only; as mlx-lm: the assistant turn left open).
    #[arg(long)]
    prefill_response: Option<String>,
    /// Extra variables for the chat template, a JSON object (e.g.
    /// `{"enable_thinking": false}`).
    #[arg(long, value_name = "JSON")]
    chat_template_config: Option<String>,
    /// A token that ends generation besides the model's own end tokens: its
    /// text or its id (repeatable; as mlx-lm's).
    #[arg(long, value_name = "TOKEN", num_args = 1..)]
    extra_eos_token: Vec<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'm', default_value_t = 100)]
    max_tokens: usize,
    /// `false` or `f` (any case): print the answer alone, without the stats
    /// after it (mlx-lm's `--verbose F`).
    #[arg(long, value_name = "BOOL", default_value = "true", action = clap::ArgAction::Set, value_parser = parse_verbose)]
    verbose: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    prefill: crate::prefill_args::PrefillArgs,
    /// What the answer is expected to be (a file being edited; OpenAI's
    /// predicted outputs): prompt lookup drafts from it too, in order. The
    /// answer is the same without it. Without `--draft`, `prompt-lookup`.
    #[arg(long, value_name = "FILE")]
    prediction_file: Option<PathBuf>,
    /// Stop when the text contains this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Use the prompt as is, without the chat template (a model without
    /// one always does).
    #[arg(long, visible_alias = "ignore-chat-template")]
    no_chat_template: bool,
    /// Run the file's dtype and quantization. Without it: float32 weights
    /// (the CPU's fast path) where they take at most 75% of the memory
    /// available, else the file's own (said on standard error); float32
    /// under --pipeline and --expert-cache-bytes.
    #[arg(long)]
    keep_dtype: bool,
    #[command(flatten)]
    speculation: crate::draft_args::DraftArgs,
    /// After the text, list each generated token with its log-probability
    /// and, given N (up to 20), its position's N most likely tokens.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "0")]
    logprobs: Option<usize>,
    #[command(flatten)]
    constraint: crate::constraint_args::ConstraintArgs,
    /// Start from a prompt cache (`cache-prompt`, or mlx-lm's
    /// `cache_prompt`): the prompt continues the cached one.
    #[arg(long)]
    prompt_cache_file: Option<PathBuf>,
    #[command(flatten)]
    cache_dir: crate::prompt_cache_dir::DirArgs,
    #[command(flatten)]
    pipeline: pipeline_rank::PipelineArgs,
    #[command(flatten)]
    load: crate::load_args::LoadArgs,
}

/// mlx-lm's reading of `--verbose`: false for `false` and `f` in any
/// case, true otherwise.
fn parse_verbose(value: &str) -> Result<bool, String> {
    Ok(!matches!(
        value.to_ascii_lowercase().as_str(),
        "false" | "f"
    ))
}

pub fn run(mut args: Args) -> Result<()> {
    args.prompt = prompt_text(&args.prompt)?;
    if args.prediction_file.is_some() && args.speculation.provider().is_none() {
        args.speculation.draft = Some(draft_prompt_lookup::ID.to_owned());
    }
    if let Some(n) = args.logprobs {
        if n > MAX_TOP_LOGPROBS {
            bail!("--logprobs {n}: at most {MAX_TOP_LOGPROBS} alternatives per token");
        }
    }
    if args.cache_dir.prompt_cache_dir.is_some() {
        if args.prompt_cache_file.is_some() {
            bail!("--prompt-cache-dir and --prompt-cache-file: choose one (the directory finds the cached prefix itself)");
        }
        if args.pipeline.pipeline {
            bail!("--prompt-cache-dir is not supported with --pipeline (the other ranks hold no copy of the cached prefix)");
        }
    }
    // As mlx-lm: without --model, the model the cache file names.
    let model_arg = match (&args.model, &args.prompt_cache_file) {
        (None, Some(file)) => prompt_cache::file_model(file)?.map(PathBuf::from),
        (m, _) => m.clone(),
    };
    let path = model_source::resolve(model_arg.clone())?;
    let tokenizer = Arc::new(model_source::tokenizer(&path)?);
    let mut plan = MemoryPlan::new();
    let policy = plan.target(&path, args.keep_dtype, args.pipeline.pipeline, &args.load);
    let mut draft_options = args.speculation.options()?;
    if let Some(id) = args.speculation.provider() {
        plan.drafter(id, &mut draft_options);
    }
    let identity = match &args.prompt_cache_file {
        Some(file) => {
            let name = cmd_cache_prompt::model_name(model_arg.as_deref(), &path);
            let identity =
                ModelIdentity::new(name, &path, policy, args.load.adapter_path.as_deref())?;
            // Another model's file is refused before the model loads.
            prompt_cache::check_model(file, &identity)?;
            Some(identity)
        }
        None => None,
    };
    if args.pipeline.pipeline && args.prompt_cache_file.is_some() {
        bail!("--prompt-cache-file is not supported with --pipeline (the other ranks hold no copy of the cached prompt)");
    }
    let settings = Settings {
        sampler: args.sampling.sampler(&tokenizer)?,
        grammar: args.constraint.grammar()?,
        draft_options,
        eos: eos_ids(&args, &tokenizer)?,
        prediction: match &args.prediction_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--prediction-file: reading {}", path.display()))?;
                tokenizer.encode(&text, false)?
            }
            None => Vec::new(),
        },
    };
    let printer = Printer::new(Arc::clone(&tokenizer), &args.stop);
    if !args.pipeline.pipeline && identity.is_none() {
        let store = args.cache_dir.open(
            model_arg.as_deref(),
            &path,
            policy,
            args.load.adapter_path.as_deref(),
        )?;
        let prompt = prompt_ids(&args, &tokenizer, false)?;
        let prompt_len = prompt.len();
        let output = through_engine(&args, &path, policy, prompt, &settings, printer, store)?;
        return report(&args, &tokenizer, &output, prompt_len, output.cached_tokens);
    }

    let head = if args.pipeline.pipeline {
        match pipeline_rank::start(&path, policy, &args.pipeline, &args.load)? {
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
            plain = model_source::load(&path, policy, &args.load)?;
            &plain
        }
    };
    local_engine::check_vocab(&tokenizer, model, &path)?;
    let cached = match (&args.prompt_cache_file, &identity) {
        (Some(file), Some(identity)) => {
            Some(prompt_cache::load_prompt_cache(file, model, identity)?)
        }
        _ => None,
    };
    let new_ids = prompt_ids(&args, &tokenizer, cached.is_some())?;
    let (prompt, prefix) = match cached {
        None => (new_ids, None),
        Some(c) => {
            let known = match c.tokens {
                Some(t) => t,
                None => {
                    if args.speculation.provider().is_some() || args.sampling.penalties().any() {
                        bail!(
                            "{}: the file does not record its prompt's tokens (mlx-lm wrote it); --draft and the penalties need them: recreate it with `mlx-spec cache-prompt`",
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
    let constraint = args.constraint.compile(
        settings.grammar.as_ref(),
        &tokenizer,
        model.info().vocab_size,
    )?;
    let output = alone(
        &args, model, &prompt, prefix, &settings, constraint, printer,
    )?;
    report(&args, &tokenizer, &output, prompt.len(), cached_len)?;
    if let Some(head) = &head {
        if args.verbose {
            println!("{}", pipeline_rank::report(head, output.tokens.len()));
        }
        head.shutdown()?;
    }
    Ok(())
}

/// The request's sampling and verification settings.
struct Settings {
    sampler: SamplerConfig,
    /// `--json-schema`, `--grammar` or `--regex`.
    grammar: Option<GrammarSpec>,
    /// The drafter's options (`--draft-model`, `--draft-option`, the dtype
    /// the memory plan chose).
    draft_options: ProviderOptions,
    /// The ids that end generation (`eos_ids`).
    eos: Vec<u32>,
    /// `--prediction-file`'s tokens (empty: none).
    prediction: Vec<u32>,
}

/// `--prompt` as mlx-lm's `generate` reads it: written-out `\n` and `\t`
/// become the characters, then `-` reads standard input.
fn prompt_text(arg: &str) -> Result<String> {
    let text = arg.replace("\\n", "\n").replace("\\t", "\t");
    if text != "-" {
        return Ok(text);
    }
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)
        .context("reading the prompt from standard input")?;
    Ok(input)
}

/// The prompt's ids: the chat template's rendering of it (with
/// `--prefill-response`, the assistant turn left open after it; cut where
/// the user turn's text starts when it continues a cached prompt), or, with
/// `--no-chat-template` or a model without a template (as mlx-lm), the raw
/// text with the tokenizer's special tokens.
fn prompt_ids(args: &Args, tokenizer: &Tokenizer, continues_cache: bool) -> Result<Vec<u32>> {
    if args.no_chat_template || tokenizer.chat_template_source().is_none() {
        return Ok(tokenizer.encode(&args.prompt, true)?);
    }
    let template = tokenizer
        .chat_template()
        .context("the model's chat template (use --no-chat-template to go without)")?;
    let kwargs = template_kwargs(args)?;
    let render = |messages: &[Message]| -> Result<String> {
        Ok(if args.prefill_response.is_some() {
            template.render_continuing_with(messages, kwargs.as_ref())?
        } else {
            let options = RenderOptions {
                add_generation_prompt: true,
                kwargs: kwargs.as_ref(),
                ..RenderOptions::default()
            };
            template.render_with(messages, &options)?
        })
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system.clone()));
    }
    let user = messages.len();
    messages.push(Message::user(args.prompt.clone()));
    if let Some(prefill) = &args.prefill_response {
        messages.push(Message::assistant(prefill.clone()));
    }
    let mut text = render(&messages)?;
    if continues_cache {
        // As mlx-lm: the cached prompt is an open user turn; what follows
        // starts where this turn's text starts.
        messages[user].content = QUERY.to_owned();
        let probe = render(&messages)?;
        let at = probe
            .find(QUERY)
            .context("the chat template drops the user's message")?;
        text = text.get(at..).unwrap_or_default().to_owned();
    }
    Ok(tokenizer.encode(&text, false)?)
}

/// `--chat-template-config`: a JSON object of template variables.
fn template_kwargs(args: &Args) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
    let Some(text) = &args.chat_template_config else {
        return Ok(None);
    };
    crate::json_arg::object("--chat-template-config", text).map(Some)
}

/// The ids that end generation: the model's own, and each
/// `--extra-eos-token` (a token's text, or its id, as mlx-lm takes them).
fn eos_ids(args: &Args, tokenizer: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids = tokenizer.eos_token_ids().clone();
    for token in &args.extra_eos_token {
        let id = match token.parse::<u32>() {
            Ok(id) if (id as usize) < tokenizer.vocab_size() => Some(id),
            Ok(_) => None,
            Err(_) => tokenizer.token_to_id(token),
        };
        let id = id.with_context(|| {
            format!("--extra-eos-token `{token}` is not a token of this tokenizer")
        })?;
        ids.insert(id);
    }
    Ok(ids.into_iter().collect())
}

/// `--logit-bias` and the penalties, in mlx-lm's order.
fn processors(args: &Args, tokenizer: &Tokenizer) -> Result<Vec<Box<dyn LogitsProcessor + Send>>> {
    let bias = args.constraint.logit_bias(tokenizer.vocab_size())?;
    Ok(args.sampling.penalties().processors(bias)?)
}

/// Runs `generate` on this thread over `model` (a pipeline head, or the
/// model a cached prompt's caches belong to, with those caches as the
/// request's prefix).
fn alone(
    args: &Args,
    model: &dyn Target,
    prompt: &[u32],
    prefix: Option<spec_core::CacheSet>,
    settings: &Settings,
    constraint: Option<Box<dyn spec_core::Constraint>>,
    mut printer: Printer,
) -> Result<Output> {
    let provider = match args.speculation.provider() {
        Some(id) => Some(serve_loop::build_provider(
            id,
            model,
            &settings.draft_options,
        )?),
        None => None,
    };
    let speculation = provider.as_deref().map(|provider| {
        let config = args
            .speculation
            .spec(provider.default_num_draft(), settings.sampler.seed);
        ProviderChoice::new(provider.id(), config)
    });
    mlx_rs::memory::reset_peak_memory()?;
    let request = Request {
        eos: settings.eos.clone(),
        sampler: settings.sampler.clone(),
        processors: processors(args, &printer.tokenizer)?,
        constraint,
        top_logprobs: args.logprobs.unwrap_or(0),
        prediction: settings.prediction.clone(),
        speculation,
        ..Request::new(prompt.to_vec(), args.max_tokens)
    };
    let providers: Vec<&dyn DraftProvider> = provider.as_deref().into_iter().collect();
    let output = serve_loop::generate_with(
        model,
        &providers,
        request,
        &args.prefill.schedule(ScheduleConfig::default().max_batch),
        prefix,
        |token| printer.token(token),
    )?;
    printer.finish(output.finish)?;
    Ok(output)
}

/// Runs the request through the [`serve_loop::Engine`] facade (a batch of
/// one, decoded pipelined as `generate` decodes a lone plain request): the
/// model and the provider load on the engine thread, which also prints the
/// text as it comes. With `store` (`--prompt-cache-dir`) the prefix cache
/// is on and kept there: the request starts from the longest prefix an
/// earlier run left, and leaves its own.
fn through_engine(
    args: &Args,
    path: &Path,
    policy: spec_models::DtypePolicy,
    prompt: Vec<u32>,
    settings: &Settings,
    printer: Printer,
    store: Option<prefix_store::DirStore>,
) -> Result<Output> {
    // One request: nothing to reuse a prefix for, unless a directory
    // keeps them across runs.
    let config = serve_loop::EngineConfig {
        prefix_cache: if store.is_some() {
            PrefixCacheConfig::default()
        } else {
            PrefixCacheConfig::off()
        },
        schedule: args.prefill.schedule(ScheduleConfig::default().max_batch),
        ..serve_loop::EngineConfig::default()
    };
    let local = Local::start(
        config,
        Setup {
            path: path.to_path_buf(),
            policy,
            load: args.load.clone(),
            provider: args
                .speculation
                .provider()
                .map(|id| (id.to_owned(), settings.draft_options.clone())),
            tokenizer: Arc::clone(&printer.tokenizer),
            store,
        },
    )?;
    let speculation = local.speculation(&args.speculation, settings.sampler.seed);
    let engine = local.engine;
    mlx_rs::memory::reset_peak_memory()?;
    let eos = settings.eos.clone();
    let processors = processors(args, &printer.tokenizer)?;
    let constraint = args.constraint.compile(
        settings.grammar.as_ref(),
        &printer.tokenizer,
        local.vocab_size,
    )?;
    let request = Request {
        eos,
        sampler: settings.sampler.clone(),
        processors,
        constraint,
        top_logprobs: args.logprobs.unwrap_or(0),
        prediction: settings.prediction.clone(),
        speculation,
        ..Request::new(prompt, args.max_tokens)
    };
    let done = answer_printer::run_printed(&engine, request, printer)?;
    engine.shutdown()?;
    Ok(done.output)
}

/// The most alternatives `--logprobs N` may ask for (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// Prints `--logprobs` (a line per token: log-probability, id, text; with
/// N, `top:` and the N most likely tokens as `id logprob "text"` joined
/// by ` | `) and the stats line (as mlx-lm's); nothing with `--verbose
/// false`.
fn report(
    args: &Args,
    tokenizer: &Tokenizer,
    output: &Output,
    prompt_len: usize,
    cached_len: usize,
) -> Result<()> {
    if !args.verbose {
        return Ok(());
    }
    if args.logprobs.is_some() {
        println!("==========");
        for (i, (&token, lp)) in output.tokens.iter().zip(&output.logprobs).enumerate() {
            let mut line = format!(
                "{lp:>10.4}\t{token:>6}\t{:?}",
                tokenizer.decode(&[token], false)?
            );
            let top = output.top_logprobs.get(i).map_or(&[][..], Vec::as_slice);
            if !top.is_empty() {
                let alternatives = top
                    .iter()
                    .map(|&(id, lp)| {
                        Ok(format!(
                            "{id} {lp:.4} {:?}",
                            tokenizer.decode(&[id], false)?
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                line.push_str("\ttop: ");
                line.push_str(&alternatives.join(" | "));
            }
            println!("{line}");
        }
    }
    println!("==========");
    println!(
        "{}",
        stats_line(args.speculation.provider(), output, prompt_len, cached_len)?
    );
    Ok(())
}

/// The stats line after an answer, as mlx-lm's (prompt and generation
/// speed, peak memory), with `provider`'s acceptance when one drafted.
pub fn stats_line(
    provider: Option<&str>,
    output: &Output,
    prompt_len: usize,
    cached_len: usize,
) -> Result<String> {
    let peak = mlx_rs::memory::peak_memory()? as f64 / 1e9;
    let s = &output.stats;
    let processed = prompt_len.saturating_sub(cached_len);
    let prompt_tps = processed as f64 / output.prompt_seconds.max(1e-9);
    let gen_tps = output.tokens.len() as f64 / output.generation_seconds.max(1e-9);
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
    if let Some(id) = provider {
        line.push_str(&format!(
            " | Draft {id}: acceptance {:.1}% ({} of {}), mean accepted length {:.2}, tokens per target forward {:.2}",
            100.0 * s.acceptance_rate(),
            s.accepted,
            s.drafted,
            s.mean_accepted_length(),
            s.tokens_per_forward()
        ));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        crate::parse_flags(args)
    }

    /// mlx-lm's spellings reach the same fields as ours.
    #[test]
    fn mlx_lms_flag_names_are_ours() {
        let a = parse(&[
            "-p",
            "P",
            "-m",
            "7",
            "--system-prompt",
            "S",
            "--ignore-chat-template",
            "--num-draft-tokens",
            "2",
            "--verbose",
            "False",
        ]);
        assert_eq!(
            (
                a.prompt.as_str(),
                a.max_tokens,
                a.system.as_deref(),
                a.no_chat_template
            ),
            ("P", 7, Some("S"), true)
        );
        assert_eq!((a.speculation.num_draft, a.verbose), (Some(2), false));
        assert!(parse(&["--verbose", "T"]).verbose && parse(&[]).verbose);
        assert!(!parse(&["--verbose", "f"]).verbose);
        let e = parse(&["--extra-eos-token", "a", "b", "--extra-eos-token", "c"]);
        assert_eq!(e.extra_eos_token, ["a", "b", "c"]);
    }
}
