//! `generate`'s and `serve`'s flags that stream a mixture-of-experts
//! model's routed experts from disk (`--expert-cache-bytes`) and keep its
//! MTP row's at 8 bits (`--mtp-expert-bits`); under `--pipeline` each rank
//! streams its own layers' experts through a tier of that size.

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ExpertArgs {
    /// Leave the routed experts of a mixture-of-experts model (glm_moe_dsa,
    /// qwen3_next / qwen3_5_moe, Gemma-4's expert blocks)
    /// on disk and read them on demand into a resident tier of at most
    /// this many bytes (least recently used evicted first); attention,
    /// dense layers, shared experts, embeddings and head stay resident.
    /// The output is the same bits as with every expert loaded. Under
    /// `--pipeline`, each rank keeps a tier of this size for its layers.
    #[arg(long, value_name = "BYTES")]
    pub expert_cache_bytes: Option<usize>,
    /// Keep the MTP row's routed experts resident at 8 bits (the only
    /// value taken; quantized once at load when stored in float): what
    /// `--draft glm52-native-mtp` needs on a streamed target.
    #[arg(long, value_name = "BITS")]
    pub mtp_expert_bits: Option<i32>,
}
