//! Loading the tensors of a model directory (single or sharded safetensors)
//! into a strict store: every tensor an architecture takes is checked by name
//! and shape, and tensors nobody took are an error. Layers read it through a
//! [`WeightsView`]: a prefix plus the load settings, narrowed with `pp`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use mlx_ext::quant::Packed;

use crate::adapter::AdapterInStore;
use crate::config::Quantization;
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
    /// A renamed tensor's name in its file (see [`Weights::stored_name`]).
    stored: HashMap<String, String>,
    /// The low-rank adapter put in beside the base tensors, if any.
    adapter: Option<AdapterInStore>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// The safetensors files of a checkpoint directory: the shards its
/// `model.safetensors.index.json` lists, else every `*.safetensors` file
/// (sorted). A directory without any is an error (naming a pickle
/// checkpoint as such).
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
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
pub fn load_file(file: &Path) -> Result<HashMap<String, Array>, ModelError> {
    load_file_with_metadata(file).map(|(tensors, _)| tensors)
}

/// A file's tensors by name and its `__metadata__` map.
pub type TensorsAndMetadata = (HashMap<String, Array>, BTreeMap<String, String>);

/// [`load_file`] and the file's `__metadata__` map (as the header check read
/// it).
pub fn load_file_with_metadata(file: &Path) -> Result<TensorsAndMetadata, ModelError> {
    if !file.exists() {
        return Err(ModelError::Io {
            path: file.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let summary = weights_guard::check_safetensors(file, &weights_guard::Limits::default())
        .map_err(|e| ModelError::WeightsCheck {
            path: file.to_path_buf(),
            context: "",
            source: e.into(),
        })?;
    let tensors = Array::load_safetensors(file).map_err(|e| ModelError::WeightsCheck {
        path: file.to_path_buf(),
        context: "",
        source: e.into(),
    })?;
    Ok((tensors, summary.metadata))
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
            stored: HashMap::new(),
            adapter: None,
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

    /// The dtype of a tensor still in the store.
    pub fn dtype_of(&self, name: &str) -> Option<Dtype> {
        self.tensors.borrow().get(name).map(Array::dtype)
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
            if new != name {
                let stored = self.stored.remove(&name).unwrap_or(name);
                self.stored.insert(new.clone(), stored);
            }
            out.insert(new, array);
        }
        *tensors = out;
        Ok(())
    }

    /// The name tensor `name` has in its file: itself, unless
    /// [`Weights::rename`] renamed it (what streamed experts look up in
    /// the shards' headers).
    pub fn stored_name(&self, name: &str) -> String {
        self.stored
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_owned())
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records the low-rank adapter whose tensors were put in beside the
    /// base ones ([`crate::adapter::Adapter::apply`]).
    pub fn set_adapter(&mut self, adapter: AdapterInStore) {
        self.adapter = Some(adapter);
    }

    /// The low-rank adapter put in, if any.
    pub fn adapter(&self) -> Option<&AdapterInStore> {
        self.adapter.as_ref()
    }

    /// Fails if any tensor was not taken: an adapter's naming the adapter.
    pub fn finish(self) -> Result<(), ModelError> {
        let tensors = self.tensors.into_inner();
        if tensors.is_empty() {
            return Ok(());
        }
        let mut names: Vec<String> = tensors.into_keys().collect();
        names.sort();
        if let Some(adapter) = &self.adapter {
            let mut stray: Vec<String> = names
                .iter()
                .filter(|n| adapter.names.binary_search(n).is_ok())
                .cloned()
                .collect();
            if !stray.is_empty() {
                stray.truncate(8);
                return Err(ModelError::Adapter {
                    path: adapter.file.clone(),
                    message: format!(
                        "{stray:?}: no linear layer of this model takes them (this engine adapts \
                         the linear layers of the model's blocks, not embeddings or experts)"
                    ),
                });
            }
        }
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

    /// The name tensor `leaf` has in its file ([`Weights::stored_name`]).
    pub fn stored_name(&self, leaf: &str) -> String {
        self.weights.stored_name(&self.name(leaf))
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

    /// The low-rank adapter in the store, if any.
    pub fn adapter(&self) -> Option<&AdapterInStore> {
        self.weights.adapter()
    }

    /// Whether this module is stored quantized: it has `scales`. A packed
    /// (`uint32`) `weight` without them is an error naming both tensors.
    pub fn is_quantized(&self) -> Result<bool, ModelError> {
        if self.contains("scales") {
            return Ok(true);
        }
        if self.weights.dtype_of(&self.name("weight")) == Some(Dtype::Uint32) {
            return Err(self.quant_error(format!(
                "`{}` is packed (uint32) but `{}` is missing",
                self.name("weight"),
                self.name("scales")
            )));
        }
        Ok(false)
    }

    /// Takes the packed `weight`, `scales` and (affine only) `biases` of
    /// this module, a `[lead.., out_dim, in_dim]` matrix (or stack) stored
    /// quantized, with the parameters mlx-lm's loader gives it (see
    /// [`Quantization::resolve`]); shapes, dtypes and the mode are checked,
    /// errors name the module or tensor.
    pub fn take_packed(
        &self,
        lead: &[i32],
        out_dim: i32,
        in_dim: i32,
    ) -> Result<Packed, ModelError> {
        let weight = self.take("weight")?;
        let scales = self.take("scales")?;
        let rank = lead.len() + 2;
        for (leaf, t) in [("weight", &weight), ("scales", &scales)] {
            if t.ndim() != rank {
                return Err(self.quant_error(format!(
                    "`{}` has shape {:?}, expected {rank} dimensions",
                    self.name(leaf),
                    t.shape()
                )));
            }
        }
        let params = self
            .quant
            .resolve(
                &self.prefix,
                in_dim,
                weight.dim(-1),
                scales.dim(-1),
                scales.dtype(),
            )?
            .ok_or_else(|| {
                self.quant_error(
                    "stored quantized but the config's quantization block has no parameters \
                     for it (no block, or `false` for this module)"
                        .into(),
                )
            })?;
        if self.contains("global_scale") {
            return Err(self.quant_error(format!(
                "`{}`: nvfp4 tensor scales are not supported",
                self.name("global_scale")
            )));
        }
        if (scales.dtype() == Dtype::Uint8) == params.mode.has_biases() {
            return Err(self.quant_error(format!(
                "`{}` is {:?}, but {params} stores {} scales",
                self.name("scales"),
                scales.dtype(),
                if params.mode.has_biases() {
                    "floating"
                } else {
                    "uint8"
                }
            )));
        }
        if in_dim % params.group_size != 0 {
            return Err(self.quant_error(format!(
                "{in_dim} columns do not divide into groups of {} ({params})",
                params.group_size
            )));
        }
        let shape = |columns: i32| [lead, &[out_dim, columns]].concat();
        let check = |leaf: &str, t: &Array, expected: Vec<i32>| {
            if t.shape() == expected.as_slice() {
                Ok(())
            } else {
                Err(ModelError::TensorShape {
                    name: self.name(leaf),
                    found: t.shape().to_vec(),
                    expected,
                })
            }
        };
        check("weight", &weight, shape(in_dim * params.bits / 32))?;
        check("scales", &scales, shape(in_dim / params.group_size))?;
        let biases = if params.mode.has_biases() {
            Some(self.take_shaped("biases", &shape(in_dim / params.group_size))?)
        } else if self.contains("biases") {
            return Err(self.quant_error(format!(
                "`{}` is stored, but {} quantization has no biases",
                self.name("biases"),
                params.mode
            )));
        } else {
            None
        };
        Packed::from_parts(weight, scales, biases, params).map_err(|source| {
            ModelError::QuantizedCheck {
                module: self.prefix.clone(),
                source,
            }
        })
    }

    fn quant_error(&self, message: String) -> ModelError {
        ModelError::Quantized {
            module: self.prefix.clone(),
            message,
        }
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

/// Quantized test stores, shared by the layer tests.
#[cfg(test)]
pub mod testing {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use mlx_ext::quant::{Packed, QuantParams};
    use mlx_rs::{Array, Dtype};

    use super::Weights;

    /// N(0, 1) float32 values.
    pub fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).expect("key");
        mlx_rs::random::normal::<f32>(shape, None, None, &key).expect("normal")
    }

    /// The largest absolute difference, in float32.
    pub fn max_abs_diff(a: &Array, b: &Array) -> f32 {
        let f = |x: &Array| x.as_dtype(Dtype::Float32).expect("f32");
        let d = f(a).subtract(f(b)).expect("subtract");
        mlx_rs::ops::abs(&d)
            .and_then(|d| d.max(None))
            .expect("max")
            .item_cast::<f32>()
    }

    /// A store holding each `(module, shape)` as random weights packed with
    /// `params` (`{module}.weight`, `.scales`, `.biases` in affine mode), and
    /// each module's dequantized float32 matrix.
    pub fn packed_store(
        modules: &[(&str, &[i32])],
        params: QuantParams,
        seed: u64,
    ) -> (Weights, HashMap<String, Array>) {
        let mut tensors = HashMap::new();
        let mut dense = HashMap::new();
        for (i, (module, shape)) in modules.iter().enumerate() {
            let packed =
                Packed::quantize(&random(shape, seed + i as u64), params).expect("quantize");
            dense.insert(
                (*module).to_owned(),
                packed
                    .dequantize()
                    .and_then(|d| Ok(d.as_dtype(Dtype::Float32)?))
                    .expect("dequantize"),
            );
            let (weight, scales, biases) = packed.into_parts();
            tensors.insert(format!("{module}.weight"), weight);
            tensors.insert(format!("{module}.scales"), scales);
            if let Some(b) = biases {
                tensors.insert(format!("{module}.biases"), b);
            }
        }
        (Weights::from_map(PathBuf::from("mem"), tensors), dense)
    }
}

#[cfg(test)]
mod tests {
    use mlx_ext::quant::{QuantMode, QuantParams};

    use mlx_rs::ops::indexing::IndexOp;

    use super::testing::packed_store;
    use super::*;
    use crate::layers::{Linear, RmsNorm};

    fn block(json: serde_json::Value) -> Quantization {
        Quantization::parse(Some(&json), Path::new("c.json")).expect("block")
    }

    fn load_error(w: &Weights, quant: &Quantization, module: &str) -> String {
        Linear::load(&w.view(quant, DtypePolicy::Keep).pp(module), 64, 8, false)
            .expect_err("must fail")
            .to_string()
    }

    /// mlx-lm's `infer_quant_config`: an mxfp8 module the block does not
    /// name loads under an affine default.
    #[test]
    fn an_unnamed_module_loads_with_the_mode_its_tensors_show() {
        let (w, _) = packed_store(&[("proj", &[8, 64])], QuantMode::Mxfp8.default_params(), 40);
        let quant = block(serde_json::json!({"group_size": 64, "bits": 4, "mode": "affine"}));
        Linear::load(&w.view(&quant, DtypePolicy::Keep).pp("proj"), 64, 8, false)
            .expect("inferred");
        w.finish().expect("every tensor taken");
    }

    #[test]
    fn bad_quantized_modules_name_the_module_or_tensor() {
        let mxfp4 = QuantMode::Mxfp4.default_params();
        let named = |mode: &str, gs: i32, bits: i32| {
            block(serde_json::json!({"group_size": 64, "bits": 4,
                "proj": {"group_size": gs, "bits": bits, "mode": mode}}))
        };
        // Missing scales: a packed weight alone.
        let (w, _) = packed_store(&[("proj", &[8, 64])], mxfp4, 41);
        w.take("proj.scales").expect("drop scales");
        let err = load_error(&w, &named("mxfp4", 32, 4), "proj");
        assert!(
            err.contains("`proj.weight` is packed (uint32) but `proj.scales` is missing"),
            "{err}"
        );
        // An fp mode with a biases tensor.
        let (w, _) = packed_store(&[("proj", &[8, 64])], mxfp4, 42);
        w.insert(
            "proj.biases".into(),
            mlx_rs::ops::zeros::<f32>(&[8, 2]).expect("zeros"),
        );
        let err = load_error(&w, &named("mxfp4", 32, 4), "proj");
        assert!(
            err.contains("`proj.biases` is stored, but mxfp4 quantization has no biases"),
            "{err}"
        );
        // The block says mxfp4; the tensors are affine (float scales).
        let (w, _) = packed_store(&[("proj", &[8, 64])], QuantParams::affine(32, 4), 43);
        let err = load_error(&w, &named("mxfp4", 32, 4), "proj");
        assert!(
            err.contains("`proj`: `proj.scales` is Float32, but mxfp4 (group size 32, 4 bits) stores uint8 scales"),
            "{err}"
        );
        // The block says nvfp4 (group 16); the tensors are mxfp4 (group 32).
        let (w, _) = packed_store(&[("proj", &[8, 64])], mxfp4, 44);
        let err = load_error(&w, &named("nvfp4", 16, 4), "proj");
        assert!(
            err.contains("`proj.scales` has shape [8, 2], expected [8, 4]"),
            "{err}"
        );
        // nvfp4 tensor scales.
        let (w, _) = packed_store(&[("proj", &[8, 64])], QuantMode::Nvfp4.default_params(), 45);
        w.insert(
            "proj.global_scale".into(),
            mlx_rs::ops::zeros::<f32>(&[1]).expect("zeros"),
        );
        let err = load_error(&w, &named("nvfp4", 16, 4), "proj");
        assert!(
            err.contains("`proj.global_scale`: nvfp4 tensor scales are not supported"),
            "{err}"
        );
        // Stored quantized, but the block keeps it full precision.
        let (w, _) = packed_store(&[("proj", &[8, 64])], mxfp4, 47);
        let quant = block(serde_json::json!({"group_size": 64, "bits": 4, "proj": false}));
        let err = load_error(&w, &quant, "proj");
        assert!(
            err.contains("`proj`: stored quantized") && err.contains("`false`"),
            "{err}"
        );
        // Not inferable: uint8 scales, 4 bits, group 64.
        let (w, _) = packed_store(&[("proj", &[8, 64])], mxfp4, 46);
        let scales = w.take("proj.scales").expect("scales");
        w.insert("proj.scales".into(), scales.index((.., ..1)));
        let quant = block(serde_json::json!({"group_size": 64, "bits": 4}));
        let err = load_error(&w, &quant, "proj");
        assert!(
            err.contains("`proj`: cannot infer its quantization mode"),
            "{err}"
        );
    }

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
        assert!(err.contains("`model.proj`: stored quantized"), "{err}");
    }

    #[test]
    fn untaken_tensors_are_named_by_finish() {
        let w = store(&[("model.extra.weight", &[1], Dtype::Float32)]);
        let err = w.finish().expect_err("left over").to_string();
        assert!(err.contains("model.extra.weight"), "{err}");
    }
}
