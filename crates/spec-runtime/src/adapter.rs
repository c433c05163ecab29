//! Fine-tuned adapters as `mlx_lm.lora` writes them (`--adapter-path DIR`):
//! `adapter_config.json` and `adapters.safetensors`.
//!
//! - `fine_tune_type` `lora` (the default) and `dora`: the file holds
//!   `{module}.lora_a` (`[in, rank]`), `{module}.lora_b` (`[rank, out]`)
//!   and, for DoRA, `{module}.m` (`[out]`) for linear layers of the model's
//!   blocks. They go into the weight store beside the base weights; each
//!   [`crate::layers::Linear`] that finds them under its name applies them
//!   as mlx-lm's `LoRALinear` / `DoRALinear` do, unfused (a linear layer
//!   the file says nothing of is one whose `lora_b` mlx-lm leaves at zero:
//!   the update is an exact no-op, so it is left out).
//! - `full`: the file holds replacement tensors under the model's own names;
//!   each replaces the base tensor of that name and shape.
//!
//! A tensor the model does not take (a layer this engine keeps in another
//! form, an embedding or expert update) is an error naming it, as is a
//! tensor that is no adapter parameter.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::linalg::{norm_l2, NormOptions};
use mlx_rs::ops::gather_mm;
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use crate::weights::{load_file, Weights, WeightsView};
use crate::ModelError;

/// The command-line option that names an adapter directory.
pub const ADAPTER_OPTION: &str = "--adapter-path";

/// The adapter's configuration file in its directory.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// The adapter's tensors in its directory.
pub const TENSORS_FILE: &str = "adapters.safetensors";

/// How the adapter was trained (`fine_tune_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FineTune {
    /// Low-rank updates added to linear layers.
    Lora,
    /// LoRA whose rows are renormalised to a learned magnitude `m`.
    Dora,
    /// Replacement weights.
    Full,
}

/// What a linear layer needs to apply a low-rank update found under its
/// name: the kind, the update's scale and rank (`lora_parameters`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LowRankSettings {
    /// Whether it is DoRA (else LoRA).
    pub dora: bool,
    /// Multiplies `x A B`.
    pub scale: f32,
    /// The inner width of every update.
    pub rank: i32,
}

#[derive(Deserialize)]
struct ConfigFile {
    fine_tune_type: Option<String>,
    num_layers: Option<i64>,
    lora_parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

/// An adapter read from its directory, ready to go into a weight store.
#[derive(Debug)]
pub struct Adapter {
    dir: PathBuf,
    fine_tune: FineTune,
    /// `None` for a full fine-tune.
    low_rank: Option<LowRankSettings>,
    /// `num_layers`: the blocks it adapts, counted from the last (0 or
    /// less: all, as mlx-lm's `layers[-max(n, 0):]` reads it).
    num_layers: i64,
    tensors: HashMap<String, Array>,
}

/// The leaf names a LoRA / DoRA file may hold.
const LOW_RANK_LEAVES: &[&str] = &["lora_a", "lora_b", "m"];

impl Adapter {
    /// Reads the adapter at `dir` (its tensors are loaded lazily, after
    /// the header check every weight file gets).
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::Adapter {
                path: dir.to_path_buf(),
                message: "no such adapter directory".into(),
            });
        }
        let config_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let config: ConfigFile = serde_json::from_str(&text)
            .map_err(|e| ModelError::config_parse(&config_path, "", e))?;
        let bad = |message: String| ModelError::Adapter {
            path: config_path.clone(),
            message,
        };
        let fine_tune = match config.fine_tune_type.as_deref().unwrap_or("lora") {
            "lora" => FineTune::Lora,
            "dora" => FineTune::Dora,
            "full" => FineTune::Full,
            other => {
                return Err(bad(format!(
                    "fine_tune_type `{other}` (known: lora, dora, full)"
                )))
            }
        };
        let low_rank = match fine_tune {
            FineTune::Full => None,
            FineTune::Lora | FineTune::Dora => {
                if config.num_layers.is_none() {
                    return Err(bad("`num_layers` is missing".into()));
                }
                let params = config
                    .lora_parameters
                    .as_ref()
                    .ok_or_else(|| bad("`lora_parameters` is missing".into()))?;
                let scale = match params.get("scale").and_then(serde_json::Value::as_f64) {
                    Some(s) if s.is_finite() => s as f32,
                    Some(_) | None if params.contains_key("scale") => {
                        return Err(bad("`lora_parameters.scale` is not a finite number".into()))
                    }
                    _ => {
                        let hint = if params.contains_key("alpha") {
                            " (found `alpha`: mlx-lm's adapters give `scale` instead)"
                        } else {
                            ""
                        };
                        return Err(bad(format!("`lora_parameters.scale` is missing{hint}")));
                    }
                };
                let rank = params
                    .get("rank")
                    .and_then(serde_json::Value::as_u64)
                    .filter(|r| (1..=65_536).contains(r))
                    .ok_or_else(|| {
                        bad("`lora_parameters.rank` is missing or not a positive integer".into())
                    })?;
                Some(LowRankSettings {
                    dora: fine_tune == FineTune::Dora,
                    scale,
                    rank: rank as i32,
                })
            }
        };
        let tensors = load_file(&dir.join(TENSORS_FILE))?;
        if tensors.is_empty() {
            return Err(ModelError::Adapter {
                path: dir.join(TENSORS_FILE),
                message: "holds no tensors".into(),
            });
        }
        if low_rank.is_some() {
            let mut strays: Vec<&String> = tensors
                .keys()
                .filter(|name| {
                    let leaf = name.rsplit('.').next().unwrap_or(name);
                    !LOW_RANK_LEAVES.contains(&leaf) || (leaf == "m" && fine_tune != FineTune::Dora)
                })
                .collect();
            if !strays.is_empty() {
                strays.sort();
                return Err(ModelError::Adapter {
                    path: dir.join(TENSORS_FILE),
                    message: format!(
                        "{strays:?}: not {} adapter parameters (lora_a, lora_b{})",
                        if fine_tune == FineTune::Dora {
                            "DoRA"
                        } else {
                            "LoRA"
                        },
                        if fine_tune == FineTune::Dora {
                            ", m"
                        } else {
                            ""
                        }
                    ),
                });
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            fine_tune,
            low_rank,
            num_layers: config.num_layers.unwrap_or(0),
            tensors,
        })
    }

    /// How it was trained.
    pub fn fine_tune(&self) -> FineTune {
        self.fine_tune
    }

    /// Kind, scale and rank of a low-rank adapter; `None` for a full
    /// fine-tune.
    pub fn low_rank(&self) -> Option<LowRankSettings> {
        self.low_rank
    }

    /// Its `adapters.safetensors` (named in errors).
    pub fn file(&self) -> PathBuf {
        self.dir.join(TENSORS_FILE)
    }

    /// Its tensors by name (mlx-lm's module paths).
    pub fn into_tensors(self) -> HashMap<String, Array> {
        self.tensors
    }

    /// A low-rank adapter's tensors must each sit in one of the last
    /// `num_layers` of a model's `blocks` blocks (mlx-lm adapts no other and
    /// would ignore them); an error names the first that does not.
    pub fn check_blocks(&self, blocks: usize) -> Result<(), ModelError> {
        if self.low_rank.is_none() {
            return Ok(());
        }
        let first = match usize::try_from(self.num_layers) {
            Ok(n) if n > 0 => blocks.saturating_sub(n),
            _ => 0,
        };
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        let outside = names.into_iter().find_map(|name| {
            let block = name
                .split(".layers.")
                .nth(1)?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()?;
            (block < first || block >= blocks).then_some((name, block))
        });
        match outside {
            Some((name, block)) => Err(ModelError::Adapter {
                path: self.file(),
                message: format!(
                    "`{name}` adapts block {block}, outside the last {} of the model's \
                     {blocks} blocks (`num_layers` {})",
                    blocks - first,
                    self.num_layers
                ),
            }),
            None => Ok(()),
        }
    }

    /// Puts the adapter into `weights` (a model of `blocks` blocks):
    /// replacement tensors over the base ones (`full`, each checked against
    /// the base tensor's shape), or the low-rank tensors beside them for
    /// the linear layers to take, each in one of the last `num_layers`
    /// blocks (mlx-lm adapts no other, and refuses a file that says
    /// otherwise).
    pub fn apply(self, weights: &mut Weights, blocks: usize) -> Result<(), ModelError> {
        let file = self.file();
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort();
        self.check_blocks(blocks)?;
        let Some(settings) = self.low_rank else {
            for (name, array) in self.tensors {
                let base = weights.take(&name).map_err(|_| ModelError::Adapter {
                    path: file.clone(),
                    message: format!("`{name}` is not a parameter of the model"),
                })?;
                if base.shape() != array.shape() {
                    return Err(ModelError::Adapter {
                        path: file.clone(),
                        message: format!(
                            "`{name}` has shape {:?}, the model's {:?}",
                            array.shape(),
                            base.shape()
                        ),
                    });
                }
                weights.insert(name, array);
            }
            return Ok(());
        };
        for (name, array) in self.tensors {
            if weights.contains(&name) {
                return Err(ModelError::Adapter {
                    path: file.clone(),
                    message: format!("`{name}` is also a tensor of the model"),
                });
            }
            weights.insert(name, array);
        }
        weights.set_adapter(AdapterInStore {
            file,
            settings,
            names,
        });
        Ok(())
    }
}

/// Puts the adapter `options` name (if any) into `weights`, a model of
/// `blocks` blocks whose tensors carry mlx-lm's module paths (each family
/// calls it after its sanitize step).
pub fn apply_option(
    options: &crate::LoadOptions,
    weights: &mut Weights,
    blocks: usize,
) -> Result<(), ModelError> {
    match &options.adapter {
        Some(dir) => Adapter::load(dir)?.apply(weights, blocks),
        None => Ok(()),
    }
}

/// What a weight store keeps of a low-rank adapter put into it.
#[derive(Debug, Clone)]
pub struct AdapterInStore {
    /// `adapters.safetensors` (named in errors).
    pub file: PathBuf,
    /// Kind, scale and rank.
    pub settings: LowRankSettings,
    /// Every tensor it put in (sorted): those left untaken are reported
    /// as the adapter's.
    pub names: Vec<String>,
}

/// A low-rank update of one linear layer: `y + scale (x A) B`, and for
/// DoRA the rows renormalised, `(m / |W + scale (A B)^T|) (...)`.
#[derive(Debug)]
pub struct LowRank {
    a: Option<(Array, Array)>,
    scale: f32,
    /// DoRA's `m / |W'|` per output row.
    magnitude: Option<Array>,
}

impl LowRank {
    /// The update under `vb` (a linear layer's view) if the store holds an
    /// adapter with tensors for it. `dense` gives the layer's weight
    /// (`[out, in]`, dequantized where stored packed), which DoRA needs.
    pub fn load(
        vb: &WeightsView<'_>,
        in_dim: i32,
        out_dim: i32,
        dense: impl FnOnce() -> Result<Array, ModelError>,
    ) -> Result<Option<Self>, ModelError> {
        let Some(adapter) = vb.adapter() else {
            return Ok(None);
        };
        let (has_a, has_b, has_m) = (
            vb.contains("lora_a"),
            vb.contains("lora_b"),
            vb.contains("m"),
        );
        if !(has_a || has_b || has_m) {
            return Ok(None);
        }
        if has_a != has_b {
            let (present, absent) = if has_a {
                ("lora_a", "lora_b")
            } else {
                ("lora_b", "lora_a")
            };
            return Err(ModelError::Adapter {
                path: adapter.file.clone(),
                message: format!("has `{}` but not `{}`", vb.name(present), vb.name(absent)),
            });
        }
        let rank = adapter.settings.rank;
        let a = if has_a {
            let a = take(vb, adapter, "lora_a", &[in_dim, rank])?;
            let b = take(vb, adapter, "lora_b", &[rank, out_dim])?;
            Some((a, b))
        } else {
            None
        };
        let scale = adapter.settings.scale;
        let magnitude = if adapter.settings.dora {
            let w = dense()?;
            let m = if has_m {
                take(vb, adapter, "m", &[out_dim])?
            } else {
                // DoRA's starting magnitude: the rows' norms in float32.
                norm_l2(w.as_dtype(Dtype::Float32)?, rows())?
            };
            let adapted = match &a {
                Some((a, b)) => {
                    let scaled_b = scalar(scale, b.dtype())?.multiply(b.t())?;
                    w.add(scaled_b.matmul(a.t())?)?
                }
                None => w,
            };
            let factor = m.divide(norm_l2(&adapted, rows())?)?;
            factor.eval()?;
            Some(factor)
        } else {
            None
        };
        Ok(Some(Self {
            a,
            scale,
            magnitude,
        }))
    }

    /// Whether it renormalises rows (DoRA): the layer then computes
    /// `x W^T` with the dense weight and adds its bias last.
    pub fn is_dora(&self) -> bool {
        self.magnitude.is_some()
    }

    /// Bytes of its arrays.
    pub fn nbytes(&self) -> usize {
        self.a.as_ref().map_or(0, |(a, b)| a.nbytes() + b.nbytes())
            + self.magnitude.as_ref().map_or(0, Array::nbytes)
    }

    /// `y + scale (x A) B` (in `x`'s dtype), then DoRA's row factor.
    pub fn apply(&self, x: &Array, y: Array) -> Result<Array, ModelError> {
        let out = match &self.a {
            Some((a, b)) => {
                let z = x.matmul(a)?.matmul(b)?;
                let update = scalar(self.scale, z.dtype())?
                    .multiply(&z)?
                    .as_dtype(x.dtype())?;
                y.add(&update)?
            }
            None => y,
        };
        match &self.magnitude {
            Some(factor) => Ok(factor.as_dtype(x.dtype())?.multiply(&out)?),
            None => Ok(out),
        }
    }
}

/// A low-rank update of stacked experts (mlx-lm's `LoRASwitchLinear`):
/// `y + scale gather(gather(x, A_e^T), B_e^T)` for each token's expert `e`,
/// `A` `[experts, rank, in]`, `B` `[experts, out, rank]`. Kept resident
/// (a few rows per expert) where the experts themselves may stream.
#[derive(Debug)]
pub struct SwitchLowRank {
    /// `A^T`, `[experts, in, rank]`.
    a_t: Array,
    /// `B^T`, `[experts, rank, out]`.
    b_t: Array,
    scale: f32,
}

impl SwitchLowRank {
    /// The update under `vb` (one stacked projection's view) if the store
    /// holds an adapter with tensors for it.
    pub fn load(
        vb: &WeightsView<'_>,
        experts: i32,
        out_dim: i32,
        in_dim: i32,
    ) -> Result<Option<Self>, ModelError> {
        let Some(adapter) = vb.adapter() else {
            return Ok(None);
        };
        let (has_a, has_b) = (vb.contains("lora_a"), vb.contains("lora_b"));
        if !(has_a || has_b || vb.contains("m")) {
            return Ok(None);
        }
        if adapter.settings.dora || vb.contains("m") || has_a != has_b {
            return Err(ModelError::Adapter {
                path: adapter.file.clone(),
                message: format!(
                    "`{}`: stacked experts take a LoRA update (`lora_a` and `lora_b`), as \
                     mlx-lm's `LoRASwitchLinear`; not DoRA, not half an update",
                    vb.prefix()
                ),
            });
        }
        let rank = adapter.settings.rank;
        let a = take(vb, adapter, "lora_a", &[experts, rank, in_dim])?;
        let b = take(vb, adapter, "lora_b", &[experts, out_dim, rank])?;
        Ok(Some(Self {
            a_t: a.swap_axes(-1, -2)?,
            b_t: b.swap_axes(-1, -2)?,
            scale: adapter.settings.scale,
        }))
    }

    /// Bytes of its arrays.
    pub fn nbytes(&self) -> usize {
        self.a_t.nbytes() + self.b_t.nbytes()
    }

    /// `y` plus the update of `x` through experts `experts` (`sorted` as
    /// the base product was gathered).
    pub fn apply(
        &self,
        x: &Array,
        experts: &Array,
        sorted: bool,
        y: Array,
    ) -> Result<Array, ModelError> {
        let z = gather_mm(x, &self.a_t, None, experts, sorted)?;
        let z = gather_mm(&z, &self.b_t, None, experts, sorted)?;
        let update = scalar(self.scale, z.dtype())?
            .multiply(&z)?
            .as_dtype(x.dtype())?;
        Ok(y.add(&update)?)
    }
}

/// Takes the adapter's tensor `leaf` under `vb` in `shape`, cast as the
/// policy says; another shape is an error naming the adapter's file (an
/// adapter made for another model, or another rank).
fn take(
    vb: &WeightsView<'_>,
    adapter: &AdapterInStore,
    leaf: &str,
    shape: &[i32],
) -> Result<Array, ModelError> {
    match vb.take_shaped(leaf, shape) {
        Ok(a) => vb.cast(a),
        Err(ModelError::TensorShape {
            name,
            found,
            expected,
        }) => Err(ModelError::Adapter {
            path: adapter.file.clone(),
            message: format!(
                "`{name}` has shape {found:?}, this model's layer and the adapter's rank \
                 {} need {expected:?} (an adapter made for another model?)",
                adapter.settings.rank
            ),
        }),
        Err(e) => Err(e),
    }
}

/// A linear layer's weight `w` (`[out, in]`, dequantized where stored
/// packed) with its low-rank update merged in, as mlx-lm's
/// `LoRALinear.fuse` and `DoRALinear.fuse` compute it: `w + (scale B^T)
/// A^T` cast to `w`'s dtype, `a` `[in, rank]`, `b` `[rank, out]`; DoRA then
/// scales each row to `m / |row|` (`m` absent: the rows' float32 norms of
/// `w`, where DoRA starts). A shape that does not fit is an error naming
/// `module` and the adapter's `file`.
pub fn fused_linear(
    file: &Path,
    module: &str,
    w: &Array,
    (a, b): (&Array, &Array),
    settings: LowRankSettings,
    m: Option<&Array>,
) -> Result<Array, ModelError> {
    let [out, inp] = w.shape() else {
        return Err(fuse_shape(file, module, "a [out, in] weight", w.shape()));
    };
    let rank = settings.rank;
    if a.shape() != [*inp, rank] || b.shape() != [rank, *out] {
        return Err(ModelError::Adapter {
            path: file.to_path_buf(),
            message: format!(
                "`{module}`: lora_a {:?} and lora_b {:?} do not fit its weight {:?} at rank \
                 {rank} (need {:?} and {:?})",
                a.shape(),
                b.shape(),
                w.shape(),
                [*inp, rank],
                [rank, *out]
            ),
        });
    }
    let delta = scalar(settings.scale, b.dtype())?
        .multiply(b.t())?
        .matmul(a.t())?
        .as_dtype(w.dtype())?;
    let fused = w.add(&delta)?;
    if !settings.dora {
        return Ok(fused);
    }
    let m = match m {
        Some(m) if m.shape() == [*out] => m.clone(),
        Some(m) => {
            return Err(ModelError::Adapter {
                path: file.to_path_buf(),
                message: format!(
                    "`{module}.m` has shape {:?}, its weight {out} rows",
                    m.shape()
                ),
            })
        }
        None => norm_l2(w.as_dtype(Dtype::Float32)?, rows())?,
    };
    let factor = m.divide(norm_l2(&fused, rows())?)?;
    Ok(factor.expand_dims(-1)?.multiply(&fused)?)
}

/// Stacked experts' weights `w` (`[experts, out, in]`) with a LoRA update
/// merged in, as mlx-lm's `LoRASwitchLinear.fuse`: `w + (scale B) A` cast
/// to `w`'s dtype, `a` `[experts, rank, in]`, `b` `[experts, out, rank]`.
pub fn fused_switch(
    file: &Path,
    module: &str,
    w: &Array,
    (a, b): (&Array, &Array),
    settings: LowRankSettings,
) -> Result<Array, ModelError> {
    let [experts, out, inp] = w.shape() else {
        return Err(fuse_shape(
            file,
            module,
            "an [experts, out, in] stack",
            w.shape(),
        ));
    };
    let rank = settings.rank;
    if settings.dora {
        return Err(ModelError::Adapter {
            path: file.to_path_buf(),
            message: format!(
                "`{module}`: stacked experts take a LoRA update, not DoRA (as mlx-lm's \
                 `LoRASwitchLinear`)"
            ),
        });
    }
    if a.shape() != [*experts, rank, *inp] || b.shape() != [*experts, *out, rank] {
        return Err(ModelError::Adapter {
            path: file.to_path_buf(),
            message: format!(
                "`{module}`: lora_a {:?} and lora_b {:?} do not fit its experts {:?} at rank \
                 {rank}",
                a.shape(),
                b.shape(),
                w.shape()
            ),
        });
    }
    let delta = scalar(settings.scale, b.dtype())?
        .multiply(b)?
        .matmul(a)?
        .as_dtype(w.dtype())?;
    Ok(w.add(&delta)?)
}

fn fuse_shape(file: &Path, module: &str, expected: &str, found: &[i32]) -> ModelError {
    ModelError::Adapter {
        path: file.to_path_buf(),
        message: format!("`{module}`: its weight has shape {found:?}, expected {expected}"),
    }
}

/// A scalar in `dtype`, as a Python float meets an array in MLX.
fn scalar(value: f32, dtype: Dtype) -> Result<Array, ModelError> {
    Ok(Array::from_f32(value).as_dtype(dtype)?)
}

/// Norms over each row of a `[out, in]` matrix.
fn rows() -> NormOptions {
    NormOptions {
        axes: 1.into(),
        keep_dims: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use mlx_rs::Array;
    use serde_json::json;

    use super::*;
    use crate::config::Quantization;
    use crate::layers::Linear;
    use crate::weights::testing::{max_abs_diff, random};
    use crate::DtypePolicy;

    const IN: i32 = 12;
    const OUT: i32 = 10;
    const RANK: i32 = 4;

    /// Writes an adapter directory: `config` and `tensors`.
    fn write_adapter(dir: &Path, config: serde_json::Value, tensors: &[(&str, Array)]) {
        std::fs::write(dir.join(CONFIG_FILE), config.to_string()).expect("config");
        let map: HashMap<String, Array> = tensors
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.clone()))
            .collect();
        Array::save_safetensors(&map, None, dir.join(TENSORS_FILE)).expect("tensors");
    }

    fn lora_config(kind: &str, scale: f32) -> serde_json::Value {
        json!({"fine_tune_type": kind, "num_layers": 2,
               "lora_parameters": {"rank": RANK, "dropout": 0.0, "scale": scale}})
    }

    /// A store holding one bias-carrying linear layer `l`.
    fn base_store(weight: &Array, bias: &Array) -> Weights {
        let tensors = HashMap::from([
            ("l.weight".to_owned(), weight.clone()),
            ("l.bias".to_owned(), bias.clone()),
        ]);
        Weights::from_map("model".into(), tensors)
    }

    /// [`base_store`] with the adapter `config` + `tensors` applied.
    fn adapted_store(
        (w, b): (&Array, &Array),
        config: serde_json::Value,
        tensors: &[(&str, Array)],
    ) -> Weights {
        let dir = tempfile::tempdir().expect("tempdir");
        write_adapter(dir.path(), config, tensors);
        let mut store = base_store(w, b);
        Adapter::load(dir.path())
            .expect("adapter")
            .apply(&mut store, 1)
            .expect("applied");
        store
    }

    fn load_linear(w: &Weights) -> Linear {
        let quant = Quantization::default();
        let vb = w.view(&quant, DtypePolicy::Keep);
        Linear::load(&vb.pp("l"), IN, OUT, true).expect("linear")
    }

    fn values(a: &Array) -> Vec<f64> {
        a.as_slice::<f32>().iter().map(|&v| f64::from(v)).collect()
    }

    /// `x [n, IN]`, `w [OUT, IN]` -> `x w^T` in f64.
    fn matmul_t(x: &[f64], w: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
        (0..n)
            .flat_map(|i| (0..m).map(move |j| (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum()))
            .collect()
    }

    fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
        (0..cols)
            .flat_map(|j| (0..rows).map(move |i| a[i * cols + j]))
            .collect()
    }

    /// The reference: `x W^T + b + scale (x A) B` (LoRA), or DoRA's
    /// `(m / |W + scale (A B)^T|) (x W^T + scale (x A) B) + b`, in f64.
    fn reference(
        x: &Array,
        (w, b): (&Array, &Array),
        (a, lb): (&Array, &Array),
        scale: f64,
        m: Option<&Array>,
    ) -> Vec<f64> {
        let n = x.shape()[0] as usize;
        let (i, o, r) = (IN as usize, OUT as usize, RANK as usize);
        let (xv, wv, bv, av, lbv) = (values(x), values(w), values(b), values(a), values(lb));
        let base = matmul_t(&xv, &wv, n, i, o);
        let xa = matmul_t(&xv, &transpose(&av, i, r), n, i, r);
        let z = matmul_t(&xa, &transpose(&lbv, r, o), n, r, o);
        let mut out: Vec<f64> = base.iter().zip(&z).map(|(y, z)| y + scale * z).collect();
        if let Some(m) = m {
            // W' = W + scale (A B)^T, row norms.
            let ab = matmul_t(&transpose(&lbv, r, o), &av, o, r, i);
            let norms: Vec<f64> = (0..o)
                .map(|j| {
                    (0..i)
                        .map(|t| (wv[j * i + t] + scale * ab[j * i + t]).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .collect();
            let mv = values(m);
            for (k, v) in out.iter_mut().enumerate() {
                *v *= mv[k % o] / norms[k % o];
            }
        }
        out.iter().enumerate().map(|(k, v)| v + bv[k % o]).collect()
    }

    fn assert_close(got: &Array, want: &[f64]) {
        let got = values(got);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }

    #[test]
    fn lora_and_dora_updates_follow_their_formulas() {
        let (w, b) = (random(&[OUT, IN], 1), random(&[OUT], 2));
        let (a, lb) = (
            random(&[IN, RANK], 3),
            random(&[RANK, OUT], 4)
                .multiply(Array::from_f32(0.1))
                .expect("scale"),
        );
        let m = random(&[OUT], 5)
            .abs()
            .expect("abs")
            .add(Array::from_f32(1.0))
            .expect("m");
        let x = random(&[3, IN], 6);
        for (kind, with_m) in [("lora", false), ("dora", true)] {
            let mut tensors = vec![("l.lora_a", a.clone()), ("l.lora_b", lb.clone())];
            if with_m {
                tensors.push(("l.m", m.clone()));
            }
            let store = adapted_store((&w, &b), lora_config(kind, 2.5), &tensors);
            let linear = load_linear(&store);
            store.finish().expect("every adapter tensor taken");
            let got = linear.forward(&x).expect("forward");
            let want = reference(&x, (&w, &b), (&a, &lb), 2.5, with_m.then_some(&m));
            assert_close(&got, &want);
            let plain = load_linear(&base_store(&w, &b)).forward(&x).expect("plain");
            assert!(
                max_abs_diff(&got, &plain) > 1e-3,
                "{kind} changes the layer"
            );
        }
    }

    #[test]
    fn a_layer_the_adapter_does_not_name_keeps_its_bits() {
        let (w, b) = (random(&[OUT, IN], 1), random(&[OUT], 2));
        let other = [
            ("k.lora_a", random(&[IN, RANK], 3)),
            ("k.lora_b", random(&[RANK, OUT], 4)),
        ];
        let store = adapted_store((&w, &b), lora_config("lora", 20.0), &other);
        let x = random(&[2, IN], 6);
        let adapted = load_linear(&store).forward(&x).expect("forward");
        let plain = load_linear(&base_store(&w, &b)).forward(&x).expect("plain");
        assert_eq!(max_abs_diff(&adapted, &plain), 0.0);
        // `k` is no layer of this model: the store names the adapter's tensors.
        let err = store.finish().expect_err("untaken").to_string();
        assert!(
            err.contains("k.lora_a") && err.contains(TENSORS_FILE),
            "{err}"
        );
    }

    #[test]
    fn a_full_fine_tune_replaces_weights_by_name_and_shape() {
        let (w, b) = (random(&[OUT, IN], 1), random(&[OUT], 2));
        let new_w = random(&[OUT, IN], 7);
        let config = json!({"fine_tune_type": "full", "num_layers": 1});
        let store = adapted_store((&w, &b), config.clone(), &[("l.weight", new_w.clone())]);
        let x = random(&[2, IN], 6);
        let got = load_linear(&store).forward(&x).expect("forward");
        let want = load_linear(&base_store(&new_w, &b))
            .forward(&x)
            .expect("new");
        assert_eq!(max_abs_diff(&got, &want), 0.0);

        for (tensor, message) in [
            (
                ("l.scale", random(&[OUT], 8)),
                "`l.scale` is not a parameter",
            ),
            (
                ("l.weight", random(&[IN, OUT], 8)),
                "has shape [12, 10], the model's [10, 12]",
            ),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            write_adapter(dir.path(), config.clone(), &[tensor]);
            let err = Adapter::load(dir.path())
                .expect("adapter")
                .apply(&mut base_store(&w, &b), 1)
                .expect_err("refused")
                .to_string();
            assert!(err.contains(message) && err.contains(TENSORS_FILE), "{err}");
        }
    }

    #[test]
    fn broken_adapters_are_named() {
        let good = [
            ("l.lora_a", random(&[IN, RANK], 3)),
            ("l.lora_b", random(&[RANK, OUT], 4)),
        ];
        type Case<'a> = (serde_json::Value, Vec<(&'a str, Array)>, &'a str);
        let cases: Vec<Case<'_>> = vec![
            (
                json!({"fine_tune_type": "qlora", "num_layers": 2}),
                good.to_vec(),
                "fine_tune_type `qlora`",
            ),
            (
                json!({"lora_parameters": {"rank": 4, "scale": 1.0}}),
                good.to_vec(),
                "`num_layers` is missing",
            ),
            (
                json!({"num_layers": 2, "lora_parameters": {"rank": 4, "alpha": 16}}),
                good.to_vec(),
                "`lora_parameters.scale` is missing (found `alpha`",
            ),
            (
                json!({"num_layers": 2, "lora_parameters": {"scale": 1.0}}),
                good.to_vec(),
                "`lora_parameters.rank`",
            ),
            (
                lora_config("lora", 1.0),
                vec![("l.weight", random(&[OUT, IN], 1))],
                "not LoRA adapter parameters",
            ),
            (
                lora_config("lora", 1.0),
                vec![("l.m", random(&[OUT], 1))],
                "not LoRA adapter parameters",
            ),
        ];
        for (config, tensors, message) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            write_adapter(dir.path(), config, &tensors);
            let err = Adapter::load(dir.path()).expect_err(message).to_string();
            assert!(err.contains(message), "{err}");
        }
        let missing = Adapter::load(Path::new("/nonexistent/adapter")).expect_err("no dir");
        assert!(
            missing.to_string().contains("no such adapter directory"),
            "{missing}"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let no_file = Adapter::load(dir.path())
            .expect_err("no config")
            .to_string();
        assert!(no_file.contains(CONFIG_FILE), "{no_file}");
    }

    #[test]
    fn half_an_update_or_a_wrong_rank_is_refused_naming_the_tensor() {
        let (w, b) = (random(&[OUT, IN], 1), random(&[OUT], 2));
        let cases = [
            (
                vec![("l.lora_a", random(&[IN, RANK], 3))],
                "has `l.lora_a` but not `l.lora_b`",
            ),
            (
                vec![
                    ("l.lora_a", random(&[IN, RANK + 1], 3)),
                    ("l.lora_b", random(&[RANK + 1, OUT], 4)),
                ],
                "`l.lora_a` has shape [12, 5], this model's layer and the adapter's rank 4 need [12, 4]",
            ),
        ];
        for (tensors, message) in cases {
            let store = adapted_store((&w, &b), lora_config("lora", 1.0), &tensors);
            let quant = Quantization::default();
            let vb = store.view(&quant, DtypePolicy::Keep);
            let err = Linear::load(&vb.pp("l"), IN, OUT, true)
                .expect_err(message)
                .to_string();
            assert!(err.contains(message), "{err}");
        }
    }
}

#[cfg(test)]
mod block_tests {
    use serde_json::json;

    use super::*;
    use crate::weights::testing::random;

    /// mlx-lm adapts the last `num_layers` blocks (0 or less: all) and
    /// refuses a file with updates elsewhere; so do we, naming the tensor.
    #[test]
    fn updates_outside_the_last_num_layers_blocks_are_refused() {
        let apply = |num_layers: i64, block: usize, blocks: usize| {
            let dir = tempfile::tempdir().expect("tempdir");
            let config = json!({"num_layers": num_layers,
                "lora_parameters": {"rank": 2, "dropout": 0.0, "scale": 1.0}});
            std::fs::write(dir.path().join(CONFIG_FILE), config.to_string()).expect("config");
            let p = format!("model.layers.{block}.mlp.up_proj");
            let tensors = HashMap::from([
                (format!("{p}.lora_a"), random(&[4, 2], 1)),
                (format!("{p}.lora_b"), random(&[2, 4], 2)),
            ]);
            Array::save_safetensors(&tensors, None, dir.path().join(TENSORS_FILE))
                .expect("tensors");
            let mut store = Weights::from_map("model".into(), HashMap::new());
            Adapter::load(dir.path())
                .expect("adapter")
                .apply(&mut store, blocks)
        };
        for (num_layers, block, blocks) in [(1, 3, 4), (4, 0, 4), (0, 0, 4), (-1, 2, 4)] {
            apply(num_layers, block, blocks).expect("inside");
        }
        for (num_layers, block, blocks, says) in [
            (
                1,
                2,
                4,
                "block 2, outside the last 1 of the model's 4 blocks",
            ),
            (8, 4, 4, "block 4, outside the last 4"),
        ] {
            let err = apply(num_layers, block, blocks)
                .expect_err("outside")
                .to_string();
            assert!(
                err.contains(says) && err.contains("up_proj.lora_") && err.contains(TENSORS_FILE),
                "{err}"
            );
        }
    }

    /// Stacked experts' merged weights are each expert's own `W_e + scale
    /// B_e A_e`; DoRA and a misfit shape are refused naming the module.
    #[test]
    fn stacked_experts_merge_each_experts_update() {
        let (experts, out, inp, rank) = (3, 10, 12, 4);
        let w = random(&[experts, out, inp], 1);
        let a = random(&[experts, rank, inp], 2);
        let b = random(&[experts, out, rank], 3);
        let settings = LowRankSettings {
            dora: false,
            scale: 0.5,
            rank,
        };
        let file = Path::new("adapters.safetensors");
        let merged = fused_switch(file, "s", &w, (&a, &b), settings).expect("merges");
        for e in 0..experts {
            let pick = |x: &Array| x.take_axis(Array::from_int(e), 0).expect("take");
            let want = pick(&w)
                .add(
                    pick(&b)
                        .matmul(pick(&a))
                        .expect("mm")
                        .multiply(Array::from_f32(0.5))
                        .expect("scale"),
                )
                .expect("add");
            let diff = crate::weights::testing::max_abs_diff(&pick(&merged), &want);
            assert!(diff < 1e-5, "expert {e}: {diff}");
        }
        let dora = LowRankSettings {
            dora: true,
            ..settings
        };
        let err = fused_switch(file, "s", &w, (&a, &b), dora)
            .expect_err("DoRA")
            .to_string();
        assert!(err.contains("`s`") && err.contains("not DoRA"), "{err}");
        let err = fused_switch(file, "s", &w, (&b, &a), settings)
            .expect_err("misfit")
            .to_string();
        assert!(err.contains("`s`") && err.contains("do not fit"), "{err}");
        let err = fused_linear(file, "l", &w, (&a, &b), settings, None)
            .expect_err("3-D")
            .to_string();
        assert!(err.contains("`l`") && err.contains("[out, in]"), "{err}");
    }
}
