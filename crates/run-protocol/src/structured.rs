//! `structured_run` (`crates/mlx-spec/examples/structured_run.rs`):
//! constrained generation (JSON schemas, Lark grammars, regexes) on a real
//! model, plainly and with each provider and forced-token drafts; gate
//! `structured` and `cargo xtask bench structured`. The gate's oracle,
//! `xtask/python/oracle_structured.py`, reads [`OracleCases`] and writes
//! [`OracleReport`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Request;

/// A request's constraint, as the gate and the oracle both name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Grammar {
    /// A JSON schema, as JSON text.
    JsonSchema {
        /// The schema.
        schema: String,
    },
    /// Any JSON object.
    JsonObject,
    /// A grammar in llguidance's Lark syntax.
    Lark {
        /// The grammar's text.
        grammar: String,
    },
    /// A regular expression the whole output must match.
    Regex {
        /// The expression.
        regex: String,
    },
}

/// One prompt and its constraint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Its name in reports.
    pub name: String,
    /// The prompt's text (the user message when `chat`).
    pub prompt: String,
    /// Whether the prompt goes through the model's chat template.
    pub chat: bool,
    /// The constraint.
    pub grammar: Grammar,
}

/// One configuration every case runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Its name in reports.
    pub name: String,
    /// Whether the constraint applies (an unconstrained run is the speed
    /// reference).
    pub constrained: bool,
    /// The provider speculating, if any.
    pub provider: Option<String>,
    /// Its options (`KEY -> VALUE`).
    pub options: BTreeMap<String, String>,
    /// Whether the constraint's forced tokens are drafted.
    pub forced_drafts: bool,
    /// Sampling at temperature 1 with this seed; greedy when `None`.
    pub seed: Option<u64>,
}

/// What `structured_run` runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredRequest {
    /// The checkpoint directory (with its tokenizer).
    pub model: PathBuf,
    /// The prompts.
    pub cases: Vec<Case>,
    /// The configurations, each running every case.
    pub runs: Vec<RunConfig>,
    /// Most tokens per case.
    pub max_tokens: usize,
    /// Times each configuration runs the cases (timings take the fastest).
    pub repeats: usize,
}

impl Request for StructuredRequest {
    const BINARY: &'static str = "structured_run";
    type Report = StructuredReport;
}

/// Every configuration's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredReport {
    /// The prompt tokens of each case, in case order.
    pub prompts: Vec<Vec<u32>>,
    /// The model's EOS tokens.
    pub eos: Vec<u32>,
    /// Each case's grammar as our engine compiled it, in case order: a
    /// JSON constraint as the schema llguidance was given (with the
    /// default layout, `spec_grammar::GrammarSpec::effective_schema`), the
    /// others as the case names them. The oracle compiles these.
    pub compiled: Vec<Grammar>,
    /// One per configuration, in request order.
    pub runs: Vec<RunReport>,
}

/// One configuration's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunReport {
    /// The configuration's name.
    pub name: String,
    /// One per case, in case order.
    pub cases: Vec<CaseReport>,
    /// Seconds of generation for all cases (the fastest repeat).
    pub seconds: f64,
}

/// One case's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseReport {
    /// The tokens generated.
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// Why it ended: `eos`, `length`, ...
    pub finish: String,
    /// Target forwards of generation.
    pub target_calls: usize,
    /// Drafts proposed (forced ones included).
    pub drafted: usize,
    /// Forced drafts proposed.
    pub forced_drafted: usize,
    /// Forced drafts accepted.
    pub forced_accepted: usize,
    /// Masks computed.
    pub masks: usize,
    /// Seconds the grammar engine took (masks, draft checks, forced
    /// tokens): `SpecStats::grammar_seconds`.
    pub grammar_seconds: f64,
    /// Seconds applying masks to logits: `SpecStats::mask_apply_seconds`.
    pub mask_apply_seconds: f64,
}

/// The oracle's input: the cases with our prompt tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OracleCases {
    /// The checkpoint directory.
    pub model: PathBuf,
    /// Most tokens per case.
    pub max_tokens: usize,
    /// The cases.
    pub cases: Vec<OracleCase>,
    /// Texts to validate against their case's schema (ours), by case
    /// index; the oracle reports each verdict.
    pub check: Vec<(usize, String)>,
}

/// One oracle case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OracleCase {
    /// Its name.
    pub name: String,
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The constraint.
    pub grammar: Grammar,
}

/// What the oracle found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OracleReport {
    /// Its greedy tokens per case (EOS excluded).
    pub tokens: Vec<Vec<u32>>,
    /// Per case: `None` when its own output is valid (parses and, for a
    /// schema, validates), else why not.
    pub invalid: Vec<Option<String>>,
    /// Per `check` entry: `None` when valid, else why not.
    pub checked: Vec<Option<String>>,
}
