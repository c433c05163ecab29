//! `mlx-spec quantize` (any target model, in mlx-lm's format) and
//! `mlx-spec quantize-drafter` (a DSpark or DFlash drafter or an EAGLE-3
//! head, by its `architectures`, with the drafter policy and a reload smoke
//! test), both
//! over `spec_formats::quantize`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use draft_deepspec::quantize::{quantize_drafter_dir, DrafterOptions, SmokeFn};
use draft_deepspec::DSparkModel;
use indicatif::{ProgressBar, ProgressStyle};
use spec_formats::quantize::{quantize_dir, QuantizeOptions, QuantizeReport};
use spec_models::{DtypePolicy, LoadOptions};
use spec_runtime::config::{QuantMode, QuantParams};
use spec_runtime::ProgressFn;

/// The quantization flags both commands share, as `mlx_lm.convert` names
/// them (`--q-mode`, `--q-bits`, `--q-group-size`): the mode, and bits and
/// group size defaulting to the mode's.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct QuantFlags {
    /// affine, mxfp4, nvfp4 or mxfp8.
    #[arg(long, default_value = "affine", value_parser = parse_mode)]
    mode: QuantMode,
    /// Bits per weight. Default: the mode's (8 for mxfp8, else 4). Affine
    /// takes 2, 3, 4, 5, 6 or 8; each other mode only its default.
    #[arg(long)]
    bits: Option<i32>,
    /// Weights sharing one scale (and bias). Default: the mode's (affine
    /// 64, mxfp4 32, nvfp4 16, mxfp8 32). Affine takes 32, 64 or 128; each
    /// other mode only its default.
    #[arg(long)]
    group_size: Option<i32>,
}

impl QuantFlags {
    /// The checked parameters.
    fn params(self) -> Result<QuantParams> {
        QuantParams::new(self.mode, self.group_size, self.bits).map_err(anyhow::Error::from)
    }
}

fn parse_mode(s: &str) -> Result<QuantMode, String> {
    s.parse::<QuantMode>().map_err(|e| e.to_string())
}

/// Arguments of `quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// The full-precision model directory (safetensors + config.json).
    src: PathBuf,
    /// The new directory to write (must not exist).
    out: PathBuf,
    #[command(flatten)]
    quant: QuantFlags,
}

/// Arguments of `quantize-drafter` (the drafter policy: affine with 4 or 8
/// bits and group size 32 or 64, or a floating-point mode).
#[derive(clap::Args)]
pub struct DrafterArgs {
    /// The drafter directory: DSpark (`Gemma4DSparkModel`), DFlash
    /// (`DFlashDraftModel`, `DFlash2DraftModel`) or an EAGLE-3 head
    /// (`LlamaForCausalLMEagle3`).
    src: PathBuf,
    /// The new directory to write (must not exist).
    out: PathBuf,
    #[command(flatten)]
    quant: QuantFlags,
    /// Do not reload the output and run the projection smoke test.
    #[arg(long)]
    skip_smoke: bool,
}

/// A progress bar over the tensors `verb` (quantizing, fusing) goes
/// through, and the callback driving it.
pub(crate) fn progress_bar(verb: &str, src: &Path) -> (ProgressBar, ProgressFn) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{verb} {{msg}} [{{bar:30}}] {{pos}}/{{len}} tensors"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(
        src.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let driven = bar.clone();
    let callback: ProgressFn = Arc::new(move |done, total| {
        driven.set_length(total as u64);
        driven.set_position(done as u64);
    });
    (bar, callback)
}

fn summary(report: &QuantizeReport, out: &Path, params: QuantParams) {
    let excluded = if report.excluded.is_empty() {
        String::new()
    } else {
        format!(", kept full precision: {}", report.excluded.join(", "))
    };
    eprintln!(
        "quantized {} modules to {params}{excluded}; {} other tensors copied; {} shard(s), {:.1} MB -> {}",
        report.quantized.len(),
        report.kept - report.excluded.len(),
        report.shards,
        report.total_size as f64 / 1e6,
        out.display()
    );
}

pub fn run(args: Args) -> Result<()> {
    let params = args.quant.params()?;
    let (bar, progress) = progress_bar("quantizing", &args.src);
    let options = QuantizeOptions {
        progress: Some(progress),
        ..QuantizeOptions::new(params)
    };
    let report = quantize_dir(&args.src, &args.out, &options);
    bar.finish_and_clear();
    let report = report.with_context(|| format!("quantizing {}", args.src.display()))?;
    summary(&report, &args.out, params);
    Ok(())
}

pub fn run_drafter(args: DrafterArgs) -> Result<()> {
    let params = args.quant.params()?;
    let (bar, progress) = progress_bar("quantizing", &args.src);
    let architecture = spec_formats::quantize::drafter::architecture(&args.src)?;
    let is = |name: &str| architecture.as_deref() == Some(name);
    let (dflash, eagle3) = (
        draft_dflash::config::ARCHITECTURES.into_iter().any(is),
        is(draft_eagle3::config::ARCHITECTURE),
    );
    let smoke = match (args.skip_smoke, dflash, eagle3) {
        (true, _, _) => None,
        (false, true, _) => Some(draft_dflash::quantize::smoke()),
        (false, _, true) => Some(draft_eagle3::quantize::smoke()),
        (false, false, false) => Some(drafter_smoke()),
    };
    let options = DrafterOptions {
        params,
        progress: Some(progress),
        smoke,
    };
    // Anything that is neither a DFlash drafter nor an EAGLE-3 head goes to
    // the DSpark policy, whose error names both the architecture found and
    // the command for target models.
    let report = if dflash {
        draft_dflash::quantize::quantize_drafter_dir(&args.src, &args.out, &options)
    } else if eagle3 {
        draft_eagle3::quantize::quantize_head_dir(&args.src, &args.out, &options)
    } else {
        quantize_drafter_dir(&args.src, &args.out, &options)
    };
    bar.finish_and_clear();
    let report = report.with_context(|| format!("quantizing drafter {}", args.src.display()))?;
    summary(&report, &args.out, params);
    if !args.skip_smoke {
        eprintln!("reload smoke test passed");
    }
    Ok(())
}

/// The seed's load smoke test: reload the quantized drafter as it is stored
/// and project one row of zero taps (`[1, 1, taps * H]`), which must give
/// `[1, 1, H]`.
fn drafter_smoke() -> SmokeFn {
    Arc::new(|dir: &Path| {
        let options = LoadOptions {
            dtype: DtypePolicy::Keep,
            progress: None,
            expert_cache_bytes: None,
            mtp_expert_bits: None,
            kv_quantization: None,
            adapter: None,
            max_kv_size: None,
        };
        let model = DSparkModel::load(dir, &options).map_err(|e| format!("reloading: {e}"))?;
        let config = model.config();
        let zeros = mlx_rs::ops::zeros::<f32>(&[1, 1, config.context_width()])
            .map_err(|e| e.to_string())?;
        let projected = model
            .project_context(&zeros)
            .map_err(|e| format!("project_context: {e}"))?;
        projected.eval().map_err(|e| e.to_string())?;
        let expected = [1, 1, config.hidden];
        if projected.shape() != expected {
            return Err(format!(
                "project_context on zeros {:?} gave {:?}, expected {expected:?}",
                zeros.shape(),
                projected.shape()
            ));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use mlx_rs::Array;
    use serde_json::json;
    use spec_formats::quantize::QuantizeError;

    use super::*;

    const H: i32 = 32;
    const V: i32 = 64;
    const R: i32 = 32;

    /// A DSpark checkpoint the drafter crate loads (2 taps, one layer).
    fn write_drafter(dir: &Path, activation: &str) {
        std::fs::create_dir_all(dir).expect("mkdir");
        let config = json!({
            "architectures": ["Gemma4DSparkModel"], "model_type": "gemma4_text", "hidden_size": H,
            "num_hidden_layers": 1, "num_attention_heads": 2, "global_head_dim": 32,
            "num_global_key_value_heads": 1, "attention_k_eq_v": true, "intermediate_size": 64,
            "hidden_activation": activation, "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
            "vocab_size": V, "block_size": 4, "mask_token_id": 3, "target_layer_ids": [0, 1],
            "num_target_layers": 2, "markov_rank": R, "markov_head_type": "vanilla",
            "enable_confidence_head": true, "confidence_head_with_markov": true,
            "rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}
        });
        std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
        let mut shapes: Vec<(String, Vec<i32>)> = [
            ("embed_tokens.weight", vec![V, H]),
            ("fc.weight", vec![H, 2 * H]),
            ("hidden_norm.weight", vec![H]),
            ("norm.weight", vec![H]),
            ("lm_head.weight", vec![V, H]),
            ("markov_head.markov_w1.weight", vec![V, R]),
            ("markov_head.markov_w2.weight", vec![V, R]),
            ("confidence_head.proj.weight", vec![1, H + R]),
            ("confidence_head.proj.bias", vec![1]),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_owned(), s))
        .collect();
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![64, H]),
            ("self_attn.k_proj.weight", vec![32, H]),
            ("self_attn.o_proj.weight", vec![H, 64]),
            ("self_attn.q_norm.weight", vec![32]),
            ("self_attn.k_norm.weight", vec![32]),
            ("input_layernorm.weight", vec![H]),
            ("post_attention_layernorm.weight", vec![H]),
            ("pre_feedforward_layernorm.weight", vec![H]),
            ("post_feedforward_layernorm.weight", vec![H]),
            ("mlp.gate_proj.weight", vec![64, H]),
            ("mlp.up_proj.weight", vec![64, H]),
            ("mlp.down_proj.weight", vec![H, 64]),
            ("layer_scalar", vec![1]),
        ] {
            shapes.push((format!("layers.0.{n}"), s));
        }
        let tensors: HashMap<String, Array> = shapes
            .into_iter()
            .map(|(name, shape)| {
                let n: i32 = shape.iter().product();
                let data: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 + name.len() as i32) % 101) as f32 / 101.0 - 0.3)
                    .collect();
                (name, Array::from_slice(&data, &shape))
            })
            .collect();
        Array::save_safetensors(tensors, None, dir.join("model.safetensors")).expect("weights");
    }

    fn options(smoke: Option<SmokeFn>) -> DrafterOptions {
        DrafterOptions {
            params: QuantParams::affine(32, 4),
            progress: None,
            smoke,
        }
    }

    #[test]
    fn the_smoke_test_reloads_a_quantized_drafter_and_catches_one_that_does_not_load() {
        let root = tempfile::tempdir().expect("tempdir");
        let good = root.path().join("good");
        write_drafter(&good, "gelu_pytorch_tanh");
        quantize_drafter_dir(
            &good,
            &root.path().join("good-q4"),
            &options(Some(drafter_smoke())),
        )
        .expect("quantize and smoke");
        // The drafter crate reloads every floating-point mode too.
        for mode in [QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8] {
            let options = DrafterOptions {
                params: mode.default_params(),
                ..options(Some(drafter_smoke()))
            };
            quantize_drafter_dir(&good, &root.path().join(mode.as_str()), &options)
                .unwrap_or_else(|e| panic!("{mode}: {e}"));
        }

        // Quantizing never reads the activation; reloading does.
        let bad = root.path().join("bad");
        write_drafter(&bad, "relu");
        let err = quantize_drafter_dir(
            &bad,
            &root.path().join("bad-q4"),
            &options(Some(drafter_smoke())),
        )
        .expect_err("smoke fails");
        assert!(
            matches!(&err, QuantizeError::Smoke { message, .. } if message.contains("relu")),
            "{err}"
        );
        quantize_drafter_dir(&bad, &root.path().join("bad-q4-unchecked"), &options(None))
            .expect("no smoke, no reload");
    }

    #[test]
    fn flags_default_per_mode_and_refuse_what_mlx_does_not_take() {
        let params = |mode: &str, bits: Option<i32>, group_size: Option<i32>| {
            let mode = parse_mode(mode)?;
            QuantFlags {
                mode,
                bits,
                group_size,
            }
            .params()
            .map_err(|e| e.to_string())
        };
        let check = |mode, group_size, bits| {
            Ok(QuantParams {
                mode,
                group_size,
                bits,
            })
        };
        assert_eq!(
            params("affine", None, None),
            check(QuantMode::Affine, 64, 4)
        );
        assert_eq!(
            params("affine", Some(8), Some(32)),
            check(QuantMode::Affine, 32, 8)
        );
        assert_eq!(params("mxfp4", None, None), check(QuantMode::Mxfp4, 32, 4));
        assert_eq!(params("nvfp4", None, None), check(QuantMode::Nvfp4, 16, 4));
        assert_eq!(params("mxfp8", None, None), check(QuantMode::Mxfp8, 32, 8));
        assert!(params("affine", Some(7), None).is_err_and(|e| e.contains("7 bits")));
        assert!(params("mxfp8", None, Some(64))
            .is_err_and(|e| e.contains("mxfp8") && e.contains("group size 32 with 8 bits only")));
        assert!(params("fp4", None, None).is_err_and(|e| e.contains("`fp4`")));
    }
}
