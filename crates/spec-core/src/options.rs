//! Provider options (`key = value` strings from a command line or a
//! request) and their typed reading by a provider, with errors that name
//! the provider and the key.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

use crate::SpecError;

/// Options of a provider, as given on the command line or in a request
/// (`--draft-model PATH` is `{"model": "PATH"}`). Hosts build it; a
/// provider reads it through [`ProviderOptions::reader`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderOptions {
    map: BTreeMap<String, String>,
}

impl ProviderOptions {
    /// No options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, returning the value it replaces.
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        self.map.insert(key, value)
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// Whether `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Whether no option is set.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The `(key, value)` pairs, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Typed access for `provider` after checking that every key set is one
    /// of `known` (the strict "no unknown keys" check): an unknown key is an
    /// error naming the provider, the key and the known keys.
    pub fn reader<'a>(
        &'a self,
        provider: &'a str,
        known: &[&str],
    ) -> Result<OptionReader<'a>, SpecError> {
        if let Some((key, value)) = self.iter().find(|(k, _)| !known.contains(k)) {
            let known = if known.is_empty() {
                "this provider takes none".to_owned()
            } else {
                let mut sorted = known.to_vec();
                sorted.sort_unstable();
                format!("known options: {}", sorted.join(", "))
            };
            return Err(SpecError::Provider {
                id: provider.to_owned(),
                message: format!("unknown option `{key}` = `{value}` ({known})"),
            });
        }
        Ok(OptionReader {
            provider,
            options: self,
        })
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for ProviderOptions {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self {
            map: iter
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }
}

impl<K: Into<String>, V: Into<String>> Extend<(K, V)> for ProviderOptions {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        self.map
            .extend(iter.into_iter().map(|(k, v)| (k.into(), v.into())));
    }
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for ProviderOptions {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

/// Which dtype a model's weights run in; a drafter's common `dtype` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DtypePolicy {
    /// Float32 weights, dequantizing quantized ones at load (`dtype=f32`,
    /// the default): on a CPU-only MLX this is the fast path (float32
    /// matmuls go through BLAS).
    #[default]
    Float32,
    /// The file's dtype and quantization, as mlx-lm runs them
    /// (`dtype=keep`).
    Keep,
}

/// The values of the common `dtype` option.
pub const DTYPE_CHOICES: [(&str, DtypePolicy); 2] =
    [("f32", DtypePolicy::Float32), ("keep", DtypePolicy::Keep)];

/// Typed, checked reading of one provider's options; every error is a
/// [`SpecError::Provider`] naming the provider, and the key and value at
/// fault.
#[derive(Debug, Clone, Copy)]
pub struct OptionReader<'a> {
    provider: &'a str,
    options: &'a ProviderOptions,
}

impl<'a> OptionReader<'a> {
    /// The raw value of `key`.
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        self.options.get(key)
    }

    /// A provider error naming the provider (for checks across keys).
    pub fn error(&self, message: impl Into<String>) -> SpecError {
        SpecError::Provider {
            id: self.provider.to_owned(),
            message: message.into(),
        }
    }

    /// `key` parsed by `parse`, `None` when unset; a value `parse` refuses
    /// is an error saying what was `expected`.
    pub fn parse_with<T>(
        &self,
        key: &str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, SpecError> {
        match self.raw(key) {
            None => Ok(None),
            Some(value) => parse(value).map(Some).ok_or_else(|| {
                self.error(format!("option `{key}` = `{value}`: expected {expected}"))
            }),
        }
    }

    /// `key` parsed with `FromStr`, `None` when unset; an unparsable value
    /// is a [`SpecError::OptionValue`] whose `source()` is the parser's error.
    pub fn get<T: FromStr>(&self, key: &str) -> Result<Option<T>, SpecError>
    where
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        match self.raw(key) {
            None => Ok(None),
            Some(value) => value.parse().map(Some).map_err(|e| SpecError::OptionValue {
                provider: self.provider.to_owned(),
                key: key.to_owned(),
                value: value.to_owned(),
                source: Box::new(e),
            }),
        }
    }

    /// `key`, which must be set: `what` says what it is in the error.
    pub fn required(&self, key: &str, what: &str) -> Result<&'a str, SpecError> {
        self.raw(key)
            .ok_or_else(|| self.error(format!("option `{key}` ({what}) is required")))
    }

    /// `key` as a whole number of at least 1, `None` when unset.
    pub fn positive(&self, key: &str) -> Result<Option<usize>, SpecError> {
        self.parse_with(key, "a whole number of at least 1", |v| {
            v.parse::<usize>().ok().filter(|&n| n >= 1)
        })
    }

    /// `key` as one of the named `choices`, `None` when unset.
    pub fn choice<T: Copy>(
        &self,
        key: &str,
        choices: &[(&str, T)],
    ) -> Result<Option<T>, SpecError> {
        let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
        let expected = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        };
        self.parse_with(key, &expected, |v| {
            choices.iter().find(|(name, _)| *name == v).map(|(_, t)| *t)
        })
    }

    /// The common `model` option: the drafter checkpoint's path, required.
    pub fn model(&self) -> Result<PathBuf, SpecError> {
        self.required("model", "the drafter checkpoint's path")
            .map(PathBuf::from)
    }

    /// The common `dtype` option: `f32` (the default) or `keep`.
    pub fn dtype(&self) -> Result<DtypePolicy, SpecError> {
        Ok(self.choice("dtype", &DTYPE_CHOICES)?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "test-provider";

    fn options(pairs: &[(&str, &str)]) -> ProviderOptions {
        pairs.iter().copied().collect()
    }

    /// The message of a provider error, after checking it names `ID`.
    fn message<T: std::fmt::Debug>(result: Result<T, SpecError>) -> String {
        match result {
            Err(SpecError::Provider { id, message }) => {
                assert_eq!(id, ID);
                message
            }
            other => panic!("expected a provider error, got {other:?}"),
        }
    }

    #[test]
    fn unknown_keys_name_the_provider_the_key_and_the_known_keys() {
        let o = options(&[("model", "m"), ("treshold", "0.5")]);
        let m = message(o.reader(ID, &["threshold", "model"]));
        assert_eq!(
            m,
            "unknown option `treshold` = `0.5` (known options: model, threshold)"
        );
        let m = message(options(&[("x", "1")]).reader(ID, &[]));
        assert_eq!(m, "unknown option `x` = `1` (this provider takes none)");
        let err = options(&[("x", "1")]).reader(ID, &[]).expect_err("unknown");
        assert!(err
            .to_string()
            .starts_with("draft provider `test-provider`: "));
        assert!(options(&[("model", "m")]).reader(ID, &["model"]).is_ok());
        assert!(ProviderOptions::new().reader(ID, &[]).is_ok());
    }

    #[test]
    fn typed_getters_name_the_key_and_the_value() {
        let o = options(&[
            ("n", "4"),
            ("zero", "0"),
            ("word", "two"),
            ("f", "0.25"),
            ("mode", "fast"),
        ]);
        let r = o
            .reader(ID, &["n", "zero", "word", "f", "mode", "unset"])
            .expect("known");
        assert_eq!(r.positive("n").expect("valid"), Some(4));
        assert_eq!(r.positive("unset").expect("unset"), None);
        assert_eq!(
            message(r.positive("zero")),
            "option `zero` = `0`: expected a whole number of at least 1"
        );
        assert!(message(r.positive("word")).contains("`word` = `two`"));
        assert_eq!(r.get::<f32>("f").expect("valid"), Some(0.25));
        let err = r.get::<f32>("word").expect_err("not a number");
        assert!(
            matches!(&err, SpecError::OptionValue { key, .. } if key == "word"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "draft provider `test-provider`: option `word` = `two`: invalid float literal"
        );
        assert!(
            std::error::Error::source(&err).is_some_and(|e| e.is::<std::num::ParseFloatError>())
        );
        assert_eq!(
            r.parse_with("f", "a number above 1", |v| v
                .parse::<f32>()
                .ok()
                .filter(|&f| f > 1.0))
                .map_err(|e| e.to_string()),
            Err(
                "draft provider `test-provider`: option `f` = `0.25`: expected a number above 1"
                    .to_owned()
            )
        );
        let three = [("a", 1), ("b", 2), ("c", 3)];
        assert_eq!(
            message(r.choice("word", &three)),
            "option `word` = `two`: expected a, b or c"
        );
        let modes = [("fast", 1), ("slow", 2)];
        assert_eq!(r.choice("mode", &modes).expect("valid"), Some(1));
        assert_eq!(r.choice("unset", &modes).expect("unset"), None);
        assert_eq!(
            message(r.choice("word", &modes)),
            "option `word` = `two`: expected fast or slow"
        );
        assert_eq!(r.required("n", "a count").expect("set"), "4");
        assert_eq!(
            message(r.required("unset", "a count")),
            "option `unset` (a count) is required"
        );
    }

    #[test]
    fn the_common_model_and_dtype_options() {
        let o = options(&[("model", "/m"), ("dtype", "keep")]);
        let r = o.reader(ID, &["model", "dtype"]).expect("known");
        assert_eq!(r.model().expect("set"), PathBuf::from("/m"));
        assert_eq!(r.dtype().expect("valid"), DtypePolicy::Keep);

        let none = ProviderOptions::new();
        let r = none.reader(ID, &["model", "dtype"]).expect("known");
        assert_eq!(r.dtype().expect("default"), DtypePolicy::Float32);
        assert_eq!(
            message(r.model()),
            "option `model` (the drafter checkpoint's path) is required"
        );

        let bad = options(&[("dtype", "f16")]);
        let r = bad.reader(ID, &["dtype"]).expect("known");
        assert_eq!(
            message(r.dtype()),
            "option `dtype` = `f16`: expected f32 or keep"
        );
    }

    #[test]
    fn options_are_built_like_a_map() {
        let mut o = ProviderOptions::new();
        assert!(o.is_empty());
        assert_eq!(o.insert("b".into(), "2".into()), None);
        assert_eq!(o.insert("a".into(), "1".into()), None);
        assert_eq!(o.insert("b".into(), "3".into()), Some("2".to_owned()));
        assert_eq!(o.get("b"), Some("3"));
        assert_eq!(o.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "3")]);
        assert_eq!(o, options(&[("b", "3"), ("a", "1")]));
    }
}
