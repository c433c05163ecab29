//! Errors in Anthropic's shape, `{"type": "error", "error": {"type",
//! "message"}}`: the server's [`ApiError`]s keep their status and message,
//! and their OpenAI `type` becomes the Anthropic one the status stands for.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::server::api::ApiError;

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The error's body in Anthropic's shape; the field it names (when it
/// names one) leads the message, as Anthropic's own messages do
/// (`max_tokens: Field required`).
pub fn body(e: &ApiError) -> Value {
    let message = match e.param {
        Some(param) if !e.message.contains(param) => format!("{param}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

/// An [`ApiError`] answered in Anthropic's shape.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        (self.0.status, axum::Json(body(&self.0))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_has_its_anthropic_type() {
        for (status, kind) in [
            (StatusCode::BAD_REQUEST, "invalid_request_error"),
            (StatusCode::UNAUTHORIZED, "authentication_error"),
            (StatusCode::FORBIDDEN, "permission_error"),
            (StatusCode::NOT_FOUND, "not_found_error"),
            (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
            (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
            (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        ] {
            assert_eq!(error_type(status), kind, "{status}");
        }
    }

    #[test]
    fn the_body_names_the_field_once() {
        let named = body(&ApiError::invalid("field required", Some("max_tokens")));
        assert_eq!(
            named,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "max_tokens: field required"}})
        );
        let already = body(&ApiError::invalid("`top_p` must be in 0..1", Some("top_p")));
        assert_eq!(already["error"]["message"], "`top_p` must be in 0..1");
        let unauthorized = body(&ApiError::unauthorized());
        assert_eq!(unauthorized["error"]["type"], "authentication_error");
        assert_eq!(unauthorized["type"], "error");
    }
}
