//! GGUF files written byte by byte (version 3, alignment 32): metadata
//! values as `weights_guard::read_gguf` reads them back, tensors as raw
//! ggml blocks. [`random_blocks`] fills a tensor of any block type with
//! seeded bytes whose float16 fields are small finite numbers, so every
//! value decodes to something finite.

use std::path::Path;

use half::{bf16, f16};
use weights_guard::{GgmlType, GgufValue};

use crate::rng::SplitMix64;
use crate::Error;

/// A GGUF file to write.
#[derive(Debug, Default, Clone)]
pub struct GgufFile {
    /// Metadata in file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensors in file order: name, ggml shape (row length first), type,
    /// data.
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => out.push(*v),
        GgufValue::I8(v) => out.extend(v.to_le_bytes()),
        GgufValue::U16(v) => out.extend(v.to_le_bytes()),
        GgufValue::I16(v) => out.extend(v.to_le_bytes()),
        GgufValue::U32(v) => out.extend(v.to_le_bytes()),
        GgufValue::I32(v) => out.extend(v.to_le_bytes()),
        GgufValue::U64(v) => out.extend(v.to_le_bytes()),
        GgufValue::I64(v) => out.extend(v.to_le_bytes()),
        GgufValue::F32(v) => out.extend(v.to_le_bytes()),
        GgufValue::F64(v) => out.extend(v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(items) => {
            // An empty array's element type is not recorded: uint8.
            let elem = items.first().map_or(0, GgufValue::type_id);
            out.extend(elem.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

impl GgufFile {
    /// Adds a metadata value.
    pub fn kv(&mut self, key: &str, value: GgufValue) -> &mut Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor of `ty` with `data` (its blocks, as ggml lays them).
    pub fn tensor(&mut self, name: &str, shape: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_owned(), shape.to_vec(), ty, data));
        self
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let mut out = b"GGUF".to_vec();
        out.extend(3_u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0_u64;
        for (name, shape, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.id().to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + data.len() as u64).next_multiple_of(32);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            out.resize(out.len().next_multiple_of(32), 0);
        }
        std::fs::write(path, out).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Byte offsets of a block type's float16 fields.
fn half_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// `elements` values of `ty` as seeded bytes; float types hold small
/// values, block types small finite float16 scales.
pub fn random_blocks(ty: GgmlType, elements: u64, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let small = |rng: &mut SplitMix64| ((rng.next_u64() % 2001) as f32 - 1000.0) / 16000.0;
    let n = elements / ty.block_size();
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| small(&mut rng).to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(small(&mut rng)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(small(&mut rng)).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.block_bytes() as usize;
            let mut out: Vec<u8> = (0..n as usize * bytes)
                .map(|_| rng.next_u64() as u8)
                .collect();
            for block in out.chunks_exact_mut(bytes) {
                for &at in half_fields(ty) {
                    let scale = small(&mut rng) / 8.0;
                    block[at..at + 2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back() {
        let dir = std::env::temp_dir().join(format!("spec-fixtures-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("t.gguf");
        let mut file = GgufFile::default();
        file.kv("general.architecture", GgufValue::String("llama".into()))
            .kv("a.f", GgufValue::F32(0.5))
            .kv(
                "a.list",
                GgufValue::Array(vec![
                    GgufValue::String("x".into()),
                    GgufValue::String("".into()),
                ]),
            )
            .tensor(
                "w",
                &[256, 2],
                GgmlType::Q6_K,
                random_blocks(GgmlType::Q6_K, 512, 7),
            )
            .tensor("n", &[3], GgmlType::F16, random_blocks(GgmlType::F16, 3, 8));
        file.write(&path).expect("write");
        let (summary, metadata) =
            weights_guard::read_gguf(&path, &weights_guard::Limits::default()).expect("read");
        std::fs::remove_dir_all(&dir).expect("clean");
        for (key, value) in &file.metadata {
            assert_eq!(metadata.get(key), Some(value), "{key}");
        }
        let tensors: Vec<_> = summary
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.shape.clone(), t.ggml_type, t.byte_len))
            .collect();
        assert_eq!(
            tensors,
            [
                ("w", vec![256, 2], GgmlType::Q6_K, 2 * 210),
                ("n", vec![3], GgmlType::F16, 6)
            ]
        );
        // Float16 fields are small and finite.
        let block = &file.tensors[0].3[..210];
        let d = u16::from_le_bytes([block[208], block[209]]);
        assert!(d & 0x7C00 != 0x7C00, "not inf or NaN: {d:#x}");
    }
}
