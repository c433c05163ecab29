//! The engine side of the speculative gates and benchmarks: runs a prompt
//! suite plainly and with each named provider in one process (the target is
//! loaded once), and writes every run's tokens, stats and timing as JSON.
//!
//! ```text
//! spec_run --model PATH [--dtype f32|keep] --prompts FILE --max-tokens N
//!          --providers plain,prompt-lookup,draft-model [--num-draft [PROVIDER=]N]...
//!          [--option PROVIDER:KEY=VALUE]... [--no-adaptive] [--temp T --seed S
//!          --verify exact|rejection] [--eos ID]... --out FILE.json
//! ```
//! `--num-draft N` sets every provider's draft count, `--num-draft ID=N` one
//! provider's (it wins over `N`); without either a provider drafts its own
//! default count. `--eos` adds end-of-sequence ids to the tokenizer's (id
//! prompts have none).
//! The prompts file is `{"prompts": [{"text": "...", "chat": true} | {"ids": [..]}]}`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serve_loop::{
    AdaptiveConfig, ProviderChoice, Request, ScheduleConfig, Scheduler, SpecConfig, VerifyMode,
};
use spec_core::{DraftProvider, ProviderOptions, SamplerConfig};
use spec_models::{load_model, DtypePolicy, LoadOptions};

// Link every provider the host links.
use draft_deepspec as _;
use draft_gemma4_assistant as _;
use draft_glm52_mtp as _;
use draft_model as _;
use draft_prompt_lookup as _;
use draft_suffix as _;

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text {
        text: String,
        #[serde(default)]
        chat: bool,
    },
    Ids {
        ids: Vec<u32>,
    },
}

#[derive(Deserialize)]
struct Prompts {
    prompts: Vec<Prompt>,
}

struct Args {
    model: PathBuf,
    dtype: DtypePolicy,
    prompts: PathBuf,
    max_tokens: usize,
    providers: Vec<String>,
    /// `None`: each provider's default.
    num_draft: Option<usize>,
    /// Per-provider draft counts, ahead of `num_draft`.
    num_draft_of: BTreeMap<String, usize>,
    options: BTreeMap<String, ProviderOptions>,
    adaptive: bool,
    temp: f32,
    seed: u64,
    verify: VerifyMode,
    eos: Vec<u32>,
    /// Steps between two batched submissions; `None`: no batched runs.
    batch: Option<usize>,
    max_batch: usize,
    cancel_every: usize,
    out: PathBuf,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        model: PathBuf::new(),
        dtype: DtypePolicy::Float32,
        prompts: PathBuf::new(),
        max_tokens: 64,
        providers: vec!["plain".into()],
        num_draft: None,
        num_draft_of: BTreeMap::new(),
        options: BTreeMap::new(),
        adaptive: true,
        temp: 0.0,
        seed: 0,
        verify: VerifyMode::ExactMatch,
        eos: Vec::new(),
        batch: None,
        max_batch: 8,
        cancel_every: 0,
        out: PathBuf::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => a.model = value()?.into(),
            "--dtype" => {
                a.dtype = if value()? == "keep" {
                    DtypePolicy::Keep
                } else {
                    DtypePolicy::Float32
                }
            }
            "--prompts" => a.prompts = value()?.into(),
            "--max-tokens" => a.max_tokens = value()?.parse()?,
            "--providers" => a.providers = value()?.split(',').map(str::to_owned).collect(),
            "--num-draft" => {
                let v = value()?;
                match v.split_once('=') {
                    Some((provider, n)) => {
                        a.num_draft_of.insert(
                            provider.to_owned(),
                            n.parse().with_context(|| format!("--num-draft {v}"))?,
                        );
                    }
                    None => {
                        a.num_draft = Some(v.parse().with_context(|| format!("--num-draft {v}"))?)
                    }
                }
            }
            "--option" => {
                let v = value()?;
                let (provider, kv) = v
                    .split_once(':')
                    .with_context(|| format!("--option {v}: expected PROVIDER:KEY=VALUE"))?;
                let (k, val) = kv
                    .split_once('=')
                    .with_context(|| format!("--option {v}: expected PROVIDER:KEY=VALUE"))?;
                a.options
                    .entry(provider.to_owned())
                    .or_default()
                    .insert(k.to_owned(), val.to_owned());
            }
            "--no-adaptive" => a.adaptive = false,
            "--temp" => a.temp = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--verify" => {
                a.verify = match value()?.as_str() {
                    "exact" => VerifyMode::ExactMatch,
                    "rejection" => VerifyMode::Rejection,
                    other => bail!("--verify {other}"),
                }
            }
            "--eos" => a.eos.push(value()?.parse()?),
            "--batch" => a.batch = Some(value()?.parse()?),
            "--max-batch" => a.max_batch = value()?.parse()?,
            "--batch-cancel-every" => a.cancel_every = value()?.parse()?,
            "--out" => a.out = value()?.into(),
            other => bail!("unknown argument {other}"),
        }
    }
    if a.model.as_os_str().is_empty()
        || a.prompts.as_os_str().is_empty()
        || a.out.as_os_str().is_empty()
    {
        bail!("--model, --prompts and --out are required");
    }
    Ok(a)
}

fn main() -> Result<()> {
    let args = parse()?;
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let prompts: Prompts = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", args.prompts.display()))?;
    let model = load_model(
        &args.model,
        &LoadOptions {
            dtype: args.dtype,
            ..LoadOptions::default()
        },
    )?;
    let needs_text = prompts
        .prompts
        .iter()
        .any(|p| matches!(p, Prompt::Text { .. }));
    let tokenizer = if needs_text {
        Some(if args.model.extension().is_some_and(|x| x == "gguf") {
            spec_text::Tokenizer::from_gguf(&args.model)?
        } else {
            spec_text::Tokenizer::from_file(args.model.join("tokenizer.json"))?
        })
    } else {
        None
    };
    let mut encoded = Vec::new();
    for p in &prompts.prompts {
        encoded.push(match (p, &tokenizer) {
            (Prompt::Ids { ids }, _) => ids.clone(),
            (Prompt::Text { text, chat }, Some(tok)) => {
                if *chat {
                    let rendered = tok
                        .chat_template()?
                        .render(&[spec_text::Message::user(text.clone())], true)?;
                    tok.encode(&rendered, false)?
                } else {
                    tok.encode(text, true)?
                }
            }
            (Prompt::Text { .. }, None) => bail!("text prompts need a tokenizer"),
        });
    }
    let mut eos: Vec<u32> = tokenizer
        .as_ref()
        .map(|t| t.eos_token_ids().iter().copied().collect())
        .unwrap_or_default();
    eos.extend(&args.eos);
    let mut providers = Vec::new();
    for name in &args.providers {
        providers.push(if name == "plain" {
            None
        } else {
            let options = args.options.get(name).cloned().unwrap_or_default();
            Some(serve_loop::build_provider(name, &model, &options)?)
        });
    }
    let sampler_config = SamplerConfig {
        temperature: args.temp,
        seed: args.seed,
        ..SamplerConfig::default()
    };
    let mut report = serde_json::Map::new();
    for (name, provider) in args.providers.iter().zip(&providers) {
        let mut runs = Vec::new();
        let held: Vec<&dyn DraftProvider> = provider.as_deref().into_iter().collect();
        for prompt in &encoded {
            let started = Instant::now();
            let request = Request {
                eos: eos.clone(),
                sampler: sampler_config.clone(),
                speculation: speculation(&args, name, provider.as_deref()),
                ..Request::new(prompt.clone(), args.max_tokens)
            };
            let out = serve_loop::generate(&model, &held, request, |_| {
                std::ops::ControlFlow::Continue(())
            })?;
            runs.push(run_json(prompt, &out, started.elapsed().as_secs_f64()));
        }
        report.insert(name.clone(), serde_json::Value::Array(runs));
    }
    if let Some(stagger) = args.batch {
        // Jobs in arrival order: prompt by prompt, every provider in turn.
        let jobs: Vec<(usize, usize)> = (0..encoded.len())
            .flat_map(|i| (0..providers.len()).map(move |p| (i, p)))
            .collect();
        let held: Vec<&dyn DraftProvider> =
            providers.iter().flatten().map(|p| p.as_ref()).collect();
        let schedule = ScheduleConfig {
            max_batch: args.max_batch,
            ..ScheduleConfig::default()
        };
        let mut scheduler = Scheduler::new(&model, schedule)?.with_providers(&held);
        let mut ids = BTreeMap::new();
        let mut done: Vec<Option<serde_json::Value>> = jobs.iter().map(|_| None).collect();
        let started = Instant::now();
        let mut step = 0;
        while done.iter().any(Option::is_none) {
            for (k, &(i, p)) in jobs.iter().enumerate() {
                if k * stagger != step {
                    continue;
                }
                let cancel = Arc::new(AtomicBool::new(false));
                let cancels_itself =
                    args.cancel_every > 0 && k % args.cancel_every == args.cancel_every - 1;
                let half = args.max_tokens / 2;
                let mut emitted = 0;
                let request = Request {
                    eos: eos.clone(),
                    sampler: sampler_config.clone(),
                    speculation: speculation(&args, &args.providers[p], providers[p].as_deref()),
                    cancel: Some(Arc::clone(&cancel)),
                    ..Request::new(encoded[i].clone(), args.max_tokens)
                };
                let id = scheduler.submit(request, move |_, _| {
                    emitted += 1;
                    if cancels_itself && emitted >= half {
                        cancel.store(true, Ordering::Relaxed);
                    }
                    std::ops::ControlFlow::Continue(())
                })?;
                ids.insert(id, k);
            }
            let stepped = scheduler.step();
            for finished in stepped.finished {
                let k = ids[&finished.id];
                let out = finished.result?;
                done[k] = Some(run_json(
                    &encoded[jobs[k].0],
                    &out,
                    started.elapsed().as_secs_f64(),
                ));
            }
            step += 1;
        }
        for (p, name) in args.providers.iter().enumerate() {
            let runs: Vec<serde_json::Value> = jobs
                .iter()
                .zip(&mut done)
                .filter(|((_, q), _)| *q == p)
                .filter_map(|(_, d)| d.take())
                .collect();
            report.insert(format!("batch:{name}"), serde_json::Value::Array(runs));
        }
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

/// The speculation of a run with `provider` (named `name`), as the
/// arguments set it.
fn speculation(
    args: &Args,
    name: &str,
    provider: Option<&dyn DraftProvider>,
) -> Option<ProviderChoice> {
    provider.map(|provider| ProviderChoice {
        id: provider.id().to_owned(),
        options: ProviderOptions::new(),
        config: SpecConfig {
            num_draft: args
                .num_draft_of
                .get(name)
                .copied()
                .or(args.num_draft)
                .unwrap_or_else(|| provider.default_num_draft()),
            verify: args.verify,
            adaptive: if args.adaptive {
                AdaptiveConfig::default()
            } else {
                AdaptiveConfig::off()
            },
            seed: args.seed,
        },
    })
}

/// One run as the gates read it.
fn run_json(prompt: &[u32], out: &serve_loop::Output, seconds: f64) -> serde_json::Value {
    let s = &out.stats;
    serde_json::json!({
        "prompt_tokens": prompt.len(),
        "prompt_ids": prompt,
        "tokens": out.tokens,
        "logprobs": out.logprobs,
        "finish": format!("{:?}", out.finish),
        "seconds": seconds,
        "generation_seconds": out.generation_seconds,
        "drafted": s.drafted, "accepted": s.accepted, "drafting_rounds": s.acceptance_lengths.len(), "target_calls": s.target_calls, "rounds": s.rounds,
        "accepted_by_pos": s.accepted_by_pos, "drafted_by_pos": s.drafted_by_pos,
    })
}
