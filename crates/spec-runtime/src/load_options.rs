//! What every loader takes: the weights' dtype policy and a progress callback.

/// Which dtype the weights run in (spec-core's, so that a provider's
/// `dtype` option reads straight into it).
pub use spec_core::DtypePolicy;

/// Called as layers finish loading: `(layers done, layers in all)`.
pub type ProgressFn = std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Options of a model load.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Weight dtype policy.
    pub dtype: DtypePolicy,
    /// Progress callback (a CLI's progress bar).
    pub progress: Option<ProgressFn>,
    /// Stream the routed experts from disk through a resident tier of this
    /// many bytes (`--expert-cache-bytes`); `None` loads them all. An
    /// architecture without streamed experts refuses it.
    pub expert_cache_bytes: Option<usize>,
    /// Keep the MTP row's routed experts resident at this many bits
    /// (`--mtp-expert-bits`; 8, the only value taken): quantized once at
    /// load (affine, group 32) when stored in float, refused when narrower.
    pub mtp_expert_bits: Option<i32>,
    /// Keep the target's keys and values quantized (`--kv-bits`,
    /// `--kv-group-size`): a model whose caches cannot be refuses it.
    pub kv_quantization: Option<crate::cache::KvQuantization>,
    /// A fine-tuned adapter directory (`--adapter-path`): an architecture
    /// that cannot apply one refuses it.
    pub adapter: Option<std::path::PathBuf>,
    /// Bound each full-attention layer's keys and values to this many
    /// positions, the first four kept (`--max-kv-size`): a family whose
    /// caches cannot be refuses it.
    pub max_kv_size: Option<usize>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("dtype", &self.dtype)
            .field("progress", &self.progress.is_some())
            .field("expert_cache_bytes", &self.expert_cache_bytes)
            .field("mtp_expert_bits", &self.mtp_expert_bits)
            .field("kv_quantization", &self.kv_quantization)
            .field("adapter", &self.adapter)
            .field("max_kv_size", &self.max_kv_size)
            .finish()
    }
}
