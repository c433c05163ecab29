//! The view of a target model that the serve loop and draft providers use.

use mlx_rs::Array;

use crate::{CacheSet, SpecError};

/// Facts about a loaded target model.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetInfo {
    /// `model_type` of the checkpoint (`llama`, `qwen3`, ...).
    pub model_type: String,
    /// Rows of the embedding table / columns of the logits.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Longest context the checkpoint was trained for, when it says.
    pub context_length: Option<usize>,
}

/// What one forward pass returns.
#[derive(Debug)]
pub struct TargetOutput {
    /// Hidden states after the final norm, `[1, L, hidden]`.
    pub hidden: Array,
    /// The outputs of the requested layers concatenated on the last axis,
    /// `[1, L, taps * hidden]`, when taps were asked for.
    pub taps: Option<Array>,
}

/// A target model: forward over a window of tokens with per-request caches.
pub trait Target: std::fmt::Debug {
    /// Facts about the model.
    fn info(&self) -> &TargetInfo;
    /// Fresh caches for one request.
    fn make_caches(&self) -> CacheSet;
    /// Runs `tokens` (`[1, L]`, int32 or uint32) through the model, appending to
    /// `caches`; `taps` lists decoder-layer indices whose outputs to return.
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError>;
    /// `forward` over decoding rows (a pending token and its drafts, or one
    /// token of plain decoding) rather than a prompt chunk. Every row must
    /// give the bits it gives when run alone: architectures whose multi-row
    /// forward computes rows another way than a single-row one (GLM's MLA
    /// expands the latent cache for several queries and absorbs it for one)
    /// override this to compute each row as a single query.
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.forward(tokens, caches, taps)
    }
    /// Logits `[.., vocab]` from post-norm hidden states.
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError>;
    /// Token embeddings, as the model's first layer sees them.
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError>;
    /// Bytes of weights held.
    fn weights_bytes(&self) -> usize;
    /// The concrete model, for providers that need more than this view (a
    /// native MTP head reads the target's own MTP weights).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A boxed target is a target (hosts hold `Box<dyn Target>` from a loader).
impl<T: Target + ?Sized> Target for Box<T> {
    fn info(&self) -> &TargetInfo {
        (**self).info()
    }
    fn make_caches(&self) -> CacheSet {
        (**self).make_caches()
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        (**self).forward(tokens, caches, taps)
    }
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        (**self).decode(tokens, caches, taps)
    }
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        (**self).logits(hidden)
    }
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        (**self).embed(tokens)
    }
    fn weights_bytes(&self) -> usize {
        (**self).weights_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        (**self).as_any()
    }
}
