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

use std::path::Path;

use anyhow::{Context, Result};
use spec_fixtures::llama::GGUF_QWEN3_MOE;

use super::{compare, llama_cpp, parity, Counts};
use crate::{reference_env, shell, synth};

const CONVERTER: &str = "xtask/python/llama_cpp_convert.py";

/// The synthetic checkpoints converted: gate models, and an all-expert
/// `qwen3_moe` (llama.cpp's `qwen3moe` has no dense layers).
const MODELS: &[&str] = &[
    "llama",
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    GGUF_QWEN3_MOE.name,
];

pub fn run(work: &Path) -> Result<Counts> {
    let llama_cpp = llama_cpp::ensure()?;
    let python = reference_env::ensure()?;
    synth::ensure(&crate::venv::ensure()?)?;
    synth::ensure_llama(&GGUF_QWEN3_MOE)?;
    let models = synth::models_dir();
    let out = work.join("converted");
    let mut cmd = reference_env::python_command(&python);
    cmd.arg(shell::root().join(CONVERTER))
        .arg("--llama-cpp")
        .arg(&llama_cpp)
        .arg("--out")
        .arg(&out);
    for name in MODELS {
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
    Ok(counts)
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
