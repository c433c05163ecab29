//! `cargo xtask bench decode`: mlx-spec and mlx-lm decoding the same model
//! (same files, dtype, prompt and BLAS) in one run, as a ratio, against the
//! bandwidth ceiling (weight bytes per token over measured memory bandwidth).
//!
//! Options: `--model DIR` (default: SmolLM2-135M in float32), `--prompt P`,
//! `--max-tokens N` (default 128), `--runs R` (best of R each, default 2).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::{real_model, shell, venv};

const DEFAULT_PROMPT: &str = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle.";

struct Options {
    model: Option<PathBuf>,
    prompt: String,
    max_tokens: usize,
    runs: usize,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options { model: None, prompt: DEFAULT_PROMPT.to_owned(), max_tokens: 128, runs: 2 };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => o.model = Some(PathBuf::from(value()?)),
            "--prompt" => o.prompt = value()?.clone(),
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--runs" => o.runs = value()?.parse().context("--runs")?,
            other => bail!("unknown option {other} (known: --model, --prompt, --max-tokens, --runs)"),
        }
    }
    if o.runs == 0 {
        bail!("--runs must be at least 1");
    }
    Ok(o)
}

/// Prompt and generation tokens/s from a final line shaped like mlx-lm's
/// (`Prompt: N tokens, X tokens-per-sec` ... `Generation: M tokens, Y tokens-per-sec`).
fn speeds(output: &str) -> Option<(f64, usize, f64)> {
    let grab = |label: &str| -> Option<(usize, f64)> {
        let at = output.rfind(label)? + label.len();
        let rest = &output[at..];
        let tokens: usize = rest.split_whitespace().next()?.parse().ok()?;
        let tps: f64 = rest.split(", ").nth(1)?.split_whitespace().next()?.parse().ok()?;
        Some((tokens, tps))
    };
    let (_, prompt_tps) = grab("Prompt: ")?;
    let (gen_tokens, gen_tps) = grab("Generation: ")?;
    Some((prompt_tps, gen_tokens, gen_tps))
}

fn run_capture(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("{what} failed:\n{text}");
    }
    Ok(text)
}

/// Single-thread read bandwidth in GB/s: the best of a few sums over 512 MiB.
fn read_bandwidth() -> f64 {
    let words = 64 << 20; // 512 MiB of u64
    let data: Vec<u64> = (0..words as u64).collect();
    let mut best = f64::MAX;
    let mut sink = 0u64;
    for _ in 0..4 {
        let t = Instant::now();
        sink = sink.wrapping_add(data.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    (words * 8) as f64 / best / 1e9
}

fn weight_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        if entry.path().extension().is_some_and(|x| x == "safetensors") {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let python = venv::ensure()?;
    let model = match &o.model {
        Some(m) => m.clone(),
        None => real_model::ensure()?,
    };
    shell::run(shell::cargo().args(["build", "--release", "-q", "-p", "mlx-spec"]))?;
    let ours_bin = shell::root().join("target").join("release").join("mlx-spec");
    let max = o.max_tokens.to_string();
    let mut best_ours: Option<(f64, usize, f64)> = None;
    let mut best_ref: Option<(f64, usize, f64)> = None;
    let better = |a: Option<(f64, usize, f64)>, b: (f64, usize, f64)| match a {
        Some(a) if a.2 >= b.2 => Some(a),
        _ => Some(b),
    };
    for run in 1..=o.runs {
        eprintln!("run {run}/{}: mlx-lm, then mlx-spec", o.runs);
        let text = run_capture(
            venv::python_command(&python)
                .args(["-m", "mlx_lm", "generate", "--model"])
                .arg(&model)
                .args(["--prompt", &o.prompt, "--max-tokens", &max]),
            "mlx_lm generate",
        )?;
        best_ref = better(best_ref, speeds(&text).with_context(|| format!("no speeds in mlx-lm's output:\n{text}"))?);
        let text = run_capture(
            Command::new(&ours_bin).args(["generate", "--model"]).arg(&model).args(["--prompt", &o.prompt, "--max-tokens", &max]),
            "mlx-spec generate",
        )?;
        best_ours = better(best_ours, speeds(&text).with_context(|| format!("no speeds in mlx-spec's output:\n{text}"))?);
    }
    let (Some(ours), Some(reference)) = (best_ours, best_ref) else { bail!("no runs") };
    let bandwidth = read_bandwidth();
    let bytes = weight_bytes(&model)?;
    let ceiling = bandwidth * 1e9 / bytes as f64;
    println!("\ndecode on {} (best of {} runs, {} tokens asked)", model.display(), o.runs, o.max_tokens);
    println!("{:<10} {:>14} {:>10} {:>14}", "", "prompt tok/s", "gen toks", "gen tok/s");
    println!("{:<10} {:>14.1} {:>10} {:>14.2}", "mlx-lm", reference.0, reference.1, reference.2);
    println!("{:<10} {:>14.1} {:>10} {:>14.2}", "mlx-spec", ours.0, ours.1, ours.2);
    println!("ratio mlx-spec / mlx-lm: generation {:.2}x, prompt {:.2}x", ours.2 / reference.2, ours.0 / reference.0);
    println!(
        "bandwidth ceiling: {:.1} GB/s read (one thread) / {:.0} MB of weights per token = {:.1} tok/s; mlx-spec reaches {:.0}% of it",
        bandwidth,
        bytes as f64 / 1e6,
        ceiling,
        100.0 * ours.2 / ceiling
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::speeds;

    #[test]
    fn reads_both_output_formats() {
        let ours = "text\n==========\nPrompt: 37 tokens, 192.880 tokens-per-sec | Generation: 7 tokens, 18.369 tokens-per-sec | Peak memory: 0.552 GB\n";
        assert_eq!(speeds(ours), Some((192.88, 7, 18.369)));
        let theirs = "text\n==========\nPrompt: 37 tokens, 138.232 tokens-per-sec\nGeneration: 8 tokens, 18.639 tokens-per-sec\nPeak memory: 0.551 GB\n";
        assert_eq!(speeds(theirs), Some((138.232, 8, 18.639)));
    }
}
