//! Our side of `cargo xtask gate gguf`: every tensor of a GGUF file as the
//! loader dequantizes it to float32.
//!
//! `gguf_dequant REQUEST.json`: a `run_protocol::gguf::GgufRequest`; writes
//! `OUT/<tensor name>.f32` (float32, little-endian, row-major) and reports
//! the tensors' names; with `export`, the file as mlx-lm directories too
//! (`EXPORT/keep`, `EXPORT/float32`).

use anyhow::Result;
use run_protocol::gguf::{GgufReport, GgufRequest};
use spec_formats::gguf::{convert_to_dir, dequantized_tensor};
use spec_models::DtypePolicy;

fn main() -> Result<()> {
    let request: GgufRequest = run_protocol::read_request()?;
    let (file, out) = (&request.file, &request.out);
    std::fs::create_dir_all(out)?;
    let summary = weights_guard::check_gguf(file, &weights_guard::Limits::default())?;
    let mut tensors = Vec::new();
    for tensor in &summary.tensors {
        let array = dequantized_tensor(file, &summary, tensor)?;
        let bytes: Vec<u8> = array
            .as_slice::<f32>()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(out.join(format!("{}.f32", tensor.name)), bytes)?;
        tensors.push(tensor.name.clone());
    }
    if let Some(export) = &request.export {
        convert_to_dir(file, &export.join("keep"), DtypePolicy::Keep)?;
        convert_to_dir(file, &export.join("float32"), DtypePolicy::Float32)?;
    }
    run_protocol::write_report::<GgufRequest>(&GgufReport { tensors })?;
    Ok(())
}
