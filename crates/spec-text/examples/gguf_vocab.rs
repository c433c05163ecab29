//! Our side of `cargo xtask gate gguf`'s tokenizer check: each GGUF file's
//! tokenizer, built from its metadata as `Tokenizer::from_gguf` builds it,
//! encodes the request's texts without special tokens added, and decodes
//! the ids again, whole and token by token; with `hf_dir`, writes the
//! tokenizer as Hugging Face files there.
//!
//! `gguf_vocab REQUEST.json`: a `run_protocol::gguf::GgufVocabRequest`.

use anyhow::Result;
use run_protocol::gguf::{GgufVocabReport, GgufVocabRequest, VocabResult};
use spec_text::Tokenizer;

fn main() -> Result<()> {
    let request: GgufVocabRequest = run_protocol::read_request()?;
    let mut cases = Vec::new();
    for case in &request.cases {
        let result = Tokenizer::from_gguf(&case.file).and_then(|tokenizer| {
            let mut result = VocabResult {
                ids: Vec::new(),
                decoded: Vec::new(),
                streamed: Vec::new(),
                error: None,
            };
            if let Some(dir) = &case.hf_dir {
                std::fs::create_dir_all(dir).map_err(|source| spec_text::TextError::Write {
                    path: dir.clone(),
                    source,
                })?;
                tokenizer.save_hf_files(dir)?;
            }
            for text in &case.texts {
                let ids = tokenizer.encode(text, false)?;
                result.decoded.push(tokenizer.decode(&ids, false)?);
                let mut stream = tokenizer.stream_decoder(false);
                let mut streamed = String::new();
                for &id in &ids {
                    streamed.push_str(&stream.step(id)?);
                }
                streamed.push_str(&stream.finish()?);
                result.streamed.push(streamed);
                result.ids.push(ids);
            }
            Ok(result)
        });
        cases.push(result.unwrap_or_else(|e| VocabResult {
            ids: Vec::new(),
            decoded: Vec::new(),
            streamed: Vec::new(),
            error: Some(e.to_string()),
        }));
    }
    run_protocol::write_report::<GgufVocabRequest>(&GgufVocabReport { cases })?;
    Ok(())
}
