//! The fingerprint our files carry: what identifies a model's caches. The
//! `config.json` bytes, the weights' headers (every tensor's name, dtype,
//! shape and place, and each file's length: a re-quantized or re-exported
//! copy differs, a byte-identical copy elsewhere does not), a sample of
//! the weights' bytes (16 blocks of 4 KiB spread over each file: another
//! fine-tune of the same shapes differs there), the dtype policy the
//! caches were computed under and, where one is applied, the fine-tuned
//! adapter (its config's bytes, its tensors' headers and a sample, as the
//! weights'). Headers are read through the weights guard;
//! the sample costs 64 KiB per file, nothing next to loading the model.

use std::fmt::Write;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::weights::weight_files;
use crate::{DtypePolicy, ModelError};

/// 64-bit FNV-1a, the fingerprint's hash. Part of the file format: files
/// written earlier carry its values, so it never changes (a test pins it).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

fn guard(file: &Path) -> impl Fn(weights_guard::GuardError) -> ModelError + '_ {
    move |e| ModelError::WeightsCheck {
        path: file.to_path_buf(),
        context: "",
        source: e.into(),
    }
}

/// The fingerprint of the model at `path` (a directory or a `.gguf` file)
/// run under `dtype`, with the fine-tuned adapter at `adapter` applied.
pub fn fingerprint(
    path: &Path,
    dtype: DtypePolicy,
    adapter: Option<&Path>,
) -> Result<String, ModelError> {
    let mut weights = String::new();
    let config = if path.extension().is_some_and(|x| x == "gguf") {
        let summary = weights_guard::check_gguf(path, &weights_guard::Limits::default())
            .map_err(guard(path))?;
        for t in &summary.tensors {
            let _ = writeln!(
                weights,
                "{} {:?} {:?} {} {}",
                t.name, t.ggml_type, t.shape, t.offset, t.byte_len
            );
        }
        // The metadata (architecture, hyperparameters, tokenizer) sits
        // before the data section: its size stands in for its bytes.
        sample(path, &mut weights)?;
        format!("gguf {} {:?}", summary.data_offset, summary.architecture)
    } else {
        let file = path.join("config.json");
        let bytes = std::fs::read(&file).map_err(|source| ModelError::Io { path: file, source })?;
        for file in weight_files(path)? {
            describe_safetensors(&file, &mut weights)?;
        }
        format!("{:016x}", fnv1a64(&bytes))
    };
    let dtype = match dtype {
        DtypePolicy::Float32 => "float32",
        DtypePolicy::Keep => "keep",
    };
    let mut print = format!(
        "config {config}, weights {:016x}, dtype {dtype}",
        fnv1a64(weights.as_bytes())
    );
    if let Some(dir) = adapter {
        let file = dir.join(spec_runtime::adapter::CONFIG_FILE);
        let mut text =
            std::fs::read(&file).map_err(|source| ModelError::Io { path: file, source })?;
        let mut tensors = String::new();
        describe_safetensors(&dir.join(spec_runtime::adapter::TENSORS_FILE), &mut tensors)?;
        text.extend_from_slice(tensors.as_bytes());
        let _ = write!(print, ", adapter {:016x}", fnv1a64(&text));
    }
    Ok(print)
}

/// Appends a safetensors file's name, sizes, every tensor's header line
/// and [`sample`]'s hash.
fn describe_safetensors(file: &Path, out: &mut String) -> Result<(), ModelError> {
    let summary = weights_guard::check_safetensors(file, &weights_guard::Limits::default())
        .map_err(guard(file))?;
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
    let _ = writeln!(
        out,
        "{} {} {}",
        name.unwrap_or_default(),
        summary.header_len,
        summary.data_len
    );
    for t in &summary.tensors {
        let _ = writeln!(
            out,
            "{} {:?} {:?} {:?}",
            t.name, t.dtype, t.shape, t.data_offsets
        );
    }
    sample(file, out)
}

/// Blocks sampled per file, and their size.
const SAMPLES: u64 = 16;
const BLOCK: u64 = 4096;

/// Appends the hash of [`SAMPLES`] blocks spread evenly over `file`.
fn sample(file: &Path, out: &mut String) -> Result<(), ModelError> {
    let io = |source| ModelError::Io {
        path: file.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(file).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut bytes = Vec::new();
    let mut block = vec![0u8; BLOCK as usize];
    for i in 0..SAMPLES {
        let at = len.saturating_sub(BLOCK) * i / (SAMPLES - 1);
        f.seek(SeekFrom::Start(at)).map_err(io)?;
        let n = (&mut f).take(BLOCK).read(&mut block).map_err(io)?;
        bytes.extend_from_slice(&block[..n]);
    }
    let _ = writeln!(out, "sample {:016x}", fnv1a64(&bytes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fnv1a64;

    /// The hash's values are in every file we wrote: FNV-1a's published
    /// test vectors pin it.
    #[test]
    fn the_hash_is_fnv1a_and_never_changes() {
        assert_eq!(fnv1a64(b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xAF63_DC4C_8601_EC8C);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_F739_67E8);
        // The fixtures' copy (test data seeds) and this one agree.
        for input in [&b"config.json"[..], b"\x00\xff\x10", b"sample"] {
            assert_eq!(fnv1a64(input), spec_fixtures::rng::fnv1a64(input));
        }
    }
}
