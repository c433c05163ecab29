//! Typed, key-by-key reading of a drafter's `config.json` object: a missing
//! key, a value of the wrong type or range and a value the drafter does not
//! implement each become the reading crate's own error, naming the key
//! (with the path of the object it sits in, `dflash_config.block_size`).

use std::marker::PhantomData;
use std::path::Path;

use serde_json::{Map, Value};

/// How a crate's error type says the three things a key reader reports.
pub trait KeyError: Sized {
    /// `key` is absent (or null).
    fn missing(path: &Path, key: String) -> Self;
    /// `key` holds a value of the wrong type or range.
    fn invalid(path: &Path, key: String, message: String) -> Self;
    /// `key` holds `value` (as JSON), which is not implemented.
    fn unsupported(path: &Path, key: String, value: String, supported: String) -> Self;
}

/// The runtime's own error: every message names the key
/// (`ModelError::Config`).
impl KeyError for crate::ModelError {
    fn missing(path: &Path, key: String) -> Self {
        Self::Config {
            path: path.to_path_buf(),
            message: format!("`{key}` is missing"),
        }
    }
    fn invalid(path: &Path, key: String, message: String) -> Self {
        Self::Config {
            path: path.to_path_buf(),
            message: format!("`{key}`: {message}"),
        }
    }
    fn unsupported(path: &Path, key: String, value: String, supported: String) -> Self {
        Self::Config {
            path: path.to_path_buf(),
            message: format!("`{key}` {value} is not implemented (supported: {supported})"),
        }
    }
}

/// Typed access to the keys of one JSON object of a config file.
#[derive(Debug)]
pub struct Keys<'a, E> {
    map: &'a Map<String, Value>,
    path: &'a Path,
    prefix: String,
    error: PhantomData<E>,
}

impl<'a, E: KeyError> Keys<'a, E> {
    /// The keys of `map`, the top level of the config file at `path`.
    pub fn new(map: &'a Map<String, Value>, path: &'a Path) -> Self {
        Self {
            map,
            path,
            prefix: String::new(),
            error: PhantomData,
        }
    }

    /// The keys of the object under `key`, named `key.inner` in errors;
    /// `None` when it is absent or null, an error when it is not an object.
    pub fn nested(&self, key: &str) -> Result<Option<Keys<'a, E>>, E> {
        let Some(v) = self.map.get(key).filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let map = v
            .as_object()
            .ok_or_else(|| self.invalid(key, format!("expected an object, got {v}")))?;
        Ok(Some(Keys {
            map,
            path: self.path,
            prefix: format!("{}{key}.", self.prefix),
            error: PhantomData,
        }))
    }

    /// The full name of `key` as errors give it.
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The raw object.
    pub fn map(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// The error for an absent `key`.
    pub fn missing(&self, key: &str) -> E {
        E::missing(self.path, self.name(key))
    }

    /// The error for a bad value of `key`.
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> E {
        E::invalid(self.path, self.name(key), message.into())
    }

    /// The error for an unimplemented `value` of `key`.
    pub fn unsupported(&self, key: &str, value: &Value, supported: &str) -> E {
        E::unsupported(
            self.path,
            self.name(key),
            value.to_string(),
            supported.to_owned(),
        )
    }

    /// `key`'s value, when present and not null.
    pub fn opt(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// `key`'s value; absent or null is an error.
    pub fn get(&self, key: &str) -> Result<&'a Value, E> {
        self.opt(key).ok_or_else(|| self.missing(key))
    }

    /// A positive integer that fits `i32`.
    pub fn positive(&self, key: &str) -> Result<i32, E> {
        let v = self.get(key)?;
        v.as_i64()
            .filter(|&n| n > 0 && n <= i64::from(i32::MAX))
            .map(|n| n as i32)
            .ok_or_else(|| self.invalid(key, format!("expected a positive integer, got {v}")))
    }

    /// A non-negative integer that fits `i32`.
    pub fn non_negative(&self, key: &str) -> Result<i32, E> {
        let v = self.get(key)?;
        v.as_i64()
            .filter(|&n| (0..=i64::from(i32::MAX)).contains(&n))
            .map(|n| n as i32)
            .ok_or_else(|| self.invalid(key, format!("expected a non-negative integer, got {v}")))
    }

    /// A finite number.
    pub fn float(&self, key: &str) -> Result<f64, E> {
        let v = self.get(key)?;
        v.as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| self.invalid(key, format!("expected a number, got {v}")))
    }

    /// `true` or `false`.
    pub fn boolean(&self, key: &str) -> Result<bool, E> {
        let v = self.get(key)?;
        v.as_bool()
            .ok_or_else(|| self.invalid(key, format!("expected true or false, got {v}")))
    }

    /// [`Keys::positive`] when present and not null, else `default`.
    pub fn positive_or(&self, key: &str, default: i32) -> Result<i32, E> {
        self.opt(key).map_or(Ok(default), |_| self.positive(key))
    }

    /// [`Keys::float`] when present and not null, else `default`.
    pub fn float_or(&self, key: &str, default: f64) -> Result<f64, E> {
        self.opt(key).map_or(Ok(default), |_| self.float(key))
    }

    /// [`Keys::boolean`] when present and not null, else `default`.
    pub fn boolean_or(&self, key: &str, default: bool) -> Result<bool, E> {
        self.opt(key).map_or(Ok(default), |_| self.boolean(key))
    }

    /// A list of target decoder-layer indices to tap: non-empty, strictly
    /// increasing, each below `num_target_layers`. `-1` (the embedding
    /// output, which some trainers tap) is refused: targets here tap
    /// decoder-layer outputs only.
    pub fn layer_ids(&self, key: &str, num_target_layers: usize) -> Result<Vec<usize>, E> {
        let v = self.get(key)?;
        let items = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
            self.invalid(
                key,
                format!("expected a non-empty list of layer indices, got {v}"),
            )
        })?;
        let mut taps = Vec::with_capacity(items.len());
        for item in items {
            let id = item
                .as_i64()
                .ok_or_else(|| self.invalid(key, format!("{item} is not an integer")))?;
            if id == -1 {
                return Err(self.unsupported(
                    key,
                    v,
                    "decoder-layer indices (the embedding output, -1, is not tapped)",
                ));
            }
            let id = usize::try_from(id)
                .ok()
                .filter(|&i| i < num_target_layers)
                .ok_or_else(|| {
                    self.invalid(
                        key,
                        format!("{id} is outside the target's {num_target_layers} layers"),
                    )
                })?;
            if taps.last().is_some_and(|&prev| prev >= id) {
                return Err(self.invalid(key, format!("{v} is not strictly increasing")));
            }
            taps.push(id);
        }
        Ok(taps)
    }
}
