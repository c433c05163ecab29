//! SentencePiece vocabularies (`tokenizer.ggml.model` = `llama`: Llama 2,
//! Mistral, TinyLlama, Phi-3) as Hugging Face's tokenizers run them: a BPE
//! with byte fallback over the pieces, `▁` for spaces and one prepended
//! (unless `tokenizer.ggml.add_space_prefix` is false). GGUF keeps the
//! pieces' scores, not merges: the merges are rebuilt from them, each pair
//! of pieces that joins into a piece ranked by that piece's score, as
//! transformers does when it converts a SentencePiece model.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper};

use super::{Metadata, ADD_SPACE_PREFIX, SCORES, TOKEN_TYPE_NORMAL, UNK_ID};
use crate::TextError;

/// SentencePiece's stand-in for a space.
const SPACE: &str = "\u{2581}";

pub(super) fn build(
    meta: &Metadata,
    tokens: &[String],
    token_types: &[i64],
) -> Result<tokenizers::Tokenizer, TextError> {
    let scores = meta.floats(SCORES)?.ok_or_else(|| meta.missing(SCORES))?;
    if scores.len() != tokens.len() {
        return Err(meta.bad(
            SCORES,
            format!("has {} entries for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let ids: HashMap<&str, u32> = (0_u32..)
        .zip(tokens)
        .map(|(id, t)| (t.as_str(), id))
        .collect();
    let normal = |id: u32| {
        token_types
            .get(id as usize)
            .is_none_or(|&t| t == TOKEN_TYPE_NORMAL)
    };
    // Every split of a normal piece into two normal pieces, the splits of a
    // piece in the order of their halves' ids, then all by the joined
    // piece's score, highest first (a stable sort keeps ties in id order).
    let mut merges: Vec<(f32, u32, u32)> = Vec::new();
    for (id, piece) in (0_u32..).zip(tokens) {
        if !normal(id) {
            continue;
        }
        let mut local: Vec<(u32, u32)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (left, right) = piece.split_at(at);
                let (&l, &r) = (ids.get(left)?, ids.get(right)?);
                (normal(l) && normal(r)).then_some((l, r))
            })
            .collect();
        local.sort_unstable();
        merges.extend(local.into_iter().map(|(l, r)| (scores[id as usize], l, r)));
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let merges = merges
        .into_iter()
        .map(|(_, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect();
    let unk = meta.token(UNK_ID, tokens)?.map(|(_, text)| text);
    let vocab: Vocab = (0_u32..)
        .zip(tokens)
        .map(|(id, t)| (t.clone(), id))
        .collect();
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = &unk {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe.build().map_err(|source| TextError::Build { source })?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", SPACE).map_err(|source| TextError::Build { source })?;
    let normalizer: NormalizerWrapper = if meta.flag(ADD_SPACE_PREFIX)?.unwrap_or(true) {
        NormalizerSequence::new(vec![Prepend::new(SPACE.to_owned()).into(), replace.into()]).into()
    } else {
        replace.into()
    };
    inner.with_normalizer(Some(normalizer));
    let back = DecoderSequence::new(vec![
        DecoderWrapper::Replace(
            Replace::new(SPACE, " ").map_err(|source| TextError::Build { source })?,
        ),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', 1, 0).into(),
    ]);
    inner.with_decoder(Some(back));
    // The unknown piece is special, as in the Hugging Face files.
    if let Some(unk) = unk {
        inner.add_special_tokens(&[AddedToken::from(unk, true)]);
    }
    Ok(inner)
}
