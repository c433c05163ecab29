//! Gate `gguf`'s converter check: llama.cpp's own converter
//! (`convert_hf_to_gguf.py`, run by `xtask/python/llama_cpp_convert.py` in
//! the reference environment) writes float32 GGUF files of synthetic
//! checkpoints of each GGUF architecture we read, and our engine run on the
//! GGUF file (`parity_run`) gives what it gives on the checkpoint itself:
//! the same tokens and the same logits, bit for bit. The checkpoints cover
//! llama.cpp's q/k row permutation (`llama`), Llama 3's rope scaling stored
//! as a `rope_freqs` tensor (`llama3`), YaRN metadata (`mistral`), q/k/v
//! biases with tied embeddings (`qwen2`), q/k norms with a head dimension
//! apart from the hidden size (`qwen3`) and stacked experts with a router
//! (`qwen3-moe-all`, `qwen3moe`).
//!
//! The same architectures at rows of 256 (`llama-k`, `qwen3-moe-k`) are
//! converted too, then rewritten in the block types people download
//! (`xtask/python/gguf_requant.py`: Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0) and loaded kept quantized: MLX's dequantization of what
//! stayed quantized equals ggml's values (`xtask/python/gguf_keep_check.py`)
//! and our engine on the quantized GGUF file gives what mlx-lm gives on our
//! export of it, bit for bit, and a row's numerics do not depend on its
//! verify window (gate `invariance`'s check: speculation stays exact).

use std::path::Path;

use anyhow::{Context, Result};
use run_protocol::gguf::GgufRequest;
use spec_fixtures::llama::{GGUF_K_LLAMA, GGUF_K_QWEN3_MOE, GGUF_QWEN3_MOE};

use super::{compare, llama_cpp, parity, Counts};
use crate::{reference_env, runs, shell, synth, venv};

const CONVERTER: &str = "xtask/python/llama_cpp_convert.py";
const REQUANT: &str = "xtask/python/gguf_requant.py";
const KEEP_CHECK: &str = "xtask/python/gguf_keep_check.py";

/// The synthetic checkpoints converted and run against themselves: gate
/// models, and an all-expert `qwen3_moe` (llama.cpp's `qwen3moe` has no
/// dense layers).
const MODELS: &[&str] = &[
    "llama",
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    GGUF_QWEN3_MOE.name,
];

/// The same architectures with rows of 256 (a k-quant super-block),
/// converted to be rewritten in quantized block types (their float32
/// conversions add nothing to the smaller ones').
const QUANTIZED: &[&str] = &[GGUF_K_LLAMA.name, GGUF_K_QWEN3_MOE.name];

pub fn run(work: &Path) -> Result<Counts> {
    let llama_cpp = llama_cpp::ensure()?;
    let python = reference_env::ensure()?;
    let venv_python = venv::ensure()?;
    synth::ensure(&venv_python)?;
    for spec in [&GGUF_QWEN3_MOE, &GGUF_K_LLAMA, &GGUF_K_QWEN3_MOE] {
        synth::ensure_llama(spec)?;
    }
    let models = synth::models_dir();
    let out = work.join("converted");
    let mut cmd = reference_env::python_command(&python);
    cmd.arg(shell::root().join(CONVERTER))
        .arg("--llama-cpp")
        .arg(&llama_cpp)
        .arg("--out")
        .arg(&out);
    for name in MODELS.iter().chain(QUANTIZED) {
        cmd.arg(models.join(name));
    }
    shell::run(&mut cmd).context("llama.cpp's converter failed")?;
    shell::build()?;
    println!("\ngguf: our engine on llama.cpp's GGUF conversion against the checkpoint");
    let mut counts = Counts::default();
    for name in MODELS {
        let verdict = check(&models.join(name), &out.join(format!("{name}.gguf")), work)
            .unwrap_or_else(|e| format!("FAIL  {e:#}"));
        counts.count(verdict.starts_with("ok"));
        println!("  {name:<14} {verdict}");
    }
    let mut requant = venv::python_command(&venv_python);
    requant
        .arg(shell::root().join(REQUANT))
        .arg("--out")
        .arg(&out);
    for name in QUANTIZED {
        requant.arg(out.join(format!("{name}.gguf")));
    }
    shell::run(&mut requant).context("rewriting the GGUF files quantized")?;
    println!("\ngguf: quantized GGUF files kept quantized, against ggml's values and mlx-lm");
    for name in QUANTIZED {
        let file = out.join(format!("{name}-q.gguf"));
        for (what, verdict) in check_quantized(&venv_python, &file, work) {
            let verdict = verdict.unwrap_or_else(|e| format!("FAIL  {e:#}"));
            counts.count(verdict.starts_with("ok"));
            println!("  {:<14} {what:<10} {verdict}", format!("{name}-q"));
        }
    }
    Ok(counts)
}

/// The quantized file's checks: what stayed quantized against ggml's
/// values, ours on the file against mlx-lm on our export of it, and rows
/// in verify windows against rows decoded one by one.
fn check_quantized(python: &Path, file: &Path, work: &Path) -> Vec<(&'static str, Result<String>)> {
    let stem = file
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let export = work.join("export").join(&stem);
    let _ = std::fs::remove_dir_all(&export);
    let request = GgufRequest {
        file: file.to_owned(),
        out: work.join("export-tensors").join(&stem),
        export: Some(export.clone()),
    };
    if let Err(e) = runs::example(
        &request,
        &work.join("runs").join(format!("{stem}-export")),
        &[],
    ) {
        let e = e.context("exporting the file");
        return vec![
            ("values", Err(e)),
            ("mlx-lm", Err(anyhow::anyhow!("no export"))),
        ];
    }
    let values = printed(
        venv::python_command(python)
            .arg(shell::root().join(KEEP_CHECK))
            .arg("--keep")
            .arg(export.join("keep"))
            .arg("--float")
            .arg(export.join("float32")),
    )
    .map(|line| format!("ok    {}", line.trim()));
    let mlx_lm = parity::mlx_lm_on_the_same_weights(
        file,
        &export.join("keep"),
        &work.join("runs").join(format!("{stem}-mlx-lm")),
    );
    let rows =
        super::invariance::check_model(file, &work.join("runs").join(format!("{stem}-rows")))
            .map(|line| format!("ok    {line}"));
    vec![("values", values), ("mlx-lm", mlx_lm), ("rows", rows)]
}

fn check(dir: &Path, gguf: &Path, work: &Path) -> Result<String> {
    let vocab = parity::vocab_size(dir)?;
    let prompts = parity::make_prompts(vocab);
    let (n, max_tokens) = (prompts.prompts.len(), prompts.max_tokens);
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let run = |model: &Path, stem: &str| -> Result<parity::Output> {
        let stem = work.join("runs").join(format!("{name}-{stem}"));
        let (logits, report) = parity::run_ours(
            model,
            prompts.prompts.clone(),
            max_tokens,
            &stem,
            (None, None),
            None,
            None,
        )?;
        parity::read_output(report, &logits, n, max_tokens, vocab)
    };
    let (theirs, ours) = (run(dir, "checkpoint")?, run(gguf, "gguf")?);
    if let Some(d) = compare::token_runs(&theirs.tokens, &ours.tokens).first() {
        return Ok(format!("FAIL  tokens differ: {d:?}"));
    }
    let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    for (i, (a, b)) in theirs.logits.iter().zip(&ours.logits).enumerate() {
        if let Some(at) = compare::first_difference(&bits(a), &bits(b)) {
            return Ok(format!(
                "FAIL  prompt {i}: logit {at} is {} from the GGUF, {} from the checkpoint",
                b[at], a[at]
            ));
        }
    }
    Ok(format!(
        "ok    {n} prompts x {max_tokens} tokens: the same tokens, logits bit-identical"
    ))
}

/// What `cmd` printed; its error output when it fails.
fn printed(cmd: &mut std::process::Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("starting `{}`", shell::render(cmd)))?;
    if !out.status.success() {
        anyhow::bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
