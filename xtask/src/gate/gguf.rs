//! `cargo xtask gate gguf`: every ggml type our GGUF loader reads equals
//! `gguf.quants.dequantize` (PyPI `gguf`, ggml's reference Python port) bit
//! for bit. `xtask/python/gguf_types.py` writes a file with a tensor of each
//! type and the reference values; our loader's dequantization
//! (`spec-models` example `gguf_dequant`) reads the same file. Then the
//! tokenizers we build from GGUF metadata against llama.cpp's vocabulary
//! tests (`gguf_vocab.rs`), and our engine on llama.cpp's conversions of
//! synthetic checkpoints against the checkpoints (`gguf_convert.rs`).

use anyhow::{bail, Context, Result};
use run_protocol::gguf::GgufRequest;

use super::compare;
use super::Counts;
use crate::{runs, shell, venv};

const WRITER: &str = "xtask/python/gguf_types.py";

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let work = shell::root().join("target").join("gate-gguf");
    let _ = std::fs::remove_dir_all(&work);
    let (theirs, ours) = (work.join("reference"), work.join("ours"));
    shell::run(
        venv::python_command(&python)
            .arg(shell::root().join(WRITER))
            .arg("--out")
            .arg(&theirs),
    )
    .context("writing the GGUF file of every type")?;
    shell::build()?;
    let request = GgufRequest {
        file: theirs.join("types.gguf"),
        out: ours.clone(),
        export: None,
    };
    let report = runs::example(&request, &work.join("ours-run"), &[])?;
    let mut counts = super::gguf_vocab::run(&work)?;
    let converted = super::gguf_convert::run(&work)?;
    counts.passed += converted.passed;
    counts.failed += converted.failed;
    let mut names: Vec<String> = std::fs::read_dir(&theirs)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".f32"))
        .collect();
    names.sort();
    if names.is_empty() {
        bail!("the reference wrote no tensors");
    }
    if report.tensors.len() != names.len() {
        eprintln!(
            "gguf: we wrote {} tensors, the reference {}",
            report.tensors.len(),
            names.len()
        );
    }
    println!("\ngguf: our float32 dequantization against gguf.quants.dequantize");
    for name in &names {
        let want = std::fs::read(theirs.join(name))?;
        let verdict = match std::fs::read(ours.join(name)) {
            Err(e) => format!("FAIL  we wrote nothing: {e}"),
            Ok(got) if got.len() != want.len() => {
                format!("FAIL  {} bytes, expected {}", got.len(), want.len())
            }
            Ok(got) => {
                let floats = |b: &[u8]| -> Vec<f32> {
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                };
                let (got, want) = (floats(&got), floats(&want));
                // Bit for bit: the first element whose bits differ.
                let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
                match compare::first_difference(&bits(&got), &bits(&want)) {
                    None => "ok    bit-identical".to_owned(),
                    Some(i) => format!("FAIL  element {i}: ours {} vs {}", got[i], want[i]),
                }
            }
        };
        counts.count(verdict.starts_with("ok"));
        println!(
            "  {:<10} {verdict}",
            name.trim_start_matches("t.").trim_end_matches(".f32")
        );
    }
    Ok(counts)
}
