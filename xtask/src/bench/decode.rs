//! `cargo xtask bench decode`: mlx-spec and mlx-lm decoding the same model
//! (same files, dtype, prompt) in one run, each on our row-invariant GEMM
//! front and on OpenBLAS alone (`MLX_SPEC_GEMM=blas`), as ratios, against the
//! bandwidth ceiling (weight bytes per token over measured memory bandwidth);
//! then the target's forward over verify windows of 1-17 rows on both.
//!
//! Options: `--model DIR` (default: SmolLM2-135M in float32), `--prompt P`,
//! `--max-tokens N` (default 128), `--runs R` (best of R each, default 2),
//! `--kv-bits B` (a third configuration: the front with both engines keeping
//! keys and values in B bits, groups of 64, both with
//! `--quantized-kv-start 0`), `--adapter-path DIR` (another: the front with
//! both engines applying that adapter, `--adapter-path`; `gate` names the
//! `parity` gate's LoRA adapter of the default model, written on first
//! use), `--context N` (the prompt repeated to about N tokens: a long
//! context, where the peak memory each engine prints, MLX's allocations,
//! shows what quantized keys and values save), `--max-kv-size N` (another:
//! the front with both engines given `--max-kv-size N`; mlx-lm bounds only
//! the families without a `make_cache`, so on the llama default model its
//! row is unbounded and says so).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use run_protocol::timing::{WindowTime, WindowTimeRequest};

use crate::{real_model, runs, shell, venv};

const DEFAULT_PROMPT: &str =
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle.";

struct Options {
    model: Option<PathBuf>,
    prompt: String,
    max_tokens: usize,
    runs: usize,
    kv_bits: Option<u32>,
    adapter: Option<String>,
    context: Option<usize>,
    max_kv_size: Option<usize>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        model: None,
        prompt: DEFAULT_PROMPT.to_owned(),
        max_tokens: 128,
        runs: 2,
        kv_bits: None,
        adapter: None,
        context: None,
        max_kv_size: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => o.model = Some(PathBuf::from(value()?)),
            "--prompt" => o.prompt = value()?.clone(),
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--runs" => o.runs = value()?.parse().context("--runs")?,
            "--kv-bits" => o.kv_bits = Some(value()?.parse().context("--kv-bits")?),
            "--adapter-path" => o.adapter = Some(value()?.clone()),
            "--context" => o.context = Some(value()?.parse().context("--context")?),
            "--max-kv-size" => o.max_kv_size = Some(value()?.parse().context("--max-kv-size")?),
            other => {
                bail!("unknown option {other} (known: --model, --prompt, --max-tokens, --runs, --kv-bits, --adapter-path, --context, --max-kv-size)")
            }
        }
    }
    if let Some(n) = o.context {
        o.prompt = long_prompt(&o.prompt, n);
    }
    if o.runs == 0 {
        bail!("--runs must be at least 1");
    }
    Ok(o)
}

/// `prompt` repeated until it is about `tokens` tokens long (four
/// characters a token, English under a BPE vocabulary; each engine reports
/// the count it saw).
fn long_prompt(prompt: &str, tokens: usize) -> String {
    let copies = (tokens * 4).div_ceil(prompt.len().max(1) + 1).max(1);
    vec![prompt; copies].join(" ")
}

/// Prompt tokens/s, generated tokens, generation tokens/s, prompt tokens
/// and peak memory in GB (as the engine prints them).
type Speeds = (f64, usize, f64, usize, f64);

/// Prompt and generation tokens/s from a final line shaped like mlx-lm's
/// (`Prompt: N tokens, X tokens-per-sec` ... `Generation: M tokens, Y
/// tokens-per-sec` ... `Peak memory: P GB`).
fn speeds(output: &str) -> Option<Speeds> {
    let grab = |label: &str| -> Option<(usize, f64)> {
        let at = output.rfind(label)? + label.len();
        let rest = &output[at..];
        let tokens: usize = rest.split_whitespace().next()?.parse().ok()?;
        let tps: f64 = rest
            .split(", ")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some((tokens, tps))
    };
    let (prompt_tokens, prompt_tps) = grab("Prompt: ")?;
    let (gen_tokens, gen_tps) = grab("Generation: ")?;
    let at = output.rfind("Peak memory: ")? + "Peak memory: ".len();
    let peak: f64 = output[at..].split_whitespace().next()?.parse().ok()?;
    Some((prompt_tps, gen_tokens, gen_tps, prompt_tokens, peak))
}

fn run_capture(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("{what} failed:\n{text}");
    }
    Ok(text)
}

/// Read bandwidth in GB/s with `threads` threads, each summing its own
/// contiguous share of 512 MiB (the best of a few passes): the ceiling a
/// decoder that streams its weights with that many threads can reach.
fn read_bandwidth(threads: usize) -> f64 {
    let words: usize = 64 << 20; // 512 MiB of u64
    let data: Vec<u64> = (0..words as u64).collect();
    let threads = threads.max(1);
    let share = words.div_ceil(threads);
    let mut best = f64::MAX;
    let mut sink = 0u64;
    for _ in 0..4 {
        let t = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|scope| {
            let parts: Vec<_> = data
                .chunks(share)
                .map(|part| scope.spawn(move || part.iter().fold(0u64, |a, &b| a.wrapping_add(b))))
                .collect();
            parts
                .into_iter()
                .map(|p| p.join().unwrap_or_default())
                .collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        sink = sums.into_iter().fold(sink, u64::wrapping_add);
    }
    std::hint::black_box(sink);
    (words * 8) as f64 / best / 1e9
}

/// The threads the front's GEMM uses, from its description (`..., N
/// threads`); the machine's cores when it does not say.
fn engine_threads(description: &str) -> usize {
    description
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" threads")?.trim().parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn weight_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "safetensors") {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// A configuration of a run: its label, environment and the flags both
/// engines take.
type Config = (String, &'static [(&'static str, &'static str)], Vec<String>);

/// The two GEMM paths compared: our front, and OpenBLAS alone.
const PATHS: [(&str, &[(&str, &str)]); 2] =
    [("front", &[]), ("openblas", &[("MLX_SPEC_GEMM", "blas")])];

/// `window_time`'s windows: median ms, rollback and bytes per window size.
fn window_times(model: &Path, env: &[(&str, &str)], label: &str) -> Result<Vec<WindowTime>> {
    let request = WindowTimeRequest::Time {
        model: model.to_owned(),
        prompt_len: 64,
        rows: vec![1, 4, 8, 17],
        repeats: 9,
    };
    let report = runs::example(&request, &work().join(format!("window-time-{label}")), env)?;
    Ok(report.windows)
}

fn work() -> PathBuf {
    shell::root().join("target").join("bench-decode")
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let python = venv::ensure()?;
    let model = match &o.model {
        Some(m) => m.clone(),
        None => real_model::ensure()?,
    };
    shell::run(shell::cargo().args([
        "build",
        "--release",
        "-q",
        "-p",
        "mlx-spec",
        "-p",
        "spec-models",
        "--bins",
        "--example",
        "window_time",
    ]))?;
    let ours_bin = shell::out_dir().join("mlx-spec");
    let max = o.max_tokens.to_string();
    // The configurations: each GEMM path with float keys and values, then
    // (with --kv-bits) the front with quantized ones.
    let mut configs: Vec<Config> = PATHS
        .iter()
        .map(|(path, env)| ((*path).to_owned(), *env, Vec::new()))
        .collect();
    if let Some(b) = o.kv_bits {
        let flags = ["--kv-bits", &b.to_string(), "--quantized-kv-start", "0"];
        let flags = flags.map(str::to_owned).to_vec();
        configs.push((format!("front+kv{b}"), PATHS[0].1, flags));
    }
    let adapter = match o.adapter.as_deref() {
        Some("gate") => {
            let name = model
                .file_name()
                .map_or_else(|| "model".into(), |n| n.to_string_lossy());
            Some(crate::adapters::ensure(&python, &model, &name, "lora", 8)?)
        }
        Some(dir) => Some(PathBuf::from(dir)),
        None => None,
    };
    if let Some(dir) = &adapter {
        let flags = vec!["--adapter-path".to_owned(), dir.display().to_string()];
        configs.push(("front+adapter".to_owned(), PATHS[0].1, flags));
    }
    if let Some(n) = o.max_kv_size {
        let flags = vec!["--max-kv-size".to_owned(), n.to_string()];
        configs.push((format!("front+max{n}"), PATHS[0].1, flags));
    }
    // (engine, configuration) -> the best run's speeds
    let mut best: Vec<((&str, String), Speeds)> = Vec::new();
    let mut keep =
        |key: (&'static str, String), v: Speeds| match best.iter_mut().find(|(k, _)| *k == key) {
            Some((_, b)) if b.2 >= v.2 => {}
            Some((_, b)) => *b = v,
            None => best.push((key, v)),
        };
    for run in 1..=o.runs {
        for (label, env, flags) in &configs {
            eprintln!("run {run}/{}, {label}: mlx-lm, then mlx-spec", o.runs);
            let text = run_capture(
                venv::python_command(&python)
                    .args(["-m", "mlx_lm", "generate", "--model"])
                    .arg(&model)
                    .args(["--prompt", &o.prompt, "--max-tokens", &max])
                    .args(flags)
                    .envs(env.iter().copied()),
                "mlx_lm generate",
            )?;
            keep(
                ("mlx-lm", label.clone()),
                speeds(&text).with_context(|| format!("no speeds in mlx-lm's output:\n{text}"))?,
            );
            let text = run_capture(
                Command::new(&ours_bin)
                    .args(["generate", "--model"])
                    .arg(&model)
                    .args(["--prompt", &o.prompt, "--max-tokens", &max])
                    .args(flags)
                    .envs(env.iter().copied()),
                "mlx-spec generate",
            )?;
            keep(
                ("mlx-spec", label.clone()),
                speeds(&text)
                    .with_context(|| format!("no speeds in mlx-spec's output:\n{text}"))?,
            );
        }
    }
    let get = |key: (&str, &str)| {
        best.iter()
            .find(|(k, _)| k.0 == key.0 && k.1 == key.1)
            .map(|(_, v)| *v)
            .context("a configuration did not run")
    };
    let windows = [
        window_times(&model, PATHS[0].1, PATHS[0].0)?,
        window_times(&model, PATHS[1].1, PATHS[1].0)?,
    ];
    let description = gemm_description()?;
    let threads = engine_threads(&description);
    let bandwidth = read_bandwidth(threads);
    let bytes = weight_bytes(&model)?;
    let ceiling = bandwidth * 1e9 / bytes as f64;
    println!(
        "\ndecode on {} (best of {} runs, {} tokens asked), CPU: {}",
        model.display(),
        o.runs,
        o.max_tokens,
        super::cpu_model()
    );
    println!("float32 GEMM of the front: {description}");
    if let Some(b) = o.kv_bits {
        println!(
            "front+kv{b}: the front, keys and values in {b} bits (groups of 64) from the first token, both engines"
        );
    }
    println!(
        "{:<10} {:<13} {:>10} {:>14} {:>10} {:>14} {:>10}",
        "engine", "GEMM", "prompt", "prompt tok/s", "gen toks", "gen tok/s", "peak GB"
    );
    for engine in ["mlx-lm", "mlx-spec"] {
        for (path, _, _) in &configs {
            let v = get((engine, path))?;
            println!(
                "{engine:<10} {path:<13} {:>10} {:>14.1} {:>10} {:>14.2} {:>10.3}",
                v.3, v.0, v.1, v.2, v.4
            );
        }
    }
    let (front, blas, lm) = (
        get(("mlx-spec", "front"))?,
        get(("mlx-spec", "openblas"))?,
        get(("mlx-lm", "front"))?,
    );
    println!(
        "ratio front / OpenBLAS (mlx-spec): generation {:.2}x, prompt {:.2}x",
        front.2 / blas.2,
        front.0 / blas.0
    );
    println!(
        "ratio mlx-spec / mlx-lm (both on the front): generation {:.2}x, prompt {:.2}x",
        front.2 / lm.2,
        front.0 / lm.0
    );
    if let Some(b) = o.kv_bits {
        let label = format!("front+kv{b}");
        let (ours, theirs) = (get(("mlx-spec", &label))?, get(("mlx-lm", &label))?);
        println!(
            "keys and values in {b} bits: mlx-spec / mlx-lm generation {:.2}x, prompt {:.2}x; against float keys: mlx-spec generation {:.2}x, mlx-lm {:.2}x",
            ours.2 / theirs.2,
            ours.0 / theirs.0,
            ours.2 / front.2,
            theirs.2 / lm.2
        );
        println!(
            "peak memory with {b}-bit keys and values against float ones (MLX's allocations, {} prompt tokens + {} generated): mlx-spec {:.3} GB less, mlx-lm {:.3} GB less",
            front.3,
            front.1,
            front.4 - ours.4,
            lm.4 - theirs.4
        );
    }
    if let Some(dir) = &adapter {
        let (ours, theirs) = (
            get(("mlx-spec", "front+adapter"))?,
            get(("mlx-lm", "front+adapter"))?,
        );
        println!(
            "adapter {} (unfused): mlx-spec / mlx-lm generation {:.2}x, prompt {:.2}x; against the base model: mlx-spec generation {:.2}x, mlx-lm {:.2}x",
            dir.display(),
            ours.2 / theirs.2,
            ours.0 / theirs.0,
            ours.2 / front.2,
            theirs.2 / lm.2
        );
    }
    if let Some(n) = o.max_kv_size {
        let label = format!("front+max{n}");
        let (ours, theirs) = (get(("mlx-spec", &label))?, get(("mlx-lm", &label))?);
        let unbounded = if bounds_kv(&model)? {
            ""
        } else {
            " (this model's mlx-lm `make_cache` ignores --max-kv-size: its caches stay unbounded)"
        };
        println!(
            "caches bounded to {n} positions ({} prompt tokens + {} generated): mlx-spec generation {:.2}x, prompt {:.2}x, peak memory {:.3} GB less than unbounded; mlx-lm generation {:.2}x, peak {:.3} GB less{unbounded}",
            front.3,
            front.1,
            ours.2 / front.2,
            ours.0 / front.0,
            front.4 - ours.4,
            theirs.2 / lm.2,
            lm.4 - theirs.4
        );
    }
    println!("verify-window forward (Target::decode after a 64-token prompt, median), its rollback (trim) and the bytes it held:");
    println!(
        "{:>6} {:>12} {:>14} {:>8} {:>12} {:>10} {:>12}",
        "rows", "front ms", "openblas ms", "ratio", "x one row", "trim us", "held KB"
    );
    let one = windows[0].iter().find(|w| w.rows == 1).map(|w| w.ms);
    for w in &windows[0] {
        if let Some(theirs) = windows[1].iter().find(|t| t.rows == w.rows) {
            println!(
                "{:>6} {:>12.2} {:>14.2} {:>7.2}x {:>11.2}x {:>10.1} {:>12.1}",
                w.rows,
                w.ms,
                theirs.ms,
                theirs.ms / w.ms,
                one.map_or(f64::NAN, |o| w.ms / o),
                w.trim_us,
                w.added_bytes as f64 / 1e3
            );
        }
    }
    println!(
        "bandwidth ceiling: {:.1} GB/s read ({threads} threads, as the engine's GEMM uses) / {:.0} MB of weights per token = {:.1} tok/s; mlx-spec reaches {:.0}% of it",
        bandwidth,
        bytes as f64 / 1e6,
        ceiling,
        100.0 * front.2 / ceiling
    );
    Ok(())
}

/// Whether mlx-lm's `make_prompt_cache` bounds the model at `dir`
/// (`model_type`s without a `make_cache`: of ours, qwen2 and qwen3).
fn bounds_kv(dir: &Path) -> Result<bool> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let model_type = config.get("model_type").and_then(|t| t.as_str());
    Ok(matches!(model_type, Some("qwen2" | "qwen3")))
}

/// The front's self-description (ISA, threads), asked of a process that
/// loads it.
fn gemm_description() -> Result<String> {
    let report = runs::example(
        &WindowTimeRequest::Describe,
        &work().join("window-time-describe"),
        &[],
    )?;
    Ok(report.gemm)
}

#[cfg(test)]
mod tests {
    use super::{engine_threads, speeds};

    #[test]
    fn the_ceiling_uses_the_engines_threads() {
        assert_eq!(
            engine_threads("row-invariant avx512f, every product, 2 threads"),
            2
        );
        assert_eq!(engine_threads("row-invariant avx2, 16 threads"), 16);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(engine_threads("the BLAS's own"), cores);
    }

    #[test]
    fn reads_both_output_formats() {
        let ours = "text\n==========\nPrompt: 37 tokens, 192.880 tokens-per-sec | Generation: 7 tokens, 18.369 tokens-per-sec | Peak memory: 0.552 GB\n";
        assert_eq!(speeds(ours), Some((192.88, 7, 18.369, 37, 0.552)));
        let theirs = "text\n==========\nPrompt: 37 tokens, 138.232 tokens-per-sec\nGeneration: 8 tokens, 18.639 tokens-per-sec\nPeak memory: 0.551 GB\n";
        assert_eq!(speeds(theirs), Some((138.232, 8, 18.639, 37, 0.551)));
    }

    #[test]
    fn a_long_prompt_repeats_the_text_to_about_the_tokens_asked() {
        let text = super::long_prompt("abcd efgh", 100);
        assert!(text.len() >= 399 && text.len() < 420, "{}", text.len());
        assert!(text.starts_with("abcd efgh abcd efgh"));
        assert_eq!(super::long_prompt("long enough", 1), "long enough");
    }
}
