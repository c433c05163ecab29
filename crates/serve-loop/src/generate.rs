//! One request run alone (a batch of one): prefill, then rounds of draft ->
//! verify -> accept -> rollback -> commit -> emit, until EOS, max tokens, a
//! stop from the host or cancellation.

use std::ops::ControlFlow;

use spec_core::Target;

use crate::request::RequestState;
use crate::scheduler::{parts_of, run_step};
use crate::{Output, Request, ScheduleConfig, ServeError};

/// Runs one request, calling `on_token` with each emitted token, with the
/// default [`ScheduleConfig`] (its prefill chunk).
pub fn generate(
    target: &dyn Target,
    req: Request<'_>,
    on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Output, ServeError> {
    generate_with(target, req, &ScheduleConfig::default(), on_token)
}

/// [`generate`] with the schedule's settings (the prefill chunk): a batch
/// of one. A plain request without logits processors decodes pipelined
/// once its prompt is in (the same tokens, without waiting on each).
pub fn generate_with(
    target: &dyn Target,
    req: Request<'_>,
    config: &ScheduleConfig,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Output, ServeError> {
    config.validate()?;
    let _span = tracing::info_span!(
        "generate",
        prompt = req.prompt.len(),
        max_tokens = req.max_tokens,
        provider = req.speculation.as_ref().map(|s| s.provider.id())
    )
    .entered();
    let parts = parts_of(req, Box::new(|t, _| on_token(t)));
    let mut state = RequestState::new(target, parts, config.prefill_chunk, None)?;
    while !state.is_done() {
        if state.plain_decoding() {
            state.decode_pipelined(&mut || false);
            break;
        }
        run_step(target, config, &mut [&mut state]);
    }
    state.close()
}
