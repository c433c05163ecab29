//! The prompt-cache gate: our prompt-cache files against mlx-lm 0.32.2's
//! (`save_prompt_cache` / `load_prompt_cache`), both directions.
//!
//! For each gate model mlx-lm implements (the float llama, its 4-bit copy,
//! Gemma-4 text with its prefix past the sliding window, GLM with the DSA
//! indexer, the hybrid `qwen3-next` and `qwen3-5-moe`, whose Gated DeltaNet
//! layers are `ArraysCache`s; the synthetic qwen3 with its keys and values
//! in 4 bits, `QuantizedKVCache`s, and the llama with its caches bounded to
//! 12 positions, `RotatingKVCache`s keeping 4, whose file holds a wrapped
//! ring), a prefix and a suffix of random token ids go to two programs
//! with the same CLI: the oracle `xtask/python/oracle_prompt_cache.py` and
//! our `spec-models` example `prompt_cache_run`. Each first caches the
//! prefix to a file; then each reads the other's file and runs the suffix
//! from it (with greedy steps after it), runs the suffix after prefilling
//! the prefix the same way without a file, and runs `prefix + suffix` cold.
//! The runs' logits (the first row: the next-token logits after the prompt)
//! must be the same bits and their tokens the same; the largest difference
//! is printed. GLM's prefill is not split-invariant (a chunk runs in another
//! form than single rows, in mlx-lm as in ours; nor is the hybrids', whose
//! expert layers sort a chunk's picks), so there a cached prefix
//! equals the same split without a file, and the cold whole-prompt
//! difference is printed only.

use std::path::Path;

use anyhow::{bail, Context, Result};
use run_protocol::prompt_cache::{
    PromptCacheAction, PromptCacheReport, PromptCacheRequest, PromptCacheSpec,
};
use run_protocol::KvCacheBits;

use super::compare;
use super::parity::{self, Output};
use super::Counts;
use crate::runs::{self, with_suffix};
use crate::{shell, synth, venv};
use spec_fixtures::rng::SplitMix64;

const ORACLE: &str = "xtask/python/oracle_prompt_cache.py";

/// The models, by gate name: those mlx-lm implements, one per cache layout;
/// `qwen3` keeps its keys and values in 4 bits (`--kv-bits`, mlx-lm's
/// `QuantizedKVCache`), groups of 32 (its head dimension is 32); the last
/// bounds the llama's caches to 12 positions (`--max-kv-size`, mlx-lm's
/// `RotatingKVCache(12, keep=4)`; the oracle runs every forward one token
/// at a time there, the path whose view of the keys is ours).
const MODELS: &[(&str, Option<KvCacheBits>, Option<usize>)] = &[
    ("llama", None, None),
    ("llama-q4g64", None, None),
    ("gemma4-text", None, None),
    ("glm", None, None),
    ("qwen3-next", None, None),
    ("qwen3-5-moe", None, None),
    (
        "qwen3",
        Some(KvCacheBits {
            bits: 4,
            group_size: 32,
            start: 0,
        }),
        None,
    ),
    ("llama", None, Some(12)),
];

/// Prefix and suffix lengths (the prefix past Gemma-4's window of 8 and
/// GLM's `index_topk` of 24) and greedy steps after the suffix.
const PREFIX: usize = 29;
const SUFFIX: usize = 5;
const STEPS: usize = 6;
const SEED: u64 = 0x7072_6f6d_7074;

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let mut checkpoints = synth::ensure(&python)?;
    checkpoints.extend(crate::synth_qwen3_next::ensure(
        &synth::models_dir(),
        &python,
    )?);
    shell::build().context("building our runner (prompt_cache_run)")?;
    let work = shell::root().join("target").join("gate-prompt-cache");
    let mut counts = Counts::default();
    for &(model, kv_cache, max_kv_size) in MODELS {
        let Some(c) = checkpoints.iter().find(|c| c.name == model) else {
            bail!("no gate checkpoint named {model}");
        };
        let name = match (kv_cache, max_kv_size) {
            (Some(kv), _) => format!("{model}+kv{}g{}", kv.bits, kv.group_size),
            (None, Some(size)) => format!("{model}+max-kv{size}"),
            (None, None) => model.to_owned(),
        };
        eprintln!("\n== prompt-cache: {name} ({})", c.dir.display());
        match check(&python, &c.dir, &work.join(&name), (kv_cache, max_kv_size)) {
            Ok(diff) => {
                println!(
                    "prompt-cache: {name}: pass (both directions, max logit difference {diff:e})"
                );
                counts.passed += 1;
            }
            Err(e) => {
                println!("prompt-cache: {name}: FAIL: {e:#}");
                counts.failed += 1;
            }
        }
    }
    println!(
        "prompt-cache: {} of {} models pass",
        counts.passed,
        MODELS.len()
    );
    Ok(counts)
}

/// Both directions on one model; the largest logit difference (0.0 when
/// it passes).
fn check(
    python: &Path,
    dir: &Path,
    work: &Path,
    (kv_cache, max_kv_size): (Option<KvCacheBits>, Option<usize>),
) -> Result<f32> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let vocab = parity::vocab_size(dir)?;
    let mut rng = SplitMix64::new(SEED);
    let mut tokens = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % vocab as u64) as u32)
            .collect()
    };
    let spec = PromptCacheSpec {
        prefix: tokens(PREFIX),
        suffix: tokens(SUFFIX),
        max_tokens: STEPS,
        kv_cache,
        max_kv_size,
    };
    // The oracle's `--spec` file.
    let spec_file = work.join("spec.json");
    std::fs::write(&spec_file, serde_json::to_string(&spec)?)?;
    let (ours_file, theirs_file) = (
        work.join("ours-cache.safetensors"),
        work.join("mlx-lm-cache.safetensors"),
    );
    let (ours_out, theirs_out) = (work.join("ours"), work.join("mlx-lm"));
    let oracle = || {
        let mut cmd = venv::python_command(python);
        cmd.arg(shell::root().join(ORACLE))
            .arg("--model")
            .arg(dir)
            .arg("--spec")
            .arg(&spec_file);
        cmd
    };
    let ours = |action: PromptCacheAction, stem: &str| {
        let request = PromptCacheRequest {
            model: dir.to_owned(),
            spec: spec.clone(),
            action,
        };
        runs::example(&request, &work.join(stem), &[])
    };
    shell::run(oracle().arg("--write").arg(&theirs_file)).context("mlx-lm writing its file")?;
    match ours(
        PromptCacheAction::Write {
            file: ours_file.clone(),
        },
        "ours-write",
    )
    .context("us writing our file")?
    {
        PromptCacheReport::Written { tokens } if tokens == PREFIX => {}
        other => bail!("prompt_cache_run wrote {other:?}, expected {PREFIX} tokens written"),
    }
    let read = ours(
        PromptCacheAction::Read {
            file: theirs_file,
            logits: with_suffix(&ours_out, ".safetensors"),
        },
        "ours",
    )
    .context("us reading mlx-lm's file")?;
    let PromptCacheReport::Ran(report) = read else {
        bail!("prompt_cache_run read mlx-lm's file but reported {read:?}");
    };
    shell::run(
        oracle()
            .arg("--read")
            .arg(&ours_file)
            .arg("--out")
            .arg(&theirs_out),
    )
    .context("mlx-lm reading our file")?;
    let ours = parity::read_output(
        report,
        &with_suffix(&ours_out, ".safetensors"),
        3,
        STEPS,
        vocab,
    )
    .context("our output")?;
    let theirs =
        parity::read_program_output(&theirs_out, 3, STEPS, vocab).context("mlx-lm's output")?;
    compare(&ours, &theirs, !dir.ends_with("glm"))
}

/// Reference: our run of the suffix after the prefix was prefilled as for
/// a file (run 2). The runs from a file, each tool's other's (run 1), and
/// mlx-lm's run 2 must match it in tokens and logits bit for bit. The cold
/// prefills of the whole prompt (run 0, ours and mlx-lm's) must too where
/// the model's prefill is split-invariant; GLM's chunk form is not (its
/// difference is printed).
fn compare(ours: &Output, theirs: &Output, split_invariant: bool) -> Result<f32> {
    let reference = (&ours.tokens[2], &ours.logits[2]);
    let vocab = reference.1.len() / STEPS;
    let runs = [
        (
            "ours from mlx-lm's file",
            &ours.tokens[1],
            &ours.logits[1],
            true,
        ),
        (
            "mlx-lm from our file",
            &theirs.tokens[1],
            &theirs.logits[1],
            true,
        ),
        (
            "mlx-lm split, no file",
            &theirs.tokens[2],
            &theirs.logits[2],
            true,
        ),
        (
            "ours cold",
            &ours.tokens[0],
            &ours.logits[0],
            split_invariant,
        ),
        (
            "mlx-lm cold",
            &theirs.tokens[0],
            &theirs.logits[0],
            split_invariant,
        ),
    ];
    let mut worst = 0f32;
    let mut failures = Vec::new();
    for (what, tokens, logits, required) in runs {
        let next = compare::max_difference(&reference.1[..vocab], &logits[..vocab]);
        let all = compare::max_difference(reference.1, logits);
        eprintln!(
            "  {what}: tokens {tokens:?}, next-token logits max diff {next:e}, all steps {all:e}{}",
            if required { "" } else { " (not required)" }
        );
        if required {
            worst = worst.max(all);
            if tokens != reference.0 || all != 0.0 {
                failures.push(what);
            }
        }
    }
    eprintln!("  reference tokens {:?}", reference.0);
    if failures.is_empty() {
        Ok(worst)
    } else {
        bail!(
            "differs from our prefix-then-suffix run: {}",
            failures.join(", ")
        )
    }
}
