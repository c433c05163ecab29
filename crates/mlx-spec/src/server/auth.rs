//! API keys: the keys the server accepts (`--api-key`, repeatable, and
//! `--api-keys-file`), and the tenant each one stands for. A request's
//! tenant is `key-N`, N the key's position (from 1) in the order given:
//! flags first, then the file's lines. The key itself never leaves this
//! module.

use std::path::Path;

use anyhow::{bail, Context, Result};

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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
