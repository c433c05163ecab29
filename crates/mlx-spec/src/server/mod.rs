//! `mlx-spec serve`: an OpenAI-compatible HTTP server with per-request
//! speculation (see `docs/SERVER.md`), a host of the [`serve_loop::Engine`]
//! facade: the model and the drafters load once on its thread, and the
//! requests in flight share every target forward (up to `--max-batch`).
//! With `--pipeline` the model is a pipeline over the ranks of `mlx-spec
//! launch`: rank 0 serves (its engine thread joins the group, loads its
//! slice and drives the other ranks), the other ranks only follow.

mod admission;
mod anthropic;
mod api;
mod auth;
mod chat_prompt;
mod chat_turn;
mod choices;
mod connections;
mod cors;
mod defaults;
mod generation;
mod logprobs;
mod metrics;
mod openai;
mod response_format;
mod responses;
mod routes;
mod sse;
mod tenants;
mod worker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use spec_core::{ProviderOptions, Target};
use spec_pipeline::PipelineHealth;
use tokio::sync::Semaphore;

use crate::memory_plan::MemoryPlan;
use crate::model_source;
use crate::pipeline_rank::{self, PipelineArgs};

/// Arguments of `serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory or GGUF file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one and prints it).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Draft providers to load (repeatable); the first is the default for
    /// requests without a `speculative` field.
    #[arg(long = "draft-provider")]
    draft_providers: Vec<String>,
    /// A provider option `PROVIDER:KEY=VALUE` (repeatable), e.g.
    /// `draft-model:model=PATH`.
    #[arg(long = "draft-option", value_name = "PROVIDER:KEY=VALUE")]
    draft_options: Vec<String>,
    /// Requests in flight or queued at once; more get 429.
    #[arg(long, default_value_t = 32)]
    max_concurrency: usize,
    /// Requests decoded together, their rows sharing each target forward
    /// (mlx_lm.server's `--decode-concurrency`).
    #[arg(long, visible_alias = "decode-concurrency", default_value_t = 8)]
    max_batch: usize,
    /// Requests waiting beyond `--max-batch` (default: `--max-concurrency`
    /// less `--max-batch`); more get 429.
    #[arg(long)]
    max_queue: Option<usize>,
    #[command(flatten)]
    prefill: crate::prefill_args::PrefillArgs,
    /// Bytes the in-memory prefix cache may hold (finished requests' prompt
    /// caches, reused by later requests sharing their prefix); 0 turns it off.
    #[arg(long, default_value_t = serve_loop::DEFAULT_PREFIX_CACHE_BYTES)]
    prompt_cache_bytes: usize,
    /// Entries the prefix cache may hold.
    #[arg(long, default_value_t = serve_loop::DEFAULT_PREFIX_CACHE_ENTRIES)]
    prompt_cache_entries: usize,
    /// Let requests that share a prompt prefix with one in flight (`n`
    /// choices, one system prompt sent at once) each prefill it, instead of
    /// waiting for the first one's prefill and starting from it. Only
    /// speed changes.
    #[arg(long)]
    no_shared_prefill: bool,
    #[command(flatten)]
    cache_dir: crate::prompt_cache_dir::DirArgs,
    /// Require `Authorization: Bearer KEY` (repeatable: each key is its
    /// own tenant, `key-N` in the order given, flags then file).
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// A file of API keys, one a line (`#` comments and blank lines skipped).
    #[arg(long, value_name = "PATH")]
    api_keys_file: Option<PathBuf>,
    /// Requests one API key may have in flight or queued at once (default:
    /// `--max-concurrency`); more get 429.
    #[arg(long, value_name = "N")]
    max_concurrency_per_key: Option<usize>,
    /// Let requests of different API keys share cached prompt prefixes (in
    /// memory and in `--prompt-cache-dir`). Off by default: each key has a
    /// partition of its own, so no key learns from `cached_tokens` or the
    /// time to first token what another sent.
    #[arg(long)]
    share_prefix_cache: bool,
    #[command(flatten)]
    defaults: defaults::DefaultArgs,
    /// Run the file's dtype and quantization. Without it: float32 weights
    /// (the CPU's fast path) where they take at most 75% of the memory
    /// available, else the file's own (said on standard error); float32
    /// under --pipeline and --expert-cache-bytes.
    #[arg(long)]
    keep_dtype: bool,
    #[command(flatten)]
    load: crate::load_args::LoadArgs,
    /// Seconds a connection has to send a request's head; also the longest
    /// an idle keep-alive connection stays open between requests.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    header_timeout: u64,
    /// Seconds a request may take, its prompt's preparation and every
    /// token included; past it the request is cancelled and answered 504
    /// (a stream ends with an error event).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    request_timeout: u64,
    /// Connections open at once; more are closed as soon as accepted.
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// Seconds the open connections have to finish after SIGTERM or
    /// SIGINT; those left then are closed.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    shutdown_grace: u64,
    /// Bytes a request body may hold; more get 413.
    #[arg(long, value_name = "BYTES", default_value_t = 2 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Bytes of memory the Responses API's stored responses may take (for
    /// `previous_response_id` and `GET /v1/responses/{id}`; each key sees
    /// its own), oldest evicted first; 0 stores none.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024)]
    response_store_bytes: usize,
    /// A Host name (without port) to answer besides the loopback ones,
    /// when the server requires no API key (repeatable); other Hosts get
    /// 403. With API keys every Host is answered.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// An origin whose web pages may call the API from a browser (CORS),
    /// e.g. `http://localhost:3000`, or `*` for any (repeatable); none by
    /// default.
    #[arg(long = "allowed-origins", value_name = "ORIGIN", num_args = 1..)]
    allowed_origins: Vec<String>,
    #[command(flatten)]
    pipeline: PipelineArgs,
}

fn parse_options(raw: &[String]) -> Result<BTreeMap<String, ProviderOptions>> {
    let mut out: BTreeMap<String, ProviderOptions> = BTreeMap::new();
    for o in raw {
        let (provider, kv) = o
            .split_once(':')
            .with_context(|| format!("--draft-option {o}: expected PROVIDER:KEY=VALUE"))?;
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--draft-option {o}: expected PROVIDER:KEY=VALUE"))?;
        out.entry(provider.to_owned())
            .or_default()
            .insert(k.to_owned(), model_source::option_value(k, v)?);
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<()> {
    if args.max_concurrency == 0 {
        bail!("--max-concurrency must be at least 1");
    }
    if args.max_concurrency_per_key == Some(0) {
        bail!("--max-concurrency-per-key must be at least 1");
    }
    // Every default in range before the model loads (`--top-k` against the
    // vocabulary once it has).
    args.defaults.request_defaults(usize::MAX)?;
    args.defaults.template_kwargs()?;
    args.defaults.num_draft()?;
    let cors = cors::layer(&args.allowed_origins)?;
    if args.max_batch == 0 {
        bail!("--max-batch must be at least 1");
    }
    if args.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    if args.header_timeout == 0 {
        bail!("--header-timeout must be at least 1");
    }
    if args.request_timeout == 0 {
        bail!("--request-timeout must be at least 1");
    }
    let path = model_source::resolve(args.model.clone())?;
    let mut plan = MemoryPlan::new();
    let dtype = plan.target(&path, args.keep_dtype, args.pipeline.pipeline, &args.load);
    let load = args.load.clone();
    let pipeline = args.pipeline.pipeline.then(|| args.pipeline.clone());
    if pipeline.is_some() && pipeline_rank::rank_from_env()? != 0 {
        // Another rank of the pipeline: it runs rank 0's forwards and binds
        // nothing.
        return pipeline_rank::follow(&path, dtype, &args.pipeline, &args.load);
    }
    let api_keys = auth::ApiKeys::load(&args.api_keys, args.api_keys_file.as_deref())?;
    let host_check = Arc::new(auth::HostCheck::new(api_keys.is_none(), &args.allow_hosts));
    let tokenizer = Arc::new(model_source::tokenizer(&path)?);
    let mut options = parse_options(&args.draft_options)?;
    let mut draft_providers = args.draft_providers.clone();
    if let Some(drafter) = &args.defaults.draft_model {
        if !draft_providers.iter().any(|p| p == "draft-model") {
            draft_providers.push("draft-model".to_owned());
        }
        let model = model_source::local_path(drafter)?;
        options
            .entry("draft-model".to_owned())
            .or_default()
            .insert("model".into(), model.to_string_lossy().into_owned());
    }
    let default_num_draft_tokens = args.defaults.num_draft()?;
    let mut ids = draft_providers.clone();
    if ids.is_empty() {
        // Prompt lookup costs nothing to load: offer it even when not asked.
        ids.push("prompt-lookup".to_owned());
    }
    for id in &ids {
        if let Some(opts) = options.get_mut(id) {
            plan.drafter(id, opts);
        }
    }
    let operator_options = options.clone();
    let metrics = Arc::new(metrics::Metrics::default());
    let model_id = model_source::served_name(args.model.as_deref(), &path);
    let config = serve_loop::EngineConfig {
        schedule: args.prefill.schedule(args.max_batch),
        max_queue: args
            .max_queue
            .unwrap_or(args.max_concurrency.saturating_sub(args.max_batch)),
        prefix_cache: serve_loop::PrefixCacheConfig {
            max_bytes: args.prompt_cache_bytes,
            max_entries: args.prompt_cache_entries,
            share_tenants: args.share_prefix_cache,
        },
        shared_prefill: !args.no_shared_prefill,
        ..serve_loop::EngineConfig::default()
    };

    let store = args.cache_dir.open(
        args.model.as_deref(),
        &path,
        dtype,
        args.load.adapter_path.as_deref(),
    )?;

    // MLX arrays live on the engine thread: the model and the drafters are
    // loaded there, and only their description comes back. A pipeline's
    // group is joined there too, so its sends and receives run on the
    // thread that runs the forwards.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let engine_tokenizer = tokenizer.clone();
    let engine_metrics = metrics.clone();
    let engine_ids = ids.clone();
    let engine = Arc::new(
        serve_loop::Engine::start(config, move || {
            let (model, health): (Box<dyn Target>, Option<PipelineHealth>) = match &pipeline {
                Some(setting) => {
                    let head = pipeline_rank::start(&path, dtype, setting, &load)?
                        .context("rank 0 of the pipeline ended as a follower")?;
                    let health = head.health();
                    (Box::new(head), Some(health))
                }
                None => (Box::new(model_source::load(&path, dtype, &load)?), None),
            };
            engine_metrics.set_experts(
                spec_models::expert_store(model.as_ref()),
                spec_models::mtp_expert_tier(model.as_ref()),
            );
            engine_tokenizer.check_vocab(model.info().vocab_size)?;
            engine_metrics
                .model_weights_bytes
                .store(model.weights_bytes() as u64, Ordering::Relaxed);
            let mut providers = Vec::new();
            let mut defaults = BTreeMap::new();
            for id in &engine_ids {
                let opts = options.remove(id).unwrap_or_default();
                let provider = serve_loop::build_provider(id, model.as_ref(), &opts)
                    .with_context(|| format!("loading draft provider {id}"))?;
                defaults.insert(id.clone(), provider.default_num_draft());
                providers.push(provider);
            }
            let _ = ready_tx.send((model.info().clone(), defaults, health));
            let factory: serve_loop::ProviderFactory = Box::new(|id, target, options| {
                Ok(serve_loop::build_provider(id, target, options)?)
            });
            Ok(serve_loop::Loaded {
                target: model,
                providers,
                factory: Some(factory),
                prefix_store: store.map(|s| Box::new(s) as Box<dyn serve_loop::PrefixStore>),
            })
        })
        .map_err(|e| anyhow::anyhow!(spec_core::error::report(&e)))?,
    );
    let (info, default_num_draft, health) = ready_rx
        .recv()
        .context("the engine thread stopped while loading")?;
    let grammar = crate::grammar::token_env(&tokenizer, info.vocab_size);
    let chat = chat_prompt::ChatSetup::new(
        &tokenizer,
        args.defaults.chat_template_source()?.as_deref(),
        args.defaults.template_kwargs()?,
    );
    let state = Arc::new(routes::AppState {
        grammar,
        chat,
        model_id,
        adapter: args
            .load
            .adapter_path
            .as_ref()
            .map(|p| p.display().to_string()),
        draft_model: args
            .defaults
            .draft_model
            .as_ref()
            .map(|p| p.display().to_string()),
        xtc_special_tokens: crate::sampling_args::xtc_special_tokens(&tokenizer)?,
        tokenizer,
        vocab_size: info.vocab_size,
        context_length: info.context_length,
        loaded_providers: ids.clone(),
        operator_options,
        default_spec: draft_providers.first().map(|p| worker::SpecChoice {
            provider: p.clone(),
            num_draft: default_num_draft_tokens,
            adaptive: true,
            policy: serve_loop::DraftPolicy::Goodput,
            options: ProviderOptions::new(),
        }),
        api_keys,
        slots: Arc::new(Semaphore::new(args.max_concurrency)),
        capacity: args.max_concurrency,
        per_key: tenants::PerKeySlots::new(
            args.max_concurrency_per_key.unwrap_or(args.max_concurrency),
        ),
        engine: engine.clone(),
        default_num_draft,
        metrics,
        defaults: args.defaults.request_defaults(info.vocab_size)?,
        request_timeout: Duration::from_secs(args.request_timeout),
        responses: responses::ResponseStore::new(args.response_store_bytes),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{*model}", get(routes::model))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/openapi.json", get(routes::openapi))
        .fallback(routes::not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::limit_time,
        ))
        .with_state(state)
        .layer(DefaultBodyLimit::max(args.max_body_bytes))
        .layer(cors)
        .layer(axum::middleware::from_fn_with_state(
            host_check,
            auth::check_host,
        ));
    let limits = connections::Limits {
        header_timeout: Duration::from_secs(args.header_timeout),
        max_connections: args.max_connections,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
    };
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("--host {} --port {}", args.host, args.port))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let watched = health.clone();
    let watched_engine = engine.clone();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        println!(
            "mlx-spec serving on http://{local} (providers: {})",
            ids.join(", ")
        );
        connections::serve(
            listener,
            app,
            limits,
            stop_requested(watched, watched_engine),
        )
        .await;
        anyhow::Ok(())
    })?;
    // The connections are drained or dropped by now; handlers' waiters
    // still blocked on a request end when the engine stops, below.
    runtime.shutdown_timeout(Duration::from_secs(1));
    let panicked = engine.failure();
    match Arc::try_unwrap(engine) {
        // Its thread drops a pipeline's head, which tells the other ranks
        // to exit.
        Ok(engine) => engine.shutdown()?,
        // A handler still holds it: the engine stops when the last goes.
        Err(engine) => drop(engine),
    }
    if let Some(message) = panicked {
        bail!("the engine thread panicked, so the server stopped: {message}");
    }
    match health.and_then(|h| h.broken()) {
        Some(first) => Err(
            anyhow::Error::from(spec_pipeline::PipelineError::Broken(first))
                .context("serving through the pipeline"),
        ),
        None => Ok(()),
    }
}

/// Resolves when the server should stop: SIGINT, SIGTERM, the pipeline
/// under it broke (a rank died or a link was lost; requests in flight fail
/// at their next step), or the engine thread panicked (no request could
/// run any more: the process exits with an error, never lingers).
async fn stop_requested(health: Option<PipelineHealth>, engine: Arc<serve_loop::Engine>) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    let broken = async {
        let Some(health) = health else {
            return std::future::pending::<()>().await;
        };
        while health.broken().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::error!("the pipeline broke: stopping the server");
    };
    let panicked = async {
        while engine.failure().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::error!("the engine thread panicked: stopping the server");
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
        () = broken => {}
        () = panicked => {}
    }
}
