//! The engine side of the speculative gates and benchmarks: runs a prompt
//! suite plainly and with each named provider in one process (the target is
//! loaded once), optionally all together through one scheduler, and reports
//! every run's tokens, stats and timing.
//!
//! `spec_run REQUEST.json`: a `run_protocol::spec::SpecRequest`; writes a
//! `SpecReport` to standard output (the convention of `run-protocol`).
//! `num_draft_of` wins over `num_draft`; without either a provider drafts
//! its own default count. `eos` adds end-of-sequence ids to the tokenizer's
//! (id prompts have none). `experts` streams the target's routed experts
//! (each run alone reports what the tier read during it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use run_protocol::spec::{Finish, Generation, Prompt, SpecReport, SpecRequest, Verify, PLAIN};
use run_protocol::{Dtype, ExpertReads};
use serve_loop::{
    AdaptiveConfig, ProviderChoice, Request, ScheduleConfig, Scheduler, SpecConfig, VerifyMode,
};
use spec_core::{DraftProvider, ProviderOptions, SamplerConfig};
use spec_models::{load_model, DtypePolicy, LoadOptions};

// Link every provider the host links.
use draft_deepspec as _;
use draft_eagle3 as _;
use draft_gemma4_assistant as _;
use draft_glm52_mtp as _;
use draft_model as _;
use draft_prompt_lookup as _;
use draft_qwen3_mtp as _;
use draft_suffix as _;

fn main() -> Result<()> {
    let args: SpecRequest = run_protocol::read_request()?;
    let model = load_model(
        &args.model,
        &LoadOptions {
            dtype: match args.dtype {
                Dtype::F32 => DtypePolicy::Float32,
                Dtype::Keep => DtypePolicy::Keep,
            },
            expert_cache_bytes: args.experts.cache_bytes,
            mtp_expert_bits: args.experts.mtp_expert_bits,
            kv_quantization: args
                .kv_cache
                .map(|kv| {
                    spec_runtime::cache::KvQuantization::new(kv.bits, kv.group_size, kv.start)
                })
                .transpose()?,
            adapter: args.adapter.clone(),
            max_kv_size: args.max_kv_size,
            ..LoadOptions::default()
        },
    )?;
    let experts = spec_models::expert_store(model.as_ref());
    let needs_text = args.prompts.iter().any(|p| !matches!(p, Prompt::Ids(_)));
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
    for p in &args.prompts {
        encoded.push(match (p, &tokenizer) {
            (Prompt::Ids(ids), _) => ids.clone(),
            (Prompt::Chat(text), Some(tok)) => {
                let rendered = tok
                    .chat_template()?
                    .render(&[spec_text::Message::user(text.clone())], true)?;
                tok.encode(&rendered, false)?
            }
            (Prompt::Text(text), Some(tok)) => tok.encode(text, true)?,
            (Prompt::Chat(_) | Prompt::Text(_), None) => bail!("text prompts need a tokenizer"),
        });
    }
    let mut eos: Vec<u32> = tokenizer
        .as_ref()
        .map(|t| t.eos_token_ids().iter().copied().collect())
        .unwrap_or_default();
    eos.extend(&args.eos);
    let mut providers = Vec::new();
    for name in &args.providers {
        providers.push(if name == PLAIN {
            None
        } else {
            let options: ProviderOptions = args
                .options
                .get(name)
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Some(serve_loop::build_provider(name, &model, &options)?)
        });
    }
    let sampler_config = SamplerConfig {
        temperature: args.sampling.temperature,
        seed: args.sampling.seed,
        ..SamplerConfig::default()
    };
    let mut report = SpecReport::default();
    for (name, provider) in args.providers.iter().zip(&providers) {
        let mut runs = Vec::new();
        let held: Vec<&dyn DraftProvider> = provider.as_deref().into_iter().collect();
        for prompt in &encoded {
            let started = Instant::now();
            let before = experts.as_ref().map(|s| s.stats());
            let request = Request {
                eos: eos.clone(),
                sampler: sampler_config.clone(),
                speculation: speculation(&args, name, provider.as_deref()),
                ..Request::new(prompt.clone(), args.max_tokens)
            };
            let out = serve_loop::generate(&model, &held, request, |_| {
                std::ops::ControlFlow::Continue(())
            })?;
            let mut run = generation(prompt, &out, started.elapsed().as_secs_f64());
            if let (Some(store), Some(before)) = (&experts, before) {
                let after = store.stats();
                run.expert_reads = Some(ExpertReads {
                    hits: after.hits - before.hits,
                    misses: after.misses - before.misses,
                    bytes_read: after.bytes_read - before.bytes_read,
                    read_seconds: after.read_seconds - before.read_seconds,
                });
            }
            runs.push(run);
        }
        report.alone.insert(name.clone(), runs);
    }
    if let Some(batch) = args.batch {
        // Jobs in arrival order: prompt by prompt, every provider in turn.
        let jobs: Vec<(usize, usize)> = (0..encoded.len())
            .flat_map(|i| (0..providers.len()).map(move |p| (i, p)))
            .collect();
        let held: Vec<&dyn DraftProvider> =
            providers.iter().flatten().map(|p| p.as_ref()).collect();
        let schedule = ScheduleConfig {
            max_batch: batch.max_batch,
            ..ScheduleConfig::default()
        };
        let mut scheduler = Scheduler::new(&model, schedule)?.with_providers(&held);
        let mut ids = BTreeMap::new();
        let mut done: Vec<Option<Generation>> = jobs.iter().map(|_| None).collect();
        let started = Instant::now();
        let mut step = 0;
        while done.iter().any(Option::is_none) {
            for (k, &(i, p)) in jobs.iter().enumerate() {
                if k * batch.stagger != step {
                    continue;
                }
                let cancel = Arc::new(AtomicBool::new(false));
                let cancels_itself =
                    batch.cancel_every > 0 && k % batch.cancel_every == batch.cancel_every - 1;
                let half = args.max_tokens / 2;
                let mut emitted = 0;
                let request = Request {
                    eos: eos.clone(),
                    sampler: sampler_config.clone(),
                    speculation: speculation(&args, &args.providers[p], providers[p].as_deref()),
                    cancel: Some(Arc::clone(&cancel)),
                    ..Request::new(encoded[i].clone(), args.max_tokens)
                };
                let id = scheduler.submit(request, move |_| {
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
                done[k] = Some(generation(
                    &encoded[jobs[k].0],
                    &out,
                    started.elapsed().as_secs_f64(),
                ));
            }
            step += 1;
        }
        for (p, name) in args.providers.iter().enumerate() {
            let runs: Vec<Generation> = jobs
                .iter()
                .zip(&mut done)
                .filter(|((_, q), _)| *q == p)
                .filter_map(|(_, d)| d.take())
                .collect();
            report.batched.insert(name.clone(), runs);
        }
    }
    run_protocol::write_report::<SpecRequest>(&report)?;
    Ok(())
}

/// The speculation of a run with `provider` (named `name`), as the
/// arguments set it.
fn speculation(
    args: &SpecRequest,
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
            verify: match args.sampling.verify {
                Verify::Exact => VerifyMode::ExactMatch,
                Verify::Rejection => VerifyMode::Rejection,
            },
            adaptive: if args.adaptive {
                AdaptiveConfig::default()
            } else {
                AdaptiveConfig::off()
            },
            seed: args.sampling.seed,
        },
    })
}

/// One run as the gates read it.
fn generation(prompt: &[u32], out: &serve_loop::Output, seconds: f64) -> Generation {
    let s = &out.stats;
    Generation {
        prompt_ids: prompt.to_vec(),
        tokens: out.tokens.clone(),
        logprobs: out.logprobs.clone(),
        finish: match out.finish {
            serve_loop::Finish::Eos => Finish::Eos,
            serve_loop::Finish::MaxTokens => Finish::MaxTokens,
            serve_loop::Finish::Stopped => Finish::Stopped,
            serve_loop::Finish::Cancelled => Finish::Cancelled,
        },
        seconds,
        generation_seconds: out.generation_seconds,
        drafted: s.drafted,
        accepted: s.accepted,
        drafting_rounds: s.acceptance_lengths.len(),
        target_calls: s.target_calls,
        rounds: s.rounds,
        accepted_by_pos: s.accepted_by_pos.clone(),
        drafted_by_pos: s.drafted_by_pos.clone(),
        expert_reads: None,
    }
}
