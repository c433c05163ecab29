//! Our side of `cargo xtask gate gguf`'s tokenizer check: each GGUF file's
//! tokenizer, built from its metadata as `Tokenizer::from_gguf` builds it,
//! encodes the request's texts without special tokens added.
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
            case.texts
                .iter()
                .map(|text| tokenizer.encode(text, false))
                .collect::<Result<Vec<_>, _>>()
        });
        cases.push(match result {
            Ok(ids) => VocabResult { ids, error: None },
            Err(e) => VocabResult {
                ids: Vec::new(),
                error: Some(e.to_string()),
            },
        });
    }
    run_protocol::write_report::<GgufVocabRequest>(&GgufVocabReport { cases })?;
    Ok(())
}
