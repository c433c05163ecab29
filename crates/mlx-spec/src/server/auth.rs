//! API keys: the keys the server accepts (`--api-key`, repeatable, and
//! `--api-keys-file`), and the tenant each one stands for. A request's
//! tenant is `key-N`, N the key's position (from 1) in the order given:
//! flags first, then the file's lines. The key itself never leaves this
//! module.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::api::ApiError;

/// The accepted keys, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeys {
    keys: Vec<String>,
}

impl ApiKeys {
    /// The keys of `flags` then of `file` (one a line; blank lines and
    /// lines starting with `#` skipped, surrounding spaces trimmed). `None`
    /// when no key is given: the server is open. Duplicates, and keys with
    /// spaces or control characters, are errors naming the key's position.
    pub fn load(flags: &[String], file: Option<&Path>) -> Result<Option<Self>> {
        let mut keys: Vec<(String, String)> = flags
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), format!("--api-key #{}", i + 1)))
            .collect();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --api-keys-file {}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let key = line.trim();
                if !key.is_empty() && !key.starts_with('#') {
                    keys.push((key.to_owned(), format!("{} line {}", path.display(), n + 1)));
                }
            }
        }
        for (i, (key, place)) in keys.iter().enumerate() {
            if key.is_empty() || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
                bail!("API key at {place} is empty or holds spaces or control characters");
            }
            if let Some((_, first)) = keys[..i].iter().find(|(k, _)| k == key) {
                bail!("API key at {place} repeats the one at {first}");
            }
        }
        Ok((!keys.is_empty()).then(|| Self {
            keys: keys.into_iter().map(|(k, _)| k).collect(),
        }))
    }

    /// The tenant of `given` (the bearer token), `None` if it is no key.
    pub fn tenant(&self, given: &str) -> Option<String> {
        // Every key is compared in full, so the time taken does not say
        // which key a guess came close to.
        let mut found = None;
        for (i, key) in self.keys.iter().enumerate() {
            if constant_time_eq(key.as_bytes(), given.as_bytes()) {
                found = Some(i);
            }
        }
        found.map(|i| format!("key-{}", i + 1))
    }
}

/// Whether `a` and `b` are equal, in a time that depends on neither their
/// contents nor their lengths' difference: both are hashed to SHA-256
/// digests first, and the two fixed-size digests compared in full.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (da, db) = (Sha256::digest(a), Sha256::digest(b));
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The token of an `Authorization` header value of the `Bearer` scheme,
/// the scheme's name matched case-insensitively (RFC 9110 §11.1).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
        .filter(|t| !t.is_empty())
}

/// The request's tenant under `keys` (`None`: the server requires no key):
/// the tenant of the key sent as `Authorization: Bearer KEY` or as
/// `x-api-key: KEY` (Anthropic's header), on every route; a 401 without a
/// valid one. A request sending both is judged by the bearer token.
pub fn tenant_of(keys: Option<&ApiKeys>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(keys) = keys else {
        return Ok(None);
    };
    let header_text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    header_text(header::AUTHORIZATION.as_str())
        .and_then(bearer_token)
        .or_else(|| header_text("x-api-key").map(str::trim))
        .and_then(|given| keys.tenant(given))
        .map(Some)
        .ok_or_else(ApiError::unauthorized)
}

/// The Host names a server without API keys answers (`--allow-host`, and
/// always the loopback names): a browser page on another site reaching a
/// loopback server through DNS rebinding sends its own name, refused.
#[derive(Debug, Clone, Default)]
pub struct HostCheck {
    /// Off when the server requires API keys.
    pub enabled: bool,
    /// Extra names, lowercase, without a port.
    pub allowed: Vec<String>,
}

impl HostCheck {
    /// A check allowing the loopback names and `allowed` (case-insensitive,
    /// without a port); `enabled` false lets every Host through.
    pub fn new(enabled: bool, allowed: &[String]) -> Self {
        Self {
            enabled,
            allowed: allowed.iter().map(|n| n.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether a request with Host header `host` may be answered.
    pub fn allows(&self, host: Option<&str>) -> bool {
        if !self.enabled {
            return true;
        }
        let Some(name) = host.map(host_name) else {
            return false;
        };
        let name = name.to_ascii_lowercase();
        matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]")
            || self.allowed.iter().any(|a| a == &name)
    }
}

/// The name part of a Host value, its `:port` cut off (`[::1]:80` gives
/// `[::1]`).
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Middleware: a 403 naming the Host when [`HostCheck`] refuses it.
pub async fn check_host(
    State(check): State<Arc<HostCheck>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    if check.allows(host.as_deref()) {
        return next.run(request).await;
    }
    let shown: String = host
        .as_deref()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(100)
        .collect();
    tracing::warn!(host = %shown, "refused a request for a Host not allowed");
    let refusal = ApiError {
        status: StatusCode::FORBIDDEN,
        message: if host.is_none() {
            "a request without a Host header is refused: without API keys this server answers only loopback names and --allow-host ones".to_owned()
        } else {
            format!("Host `{shown}` is not allowed: without API keys this server answers only loopback names and --allow-host ones")
        },
        kind: "invalid_request_error",
        param: None,
        code: Some("host_not_allowed"),
    };
    if super::anthropic::serves(request.uri().path()) {
        super::anthropic::AnthropicError(refusal).into_response()
    } else {
        refusal.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(flags: &[&str], file: Option<&str>) -> Result<Option<ApiKeys>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys");
        if let Some(text) = file {
            std::fs::write(&path, text)?;
        }
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        ApiKeys::load(&flags, file.map(|_| path.as_path()))
    }

    #[test]
    fn each_key_is_its_own_tenant() {
        let k = keys(&["alpha", "beta"], Some("# team keys\n\n  gamma  \n"))
            .expect("valid")
            .expect("keys");
        assert_eq!(k.tenant("alpha").as_deref(), Some("key-1"));
        assert_eq!(k.tenant("beta").as_deref(), Some("key-2"));
        assert_eq!(k.tenant("gamma").as_deref(), Some("key-3"));
        for wrong in ["", "alph", "alphaa", "# team keys", "Beta"] {
            assert_eq!(k.tenant(wrong), None, "{wrong:?}");
        }
        assert_eq!(keys(&[], None).expect("valid"), None, "no key: open");
        assert_eq!(keys(&[], Some("# none\n")).expect("valid"), None);
    }

    #[test]
    fn keys_compare_whatever_their_lengths() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret-and-more"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(constant_time_eq(b"", b""));
        let long = "k".repeat(10_000);
        assert!(constant_time_eq(long.as_bytes(), long.as_bytes()));
        assert!(!constant_time_eq(long.as_bytes(), &long.as_bytes()[1..]));
    }

    #[test]
    fn the_bearer_scheme_matches_in_any_case() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }

    #[test]
    fn the_key_comes_as_bearer_or_as_x_api_key() {
        let k = keys(&["alpha", "beta"], None)
            .expect("valid")
            .expect("keys");
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (name, value) in pairs {
                h.insert(*name, HeaderValue::from_str(value).expect("a header value"));
            }
            h
        };
        let tenant = |pairs: &[(&'static str, &str)]| {
            tenant_of(Some(&k), &headers(pairs)).map_err(|e| e.status)
        };
        assert_eq!(
            tenant(&[("authorization", "Bearer alpha")]),
            Ok(Some("key-1".into()))
        );
        assert_eq!(tenant(&[("x-api-key", "beta")]), Ok(Some("key-2".into())));
        assert_eq!(tenant(&[("x-api-key", " beta ")]), Ok(Some("key-2".into())));
        // Both sent: the bearer token decides, whatever the other says.
        assert_eq!(
            tenant(&[("authorization", "Bearer alpha"), ("x-api-key", "beta")]),
            Ok(Some("key-1".into()))
        );
        assert_eq!(
            tenant(&[("authorization", "Bearer wrong"), ("x-api-key", "beta")]),
            Err(StatusCode::UNAUTHORIZED)
        );
        for refused in [
            &[][..],
            &[("x-api-key", "gamma")][..],
            &[("x-api-key", "")][..],
            &[("authorization", "alpha")][..],
            &[("authorization", "Basic alpha")][..],
        ] {
            assert_eq!(
                tenant(refused),
                Err(StatusCode::UNAUTHORIZED),
                "{refused:?}"
            );
        }
        assert_eq!(
            tenant_of(None, &headers(&[])).map_err(|e| e.status),
            Ok(None)
        );
    }

    #[test]
    fn only_loopback_and_allowed_hosts_pass() {
        let check = HostCheck::new(true, &["My.Box".to_owned()]);
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:5",
            "[::1]",
            "[::1]:8080",
            "my.box",
            "my.box:80",
        ] {
            assert!(check.allows(Some(ok)), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.2",
            "[::2]:80",
            "",
        ] {
            assert!(!check.allows(Some(refused)), "{refused}");
        }
        assert!(!check.allows(None));
        assert!(HostCheck::new(false, &[]).allows(Some("evil.example")));
    }

    #[test]
    fn bad_keys_are_refused_naming_where_they_are() {
        let cases: [(&[&str], Option<&str>, &str); 3] = [
            (
                &["a", "b", "a"],
                None,
                "--api-key #3 repeats the one at --api-key #1",
            ),
            (
                &["a"],
                Some("b\na\n"),
                "line 2 repeats the one at --api-key #1",
            ),
            (&["a b"], None, "--api-key #1 is empty or holds spaces"),
        ];
        for (flags, file, fragment) in cases {
            let message = format!("{:#}", keys(flags, file).expect_err("invalid"));
            assert!(message.contains(fragment), "{message}");
        }
        let missing = ApiKeys::load(&[], Some(Path::new("/nonexistent/keys")));
        assert!(format!("{:#}", missing.expect_err("missing")).contains("/nonexistent/keys"));
    }
}
