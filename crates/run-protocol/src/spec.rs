//! `spec_run` (`crates/mlx-spec/examples/spec_run.rs`): a prompt suite run
//! plainly and with each named provider in one process, alone and
//! optionally all together through one scheduler; the engine side of the
//! speculative gates (`lossless`, `batch`, `draft-parity`, ...) and benches.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Dtype, ExpertOptions, ExpertReads, Request};

/// The provider id that means plain decoding (no speculation).
pub const PLAIN: &str = "plain";

/// One prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Prompt {
    /// A user message, rendered with the model's chat template.
    Chat(String),
    /// Text tokenized as it is (with the tokenizer's special tokens).
    Text(String),
    /// Token ids as they are.
    Ids(Vec<u32>),
}

/// How tokens are chosen and drafts verified.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// The sampler's and the rejection sampler's seed.
    pub seed: u64,
    /// How drafts are verified.
    pub verify: Verify,
}

impl Default for Sampling {
    /// Greedy, exact-match verification.
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            seed: 0,
            verify: Verify::Exact,
        }
    }
}

/// How a round's drafts are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// A draft is accepted where it equals the sampled token.
    Exact,
    /// Rejection sampling against the target's distribution.
    Rejection,
}

/// The batched runs: every job (prompt by prompt, each provider in turn)
/// submitted to one scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// Scheduler steps between two submissions.
    pub stagger: usize,
    /// The scheduler's most active requests.
    pub max_batch: usize,
    /// Every `cancel_every`-th job cancels itself half-way (0: none).
    pub cancel_every: usize,
}

/// What `spec_run` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecRequest {
    /// The target: a checkpoint directory or a GGUF file.
    pub model: PathBuf,
    /// How the target's weights load.
    pub dtype: Dtype,
    /// The prompts, each run by every provider.
    pub prompts: Vec<Prompt>,
    /// Most tokens a run emits.
    pub max_tokens: usize,
    /// Provider ids, in run order; [`PLAIN`] for plain decoding.
    pub providers: Vec<String>,
    /// Every provider's draft count; `None`: each provider's default.
    #[serde(default)]
    pub num_draft: Option<usize>,
    /// Per-provider draft counts, ahead of `num_draft`.
    #[serde(default)]
    pub num_draft_of: BTreeMap<String, usize>,
    /// Provider options (`KEY -> VALUE`) by provider id.
    #[serde(default)]
    pub options: BTreeMap<String, BTreeMap<String, String>>,
    /// Adaptive draft counts (false: the count is fixed).
    pub adaptive: bool,
    /// Token choice and verification.
    #[serde(default)]
    pub sampling: Sampling,
    /// End-of-sequence ids besides the tokenizer's (id prompts have none).
    #[serde(default)]
    pub eos: Vec<u32>,
    /// The batched runs, after the runs alone; `None`: none.
    #[serde(default)]
    pub batch: Option<Batch>,
    /// Where the target's experts live (default: resident, as stored).
    #[serde(default)]
    pub experts: ExpertOptions,
    /// The target's keys and values kept quantized (`--kv-bits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<crate::KvCacheBits>,
    /// A fine-tuned adapter applied to the target (`--adapter-path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<PathBuf>,
    /// The target's caches bounded to this many positions
    /// (`--max-kv-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_size: Option<usize>,
}

impl SpecRequest {
    /// A greedy request with each provider's default, adaptive draft count.
    pub fn new(
        model: PathBuf,
        dtype: Dtype,
        prompts: Vec<Prompt>,
        max_tokens: usize,
        providers: Vec<String>,
    ) -> Self {
        SpecRequest {
            model,
            dtype,
            prompts,
            max_tokens,
            providers,
            num_draft: None,
            num_draft_of: BTreeMap::new(),
            options: BTreeMap::new(),
            adaptive: true,
            sampling: Sampling::default(),
            eos: Vec::new(),
            batch: None,
            experts: ExpertOptions::default(),
            kv_cache: None,
            adapter: None,
            max_kv_size: None,
        }
    }

    /// Sets provider `id`'s option `key`.
    pub fn option(&mut self, id: &str, key: &str, value: impl Into<String>) -> &mut Self {
        self.options
            .entry(id.to_owned())
            .or_default()
            .insert(key.to_owned(), value.into());
        self
    }
}

impl Request for SpecRequest {
    const BINARY: &'static str = "spec_run";
    type Report = SpecReport;
}

/// Why a run ended (`serve_loop::Finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Finish {
    /// An end-of-sequence token.
    Eos,
    /// `max_tokens` emitted.
    MaxTokens,
    /// The host stopped it.
    Stopped,
    /// It was cancelled.
    Cancelled,
}

/// One prompt's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// The prompt as token ids (chat and text prompts tokenized).
    pub prompt_ids: Vec<u32>,
    /// Emitted tokens.
    pub tokens: Vec<u32>,
    /// Log-probability of each emitted token.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: Finish,
    /// Wall time from the start of the run (of the batch, when batched).
    pub seconds: f64,
    /// Time spent generating after the prefill.
    pub generation_seconds: f64,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Rounds that drafted at least one token.
    pub drafting_rounds: usize,
    /// Target forwards.
    pub target_calls: usize,
    /// Rounds, drafting or not.
    pub rounds: usize,
    /// Rounds whose proposal at each draft position was accepted.
    pub accepted_by_pos: Vec<usize>,
    /// Rounds that proposed a token at each draft position.
    pub drafted_by_pos: Vec<usize>,
    /// What the streamed-expert tier did during this run (`None`: experts
    /// resident, or a batched run, whose reads are shared).
    #[serde(default)]
    pub expert_reads: Option<ExpertReads>,
}

/// The runs' tokens.
pub fn tokens(runs: &[Generation]) -> Vec<&[u32]> {
    runs.iter().map(|r| r.tokens.as_slice()).collect()
}

/// What `spec_run` writes: each provider's runs, one per prompt in prompt
/// order, by provider id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecReport {
    /// Each request alone.
    pub alone: BTreeMap<String, Vec<Generation>>,
    /// The same requests run together (empty without [`SpecRequest::batch`]).
    pub batched: BTreeMap<String, Vec<Generation>>,
}

impl SpecReport {
    /// Provider `id`'s runs alone (empty when it did not run).
    pub fn alone(&self, id: &str) -> &[Generation] {
        self.alone.get(id).map_or(&[], Vec::as_slice)
    }

    /// Provider `id`'s batched runs (empty when none ran).
    pub fn batched(&self, id: &str) -> &[Generation] {
        self.batched.get(id).map_or(&[], Vec::as_slice)
    }
}

/// `{"prompts": [...]}`: prompts as the oracles' prompt files hold them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptFile {
    /// The prompts.
    pub prompts: Vec<Prompt>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_tagged_by_kind() {
        let p = vec![Prompt::Ids(vec![1, 2]), Prompt::Chat("hi".into())];
        let text = serde_json::to_string(&PromptFile { prompts: p.clone() }).expect("json");
        assert_eq!(text, r#"{"prompts":[{"ids":[1,2]},{"chat":"hi"}]}"#);
        let back: PromptFile = serde_json::from_str(&text).expect("parses");
        assert_eq!(back.prompts, p);
    }
}
