//! The engine side of gate `structured` and `cargo xtask bench
//! structured`: constrained generation (JSON schemas, Lark grammars,
//! regexes) on a real model with its tokenizer, in each configuration the
//! request names (unconstrained, constrained plainly, with forced-token
//! drafts, with a provider), every case in each; reports tokens, text,
//! stats and the fastest repeat's seconds.
//!
//! `structured_run REQUEST.json`: a `run_protocol::structured::StructuredRequest`;
//! writes a `StructuredReport` to standard output.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use run_protocol::structured::{
    CaseReport, Grammar, RunConfig, RunReport, StructuredReport, StructuredRequest,
};
use serve_loop::{AdaptiveConfig, Finish, Output, ProviderChoice, Request, SpecConfig};
use spec_core::{DraftProvider, ProviderOptions, SamplerConfig, Target};
use spec_grammar::{GrammarSpec, TokenEnv};
use spec_models::{load_model, LoadOptions};

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
    let args: StructuredRequest = run_protocol::read_request()?;
    let model = load_model(&args.model, &LoadOptions::default())?;
    let tokenizer = Arc::new(spec_text::Tokenizer::from_file(
        args.model.join("tokenizer.json"),
    )?);
    let env = TokenEnv::new(Arc::clone(&tokenizer), model.info().vocab_size)?;
    let eos: Vec<u32> = tokenizer.eos_token_ids().iter().copied().collect();
    let mut prompts = Vec::new();
    let mut specs = Vec::new();
    for case in &args.cases {
        prompts.push(if case.chat {
            let rendered = tokenizer
                .chat_template()?
                .render(&[spec_text::Message::user(case.prompt.clone())], true)?;
            tokenizer.encode(&rendered, false)?
        } else {
            tokenizer.encode(&case.prompt, true)?
        });
        specs.push(spec_of(&case.grammar).with_context(|| format!("case {}", case.name))?);
    }
    let mut providers: Vec<Box<dyn DraftProvider>> = Vec::new();
    for run in &args.runs {
        if let Some(id) = &run.provider {
            if providers.iter().all(|p| p.id() != id) {
                let options: ProviderOptions = run.options.clone().into_iter().collect();
                providers.push(serve_loop::build_provider(id, &model, &options)?);
            }
        }
    }
    let held: Vec<&dyn DraftProvider> = providers.iter().map(|p| p.as_ref()).collect();
    let mut report = StructuredReport {
        prompts: prompts.clone(),
        eos: eos.clone(),
        compiled: specs.iter().zip(&args.cases).map(compiled).collect(),
        runs: Vec::new(),
    };
    for run in &args.runs {
        let mut best: Option<RunReport> = None;
        for _ in 0..args.repeats.max(1) {
            let mut cases = Vec::new();
            let mut seconds = 0.0;
            for (prompt, spec) in prompts.iter().zip(&specs) {
                let started = Instant::now();
                let request = request(run, prompt, spec, &env, &eos, args.max_tokens)?;
                let out =
                    serve_loop::generate(&model, &held, request, |_| ControlFlow::Continue(()))?;
                seconds += started.elapsed().as_secs_f64();
                cases.push(case_report(&tokenizer, &out)?);
            }
            if best.as_ref().is_none_or(|b| seconds < b.seconds) {
                best = Some(RunReport {
                    name: run.name.clone(),
                    cases,
                    seconds,
                });
            }
        }
        report.runs.extend(best);
    }
    run_protocol::write_report::<StructuredRequest>(&report)?;
    Ok(())
}

fn spec_of(grammar: &Grammar) -> Result<GrammarSpec> {
    Ok(match grammar {
        Grammar::JsonSchema { schema } => GrammarSpec::JsonSchema(serde_json::from_str(schema)?),
        Grammar::JsonObject => GrammarSpec::JsonObject,
        Grammar::Lark { grammar } => GrammarSpec::Lark(grammar.clone()),
        Grammar::Regex { regex } => GrammarSpec::Regex(regex.clone()),
    })
}

/// The grammar llguidance compiles for `case`: a JSON constraint as its
/// effective schema (with spec-grammar's default layout).
fn compiled((spec, case): (&GrammarSpec, &run_protocol::structured::Case)) -> Grammar {
    match spec.effective_schema() {
        Some(schema) => Grammar::JsonSchema {
            schema: schema.to_string(),
        },
        None => case.grammar.clone(),
    }
}

fn request(
    run: &RunConfig,
    prompt: &[u32],
    spec: &GrammarSpec,
    env: &TokenEnv,
    eos: &[u32],
    max_tokens: usize,
) -> Result<Request> {
    let constraint: Option<Box<dyn spec_core::Constraint>> = if run.constrained {
        Some(Box::new(env.constraint(spec)?))
    } else {
        None
    };
    let sampler = match run.seed {
        Some(seed) => SamplerConfig {
            temperature: 1.0,
            seed,
            ..SamplerConfig::default()
        },
        None => SamplerConfig::default(),
    };
    let speculation = run.provider.as_ref().map(|id| {
        ProviderChoice::new(
            id.clone(),
            SpecConfig {
                seed: run.seed.unwrap_or(0),
                adaptive: AdaptiveConfig::default(),
                ..SpecConfig::default()
            },
        )
    });
    Ok(Request {
        eos: eos.to_vec(),
        sampler,
        constraint,
        forced_drafts: run.forced_drafts,
        speculation,
        ..Request::new(prompt.to_vec(), max_tokens)
    })
}

fn case_report(tokenizer: &spec_text::Tokenizer, out: &Output) -> Result<CaseReport> {
    Ok(CaseReport {
        tokens: out.tokens.clone(),
        text: tokenizer.decode(&out.tokens, true)?,
        finish: match out.finish {
            Finish::Eos => "eos",
            Finish::MaxTokens => "length",
            Finish::Stopped => "stopped",
            Finish::Cancelled => "cancelled",
        }
        .to_owned(),
        target_calls: out.stats.target_calls,
        drafted: out.stats.drafted,
        forced_drafted: out.stats.forced_drafted,
        forced_accepted: out.stats.forced_accepted,
        masks: out.stats.masks,
        grammar_seconds: out.stats.grammar_seconds,
        mask_apply_seconds: out.stats.mask_apply_seconds,
    })
}
