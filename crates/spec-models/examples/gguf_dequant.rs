//! Our side of `cargo xtask gate gguf`: every tensor of a GGUF file as the
//! loader dequantizes it to float32.
//!
//! `gguf_dequant --file F.gguf --out DIR` writes `DIR/<tensor name>.f32`
//! (float32, little-endian, row-major).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use spec_formats::gguf::dequantized_tensor;

fn main() -> Result<()> {
    let (mut file, mut out) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--file" => file = Some(PathBuf::from(value)),
            "--out" => out = Some(PathBuf::from(value)),
            other => bail!("unknown argument {other}"),
        }
    }
    let file = file.context("--file is required")?;
    let out = out.context("--out is required")?;
    std::fs::create_dir_all(&out)?;
    let summary = weights_guard::check_gguf(&file, &weights_guard::Limits::default())?;
    for tensor in &summary.tensors {
        let array = dequantized_tensor(&file, &summary, tensor)?;
        let bytes: Vec<u8> = array
            .as_slice::<f32>()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(out.join(format!("{}.f32", tensor.name)), bytes)?;
    }
    println!("{} tensors", summary.tensors.len());
    Ok(())
}
