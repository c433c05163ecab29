//! One request run alone (a batch of one): prefill, then rounds of draft ->
//! verify -> accept -> rollback -> commit -> emit, until EOS, max tokens, a
//! stop from the host or cancellation.

use std::ops::ControlFlow;

use spec_core::{CacheSet, DraftProvider, Target};

use crate::request::{chosen, RequestState};
use crate::scheduler::run_step;
use crate::{Output, Request, ScheduleConfig, ServeError};

/// Runs one request, calling `on_token` with each emitted token, with the
/// default [`ScheduleConfig`] (its prefill chunk). The request's
/// speculation names one of `providers` by id.
pub fn generate(
    target: &dyn Target,
    providers: &[&dyn DraftProvider],
    req: Request,
    on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Output, ServeError> {
    generate_with(
        target,
        providers,
        req,
        &ScheduleConfig::default(),
        None,
        on_token,
    )
}

/// [`generate`] with the schedule's settings (the prefill chunk): a batch
/// of one. `prefix`: caches already holding `prompt[..offset]` (a
/// prompt-cache file): prefill starts at their offset; at least one prompt
/// token must be left, and a provider that reads tapped layers is refused.
/// A plain request without logits processors decodes pipelined once its
/// prompt is in (the same tokens, without waiting on each).
pub fn generate_with(
    target: &dyn Target,
    providers: &[&dyn DraftProvider],
    req: Request,
    config: &ScheduleConfig,
    prefix: Option<CacheSet>,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Output, ServeError> {
    config.validate()?;
    let _span = tracing::info_span!(
        "generate",
        prompt = req.prompt.len(),
        max_tokens = req.max_tokens,
        provider = req.speculation.as_ref().map(|s| s.id.as_str())
    )
    .entered();
    let provider = chosen(&req, providers)?;
    let mut state = RequestState::new(
        target,
        req,
        provider,
        prefix,
        Box::new(|e: &crate::Emitted<'_>| on_token(e.token)),
        config.prefill_chunk,
        None,
    )?;
    let mut cost = crate::step_cost::StepCost::new();
    while !state.is_done() {
        if state.plain_decoding() {
            state.decode_pipelined(&mut || false);
            break;
        }
        run_step(target, config, &mut [&mut state], &mut cost);
    }
    state.close()
}
