//! `generate`'s and `serve`'s flags on how the target loads: its routed
//! experts streamed from disk (`--expert-cache-bytes`), its MTP row's at 8
//! bits (`--mtp-expert-bits`), its keys and values kept quantized
//! (`--kv-bits`, `--kv-group-size`) or bounded (`--max-kv-size`), a
//! fine-tuned adapter applied (`--adapter-path`); under `--pipeline` each rank takes them for its own
//! layers.

use anyhow::Result;
use spec_models::{DtypePolicy, LoadOptions};
use spec_runtime::cache::KvQuantization;
use spec_runtime::ProgressFn;

#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Leave the routed experts of a mixture-of-experts model (qwen3_moe,
    /// gpt_oss in mlx-lm's layout, glm_moe_dsa, qwen3_next / qwen3_5_moe,
    /// Gemma-4's expert blocks)
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
    /// Keep the target's keys and values quantized to this many bits (2,
    /// 3, 4, 5, 6 or 8; MLX's affine mode, one scale and bias per group of
    /// the head dimension), as mlx-lm's `--kv-bits`: from
    /// --quantized-kv-start on, the cache takes about BITS/32 of float32's
    /// memory (plus the scales). The llama family (llama, mistral, qwen2,
    /// qwen3, qwen3_moe) and the full-attention layers of qwen3_next / qwen3_5 /
    /// qwen3_5_moe; sliding-window layers stay float. Prompt-cache files
    /// hold them as mlx-lm's `QuantizedKVCache`.
    #[arg(long, value_name = "BITS")]
    pub kv_bits: Option<i32>,
    /// With --kv-bits: elements of the head dimension sharing a scale and
    /// a bias (32, 64 or 128).
    #[arg(long, value_name = "N", default_value_t = KvQuantization::DEFAULT_GROUP_SIZE, requires = "kv_bits")]
    pub kv_group_size: i32,
    /// With --kv-bits: queries from this position on read the quantized
    /// keys and values, earlier ones float ones (kept until the cache is
    /// past it), as mlx-lm's default. Decided per position where mlx-lm
    /// converts after a forward, so the output equals mlx-lm's when the
    /// prompt is shorter than N, and speculation, batching and prefix-cache
    /// hits leave it unchanged. 0 quantizes every position.
    #[arg(long, value_name = "N", default_value_t = KvQuantization::DEFAULT_START, requires = "kv_bits")]
    pub quantized_kv_start: usize,
    /// Apply the fine-tuned adapter `mlx_lm.lora` wrote into DIR
    /// (`adapter_config.json`, `adapters.safetensors`): LoRA and DoRA
    /// updates on the linear layers of the model's blocks, unfused, or a
    /// full fine-tune's replacement weights; the output equals mlx-lm's
    /// `--adapter-path`. Every family: llama, Gemma-4, the Qwen3-Next /
    /// Qwen3.5 hybrids and GLM (their stacked experts too).
    #[arg(long, value_name = "DIR")]
    pub adapter_path: Option<std::path::PathBuf>,
    /// Bound each layer's keys and values to N positions, as mlx-lm's
    /// `--max-kv-size` (its `RotatingKVCache`, keep 4): every query sees
    /// the first 4 positions and the last N - 4, so memory stops growing
    /// with the sequence. The llama family (llama, mistral, qwen2, qwen3;
    /// mlx-lm itself bounds qwen2 and qwen3 and ignores the flag for llama
    /// and mistral) and the attention layers of the Qwen3.5 / Next hybrids
    /// (mlx-lm ignores it there); layers with a sliding window keep theirs,
    /// the hybrids' recurrent layers their fixed-size states. Exact under
    /// speculation, batching and prefix-cache hits; float keys only (not
    /// with --kv-bits). The output equals mlx-lm's when the prompt is at
    /// most N tokens (a longer prompt's prefill differs: see
    /// docs/ARCHITECTURE.md).
    #[arg(long, value_name = "N")]
    pub max_kv_size: Option<usize>,
}

impl Default for LoadArgs {
    fn default() -> Self {
        Self {
            expert_cache_bytes: None,
            mtp_expert_bits: None,
            kv_bits: None,
            kv_group_size: KvQuantization::DEFAULT_GROUP_SIZE,
            quantized_kv_start: KvQuantization::DEFAULT_START,
            adapter_path: None,
            max_kv_size: None,
        }
    }
}

impl LoadArgs {
    /// The load options these flags ask for, in `dtype`.
    pub fn options(&self, dtype: DtypePolicy, progress: Option<ProgressFn>) -> Result<LoadOptions> {
        let kv_quantization = self
            .kv_bits
            .map(|bits| KvQuantization::new(bits, self.kv_group_size, self.quantized_kv_start))
            .transpose()?;
        Ok(LoadOptions {
            dtype,
            progress,
            expert_cache_bytes: self.expert_cache_bytes,
            mtp_expert_bits: self.mtp_expert_bits,
            kv_quantization,
            adapter: self.adapter_path.clone(),
            max_kv_size: self.max_kv_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_flags_become_load_options_or_a_named_error() {
        let flags = LoadArgs {
            kv_bits: Some(4),
            ..LoadArgs::default()
        };
        let options = flags.options(DtypePolicy::Float32, None).expect("options");
        assert_eq!(
            options.kv_quantization,
            Some(KvQuantization::new(4, 64, 5000).expect("params"))
        );
        let none = LoadArgs::default().options(DtypePolicy::Float32, None);
        assert!(none.expect("options").kv_quantization.is_none());
        let bad = LoadArgs {
            kv_bits: Some(4),
            kv_group_size: 100,
            ..LoadArgs::default()
        };
        let err = bad
            .options(DtypePolicy::Float32, None)
            .expect_err("refused");
        assert!(err.to_string().contains("--kv-group-size 100"), "{err}");
    }
}
