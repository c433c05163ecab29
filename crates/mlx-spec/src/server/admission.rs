//! Admission: a request's speculation resolved against the loaded
//! providers, its places taken in `--max-concurrency` and its key's limit
//! (429 past them), and its prepared prompt submitted to the engine.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use serde_json::Value;
use serve_loop::ServeError;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::api::{ApiError, Common, Params, SpecField, SpecRequest};
use super::generation::Prepared;
use super::routes::AppState;
use super::tenants::KeySlot;
use super::worker::{CancelOnDrop, Event, SpecChoice, Submission};

fn speculation(
    state: &AppState,
    field: &Option<SpecField>,
    num_draft_tokens: Option<i64>,
    predicted: bool,
) -> Result<Option<SpecChoice>, ApiError> {
    let mut choice = match field {
        // A predicted output is drafted from by prompt lookup (and suffix
        // decoding): a request that names no speculation gets one.
        None if predicted => prediction_spec(state),
        None | Some(SpecField::Off(true)) => state.default_spec.clone(),
        Some(SpecField::Off(false)) => None,
        Some(SpecField::On(s)) => Some(spec_choice(
            s,
            &state.loaded_providers,
            &state.operator_options,
        )?),
    };
    // mlx_lm.server's top-level `num_draft_tokens`: the count of whatever
    // speculation runs (over the operator's default), unless the request's
    // `speculative` object names its own.
    if let Some(n) = num_draft_tokens {
        let n = usize::try_from(n)
            .ok()
            .filter(|n| (1..=16).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("`num_draft_tokens` must be between 1 and 16, got {n}"),
                    Some("num_draft_tokens"),
                )
            })?;
        let own = matches!(field, Some(SpecField::On(s)) if s.num_draft_tokens.is_some());
        if let Some(c) = choice.as_mut().filter(|_| !own) {
            c.num_draft = Some(n);
        }
    }
    Ok(choice)
}

/// Speculation for a request with a predicted output and no `speculative`
/// field: the server's default when that drafts from predictions (prompt
/// lookup, suffix decoding), else prompt lookup with its own count when
/// loaded, else the default.
fn prediction_spec(state: &AppState) -> Option<SpecChoice> {
    let lookup = draft_prompt_lookup::ID;
    match &state.default_spec {
        Some(d) if d.provider == lookup || d.provider == draft_suffix::ID => Some(d.clone()),
        _ if state.loaded_providers.iter().any(|p| p == lookup) => Some(SpecChoice {
            provider: lookup.to_owned(),
            num_draft: None,
            adaptive: true,
            policy: serve_loop::DraftPolicy::Goodput,
            options: spec_core::ProviderOptions::new(),
        }),
        _ => state.default_spec.clone(),
    }
}

/// The speculation a `speculative` object asks for, checked against the
/// providers the server loaded. Its provider options must be ones the
/// provider lets a request set (`ProviderRegistration::request_options`),
/// in range: anything else (a path, a model directory, a size of shared
/// state) is the operator's and a 400 naming the option. Valid options
/// merge over the operator's for that provider.
fn spec_choice(
    s: &SpecRequest,
    loaded_providers: &[String],
    operator_options: &BTreeMap<String, spec_core::ProviderOptions>,
) -> Result<SpecChoice, ApiError> {
    if !loaded_providers.contains(&s.provider) {
        return Err(ApiError::invalid(
            format!(
                "unknown or unloaded draft provider `{}` (loaded: {})",
                s.provider,
                loaded_providers.join(", ")
            ),
            Some("speculative"),
        ));
    }
    let num_draft = match s.num_draft_tokens {
        None => None,
        Some(n) if (1..=16).contains(&n) => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(
                format!("`num_draft_tokens` must be between 1 and 16, got {n}"),
                Some("speculative"),
            ))
        }
    };
    let mut options = spec_core::ProviderOptions::new();
    for (k, v) in &s.options {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                return Err(ApiError::invalid(
                    format!("provider option `{k}` must be a string, number or boolean"),
                    Some("speculative"),
                ))
            }
        };
        options.insert(k.clone(), v);
    }
    if !options.is_empty() {
        let allowed = spec_core::resolve(&s.provider)
            .map(|r| r.request_options)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("speculative")))?;
        spec_core::check_request_options(&s.provider, allowed, &options)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("speculative")))?;
        let operator = operator_options
            .get(&s.provider)
            .cloned()
            .unwrap_or_default();
        options = spec_core::merge_request_options(&operator, &options);
    }
    let policy = match s.draft_policy.as_deref() {
        None => serve_loop::DraftPolicy::default(),
        Some(name) => serve_loop::DraftPolicy::parse(name).ok_or_else(|| {
            ApiError::invalid(
                format!("`draft_policy` must be \"goodput\" or \"per-row\", got \"{name}\""),
                Some("speculative"),
            )
        })?,
    };
    Ok(SpecChoice {
        provider: s.provider.clone(),
        num_draft,
        adaptive: s.adaptive.unwrap_or(true),
        policy,
        options,
    })
}

/// A request past validation and admission: it holds its places in
/// `--max-concurrency` and its key's limit while its prompt is prepared
/// and while it runs.
pub(super) struct Admitted {
    pub(super) params: Params,
    spec: Option<SpecChoice>,
    tenant: Option<String>,
    permit: Place,
}

/// A request's place: one of the server's and, with API keys, one of its
/// key's.
pub(super) type Place = (OwnedSemaphorePermit, Option<KeySlot>);

/// `count` places for one request's choices, all or none (429 when the
/// server or the key has fewer free): a refused request holds nothing.
pub(super) fn take_places(
    state: &AppState,
    tenant: Option<&str>,
    count: usize,
) -> Result<Vec<Place>, ApiError> {
    let mut places = Vec::with_capacity(count);
    for _ in 0..count {
        // The key's own place first: a key at its limit is refused without
        // taking a place another key could use.
        let key_slot = match tenant {
            Some(t) => Some(state.per_key.try_take(t).ok_or_else(|| {
                state.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
                ApiError::key_busy(state.per_key.limit())
            })?),
            None => None,
        };
        let permit = state.slots.clone().try_acquire_owned().map_err(|_| {
            state.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
            ApiError::busy(state.capacity)
        })?;
        places.push((permit, key_slot));
    }
    Ok(places)
}

/// A 404 unless `model` is unset, empty or the model this server serves.
pub(super) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(model) if !model.is_empty() && model != state.model_id => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "model `{model}` does not exist (this server serves `{}`)",
                state.model_id
            ),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }),
        _ => Ok(()),
    }
}

/// What a request may name of mlx_lm.server's per-request loads: the
/// field, what it names, and the flag that loads it here.
struct Loadable {
    param: &'static str,
    what: &'static str,
    flag: &'static str,
}

/// mlx_lm.server's per-request adapter (`adapters`).
const ADAPTER: Loadable = Loadable {
    param: "adapters",
    what: "adapter",
    flag: "--adapter-path",
};

/// mlx_lm.server's per-request draft model (`draft_model`).
const DRAFT_MODEL: Loadable = Loadable {
    param: "draft_model",
    what: "draft model",
    flag: "--draft-model",
};

/// A 400 unless `asked` is unset, empty, mlx_lm.server's `default_model`
/// or what this server loaded for every request (`served`): one model,
/// adapter and drafter serve every request, and a request never names a
/// path for the server to load.
fn check_loaded(
    field: &Loadable,
    served: Option<&str>,
    asked: Option<&str>,
) -> Result<(), ApiError> {
    match asked {
        Some(asked) if !asked.is_empty() && asked != "default_model" && Some(asked) != served => {
            Err(ApiError {
                status: StatusCode::BAD_REQUEST,
                message: match served {
                    Some(served) => format!(
                        "{} `{asked}` is not loaded: this server uses `{served}` for every request ({})",
                        field.what, field.flag
                    ),
                    None => format!(
                        "{} `{asked}` is not loaded: this server uses no {} ({})",
                        field.what, field.what, field.flag
                    ),
                },
                kind: "invalid_request_error",
                param: Some(field.param),
                code: None,
            })
        }
        _ => Ok(()),
    }
}

/// Validates what needs no prompt and takes the request's place (429
/// when the server or the key is full), unless it comes with one
/// (`take_places`).
pub(super) fn admit(
    state: &AppState,
    tenant: Option<String>,
    common: &Common,
    logprobs: Option<usize>,
    place: Option<Place>,
) -> Result<Admitted, ApiError> {
    let mut params = common.params(state.vocab_size, &state.defaults)?;
    params.logprobs = logprobs;
    params.prompt_logprobs = logprobs.filter(|_| common.score_prompt);
    if params.sampler.xtc_probability > 0.0 {
        params.sampler.xtc_special_tokens = state.xtc_special_tokens.clone();
    }
    check_model(state, common.model.as_deref())?;
    check_loaded(
        &ADAPTER,
        state.adapter.as_deref(),
        common.adapters.as_deref(),
    )?;
    check_loaded(
        &DRAFT_MODEL,
        state.draft_model.as_deref(),
        common.draft_model.as_deref(),
    )?;
    let predicted = params.prediction.is_some();
    let spec = speculation(
        state,
        &params.speculative,
        common.num_draft_tokens,
        predicted,
    )?;
    let place = match place {
        Some(place) => place,
        None => take_places(state, tenant.as_deref(), 1)?
            .pop()
            .ok_or_else(|| ApiError::internal("no place taken"))?,
    };
    Ok(Admitted {
        params,
        spec,
        tenant,
        permit: place,
    })
}

/// Checks the prepared prompt and submits the admitted request to the
/// engine; returns the event stream and the guard that cancels the
/// request when the handler goes away.
pub(super) fn submit(
    state: &AppState,
    admitted: Admitted,
    prepared: Prepared,
) -> Result<(Params, mpsc::UnboundedReceiver<Event>, CancelOnDrop), ApiError> {
    let Admitted {
        params,
        spec,
        tenant,
        permit,
    } = admitted;
    let Prepared {
        prompt,
        constraint,
        keep_special_tokens,
    } = prepared;
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
    }
    if let Some(ctx) = state.context_length {
        if prompt.len() + params.max_tokens > ctx {
            return Err(ApiError::invalid(
                format!("prompt ({} tokens) + max_tokens ({}) exceeds the model's context of {ctx} tokens", prompt.len(), params.max_tokens),
                Some("max_tokens"),
            ));
        }
    }
    let default_num_draft = spec
        .as_ref()
        .and_then(|s| state.default_num_draft.get(&s.provider).copied())
        .unwrap_or(0);
    let bias = spec_core::LogitBias::new(&params.logit_bias, state.vocab_size)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("logit_bias")))?;
    let processors = params
        .penalties
        .processors(Some(bias))
        .map_err(|e| ApiError::invalid(e.to_string(), None))?;
    let prediction = match &params.prediction {
        Some(text) => state
            .tokenizer
            .encode(text, false)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("prediction")))?,
        None => Vec::new(),
    };
    let job = Submission {
        prompt,
        prediction,
        params: params.clone(),
        spec,
        default_num_draft,
        tenant,
        cache_salt: params.cache_salt.clone(),
        processors,
        constraint,
        keep_special_tokens,
        permit,
    };
    let (rx, cancel) = super::worker::submit(&state.engine, &state.tokenizer, &state.metrics, job)
        .map_err(|e| match e {
            ServeError::Busy { .. } => {
                state.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
                ApiError::busy(state.capacity)
            }
            ServeError::TooLong { .. } => ApiError::invalid(e.to_string(), Some("max_tokens")),
            e => {
                tracing::error!(error = %spec_core::error::report(&e), "a request could not be submitted");
                ApiError::internal(super::worker::public_message(&e))
            }
        })?;
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    Ok((params, rx, cancel))
}

/// The 400 of a request the engine refused for its own input (its
/// provider options): the whole chain, which names only what the request
/// sent.
pub(super) fn refused_input(e: &ServeError) -> ApiError {
    ApiError::invalid(spec_core::error::report(e), Some("speculative"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn choice(body: Value) -> Result<SpecChoice, ApiError> {
        let request: SpecRequest = serde_json::from_value(body).expect("a speculative object");
        let loaded = ["prompt-lookup", "suffix", "draft-model"].map(str::to_owned);
        let operator = BTreeMap::from([
            (
                "draft-model".to_owned(),
                spec_core::ProviderOptions::from([("model", "/models/drafter")]),
            ),
            (
                "suffix".to_owned(),
                spec_core::ProviderOptions::from([
                    ("global_per_tenant", "true"),
                    ("max_depth", "32"),
                ]),
            ),
        ]);
        spec_choice(&request, &loaded, &operator)
    }

    /// mlx_lm.server loads the adapter a request names; here one model
    /// serves every request: only the served adapter (or none) is taken,
    /// anything else is a 400 naming `adapters` and what is served.
    #[test]
    fn a_request_names_the_served_adapter_or_draft_model_or_none() {
        for (served, asked) in [
            (None, None),
            (None, Some("")),
            (None, Some("default_model")),
            (Some("/a/lora"), None),
            (Some("/a/lora"), Some("/a/lora")),
        ] {
            for field in [&ADAPTER, &DRAFT_MODEL] {
                assert!(
                    check_loaded(field, served, asked).is_ok(),
                    "{served:?} {asked:?}"
                );
            }
        }
        for (served, asked, says) in [
            (None, "/b", "uses no adapter"),
            (Some("/a/lora"), "/etc", "uses `/a/lora`"),
        ] {
            let err = check_loaded(&ADAPTER, served, Some(asked)).expect_err("refused");
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert_eq!(err.param, Some("adapters"));
            assert!(
                err.message.contains(asked) && err.message.contains(says),
                "{}",
                err.message
            );
        }
        let err =
            check_loaded(&DRAFT_MODEL, Some("/m/small"), Some("/m/other")).expect_err("refused");
        assert_eq!(err.param, Some("draft_model"));
        assert!(err.message.contains("--draft-model"), "{}", err.message);
    }

    /// Found on a live server: `"model": "/etc"` for `draft-model` made the
    /// engine thread try to load `/etc` and answer 500. Paths, model
    /// directories and sizes of shared state are the operator's: a request
    /// naming one is a 400 naming the option, before anything is built.
    #[test]
    fn requests_never_name_files_or_size_shared_state() {
        for (body, fragment) in [
            (
                json!({"provider": "draft-model", "model": "/etc"}),
                "option `model` cannot be set by a request",
            ),
            (
                json!({"provider": "draft-model", "dtype": "keep"}),
                "option `dtype` cannot be set by a request",
            ),
            (
                json!({"provider": "suffix", "global_per_tenant": false}),
                "option `global_per_tenant` cannot be set by a request",
            ),
            (
                json!({"provider": "suffix", "max_tree_tokens": 100000000}),
                "option `max_tree_tokens`",
            ),
            (
                json!({"provider": "prompt-lookup", "max_ngram": 1000}),
                "a whole number from 1 to 32",
            ),
            (
                json!({"provider": "prompt-lookup", "bogus": 1}),
                "option `bogus` cannot be set by a request",
            ),
            (
                json!({"provider": "suffix", "min_token_prob": 2.5}),
                "a number from 0 to 1",
            ),
        ] {
            let err = choice(body.clone()).expect_err("must be refused");
            assert_eq!(
                (err.status, err.param),
                (StatusCode::BAD_REQUEST, Some("speculative")),
                "{body}"
            );
            assert!(err.message.contains(fragment), "{body}: {}", err.message);
        }
    }

    #[test]
    fn request_options_merge_over_the_operators() {
        let merged = choice(json!({"provider": "suffix", "min_token_prob": 0.2})).expect("valid");
        assert_eq!(
            merged.options,
            spec_core::ProviderOptions::from([
                ("global_per_tenant", "true"),
                ("max_depth", "32"),
                ("min_token_prob", "0.2"),
            ]),
            "the operator's options stay"
        );
        // No options of its own: the loaded provider, as the operator built it.
        let plain = choice(json!({"provider": "draft-model"})).expect("valid");
        assert!(plain.options.is_empty());
    }

    #[test]
    fn adaptive_false_asks_for_a_fixed_draft_length() {
        let fixed = choice(json!({"provider": "prompt-lookup", "num_draft_tokens": 4,
            "adaptive": false, "max_ngram": 3}))
        .expect("valid");
        assert_eq!((fixed.num_draft, fixed.adaptive), (Some(4), false));
        assert_eq!(
            fixed.options,
            spec_core::ProviderOptions::from([("max_ngram", "3")]),
            "`adaptive` is the server's, not a provider option"
        );
        let default = choice(json!({"provider": "prompt-lookup"})).expect("valid");
        assert!(default.adaptive, "the controller is on unless turned off");
        assert!(
            choice(json!({"provider": "prompt-lookup", "adaptive": true}))
                .expect("valid")
                .adaptive
        );
        assert_eq!(default.policy, serve_loop::DraftPolicy::Goodput);
        let per_row =
            choice(json!({"provider": "prompt-lookup", "draft_policy": "per-row"})).expect("valid");
        assert_eq!(per_row.policy, serve_loop::DraftPolicy::PerRow);
        assert!(
            per_row.options.is_empty(),
            "`draft_policy` is no provider option"
        );
        assert!(choice(json!({"provider": "prompt-lookup", "draft_policy": "fast"})).is_err());
    }

    #[test]
    fn bad_speculative_objects_are_refused() {
        for body in [
            json!({"provider": "gemma4-assistant"}),
            json!({"provider": "prompt-lookup", "num_draft_tokens": 17}),
            json!({"provider": "prompt-lookup", "max_ngram": [3]}),
        ] {
            let err = choice(body.clone()).expect_err("must fail");
            assert_eq!(
                (err.status, err.param),
                (StatusCode::BAD_REQUEST, Some("speculative")),
                "{body}"
            );
        }
    }
}
