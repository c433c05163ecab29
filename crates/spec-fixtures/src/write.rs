//! The seeded writer every layout shares: tensor specs, their values (one PRNG
//! stream per tensor), `config.json` and float32 / int64 safetensors files.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::rng::{Normal, SplitMix64};
use crate::Error;

/// How a random tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// N(0, std).
    Normal(f64),
    /// 1 + N(0, std): RMSNorm weights and layer scalars.
    OnePlusNormal(f64),
}

/// One random tensor of a layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Name in the checkpoint.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, init: Init) -> Self {
        Self {
            name: name.into(),
            shape,
            init,
        }
    }

    /// The tensor with its values drawn from the stream of `seed`, `model` and
    /// its name.
    pub fn draw(&self, seed: u64, model: &str) -> Tensor {
        let len = self.shape.iter().product();
        Tensor {
            name: self.name.clone(),
            shape: self.shape.clone(),
            data: Data::F32(values(seed, model, &self.name, len, self.init)),
        }
    }
}

/// Values of a tensor, little-endian on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// float32.
    F32(Vec<f32>),
    /// int64 (token orderings, vocabulary maps).
    I64(Vec<i64>),
    /// bool (vocabulary masks).
    Bool(Vec<bool>),
}

/// A tensor with its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Name in the checkpoint.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Data,
}

impl Tensor {
    /// A float32 tensor.
    pub fn f32(name: impl Into<String>, shape: Vec<usize>, values: Vec<f32>) -> Self {
        Self {
            name: name.into(),
            shape,
            data: Data::F32(values),
        }
    }
}

/// Values of one tensor: its own PRNG stream, keyed by seed, model and tensor
/// name, so they do not depend on the order tensors are generated in.
pub fn values(seed: u64, model: &str, tensor: &str, len: usize, init: Init) -> Vec<f32> {
    let mut normal = Normal::new(SplitMix64::keyed(seed, &format!("{model}/{tensor}")));
    let (offset, std) = match init {
        Init::Normal(std) => (0.0, std),
        Init::OnePlusNormal(std) => (1.0, std),
    };
    (0..len)
        .map(|_| (offset + std * normal.sample()) as f32)
        .collect()
}

/// Writes `config` as pretty JSON to `dir/config.json`.
pub fn write_config(dir: &Path, config: &Value) -> Result<(), Error> {
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config)? + "\n";
    std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
}

/// Writes `config.json` and `model.safetensors` (the random tensors of
/// `specs`, drawn for `seed` and `model`) into `dir`, which must exist.
pub fn write_checkpoint(
    dir: &Path,
    config: &Value,
    specs: &[TensorSpec],
    seed: u64,
    model: &str,
) -> Result<(), Error> {
    write_config(dir, config)?;
    let tensors: Vec<Tensor> = specs.iter().map(|s| s.draw(seed, model)).collect();
    write_tensors(&dir.join("model.safetensors"), &tensors)
}

/// Writes `tensors` as a safetensors file with `{"format": "pt"}` metadata.
pub fn write_tensors(path: &Path, tensors: &[Tensor]) -> Result<(), Error> {
    let bytes: Vec<(&Tensor, safetensors::Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|t| match &t.data {
            Data::F32(v) => (
                t,
                safetensors::Dtype::F32,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            Data::I64(v) => (
                t,
                safetensors::Dtype::I64,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            Data::Bool(v) => (
                t,
                safetensors::Dtype::BOOL,
                v.iter().map(|&x| u8::from(x)).collect(),
            ),
        })
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (t, dtype, b) in &bytes {
        let view =
            safetensors::tensor::TensorView::new(*dtype, t.shape.clone(), b).map_err(|source| {
                Error::Safetensors {
                    context: format!("tensor `{}`", t.name),
                    source,
                }
            })?;
        views.push((t.name.as_str(), view));
    }
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|source| {
        Error::Safetensors {
            context: format!("writing {}", path.display()),
            source,
        }
    })
}

/// Reads a float32 tensor as (shape, values); any other dtype is an error.
pub fn read_f32(
    st: &safetensors::SafeTensors<'_>,
    name: &str,
) -> Result<(Vec<usize>, Vec<f32>), Error> {
    let view = st.tensor(name).map_err(|source| Error::Safetensors {
        context: format!("tensor `{name}`"),
        source,
    })?;
    if view.dtype() != safetensors::Dtype::F32 {
        return Err(Error::Tensor {
            name: name.to_owned(),
            message: format!("{:?}, expected F32", view.dtype()),
        });
    }
    let values = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((view.shape().to_vec(), values))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn init_scales_are_as_configured() {
        let w = values(1, "m", "w", 50_000, Init::Normal(0.25));
        let n = values(1, "m", "n", 50_000, Init::OnePlusNormal(0.1));
        let stats = |v: &[f32]| {
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
            let var = v
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / v.len() as f64;
            (mean, var.sqrt())
        };
        let (wm, ws) = stats(&w);
        let (nm, ns) = stats(&n);
        assert!(wm.abs() < 0.01 && (ws - 0.25).abs() < 0.01, "{wm} {ws}");
        assert!(
            (nm - 1.0).abs() < 0.01 && (ns - 0.1).abs() < 0.01,
            "{nm} {ns}"
        );
    }

    #[test]
    fn values_are_keyed_by_seed_model_and_tensor() {
        let a = values(1, "m", "fc.weight", 16, Init::Normal(1.0));
        assert_eq!(a, values(1, "m", "fc.weight", 16, Init::Normal(1.0)));
        assert_ne!(a, values(1, "m", "lm_head.weight", 16, Init::Normal(1.0)));
        assert_ne!(a, values(1, "n", "fc.weight", 16, Init::Normal(1.0)));
        assert_ne!(a, values(2, "m", "fc.weight", 16, Init::Normal(1.0)));
    }

    #[test]
    fn safetensors_writer_round_trips() {
        let dir = tempdir("st");
        let path = dir.join("t.safetensors");
        let tensors = vec![
            Tensor::f32(
                "a",
                vec![2, 3],
                vec![1.0, -2.5, 3.25, f32::MIN_POSITIVE, 0.0, -0.0],
            ),
            Tensor::f32("b.c", vec![1], vec![7.0]),
        ];
        write_tensors(&path, &tensors).expect("write");
        let bytes = std::fs::read(&path).expect("read");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("parse");
        for t in &tensors {
            let Data::F32(v) = &t.data else {
                unreachable!()
            };
            let (s, got) = read_f32(&st, &t.name).expect("tensor");
            assert_eq!(
                (&s, got.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                (&t.shape, v.iter().map(|x| x.to_bits()).collect())
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    pub(crate) fn tempdir(label: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("spec-fixtures-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }
}
