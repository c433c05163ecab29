//! Loading the tensors of a model directory (single or sharded safetensors)
//! into a strict store: every tensor an architecture takes is checked by name
//! and shape, and tensors nobody took are an error. Layers read it through a
//! [`WeightsView`]: a prefix plus the load settings, narrowed with `pp`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use crate::config::{QuantParams, Quantization};
use crate::{DtypePolicy, ModelError};

/// Tensors of a checkpoint, taken out one by one by the model builder.
///
/// Taking goes through a shared reference (the store sits behind a
/// `RefCell`, borrowed only inside one call) so that many [`WeightsView`]s
/// can read from it at once.
#[derive(Debug)]
pub struct Weights {
    dir: PathBuf,
    tensors: RefCell<HashMap<String, Array>>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// The safetensors files of a checkpoint directory: the shards its
/// `model.safetensors.index.json` lists, else every `*.safetensors` file
/// (sorted). A directory without any is an error (naming a pickle
/// checkpoint as such).
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|source| ModelError::Io {
            path: index.clone(),
            source,
        })?;
        let parsed: ShardIndex =
            serde_json::from_str(&text).map_err(|e| ModelError::WeightsCheck {
                path: index.clone(),
                context: "",
                source: e.into(),
            })?;
        let mut shards: Vec<PathBuf> = parsed.weight_map.values().map(|f| dir.join(f)).collect();
        shards.sort();
        shards.dedup();
        shards
    } else {
        let entries = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        found.sort();
        found
    };
    if files.is_empty() {
        // A checkpoint saved as pickle is refused by name: unpickling runs code.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                weights_guard::refuse_pickle(&entry.path()).map_err(|e| {
                    ModelError::WeightsCheck {
                        path: entry.path(),
                        context: "",
                        source: e.into(),
                    }
                })?;
            }
        }
        return Err(ModelError::WeightsFile {
            path: dir.to_path_buf(),
            message: "no *.safetensors files".into(),
        });
    }
    Ok(files)
}

/// The tensors of one safetensors file (loaded lazily by MLX), after our
/// own header validation: MLX never sees a malformed or hostile file.
pub(crate) fn load_file(file: &Path) -> Result<HashMap<String, Array>, ModelError> {
    if !file.exists() {
        return Err(ModelError::Io {
            path: file.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "shard listed in the index is missing",
            ),
        });
    }
    weights_guard::check_safetensors(file, &weights_guard::Limits::default()).map_err(|e| {
        ModelError::WeightsCheck {
            path: file.to_path_buf(),
            context: "",
            source: e.into(),
        }
    })?;
    Array::load_safetensors(file).map_err(|e| ModelError::WeightsCheck {
        path: file.to_path_buf(),
        context: "",
        source: e.into(),
    })
}

impl Weights {
    /// Reads `model.safetensors.index.json` when present (sharded), else every
    /// `*.safetensors` file of `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let files = weight_files(dir)?;
        let mut tensors = HashMap::new();
        for file in &files {
            let loaded = load_file(file)?;
            for (name, array) in loaded {
                if tensors.insert(name.clone(), array).is_some() {
                    return Err(ModelError::WeightsFile {
                        path: file.clone(),
                        message: format!("tensor `{name}` appears in two files"),
                    });
                }
            }
        }
        Ok(Self::from_map(dir.to_path_buf(), tensors))
    }

    /// A store over tensors already in memory (tests, converters).
    pub fn from_map(dir: PathBuf, tensors: HashMap<String, Array>) -> Self {
        Self {
            dir,
            tensors: RefCell::new(tensors),
        }
    }

    /// The root view: full tensor names, loaded under `quant` and `policy`.
    pub fn view<'a>(&'a self, quant: &'a Quantization, policy: DtypePolicy) -> WeightsView<'a> {
        WeightsView {
            weights: self,
            prefix: String::new(),
            quant,
            policy,
        }
    }

    /// Whether a tensor of this name is present (and not yet taken).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.borrow().contains_key(name)
    }

    /// Takes a tensor out of the store.
    pub fn take(&self, name: &str) -> Result<Array, ModelError> {
        self.tensors
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_owned(),
                dir: self.dir.clone(),
            })
    }

    /// Takes a tensor and checks its shape.
    pub fn take_shaped(&self, name: &str, shape: &[i32]) -> Result<Array, ModelError> {
        let t = self.take(name)?;
        if t.shape() != shape {
            return Err(ModelError::TensorShape {
                name: name.to_owned(),
                found: t.shape().to_vec(),
                expected: shape.to_vec(),
            });
        }
        Ok(t)
    }

    /// Puts a tensor (back) into the store: a loader rewriting a layout
    /// (stacking per-expert weights, splitting a fused projection).
    pub fn insert(&self, name: String, array: Array) {
        self.tensors.borrow_mut().insert(name, array);
    }

    /// Drops tensors the architecture knowingly ignores.
    pub fn discard_where(&self, unused: impl Fn(&str) -> bool) {
        self.tensors.borrow_mut().retain(|name, _| !unused(name));
    }

    /// Renames every tensor through `rename` (a checkpoint whose names differ
    /// from the module paths); two tensors landing on one name are an error.
    pub fn rename(&mut self, rename: impl Fn(&str) -> String) -> Result<(), ModelError> {
        let tensors = self.tensors.get_mut();
        let mut out = HashMap::with_capacity(tensors.len());
        for (name, array) in tensors.drain() {
            let new = rename(&name);
            if out.contains_key(&new) {
                return Err(ModelError::WeightsFile {
                    path: self.dir.clone(),
                    message: format!(
                        "two tensors are both named `{new}` once renamed (one was `{name}`)"
                    ),
                });
            }
            out.insert(new, array);
        }
        *tensors = out;
        Ok(())
    }

    /// Fails if any tensor was not taken.
    pub fn finish(self) -> Result<(), ModelError> {
        let tensors = self.tensors.into_inner();
        if tensors.is_empty() {
            return Ok(());
        }
        let mut names: Vec<String> = tensors.into_keys().collect();
        names.sort();
        names.truncate(8);
        Err(ModelError::UnexpectedTensors {
            dir: self.dir,
            names,
        })
    }
}

/// A prefixed window on a [`Weights`] store, carrying what layer loaders
/// need besides names: the checkpoint's quantization block and the dtype
/// policy. `pp` narrows it to a sub-module; every tensor it takes is named
/// in full (prefix included) in lookups and errors.
#[derive(Debug, Clone)]
pub struct WeightsView<'a> {
    weights: &'a Weights,
    prefix: String,
    quant: &'a Quantization,
    policy: DtypePolicy,
}

impl WeightsView<'_> {
    /// The view of sub-module `name` (`model.layers` then `3` reads
    /// `model.layers.3.*`).
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        Self {
            weights: self.weights,
            prefix: self.name(&name.to_string()),
            quant: self.quant,
            policy: self.policy,
        }
    }

    /// The module path this view reads under (empty at the root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full name of tensor `leaf` under this view.
    pub fn name(&self, leaf: &str) -> String {
        if self.prefix.is_empty() {
            leaf.to_owned()
        } else {
            format!("{}.{leaf}", self.prefix)
        }
    }

    /// The dtype policy.
    pub fn policy(&self) -> DtypePolicy {
        self.policy
    }

    /// The quantization parameters of this module (the view's prefix), for
    /// one stored quantized; an error naming the module when the config's
    /// quantization block has none.
    pub fn quant_params(&self) -> Result<QuantParams, ModelError> {
        self.quant.for_module(&self.prefix).ok_or_else(|| {
            ModelError::Spec(spec_core::SpecError::Invalid(format!(
                "`{}` is stored quantized but the config's quantization block has no \
                 parameters for it",
                self.prefix
            )))
        })
    }

    /// Whether tensor `leaf` is present (and not yet taken).
    pub fn contains(&self, leaf: &str) -> bool {
        self.weights.contains(&self.name(leaf))
    }

    /// Takes tensor `leaf`.
    pub fn take(&self, leaf: &str) -> Result<Array, ModelError> {
        self.weights.take(&self.name(leaf))
    }

    /// Puts tensor `leaf` (back): a loader rewriting a layout.
    pub fn insert(&self, leaf: &str, array: Array) {
        self.weights.insert(self.name(leaf), array);
    }

    /// Takes tensor `leaf` and checks its shape.
    pub fn take_shaped(&self, leaf: &str, shape: &[i32]) -> Result<Array, ModelError> {
        self.weights.take_shaped(&self.name(leaf), shape)
    }

    /// Takes tensor `leaf`, checks its shape and casts it as the policy says
    /// (float32 under `Float32`, untouched under `Keep`).
    pub fn take_cast(&self, leaf: &str, shape: &[i32]) -> Result<Array, ModelError> {
        self.cast(self.take_shaped(leaf, shape)?)
    }

    /// Casts `a` as the policy says.
    pub fn cast(&self, a: Array) -> Result<Array, ModelError> {
        match self.policy {
            DtypePolicy::Float32 if a.dtype() != Dtype::Float32 => Ok(a.as_dtype(Dtype::Float32)?),
            _ => Ok(a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{Linear, RmsNorm};

    fn store(tensors: &[(&str, &[i32], Dtype)]) -> Weights {
        let map = tensors
            .iter()
            .map(|(name, shape, dtype)| {
                let zeros = mlx_rs::ops::zeros::<f32>(shape).expect("zeros");
                ((*name).to_owned(), zeros.as_dtype(*dtype).expect("cast"))
            })
            .collect();
        Weights::from_map(PathBuf::from("mem"), map)
    }

    #[test]
    fn pp_joins_names_with_dots_from_an_empty_root() {
        let w = store(&[]);
        let quant = Quantization::default();
        let root = w.view(&quant, DtypePolicy::Keep);
        assert_eq!(root.name("lm_head"), "lm_head");
        let layer = root.pp("model.layers").pp(3);
        assert_eq!(layer.prefix(), "model.layers.3");
        assert_eq!(
            layer.pp("self_attn").name("q_proj"),
            "model.layers.3.self_attn.q_proj"
        );
    }

    #[test]
    fn loaders_take_full_names_and_errors_name_the_full_tensor() {
        let w = store(&[
            ("model.layers.0.q_proj.weight", &[4, 2], Dtype::Float32),
            ("model.layers.0.norm.weight", &[2], Dtype::Float32),
            ("model.layers.0.k_proj.weight", &[4, 3], Dtype::Float32),
        ]);
        let quant = Quantization::default();
        let vb = w.view(&quant, DtypePolicy::Float32);
        let p = vb.pp("model.layers").pp(0);
        Linear::load(&p.pp("q_proj"), 2, 4, false).expect("q_proj");
        RmsNorm::load(&p.pp("norm"), 2, 1e-6).expect("norm");
        let missing = Linear::load(&p.pp("v_proj"), 2, 4, false).expect_err("missing");
        assert!(
            missing.to_string().contains("model.layers.0.v_proj.weight"),
            "{missing}"
        );
        let shaped = Linear::load(&p.pp("k_proj"), 2, 4, false).expect_err("shape");
        assert!(
            shaped.to_string().contains("model.layers.0.k_proj.weight"),
            "{shaped}"
        );
        w.finish().expect("every tensor taken");
    }

    #[test]
    fn take_cast_follows_the_dtype_policy() {
        let w = store(&[("a", &[1], Dtype::Bfloat16), ("b", &[1], Dtype::Bfloat16)]);
        let quant = Quantization::default();
        let float = w.view(&quant, DtypePolicy::Float32);
        assert_eq!(
            float.take_cast("a", &[1]).expect("a").dtype(),
            Dtype::Float32
        );
        let keep = w.view(&quant, DtypePolicy::Keep);
        assert_eq!(
            keep.take_cast("b", &[1]).expect("b").dtype(),
            Dtype::Bfloat16
        );
    }

    #[test]
    fn a_quantized_module_without_parameters_is_named() {
        let w = store(&[
            ("model.proj.weight", &[4, 1], Dtype::Uint32),
            ("model.proj.scales", &[4, 1], Dtype::Float32),
        ]);
        let quant = Quantization::default();
        let err = Linear::load(
            &w.view(&quant, DtypePolicy::Keep).pp("model.proj"),
            8,
            4,
            false,
        )
        .expect_err("no parameters")
        .to_string();
        assert!(err.contains("`model.proj` is stored quantized"), "{err}");
    }

    #[test]
    fn untaken_tensors_are_named_by_finish() {
        let w = store(&[("model.extra.weight", &[1], Dtype::Float32)]);
        let err = w.finish().expect_err("left over").to_string();
        assert!(err.contains("model.extra.weight"), "{err}");
    }
}
