//! The OpenAI-compatible request and response shapes, and their validation:
//! every bad request is refused with a 400 in OpenAI's error format before
//! any work is queued.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::choices::MAX_CHOICES;
use super::defaults::RequestDefaults;
use super::response_format::ResponseFormat;

/// An error in OpenAI's format.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }
    /// A request whose events stopped before its end (the engine went
    /// away).
    pub fn engine_stopped() -> Self {
        Self::internal("the engine stopped before finishing the request")
    }
    pub fn busy(queue: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "the server is at capacity ({queue} requests in flight or queued); retry later"
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }
    /// A key already holds `--max-concurrency-per-key` requests.
    pub fn key_busy(limit: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "this API key already has {limit} requests in flight or queued (the per-key limit); retry later"
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }
    pub fn body(&self) -> Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The `speculative` extension: `false` turns speculation off, an object
/// selects a provider by id with its parameters.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum SpecField {
    Off(bool),
    On(SpecRequest),
}

#[derive(Debug, Deserialize, Clone)]
pub struct SpecRequest {
    pub provider: String,
    pub num_draft_tokens: Option<usize>,
    /// `false`: every round drafts `num_draft_tokens` (the CLI's
    /// `--no-adaptive`); unset or `true`: the adaptive controller.
    pub adaptive: Option<bool>,
    /// With the controller on: `"goodput"` (default: lengths chosen per
    /// step for the whole batch) or `"per-row"`.
    pub draft_policy: Option<String>,
    #[serde(flatten)]
    pub options: std::collections::BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize, Clone, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by both endpoints.
#[derive(Debug, Deserialize, Clone)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub speculative: Option<SpecField>,
    /// Partitions the prefix cache (vLLM's `cache_salt`): only requests
    /// with the same salt (and, with API keys, the same key) share cached
    /// prefixes.
    pub cache_salt: Option<String>,
    /// Token id (a string) -> bias in [-100, 100], added to its logit.
    pub logit_bias: Option<Value>,
    /// `text`, `json_object`, `json_schema`, `regex` or `grammar`
    /// ([`ResponseFormat`]).
    pub response_format: Option<Value>,
    /// mlx_lm.server's per-request adapter path: taken only when it names
    /// the adapter this server applies (`--adapter-path`).
    pub adapters: Option<String>,
    /// mlx_lm.server's penalties: each an amount and the tokens it looks
    /// back over (default 20; 0: all of them).
    pub repetition_penalty: Option<f64>,
    pub repetition_context_size: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub presence_context_size: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub frequency_context_size: Option<i64>,
    /// mlx_lm.server's per-request draft model: taken only when it names
    /// the one this server loaded (`--draft-model`) or `default_model`.
    pub draft_model: Option<String>,
    /// mlx_lm.server's draft count (1 to 16) for whatever speculation the
    /// request runs, unless its `speculative` object names its own.
    pub num_draft_tokens: Option<i64>,
    /// XTC sampling (mlx_lm.server's fields): the chance per token and the
    /// probability threshold (default 0.1, at most 0.5).
    pub xtc_probability: Option<f64>,
    pub xtc_threshold: Option<f64>,
    /// OpenAI's predicted outputs: `{"type": "content", "content": ...}`,
    /// what the answer is expected to be, which prompt lookup drafts from.
    pub prediction: Option<Value>,
    /// Which of the request's choices these parameters are for: a seeded
    /// request's choice `i` samples from `seed + i` (so choice 0 is what
    /// the same request with `n: 1` gives).
    #[serde(skip)]
    pub choice: usize,
    /// Whether the prompt's tokens are scored beside the answer's (set by
    /// the endpoint: completions' `echo` with `logprobs`).
    #[serde(skip)]
    pub score_prompt: bool,
}

#[derive(Debug, Deserialize, Clone)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// 0 to 20: report each token's log-probability and this many
    /// alternatives (the completions API's legacy shape).
    pub logprobs: Option<Value>,
    /// The prompt's text before each choice's.
    #[serde(default)]
    pub echo: bool,
    /// OpenAI's insertion text (after the completion): not supported, so
    /// a non-empty one is refused rather than ignored.
    pub suffix: Option<Value>,
    /// OpenAI's server-side candidates: `best_of` completions of each
    /// prompt run, and the `n` with the highest log-probability per token
    /// are returned (not streamed).
    pub best_of: Option<Value>,
    #[serde(flatten)]
    pub common: Common,
}

impl CompletionRequest {
    /// The candidates each prompt runs (`best_of`, at least `n`, `n`
    /// without it; more than `n` only unstreamed), after refusing a
    /// non-empty `suffix`, which this server does not implement.
    pub fn candidates(&self, n: usize, stream: bool) -> Result<usize, ApiError> {
        match &self.suffix {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "`suffix` (text inserted after the completion) is not supported",
                    Some("suffix"),
                ))
            }
        }
        let invalid = |m: String| Err(ApiError::invalid(m, Some("best_of")));
        let best_of = match &self.best_of {
            None | Some(Value::Null) => return Ok(n),
            Some(v) => match v.as_u64() {
                Some(b) if b as usize >= n && b as usize <= MAX_CHOICES => b as usize,
                _ => {
                    return invalid(format!(
                        "`best_of` must be an integer from `n` ({n}) to {MAX_CHOICES}, got {v}"
                    ))
                }
            },
        };
        if best_of > n && stream {
            return invalid(format!(
                "`best_of` {best_of} picks {n} of its candidates once they end: not with `stream`"
            ));
        }
        Ok(best_of)
    }
}

/// The completions API's `prompt`: a text, token ids, or a list of either
/// (one choice, or `n`, for each).
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The request's prompts, in order: each a text, or token ids below
    /// `vocab`; at least one, none empty.
    pub fn inputs(&self, vocab: usize) -> Result<Vec<PromptInput>, ApiError> {
        let invalid = |m: String| ApiError::invalid(m, Some("prompt"));
        let ids = |v: &[i64]| -> Result<PromptInput, ApiError> {
            if v.is_empty() {
                return Err(invalid("a token prompt must hold at least one id".into()));
            }
            v.iter()
                .map(|&id| {
                    u32::try_from(id)
                        .ok()
                        .filter(|&t| (t as usize) < vocab)
                        .ok_or_else(|| {
                            invalid(format!(
                                "token id {id} is outside the vocabulary (0 to {})",
                                vocab - 1
                            ))
                        })
                })
                .collect::<Result<Vec<u32>, _>>()
                .map(PromptInput::Tokens)
        };
        let inputs = match self {
            Prompt::Text(t) => vec![PromptInput::Text(t.clone())],
            Prompt::Texts(v) => v.iter().cloned().map(PromptInput::Text).collect(),
            Prompt::Tokens(v) => vec![ids(v)?],
            Prompt::TokenLists(v) => v.iter().map(|p| ids(p)).collect::<Result<_, _>>()?,
        };
        if inputs.is_empty() {
            return Err(invalid("`prompt` must hold at least one prompt".into()));
        }
        Ok(inputs)
    }
}

/// Validated generation parameters.
#[derive(Debug, Clone)]
pub struct Params {
    pub max_tokens: usize,
    pub sampler: spec_core::SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub speculative: Option<SpecField>,
    pub cache_salt: Option<String>,
    /// `(token id, bias)`, ids below the vocabulary, biases in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    pub response_format: ResponseFormat,
    /// `None`: no log-probabilities; `Some(n)`: each token's and `n`
    /// alternatives (set by the endpoint from its own field).
    pub logprobs: Option<usize>,
    /// `Some(n)`: the prompt's tokens scored too, with `n` alternatives
    /// (completions' `echo` with `logprobs`; set by the endpoint).
    pub prompt_logprobs: Option<usize>,
    /// The predicted output's text (`prediction`), when given.
    pub prediction: Option<String>,
    /// Repetition, presence and frequency penalties (after `logit_bias`).
    pub penalties: spec_core::Penalties,
}

/// OpenAI's `prediction`: `{"type": "content", "content": TEXT}`, the
/// content a string or a list of `{"type": "text", "text": ...}` parts
/// (joined); `None` when absent or `null`.
pub fn prediction(field: Option<&Value>) -> Result<Option<String>, ApiError> {
    let invalid = |m: &str| ApiError::invalid(m, Some("prediction"));
    let object = match field {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(invalid("`prediction` must be an object")),
    };
    if object.get("type").and_then(Value::as_str) != Some("content") {
        return Err(invalid("`prediction.type` must be \"content\""));
    }
    let text = match object.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(invalid(
                        "`prediction.content` parts must be {\"type\": \"text\", \"text\": ...}",
                    )),
                },
            )
            .collect::<Result<String, _>>()?,
        _ => {
            return Err(invalid(
                "`prediction.content` must be a string or a list of text parts",
            ))
        }
    };
    Ok(Some(text))
}

/// The most entries a `logit_bias` may have.
pub const MAX_LOGIT_BIAS_ENTRIES: usize = 1024;

/// `logit_bias`: an object from token ids (strings of integers below
/// `vocab`) to numbers in [-100, 100]; a 400 naming the first bad key.
pub fn logit_bias(field: Option<&Value>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let invalid = |message: String| ApiError::invalid(message, Some("logit_bias"));
    let map = match field {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(invalid(
                "`logit_bias` must be an object from token ids to biases".to_owned(),
            ))
        }
    };
    if map.len() > MAX_LOGIT_BIAS_ENTRIES {
        return Err(invalid(format!(
            "`logit_bias` has {} entries, at most {MAX_LOGIT_BIAS_ENTRIES}",
            map.len()
        )));
    }
    map.iter()
        .map(|(key, value)| {
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    invalid(format!(
                        "`logit_bias` key `{key}` is not a token id of this model (an integer from 0 to {})",
                        vocab.saturating_sub(1)
                    ))
                })?;
            let bias = value
                .as_f64()
                .filter(|b| b.is_finite() && (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    invalid(format!(
                        "`logit_bias` value of `{key}` must be a number from -100 to 100, got {value}"
                    ))
                })?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// A penalty and its look-back: the amount finite (and, for the
/// repetition penalty, not negative), the context a non-negative integer;
/// `None` when the amount is absent.
fn penalty(
    amount: Option<f64>,
    context: Option<i64>,
    names: (&'static str, &'static str),
    non_negative: bool,
) -> Result<Option<(f32, usize)>, ApiError> {
    let (name, context_name) = names;
    let context = match context {
        None => spec_core::DEFAULT_PENALTY_CONTEXT,
        Some(c) => usize::try_from(c).map_err(|_| {
            ApiError::invalid(
                format!("`{context_name}` must be a non-negative integer, got {c}"),
                Some(context_name),
            )
        })?,
    };
    match amount {
        None => Ok(None),
        Some(p) if p.is_finite() && (p as f32).is_finite() && (!non_negative || p >= 0.0) => {
            Ok(Some((p as f32, context)))
        }
        Some(p) => Err(ApiError::invalid(
            if non_negative {
                format!("`{name}` must be a finite number >= 0, got {p}")
            } else {
                format!("`{name}` must be a finite number, got {p}")
            },
            Some(name),
        )),
    }
}

fn unit_interval(v: Option<f64>, name: &'static str, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            format!("`{name}` must be between 0 and 1, got {x}"),
            Some(name),
        )),
    }
}

impl Common {
    /// `n`, checked: how many choices to generate for each prompt.
    pub fn choice_count(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if n >= 1 && n as u64 <= MAX_CHOICES as u64 => Ok(n as usize),
            Some(n) => Err(ApiError::invalid(
                format!("`n` must be between 1 and {MAX_CHOICES}, got {n}"),
                Some("n"),
            )),
        }
    }

    /// These parameters for choice `index` of the request.
    pub fn for_choice(&self, index: usize) -> Self {
        Self {
            choice: index,
            ..self.clone()
        }
    }

    /// The request's generation parameters, checked, with `defaults` for
    /// what it leaves out.
    pub fn params(&self, vocab: usize, defaults: &RequestDefaults) -> Result<Params, ApiError> {
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => defaults.max_tokens,
            Some(m) if (1..=1_000_000).contains(&m) => m as usize,
            // The legacy scoring request: the prompt's log-probabilities,
            // nothing generated.
            Some(0) if self.score_prompt => 0,
            Some(m) => {
                return Err(ApiError::invalid(
                    format!(
                        "`max_tokens` must be between 1 and 1000000 (0 only with `echo` and `logprobs`: the prompt scored alone), got {m}"
                    ),
                    Some("max_tokens"),
                ))
            }
        };
        let temperature = match self.temperature {
            None => defaults.temperature,
            Some(t) if t.is_finite() && (0.0..=2.0).contains(&t) => t as f32,
            Some(t) => {
                return Err(ApiError::invalid(
                    format!("`temperature` must be between 0 and 2, got {t}"),
                    Some("temperature"),
                ))
            }
        };
        let top_p = unit_interval(self.top_p, "top_p", defaults.top_p)?;
        let min_p = unit_interval(self.min_p, "min_p", defaults.min_p)?;
        let top_k = match self.top_k {
            None => defaults.top_k,
            Some(0) | Some(-1) => 0,
            Some(k) if k > 0 && (k as usize) < vocab => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("`top_k` must be in 1..{vocab} (or 0/-1 for off), got {k}"),
                    Some("top_k"),
                ))
            }
        };
        let seed = match self.seed {
            None => crate::random::fresh_u64(),
            Some(s) if s >= 0 => (s as u64).wrapping_add(self.choice as u64),
            Some(s) => {
                return Err(ApiError::invalid(
                    format!("`seed` must be non-negative, got {s}"),
                    Some("seed"),
                ))
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
            Some(Stop::Many(v)) => {
                return Err(ApiError::invalid(
                    format!("at most 4 stop sequences, got {}", v.len()),
                    Some("stop"),
                ))
            }
        };
        if stop.iter().any(|s| s.is_empty() || s.len() > 256) {
            return Err(ApiError::invalid(
                "stop sequences must be 1 to 256 bytes",
                Some("stop"),
            ));
        }
        if let Some(salt) = &self.cache_salt {
            if salt.is_empty() || salt.len() > 256 {
                return Err(ApiError::invalid(
                    format!("`cache_salt` must be 1 to 256 bytes, got {}", salt.len()),
                    Some("cache_salt"),
                ));
            }
        }
        let sampler = spec_core::SamplerConfig {
            temperature,
            top_p,
            min_p,
            top_k,
            xtc_probability: unit_interval(self.xtc_probability, "xtc_probability", 0.0)?,
            xtc_threshold: match self.xtc_threshold {
                None => spec_core::SamplerConfig::default().xtc_threshold,
                Some(t) if t.is_finite() && (0.0..=0.5).contains(&t) => t as f32,
                Some(t) => {
                    return Err(ApiError::invalid(
                        format!("`xtc_threshold` must be between 0 and 0.5, got {t}"),
                        Some("xtc_threshold"),
                    ))
                }
            },
            seed,
            ..spec_core::SamplerConfig::default()
        };
        let penalties = spec_core::Penalties {
            repetition: penalty(
                self.repetition_penalty,
                self.repetition_context_size,
                ("repetition_penalty", "repetition_context_size"),
                true,
            )?,
            presence: penalty(
                self.presence_penalty,
                self.presence_context_size,
                ("presence_penalty", "presence_context_size"),
                false,
            )?,
            frequency: penalty(
                self.frequency_penalty,
                self.frequency_context_size,
                ("frequency_penalty", "frequency_context_size"),
                false,
            )?,
        };
        sampler.validate(vocab).map_err(|e| {
            let param = match &e {
                spec_core::SpecError::Input(spec_core::InputError::SamplerParam {
                    name, ..
                }) => Some(*name),
                _ => None,
            };
            ApiError::invalid(e.to_string(), param)
        })?;
        Ok(Params {
            max_tokens,
            sampler,
            stop,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            speculative: self.speculative.clone(),
            cache_salt: self.cache_salt.clone(),
            logit_bias: logit_bias(self.logit_bias.as_ref(), vocab)?,
            response_format: ResponseFormat::parse(self.response_format.as_ref())?,
            logprobs: None,
            prompt_logprobs: None,
            prediction: prediction(self.prediction.as_ref())?,
            penalties,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenAI's defaults, `max_tokens` 16.
    const DEFAULTS: RequestDefaults = RequestDefaults {
        max_tokens: 16,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
    };

    fn common(v: Value) -> Common {
        serde_json::from_value(v).expect("parse")
    }

    #[test]
    fn sampling_values_out_of_range_are_400s_naming_the_parameter() {
        for (body, param) in [
            (json!({"temperature": 3.0}), "temperature"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"top_k": 100000}), "top_k"),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"seed": -3}), "seed"),
            (json!({"repetition_penalty": -1.0}), "repetition_penalty"),
            (json!({"presence_penalty": 1e300}), "presence_penalty"),
            (
                json!({"frequency_penalty": 1, "frequency_context_size": -2}),
                "frequency_context_size",
            ),
            (json!({"xtc_probability": 1.5}), "xtc_probability"),
            (json!({"xtc_threshold": 0.6}), "xtc_threshold"),
        ] {
            let err = common(body.clone())
                .params(1000, &DEFAULTS)
                .expect_err("must fail");
            assert_eq!(
                (err.status, err.param),
                (StatusCode::BAD_REQUEST, Some(param)),
                "{body}"
            );
        }
        let ok =
            common(json!({"temperature": 0, "max_tokens": 5, "stop": "x", "speculative": false}))
                .params(1000, &DEFAULTS)
                .expect("valid");
        assert_eq!((ok.max_tokens, ok.stop.len()), (5, 1));
        assert!(!ok.penalties.any());
        let ok = common(json!({
            "presence_penalty": -0.5,
            "frequency_penalty": 0.25,
            "frequency_context_size": 0,
            "repetition_penalty": 1.1,
            "xtc_probability": 0.5,
        }))
        .params(1000, &DEFAULTS)
        .expect("valid");
        assert_eq!(
            ok.penalties,
            spec_core::Penalties {
                repetition: Some((1.1, 20)),
                presence: Some((-0.5, 20)),
                frequency: Some((0.25, 0)),
            }
        );
        assert_eq!(
            (ok.sampler.xtc_probability, ok.sampler.xtc_threshold),
            (0.5, 0.1)
        );
    }

    #[test]
    fn n_counts_choices_and_each_choice_samples_from_its_own_seed() {
        assert_eq!(common(json!({})).choice_count().expect("default"), 1);
        assert_eq!(common(json!({"n": 3})).choice_count().expect("valid"), 3);
        for n in [0, -1, MAX_CHOICES as i64 + 1] {
            let err = common(json!({ "n": n }))
                .choice_count()
                .expect_err("out of range");
            assert_eq!(err.param, Some("n"), "{n}");
        }
        let seeded = common(json!({"seed": 40, "n": 3}));
        let seeds: Vec<u64> = (0..3)
            .map(|i| {
                let params = seeded.for_choice(i).params(1000, &DEFAULTS).expect("valid");
                params.sampler.seed
            })
            .collect();
        assert_eq!(seeds, [40, 41, 42]);
        let top = common(json!({ "seed": i64::MAX })).for_choice(2);
        let wrapped = top.params(1000, &DEFAULTS).expect("valid").sampler.seed;
        assert_eq!(wrapped, i64::MAX as u64 + 2, "no overflow");
        // Without a seed every request (and every choice) samples afresh.
        let unseeded = common(json!({}));
        let a = unseeded
            .params(1000, &DEFAULTS)
            .expect("valid")
            .sampler
            .seed;
        let b = unseeded
            .params(1000, &DEFAULTS)
            .expect("valid")
            .sampler
            .seed;
        assert_ne!(a, b);
    }

    #[test]
    fn logit_bias_takes_token_ids_and_biases_in_range() {
        let ok = common(json!({"logit_bias": {"7": -100, "0": 100, "999": 2.5}}))
            .params(1000, &DEFAULTS)
            .expect("valid");
        let mut bias = ok.logit_bias;
        bias.sort_by_key(|&(id, _)| id);
        assert_eq!(bias, [(0, 100.0), (7, -100.0), (999, 2.5)]);
        for (body, names) in [
            (json!({"logit_bias": {"1000": 1}}), "key `1000`"),
            (json!({"logit_bias": {"-1": 1}}), "key `-1`"),
            (json!({"logit_bias": {"hello": 1}}), "key `hello`"),
            (json!({"logit_bias": {"3": 100.5}}), "value of `3`"),
            (json!({"logit_bias": {"3": -101}}), "value of `3`"),
            (json!({"logit_bias": {"3": "5"}}), "value of `3`"),
            (json!({"logit_bias": [1, 2]}), "must be an object"),
        ] {
            let err = common(body.clone())
                .params(1000, &DEFAULTS)
                .expect_err("must fail");
            assert_eq!(
                (err.status, err.param),
                (StatusCode::BAD_REQUEST, Some("logit_bias")),
                "{body}"
            );
            assert!(err.message.contains(names), "{body}: {}", err.message);
        }
        let many: serde_json::Map<String, Value> = (0..=MAX_LOGIT_BIAS_ENTRIES)
            .map(|i| (i.to_string(), json!(1)))
            .collect();
        assert!(common(json!({"logit_bias": many}))
            .params(5000, &DEFAULTS)
            .is_err());
    }

    #[test]
    fn response_format_is_checked_with_the_other_parameters() {
        let ok = common(json!({"response_format": {"type": "json_object"}}))
            .params(1000, &DEFAULTS)
            .expect("valid");
        assert!(ok.response_format.grammar().is_some());
        let err = common(json!({"response_format": {"type": "yaml"}}))
            .params(1000, &DEFAULTS)
            .expect_err("unknown type");
        assert_eq!(err.param, Some("response_format"));
        assert!(err.message.contains("`yaml`"), "{}", err.message);
    }

    #[test]
    fn speculative_field_is_false_or_a_provider_object() {
        let c = common(
            json!({"speculative": {"provider": "prompt-lookup", "num_draft_tokens": 4, "max_ngram": "3"}}),
        );
        match c.speculative {
            Some(SpecField::On(s)) => {
                assert_eq!(
                    (s.provider.as_str(), s.num_draft_tokens),
                    ("prompt-lookup", Some(4))
                );
                assert!(s.options.contains_key("max_ngram"));
                assert_eq!(s.adaptive, None);
            }
            other => panic!("{other:?}"),
        }
        let fixed = common(json!({"speculative": {"provider": "p", "adaptive": false}}));
        match fixed.speculative {
            Some(SpecField::On(s)) => {
                assert_eq!(s.adaptive, Some(false));
                assert!(s.options.is_empty(), "`adaptive` is no provider option");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            common(json!({"speculative": false})).speculative,
            Some(SpecField::Off(false))
        ));
    }
}
