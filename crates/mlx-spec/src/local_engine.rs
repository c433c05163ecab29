//! The engine `generate` and `chat` run their requests on: a
//! [`serve_loop::Engine`] whose thread loads the model and the one draft
//! provider (MLX state stays on that thread), with the prefix cache the
//! command asks for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use serve_loop::{Engine, EngineConfig, ProviderChoice};
use spec_core::{ProviderOptions, Target};
use spec_text::Tokenizer;

use crate::draft_args::DraftArgs;
use crate::load_args::LoadArgs;
use crate::memory_plan::MemoryPlan;
use crate::model_source;

/// What the engine loads.
pub struct Setup {
    /// The model directory or file.
    pub path: PathBuf,
    /// Its dtype policy (`MemoryPlan::target`).
    pub policy: spec_models::DtypePolicy,
    /// `--adapter-path`, `--kv-bits`, ... .
    pub load: LoadArgs,
    /// The draft provider's id, if any, and its options.
    pub provider: Option<(String, ProviderOptions)>,
    /// The tokenizer the model's vocabulary is checked against.
    pub tokenizer: Arc<Tokenizer>,
    /// `--prompt-cache-dir`'s store, if any.
    pub store: Option<prefix_store::DirStore>,
}

impl Setup {
    /// The model at `path` and the provider `speculation` names (if any),
    /// their dtypes chosen by the memory plan (`--keep-dtype` keeps the
    /// target's file as is); no prefix store.
    pub fn planned(
        path: PathBuf,
        keep_dtype: bool,
        load: &LoadArgs,
        speculation: Option<&DraftArgs>,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<Setup> {
        let mut plan = MemoryPlan::new();
        let policy = plan.target(&path, keep_dtype, false, load);
        let provider = match speculation.and_then(|s| s.provider().map(|id| (s, id))) {
            Some((args, id)) => {
                let mut options = args.options()?;
                plan.drafter(id, &mut options);
                Some((id.to_owned(), options))
            }
            None => None,
        };
        Ok(Setup {
            path,
            policy,
            load: load.clone(),
            provider,
            tokenizer,
            store: None,
        })
    }
}

/// A started engine and what its loader reported.
pub struct Local {
    /// The engine.
    pub engine: Engine,
    /// The model's vocabulary size.
    pub vocab_size: usize,
    /// The loaded provider's id and `default_num_draft`, if one loaded.
    provider: Option<(String, usize)>,
}

impl Local {
    /// Starts the engine with `config` and loads `setup` on its thread.
    pub fn start(config: EngineConfig, setup: Setup) -> Result<Local> {
        let (info_tx, info_rx) = std::sync::mpsc::channel();
        let Setup {
            path,
            policy,
            load,
            provider,
            tokenizer,
            store,
        } = setup;
        let engine = Engine::start(config, move || {
            let model = model_source::load(&path, policy, &load)?;
            check_vocab(&tokenizer, &model, &path)?;
            let mut providers = Vec::new();
            let mut default_num_draft = None;
            if let Some((id, options)) = &provider {
                let built = serve_loop::build_provider(id, &model, options)?;
                default_num_draft = Some((id.clone(), built.default_num_draft()));
                providers.push(built);
            }
            let _ = info_tx.send((model.info().vocab_size, default_num_draft));
            Ok(serve_loop::Loaded {
                target: Box::new(model),
                providers,
                factory: None,
                prefix_store: store.map(|s| Box::new(s) as Box<dyn serve_loop::PrefixStore>),
            })
        })
        .map_err(|e| match e {
            serve_loop::ServeError::Load(source) => anyhow::anyhow!(source),
            e => e.into(),
        })?;
        let (vocab_size, provider) = info_rx.recv().context("the engine loaded no model")?;
        Ok(Local {
            engine,
            vocab_size,
            provider,
        })
    }

    /// A request's speculation by the loaded provider with `args`'
    /// settings; `None` without a provider.
    pub fn speculation(&self, args: &DraftArgs, seed: u64) -> Option<ProviderChoice> {
        self.provider
            .as_ref()
            .map(|(id, default)| ProviderChoice::new(id.clone(), args.spec(*default, seed)))
    }
}

/// Refuses a tokenizer whose ids the model's vocabulary does not hold.
pub fn check_vocab(tokenizer: &Tokenizer, model: &dyn Target, path: &Path) -> Result<()> {
    tokenizer
        .check_vocab(model.info().vocab_size)
        .with_context(|| format!("tokenizer of {}", path.display()))
}
