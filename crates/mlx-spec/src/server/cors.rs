//! Cross-origin requests from web pages (`--allowed-origins`): none by
//! default, unlike mlx_lm.server's `*`, so a page the user visits cannot
//! read what a local server answers; each origin listed (or `*`) may call
//! the API from a browser, its preflight answered before any key check
//! (browsers send no credentials with one).

use std::time::Duration;

use anyhow::{bail, Result};
use axum::http::{header, HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The layer for `origins` (each `scheme://host[:port]`, or `*` alone).
pub fn layer(origins: &[String]) -> Result<CorsLayer> {
    let allow = if origins.iter().any(|o| o == "*") {
        if origins.len() > 1 {
            bail!("--allowed-origins: `*` allows every origin; give it alone");
        }
        AllowOrigin::any()
    } else {
        let mut values = Vec::with_capacity(origins.len());
        for origin in origins {
            let well_formed = (origin.starts_with("http://") || origin.starts_with("https://"))
                && !origin.ends_with('/');
            match HeaderValue::from_str(origin) {
                Ok(v) if well_formed => values.push(v),
                _ => bail!(
                    "--allowed-origins `{origin}`: expected an origin such as http://localhost:3000 (scheme, host, optional port, no path)"
                ),
            }
        }
        AllowOrigin::list(values)
    };
    Ok(CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static("anthropic-version"),
            HeaderName::from_static("anthropic-beta"),
        ])
        .max_age(Duration::from_secs(600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked() {
        assert!(layer(&[]).is_ok());
        assert!(layer(&["*".into()]).is_ok());
        assert!(layer(&["http://localhost:3000".into(), "https://ui.example".into()]).is_ok());
        for bad in ["localhost:3000", "http://x/", "*,http://a"] {
            let origins: Vec<String> = bad.split(',').map(str::to_owned).collect();
            let err = layer(&origins).expect_err(bad);
            assert!(err.to_string().contains("--allowed-origins"), "{err}");
        }
    }
}
