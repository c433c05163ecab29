//! A flag whose value is a JSON object of template variables
//! (`generate --chat-template-config`, `serve --chat-template-args`).

use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// `text`, given to `flag`, as a JSON object.
pub fn object(flag: &str, text: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => bail!("{flag}: expected a JSON object, got {other}"),
        Err(e) => bail!("{flag}: not JSON ({e})"),
    }
}
