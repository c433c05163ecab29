//! `mlx-spec quantize` (any target model, in mlx-lm's format) and
//! `mlx-spec quantize-drafter` (a DSpark drafter, with the seed's policy and
//! a reload smoke test), both over `spec_models::quantize`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use draft_deepspec::DSparkModel;
use indicatif::{ProgressBar, ProgressStyle};
use spec_models::load::ProgressFn;
use spec_models::{DtypePolicy, LoadOptions};
use spec_models::quantize::drafter::{quantize_drafter_dir, DrafterOptions, SmokeFn, DRAFTER_BITS, DRAFTER_GROUP_SIZES};
use spec_models::quantize::{quantize_dir, QuantizeOptions, QuantizeReport, BITS, GROUP_SIZES};

/// Arguments of `quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// The full-precision model directory (safetensors + config.json).
    src: PathBuf,
    /// The new directory to write (must not exist).
    out: PathBuf,
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    #[arg(long, default_value_t = 4, value_parser = |s: &str| one_of(s, BITS))]
    bits: i32,
    /// Weights sharing one scale and bias: 32, 64 or 128.
    #[arg(long, default_value_t = 64, value_parser = |s: &str| one_of(s, GROUP_SIZES))]
    group_size: i32,
}

/// Arguments of `quantize-drafter`.
#[derive(clap::Args)]
pub struct DrafterArgs {
    /// The DSpark drafter directory (`Gemma4DSparkModel`).
    src: PathBuf,
    /// The new directory to write (must not exist).
    out: PathBuf,
    /// Bits per weight: 4 or 8.
    #[arg(long, default_value_t = 4, value_parser = |s: &str| one_of(s, DRAFTER_BITS))]
    bits: i32,
    /// Weights sharing one scale and bias: 32 or 64.
    #[arg(long, default_value_t = 64, value_parser = |s: &str| one_of(s, DRAFTER_GROUP_SIZES))]
    group_size: i32,
    /// Do not reload the output and run the projection smoke test.
    #[arg(long)]
    skip_smoke: bool,
}

fn one_of(s: &str, allowed: &[i32]) -> Result<i32, String> {
    let listed = || allowed.iter().map(i32::to_string).collect::<Vec<_>>().join(", ");
    match s.parse::<i32>() {
        Ok(v) if allowed.contains(&v) => Ok(v),
        _ => Err(format!("expected one of {}", listed())),
    }
}

/// A progress bar over the source tensors, and the callback driving it.
fn progress_bar(src: &Path) -> (ProgressBar, ProgressFn) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("quantizing {msg} [{bar:30}] {pos}/{len} tensors")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let driven = bar.clone();
    let callback: ProgressFn = Arc::new(move |done, total| {
        driven.set_length(total as u64);
        driven.set_position(done as u64);
    });
    (bar, callback)
}

fn summary(report: &QuantizeReport, out: &Path, bits: i32, group_size: i32) {
    let excluded = if report.excluded.is_empty() { String::new() } else { format!(", kept full precision: {}", report.excluded.join(", ")) };
    eprintln!(
        "quantized {} modules to {bits} bits (group {group_size}){excluded}; {} other tensors copied; {} shard(s), {:.1} MB -> {}",
        report.quantized.len(),
        report.kept - report.excluded.len(),
        report.shards,
        report.total_size as f64 / 1e6,
        out.display()
    );
}

pub fn run(args: Args) -> Result<()> {
    let (bar, progress) = progress_bar(&args.src);
    let options = QuantizeOptions { progress: Some(progress), ..QuantizeOptions::new(args.bits, args.group_size) };
    let report = quantize_dir(&args.src, &args.out, &options);
    bar.finish_and_clear();
    let report = report.with_context(|| format!("quantizing {}", args.src.display()))?;
    summary(&report, &args.out, args.bits, args.group_size);
    Ok(())
}

pub fn run_drafter(args: DrafterArgs) -> Result<()> {
    let (bar, progress) = progress_bar(&args.src);
    let smoke = if args.skip_smoke { None } else { Some(drafter_smoke()) };
    let options = DrafterOptions { bits: args.bits, group_size: args.group_size, progress: Some(progress), smoke };
    let report = quantize_drafter_dir(&args.src, &args.out, &options);
    bar.finish_and_clear();
    let report = report.with_context(|| format!("quantizing drafter {}", args.src.display()))?;
    summary(&report, &args.out, args.bits, args.group_size);
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
        let options = LoadOptions { dtype: DtypePolicy::Keep, progress: None };
        let model = DSparkModel::load(dir, &options).map_err(|e| format!("reloading: {e}"))?;
        let config = model.config();
        let zeros = mlx_rs::ops::zeros::<f32>(&[1, 1, config.context_width()]).map_err(|e| e.to_string())?;
        let projected = model.project_context(&zeros).map_err(|e| format!("project_context: {e}"))?;
        projected.eval().map_err(|e| e.to_string())?;
        let expected = [1, 1, config.hidden];
        if projected.shape() != expected {
            return Err(format!("project_context on zeros {:?} gave {:?}, expected {expected:?}", zeros.shape(), projected.shape()));
        }
        Ok(())
    })
}
