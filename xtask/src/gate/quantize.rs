//! `cargo xtask gate quantize`: `mlx-spec quantize` against mlx and mlx-lm.
//!
//! For each case (a float checkpoint and a mode / bits / group size setting:
//! every affine bit width and group size between them, and each of MLX's
//! floating-point modes mxfp4, nvfp4, mxfp8; tied and untied heads, biases),
//! `mlx-spec quantize` writes our copy; `python/quantize_check.py` then
//! checks that its quantized tensors equal `mx.quantize` bit for bit and
//! that mlx-lm, quantizing the same source with the same settings
//! (`mlx_lm.convert -q --q-mode M` where the source has a tokenizer, convert's
//! own steps otherwise), writes the same tensors, config and index, and that mlx-lm
//! loads ours and generates the same tokens from it as from its own. Last,
//! our engine (the parity gate's runner) loads our copy, kept quantized, and
//! must give those same tokens.
//!
//! Fuse cases run `mlx-spec fuse` (a gate model and one of the `parity`
//! gate's adapters: DoRA on float and 4-bit weights, kept quantized and
//! dequantized, a full fine-tune, LoRA on the real model and on stacked
//! experts); `python/fuse_check.py` has mlx-lm fuse the same files
//! (`mlx_lm.fuse`, or its steps where the model has no tokenizer) and
//! checks the same tensors bit for bit and the same `quantization` block;
//! then mlx-lm and our engine must give the same tokens from our copy.
//!
//! Drafter cases run `mlx-spec quantize-drafter` (its reload smoke test
//! included) on the synthetic DSpark drafter (float32 and bfloat16); its
//! output must equal `mx.quantize` bit for bit and, where `synth_dspark.rs`
//! quantized the same drafter with the seed's policy in Python, that copy
//! (tensors and `quantization` block).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::json;

use super::{parity, Counts};
use crate::{adapters, real_model, shell, synth, synth_dspark, venv};
use spec_fixtures::rng::SplitMix64;

const CHECK: &str = "xtask/python/quantize_check.py";
const PROMPT_SEED: u64 = 0x7175_616e_7469_7a65;
const PROMPT_LENGTHS: &[usize] = &[1, 9, 33];
const MAX_TOKENS: usize = 16;

/// A source checkpoint (a synthetic one by name, or the real model) and settings.
struct Case {
    model: &'static str,
    /// MLX's mode, as `--mode` and mlx-lm's `--q-mode` take it.
    mode: &'static str,
    bits: u32,
    group_size: u32,
    /// What mlx-lm's files are to ours.
    files: Files,
}

/// How mlx-lm's quantized files compare with ours.
#[derive(Clone, Copy)]
enum Files {
    /// The same tensors, config and index.
    Same,
    /// The same, and both quantize what mlx-lm's `sanitize` makes of the
    /// source (`qwen3_moe`'s per-expert tensors stacked): our tensors are
    /// checked against `mx.quantize` of mlx-lm's loaded model.
    Sanitized,
    /// Not compared: mlx-lm's `sanitize` rewrites the checkpoint at load
    /// (the gemma4 wrapper: renamed, KV-shared layers' unused projections
    /// and the vision tower dropped), which we quantize as stored; loading
    /// and tokens are still compared.
    Rewritten,
}

const CASES: &[Case] = &[
    Case {
        model: "llama",
        mode: "affine",
        bits: 4,
        group_size: 64,
        files: Files::Same,
    },
    Case {
        model: "llama",
        mode: "affine",
        bits: 2,
        group_size: 32,
        files: Files::Same,
    },
    Case {
        model: "llama3",
        mode: "affine",
        bits: 8,
        group_size: 32,
        files: Files::Same,
    },
    Case {
        model: "qwen2",
        mode: "affine",
        bits: 3,
        group_size: 32,
        files: Files::Same,
    },
    Case {
        model: "qwen3",
        mode: "affine",
        bits: 6,
        group_size: 64,
        files: Files::Same,
    },
    // Group 128 on a 64-wide model: only the down projections divide.
    Case {
        model: "mistral",
        mode: "affine",
        bits: 5,
        group_size: 128,
        files: Files::Same,
    },
    // Sliding and full attention, GeGLU, softcapping: mlx-lm's gemma4_text.
    Case {
        model: "gemma4-text",
        mode: "affine",
        bits: 4,
        group_size: 32,
        files: Files::Same,
    },
    Case {
        model: "gemma4-shared",
        mode: "affine",
        bits: 8,
        group_size: 32,
        files: Files::Rewritten,
    },
    Case {
        model: real_model::NAME,
        mode: "affine",
        bits: 4,
        group_size: 64,
        files: Files::Same,
    },
    // Expert and dense layers, Gated DeltaNet: the router and the shared
    // expert's gate at 8 bits group 64 (mlx-lm's `qwen3_next` predicate).
    Case {
        model: "qwen3-next-moe",
        mode: "affine",
        bits: 4,
        group_size: 32,
        files: Files::Same,
    },
    // Biased stacked experts and attention sinks, the router at 8 bits
    // group 64 affine beside mxfp4 (gpt-oss's predicate).
    Case {
        model: "gpt-oss",
        mode: "mxfp4",
        bits: 4,
        group_size: 32,
        files: Files::Same,
    },
    // Hugging Face's per-expert tensors: mlx-lm stacks them before it
    // quantizes, and so do we; the router at 8 bits group 64.
    Case {
        model: "qwen3-moe",
        mode: "affine",
        bits: 4,
        group_size: 32,
        files: Files::Sanitized,
    },
    // MLX's floating-point modes, each with its only group size and bits:
    // untied and tied heads. (The real model in nvfp4 through
    // `mlx_lm.convert` itself ran here until 2026-12-06: 47 s of the gate,
    // the slowest case; the real model goes through `mlx_lm.convert` in
    // affine above, each float mode through convert's own steps.)
    Case {
        model: "llama",
        mode: "mxfp4",
        bits: 4,
        group_size: 32,
        files: Files::Same,
    },
    Case {
        model: "llama3",
        mode: "nvfp4",
        bits: 4,
        group_size: 16,
        files: Files::Same,
    },
    Case {
        model: "qwen3",
        mode: "mxfp8",
        bits: 8,
        group_size: 32,
        files: Files::Same,
    },
];

/// `mlx-spec fuse` cases: a gate model, the kind and blocks of its adapter
/// (`adapters::ensure`, the `parity` gate's), and `--dequantize`. DoRA on a
/// float and on a 4-bit model (merged, then quantized again; and
/// dequantized), a full fine-tune, LoRA on the real model (mlx-lm's own
/// `mlx_lm.fuse` command, tokenizer and all) and on stacked experts (stored
/// stacked, and per expert: `qwen3-moe`, stacked first as mlx-lm does).
const FUSE_CASES: &[(&str, &str, usize, bool)] = &[
    ("llama", "dora", 64, false),
    ("llama-q4g64", "dora", 64, false),
    ("llama-q4g64", "dora", 64, true),
    ("llama", "full", 1, false),
    (real_model::NAME, "lora", 8, false),
    ("qwen3-next-moe", "lora", 64, false),
    ("qwen3-moe", "lora", 64, false),
];

/// `mlx-spec quantize-drafter` on the fitted synthetic llama drafter: float32
/// against the Python-quantized copies of `synth_dspark.rs` (affine 4-bit
/// group 64, 8-bit group 32), its bfloat16 copy, and the floating-point
/// modes (checked against `mx.quantize`): (dtype, mode, bits, group size).
const DRAFTER_CASES: &[(&str, &str, u32, u32)] = &[
    ("f32", "affine", 4, 64),
    ("f32", "affine", 8, 32),
    ("bf16", "affine", 4, 32),
    ("f32", "mxfp4", 4, 32),
    ("bf16", "nvfp4", 4, 16),
    ("f32", "mxfp8", 8, 32),
];

#[derive(Deserialize)]
struct Results {
    results: Vec<CheckResult>,
}

#[derive(Deserialize)]
struct CheckResult {
    name: String,
    ok: bool,
    checks: Vec<String>,
    errors: Vec<String>,
    /// mlx-lm's greedy tokens from our copy, per prompt (targets only).
    tokens: Vec<Vec<u32>>,
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let mut sources: Vec<(String, PathBuf)> = synth::ensure(&python)?
        .into_iter()
        .filter(|c| crate::synth_glm::mlx_lm_implements(&c.name))
        .map(|c| (c.name, c.dir))
        .collect();
    sources.push((real_model::NAME.to_owned(), real_model::ensure()?));
    // The hybrid checkpoints.
    sources.extend(
        crate::synth_qwen3_next::ensure(&synth::models_dir(), &python)?
            .into_iter()
            .map(|c| (c.name, c.dir)),
    );
    // mlx-spec and our parity runner.
    shell::build().context("building mlx-spec")?;
    let work = shell::root().join("target").join("gate-quantize");
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;

    let mut runs = Vec::new();
    let mut names = Vec::new();
    let mut drafter_names = Vec::new();
    for case in CASES {
        let src = &sources
            .iter()
            .find(|(n, _)| n == case.model)
            .with_context(|| format!("no checkpoint `{}`", case.model))?
            .1;
        let name = case_name(case.model, case.mode, case.bits, case.group_size);
        let ours = work.join(&name).join("ours");
        let t = Instant::now();
        shell::run(
            shell::bin("mlx-spec")
                .arg("quantize")
                .arg(src)
                .arg(&ours)
                .args([
                    "--mode",
                    case.mode,
                    "--bits",
                    &case.bits.to_string(),
                    "--group-size",
                    &case.group_size.to_string(),
                ]),
        )
        .with_context(|| format!("mlx-spec quantize {name}"))?;
        eprintln!(
            "quantize: {name}: ours in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let prompts = prompts(&name, vocab_size(src)?);
        runs.push(json!({
            "name": name, "src": src, "ours": ours, "ref": work.join(&name).join("mlx-lm"),
            "mode": case.mode, "bits": case.bits, "group_size": case.group_size,
            "prompts": prompts, "max_tokens": MAX_TOKENS,
            "same_files": !matches!(case.files, Files::Rewritten),
            "sanitized_source": matches!(case.files, Files::Sanitized),
        }));
        names.push((name, ours, prompts));
    }
    for &(model, kind, layers, dequantize) in FUSE_CASES {
        let src = &sources
            .iter()
            .find(|(n, _)| n == model)
            .with_context(|| format!("no checkpoint `{model}`"))?
            .1;
        let adapter = adapters::ensure(&python, src, model, kind, layers)?;
        let name = format!(
            "fuse-{model}+{kind}{layers}{}",
            if dequantize { "-dequantized" } else { "" }
        );
        let ours = work.join(&name).join("ours");
        let mut cmd = shell::bin("mlx-spec");
        cmd.arg("fuse")
            .arg("--model")
            .arg(src)
            .arg("--adapter-path")
            .arg(&adapter)
            .arg("--save-path")
            .arg(&ours);
        if dequantize {
            cmd.arg("--dequantize");
        }
        shell::run(&mut cmd).with_context(|| format!("mlx-spec fuse {name}"))?;
        let prompts = prompts(&name, vocab_size(src)?);
        runs.push(json!({
            "name": name, "kind": "fuse", "model": src, "adapter": adapter, "ours": ours,
            "ref": work.join(&name).join("mlx-lm"), "dequantize": dequantize,
            "prompts": prompts, "max_tokens": MAX_TOKENS,
        }));
        names.push((name, ours, prompts));
    }
    let drafters = synth_dspark::ensure(&python)?;
    let pair = &drafters.llama;
    for &(dtype, mode, bits, group_size) in DRAFTER_CASES {
        let name = case_name(&format!("dspark-{dtype}"), mode, bits, group_size);
        let (src, expected) = match (dtype, mode, bits, group_size) {
            ("f32", "affine", 4, 64) => (&pair.fit, Some(&pair.fit_q4)),
            ("f32", "affine", 8, 32) => (&pair.fit, Some(&pair.fit_q8)),
            ("f32", ..) => (&pair.fit, None),
            _ => (&pair.fit_bf16, None),
        };
        let ours = work.join(&name).join("ours");
        shell::run(
            shell::bin("mlx-spec")
                .arg("quantize-drafter")
                .arg(src)
                .arg(&ours)
                .args([
                    "--mode",
                    mode,
                    "--bits",
                    &bits.to_string(),
                    "--group-size",
                    &group_size.to_string(),
                ]),
        )
        .with_context(|| format!("mlx-spec quantize-drafter {name}"))?;
        runs.push(json!({"name": name, "kind": "drafter", "src": src, "ours": ours, "expected": expected}));
        drafter_names.push(name);
    }
    let runs_file = work.join("runs.json");
    std::fs::write(&runs_file, serde_json::to_string(&json!({ "runs": runs }))?)?;
    let results_file = work.join("results.json");
    let t = Instant::now();
    shell::run(
        venv::python_command(&python)
            .arg(shell::root().join(CHECK))
            .arg("--runs")
            .arg(&runs_file)
            .arg("--out")
            .arg(&results_file),
    )
    .context("quantize_check.py could not run")?;
    eprintln!("quantize: mlx checks in {:.1} s", t.elapsed().as_secs_f64());
    let text = std::fs::read_to_string(&results_file)
        .with_context(|| format!("reading {}", results_file.display()))?;
    let results: Results = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", results_file.display()))?;
    if results.results.len() != names.len() + drafter_names.len() {
        bail!(
            "{} results for {} cases",
            results.results.len(),
            names.len() + drafter_names.len()
        );
    }

    let mut counts = Counts::default();
    let (target_results, drafter_results) = results.results.split_at(names.len());
    for ((name, ours, prompts), result) in names.iter().zip(target_results) {
        let passed = report(name, result)?
            && match engine_matches_mlx_lm(
                name,
                ours,
                prompts,
                &result.tokens,
                &work.join(name).join("engine"),
            ) {
                Ok(matched) => matched,
                Err(e) => {
                    eprintln!("quantize: {name}: FAILED: {e:#}");
                    false
                }
            };
        tally(&mut counts, name, passed);
    }
    for (name, result) in drafter_names.iter().zip(drafter_results) {
        let passed = report(name, result)?;
        tally(&mut counts, name, passed);
    }
    println!(
        "quantize: {} of {} cases pass",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// `llama-q4g64` for affine cases, `llama-mxfp4` for the others (each
/// takes one group size and bit width).
fn case_name(model: &str, mode: &str, bits: u32, group_size: u32) -> String {
    if mode == "affine" {
        format!("{model}-q{bits}g{group_size}")
    } else {
        format!("{model}-{mode}")
    }
}

/// Prints a result's checks and errors; whether it passed.
fn report(name: &str, result: &CheckResult) -> Result<bool> {
    if result.name != name {
        bail!("result for `{}` where `{name}` was expected", result.name);
    }
    for line in &result.checks {
        eprintln!("quantize: {name}: {line}");
    }
    for line in &result.errors {
        eprintln!("quantize: {name}: FAILED: {line}");
    }
    Ok(result.ok)
}

fn tally(counts: &mut Counts, name: &str, passed: bool) {
    println!("quantize: {name}: {}", if passed { "ok" } else { "FAILED" });
    counts.count(passed);
}

/// Our engine on our quantized copy (`parity_run`, the file's quantization
/// kept): it must give the tokens mlx-lm generated from the same files.
fn engine_matches_mlx_lm(
    name: &str,
    dir: &Path,
    prompts: &[Vec<u32>],
    mlx_lm_tokens: &[Vec<u32>],
    work: &Path,
) -> Result<bool> {
    let (_, report) = parity::run_ours(
        dir,
        prompts.to_vec(),
        MAX_TOKENS,
        &work.join("ours"),
        (None, None),
        None,
        None,
    )?;
    let ours = report.tokens();
    if ours == mlx_lm_tokens {
        eprintln!("quantize: {name}: our engine loads it and gives mlx-lm's tokens");
        Ok(true)
    } else {
        eprintln!("quantize: {name}: FAILED: our engine gives {ours:?}, mlx-lm {mlx_lm_tokens:?}");
        Ok(false)
    }
}

fn vocab_size(dir: &Path) -> Result<u64> {
    let path = dir.join("config.json");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    config["vocab_size"]
        .as_u64()
        .filter(|v| *v > 0)
        .with_context(|| format!("{}: no vocab_size", path.display()))
}

/// Deterministic prompts of `PROMPT_LENGTHS`, ids uniform in the vocabulary.
fn prompts(name: &str, vocab: u64) -> Vec<Vec<u32>> {
    PROMPT_LENGTHS
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut rng = SplitMix64::keyed(PROMPT_SEED, &format!("{name} prompt {i}"));
            (0..len).map(|_| rng.below(vocab) as u32).collect()
        })
        .collect()
}
