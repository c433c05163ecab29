//! Constrained decoding for `serve`'s `response_format` and `generate`'s
//! `--json-schema`, `--grammar` and `--regex`: the model's token
//! environment, built once, and each request's compiled constraint.

use std::sync::Arc;

pub use spec_grammar::{GrammarError, GrammarSpec, TokenEnv};
use spec_text::Tokenizer;

/// The model's token environment, or why it has none (a vocabulary
/// llguidance cannot read): constrained requests are then refused with
/// that reason, the rest served.
pub fn token_env(
    tokenizer: &Arc<Tokenizer>,
    model_vocab_size: usize,
) -> Result<Arc<TokenEnv>, String> {
    let started = std::time::Instant::now();
    match TokenEnv::new(Arc::clone(tokenizer), model_vocab_size) {
        Ok(env) => {
            tracing::info!(
                ms = started.elapsed().as_millis() as u64,
                "token environment for constrained decoding ready"
            );
            Ok(Arc::new(env))
        }
        Err(e) => {
            let reason = spec_core::error::report(&e);
            tracing::warn!(error = %reason, "constrained decoding is off for this model");
            Err(reason)
        }
    }
}

/// `spec` compiled into a fresh constraint for one request.
pub fn compile(
    env: &TokenEnv,
    spec: &GrammarSpec,
) -> Result<Box<dyn spec_core::Constraint>, GrammarError> {
    Ok(Box::new(env.constraint(spec)?))
}
