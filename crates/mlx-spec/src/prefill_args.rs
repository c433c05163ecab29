//! `--prefill-step-size` (mlx-lm's name): prompt tokens per prefill chunk,
//! for `generate` and `serve`.

use clap::Args;
use serve_loop::{ScheduleConfig, DEFAULT_PREFILL_CHUNK};

#[derive(Args, Debug, Clone)]
pub struct PrefillArgs {
    /// Prompt tokens processed per step, on a fixed grid from the prompt's
    /// start (smaller lowers peak memory). mlx-lm's default is 2048: for a
    /// model whose prefill bits depend on the split (GLM, the Qwen3.5 /
    /// Next hybrids), prompts longer than the step give mlx-lm's bits only
    /// with its step. The prefix cache reuses entries of the same step.
    #[arg(long, default_value_t = DEFAULT_PREFILL_CHUNK as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_step_size: u64,
}

impl PrefillArgs {
    /// The schedule with this step (and a step's prefill budget of at least
    /// one chunk), `max_batch` requests at once.
    pub fn schedule(&self, max_batch: usize) -> ScheduleConfig {
        let chunk = usize::try_from(self.prefill_step_size).unwrap_or(usize::MAX);
        let default = ScheduleConfig::default();
        ScheduleConfig {
            max_batch,
            prefill_chunk: chunk,
            prefill_budget: default.prefill_budget.max(chunk),
        }
    }
}
