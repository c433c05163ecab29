//! A chained head's state right after its prefill (Qwen's MTP head,
//! EAGLE-3), as a prefix-cache entry keeps it: the head's key/value rows
//! (row `j` pairs prompt token `j + 1` with the input at position `j`) and
//! every prompt position's input (`[1, P, H]`; the last one anchors the
//! first draft). A later prompt sharing the first `keep` tokens starts from
//! the rows before position `keep - 1` and the inputs of positions
//! `..keep`, and adds the rest itself.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::{LayerCache, SavedDraft, SpecError};

use super::KvCache;

/// A head's rows and inputs after a prefill.
#[derive(Debug)]
pub struct SavedHeadRows {
    cache: KvCache,
    inputs: Array,
}

impl SavedHeadRows {
    /// Keeps `cache` (the prompt's rows) and `inputs` (every prompt
    /// position's, `[1, P, H]`).
    pub fn new(cache: KvCache, inputs: Array) -> Self {
        Self { cache, inputs }
    }

    /// For a prompt of `len` tokens whose first `keep` equal the saved
    /// prompt's: the cache holding the rows of positions before `keep - 1`
    /// and the inputs of positions `..keep`; `None` when `keep` is 0 or
    /// beyond either prompt.
    pub fn restore(&self, keep: usize, len: usize) -> Result<Option<(KvCache, Array)>, SpecError> {
        if keep == 0 || keep > self.tokens() || keep > len {
            return Ok(None);
        }
        let mut cache = self.cache.clone();
        let extra = cache.offset().saturating_sub(keep - 1);
        if extra > 0 {
            cache.trim(extra)?;
        }
        Ok(Some((cache, self.inputs.index((.., ..keep as i32, ..)))))
    }
}

impl SavedDraft for SavedHeadRows {
    fn tokens(&self) -> usize {
        self.inputs.shape().get(1).map_or(0, |&p| p as usize)
    }
    fn nbytes(&self) -> usize {
        self.cache.nbytes() + self.inputs.nbytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_keeps_the_rows_before_the_shared_prefix_s_last_position() {
        let mut cache = KvCache::new();
        let rows = Array::from_slice(
            &(0..20).map(|i| i as f32).collect::<Vec<_>>(),
            &[1, 1, 5, 4],
        );
        cache.update_and_fetch(&rows, &rows).expect("rows");
        let inputs = Array::zeros::<f32>(&[1, 6, 3]).expect("inputs");
        let saved = SavedHeadRows::new(cache, inputs);
        assert_eq!(saved.tokens(), 6);
        let (c, kept) = saved.restore(4, 9).expect("restore").expect("some");
        assert_eq!(c.offset(), 3);
        assert_eq!(kept.shape(), [1, 4, 3]);
        let (c, _) = saved.restore(6, 6).expect("restore").expect("some");
        assert_eq!(c.offset(), 5, "the whole saved prompt: every row");
        assert!(saved.restore(0, 6).expect("restore").is_none());
        assert!(
            saved.restore(7, 9).expect("restore").is_none(),
            "past the saved prompt"
        );
        assert!(
            saved.restore(5, 4).expect("restore").is_none(),
            "past this prompt"
        );
    }
}
