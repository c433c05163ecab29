//! The parity gate: our target-model runtime against mlx-lm 0.32.2.
//!
//! For each checkpoint (the synthetic ones of `synth.rs`, the hybrid ones
//! of `synth_qwen3_next.rs`, copies of both written by mlx-lm in MLX's
//! floating-point quantization modes and, for the hybrid expert models,
//! with the model's own quant predicate (`synth_modes.rs`), plus any
//! `--model DIR`; then the real model with its keys and values quantized,
//! `KV_CACHES`, with fine-tuned adapters, `ADAPTERS`, and with logits
//! processors and a sampler, `DECODING`), the same prompts go to two
//! programs:
//!
//! - the oracle, `xtask/python/oracle_lm.py`, in the project venv, called
//!   once for every checkpoint as `--job DIR PROMPTS.json PREFIX ...`: for
//!   each it writes `PREFIX.json` (`run_protocol::greedy::GreedyReport`),
//!   `PREFIX.safetensors` and `PREFIX.seconds`, or `PREFIX.error`;
//! - our runner, the `spec-models` example `parity_run`, on a
//!   `ParityRequest`: the same report on standard output (saved as
//!   `ours.json`) and the same tensors in `ours.safetensors`.
//!
//! The tensors are float32 `logits_{i}`, shape [max_tokens, vocab], row s =
//! the logits that produced token s; with a `Decoding`, also `probs_{i}`,
//! the sampler's distribution at each step, which must be equal bit for bit
//! (the filters' cuts are all or nothing: a differing cut is no rounding).
//!
//! Greedy tokens must be identical. Logits are compared for information: both
//! sides run the same libmlx build, so the same op sequence gives the same bits
//! and the expected difference is 0.0; a non-zero one means a different op
//! sequence (another fusion, prefill split or dtype path), which fails the gate
//! only once it changes a token.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use run_protocol::greedy::{Decoding, GreedyReport, ParityRequest};
use run_protocol::Dtype;
use run_protocol::KvCacheBits;
use serde::Serialize;
use serde_json::Value;

use super::compare::{self, Divergence};
use super::{Counts, Options};
use crate::runs::{self, with_suffix};
use crate::{real_model, shell, synth, synth_modes, venv};
use spec_fixtures::rng::SplitMix64;

const ORACLE: &str = "xtask/python/oracle_lm.py";

/// Prompt lengths: a single token (no prefill at all), short ones, and one
/// past 100 tokens; all with their generation inside the synthetic models'
/// 512 positions.
const PROMPT_LENGTHS: &[usize] = &[1, 4, 17, 64, 131];
const MAX_TOKENS: usize = 64;
const PROMPT_SEED: u64 = 0x7061_7269_7479;

/// A KV cache setting and the prompt lengths it runs.
type KvSetting = (KvCacheBits, &'static [usize]);

/// The real model again with quantized keys and values (`--kv-bits`):
/// 4 bits in mlx-lm's default groups of 64 from the first token, against
/// mlx-lm's model running a `QuantizedKVCache` from it, on prompts of 4 and
/// 131 tokens; 8 bits in groups of 32 from position 40, against mlx-lm's
/// own `--kv-bits` conversion (`generate_step(kv_bits=8, kv_group_size=32,
/// quantized_kv_start=40)`), on prompts of 4 and 17 tokens (shorter than the
/// start: mlx-lm converts after a forward, so a prompt across the start
/// would run its float chunk past it).
const KV_CACHES: &[KvSetting] = &[
    (
        KvCacheBits {
            bits: 4,
            group_size: 64,
            start: 0,
        },
        &[4, 131],
    ),
    (
        KvCacheBits {
            bits: 8,
            group_size: 32,
            start: 40,
        },
        &[4, 17],
    ),
];

/// The real model with its caches bounded (`--max-kv-size`) against
/// mlx-lm's `RotatingKVCache(MAX_KV_SIZE, keep=4)` in every layer (what its
/// `make_prompt_cache` builds for the families without a `make_cache`), on
/// prompts no longer than the bound whose 64 tokens run well past it: the
/// ring wraps and every later query sees the first 4 positions and the last
/// 28.
const MAX_KV_SIZE: usize = 32;
const MAX_KV_LENGTHS: &[usize] = &[4, 17];
/// The hybrid whose attention layers are bounded too.
const MAX_KV_HYBRID: &str = "qwen3-next";

/// Checkpoints with a fine-tuned adapter (`--adapter-path`) that mlx-lm's
/// own training preparation wrote (`adapters::ensure`): the model, the
/// adapter's kind, the blocks it adapts (counted from the last) and the
/// prompt lengths it runs. The real model with LoRA (the `lossless`
/// gate's adapter); the synthetic llama with DoRA and a full fine-tune of
/// its last block; the hybrid
/// `qwen3-next` (Gated DeltaNet projections too) and `qwen3-5` (its
/// multimodal module paths), `gemma4-text` (per-layer input projections)
/// and the expert models (LoRA on the stacked experts, mlx-lm's
/// `LoRASwitchLinear`; routers and shared experts; `qwen3-moe`'s experts
/// stored per expert) with LoRA on every block, one of them 4-bit; DoRA over a 4-bit llama.
const ADAPTERS: &[(&str, &str, usize, &[usize])] = &[
    (real_model::NAME, "lora", 8, &[131]),
    ("llama", "dora", 64, &[17]),
    ("llama", "full", 1, &[17]),
    ("qwen3-next", "lora", 64, &[17]),
    ("qwen3-5", "lora", 64, &[17]),
    ("gemma4-text", "lora", 64, &[17]),
    ("qwen3-next-moe", "lora", 64, &[17]),
    ("qwen3-moe", "lora", 64, &[17]),
    ("qwen3-5-moe-q4g32", "lora", 64, &[17]),
    ("gemma4-moe", "lora", 64, &[17]),
    ("llama-q4g64", "dora", 64, &[17]),
    ("glm", "lora", 64, &[17]),
];

/// The real model with every logits processor mlx-lm has (a logit bias and
/// the three penalties, one over the whole history) and a sampler with
/// every filter (top-p, min-p keeping 4, XTC always applied, top-k) at a
/// temperature: mlx-lm's `make_logits_processors` and `make_sampler`
/// against spec-core's, on prompts of 17 and 131 tokens. Amounts are exact
/// in float32 so that both sides hold the same numbers.
fn decoding() -> Decoding {
    Decoding {
        logit_bias: vec![(198, 2.5), (30, -3.0)],
        repetition: Some((1.25, 16)),
        presence: Some((0.375, 0)),
        frequency: Some((0.125, 48)),
        temperature: 0.75,
        top_p: 0.9375,
        min_p: 0.03125,
        min_tokens_to_keep: 4,
        top_k: 64,
        xtc_probability: 1.0,
        xtc_threshold: 0.0625,
        xtc_special_tokens: vec![0, 198],
    }
}

/// The prompt lengths of the `decoding()` row.
const DECODING_LENGTHS: &[usize] = &[17];

/// What a row runs beyond the checkpoint as stored: quantized keys and
/// values, an adapter or processors and a sampler, on some of the prompts.
#[derive(Debug, Clone, Default)]
struct Extra {
    kv: Option<KvCacheBits>,
    max_kv_size: Option<usize>,
    adapter: Option<PathBuf>,
    decoding: Option<Decoding>,
    /// The prompt lengths it runs (`None`: every one).
    lengths: Option<&'static [usize]>,
}

pub fn run(options: &Options) -> Result<Counts> {
    let python = venv::ensure()?;
    let synthetic = synth::ensure(&python)?;
    let hybrid = crate::synth_qwen3_next::ensure(&synth::models_dir(), &python)?;
    let sources: Vec<_> = synthetic.iter().chain(&hybrid).cloned().collect();
    let modes = synth_modes::ensure(&python, &sources)?;
    let mut models: Vec<(String, PathBuf)> = synthetic
        .into_iter()
        .filter(|c| crate::synth_glm::mlx_lm_implements(&c.name))
        .chain(hybrid)
        .chain(modes)
        .map(|c| (c.name, c.dir))
        .collect();
    let real = real_model::ensure()?;
    models.push((real_model::NAME.to_owned(), real.clone()));
    for dir in &options.models {
        let name = dir
            .canonicalize()
            .with_context(|| format!("--model {}", dir.display()))?
            .file_name()
            .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned());
        models.push((name, dir.clone()));
    }
    // The same checkpoints' names with what they run beyond their files:
    // nothing for every one, then the real model's keys and values
    // quantized, then the real model adapted.
    let mut models: Vec<(String, PathBuf, Extra)> = models
        .into_iter()
        .map(|(n, d)| (n, d, Extra::default()))
        .collect();
    for (kv, lengths) in KV_CACHES {
        let name = format!(
            "{}+kv{}g{}s{}",
            real_model::NAME,
            kv.bits,
            kv.group_size,
            kv.start
        );
        let extra = Extra {
            kv: Some(*kv),
            lengths: Some(lengths),
            ..Extra::default()
        };
        models.push((name, real.clone(), extra));
    }
    // The real model bounded, and a hybrid's attention layers (mlx-lm's
    // own `make_cache` ignores the bound there; its layers run the same
    // `RotatingKVCache` given one).
    for name in [real_model::NAME, MAX_KV_HYBRID] {
        let dir = models
            .iter()
            .find(|(n, _, extra)| n == name && extra.kv.is_none())
            .map(|(_, dir, _)| dir.clone())
            .with_context(|| format!("no gate model `{name}` for its bounded row"))?;
        models.push((
            format!("{name}+max-kv{MAX_KV_SIZE}"),
            dir,
            Extra {
                max_kv_size: Some(MAX_KV_SIZE),
                lengths: Some(MAX_KV_LENGTHS),
                ..Extra::default()
            },
        ));
    }
    for (model, kind, layers, lengths) in ADAPTERS {
        let dir = models
            .iter()
            .find(|(name, _, extra)| name == model && extra.kv.is_none())
            .map(|(_, dir, _)| dir.clone())
            .with_context(|| format!("no gate model `{model}` for its adapter"))?;
        let extra = Extra {
            adapter: Some(crate::adapters::ensure(
                &python, &dir, model, kind, *layers,
            )?),
            lengths: Some(lengths),
            ..Extra::default()
        };
        models.push((format!("{model}+{kind}{layers}"), dir, extra));
    }
    models.push((
        format!("{}+penalties+sampler", real_model::NAME),
        real.clone(),
        Extra {
            decoding: Some(decoding()),
            lengths: Some(DECODING_LENGTHS),
            ..Extra::default()
        },
    ));
    let work = shell::root().join("target").join("gate-parity");
    // Built once up front: a runner that does not compile fails every model
    // at once instead of recompiling (and failing) once per model.
    let built =
        shell::build().context("our runner (spec-models example parity_run) does not build");
    if let Err(e) = &built {
        eprintln!("parity: {e:#}");
    }
    // Every checkpoint's prompts first, then one oracle process for all
    // of them (mlx-lm's import costs a second a process) while ours run
    // beside it (`runs::parallel`), then the comparisons.
    let jobs: Vec<Result<Job>> = models
        .iter()
        .map(|(name, dir, extra)| Job::prepare(dir, &work.join(name), extra))
        .collect();
    let (oracle, ours) = match &built {
        Ok(()) => std::thread::scope(|scope| {
            let oracle = scope.spawn(|| run_oracle(&python, jobs.iter().flatten()));
            // The real model's runs first: the longest.
            let ours = runs::parallel_long_first(
                models
                    .iter()
                    .zip(&jobs)
                    .filter_map(|((name, _, _), job)| {
                        let job = job.as_ref().ok()?;
                        let run: runs::Job<Ours> = Box::new(|| job.run_ours());
                        Some((name.starts_with(real_model::NAME), run))
                    })
                    .collect(),
            );
            let oracle = oracle
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the oracle's thread panicked")));
            (oracle, ours)
        }),
        Err(_) => (Ok(()), Ok(Vec::new())),
    };
    let mut ours = ours?.into_iter();
    let mut rows = Vec::new();
    for ((name, dir, extra), job) in models.iter().zip(jobs) {
        eprintln!("\n== parity: {name} ({})", dir.display());
        let outcome = match (&built, job) {
            (Err(e), _) => Err(anyhow::anyhow!("{e}")),
            (Ok(()), Err(e)) => Err(e),
            (Ok(()), Ok(job)) => {
                let mine = ours
                    .next()
                    .unwrap_or_else(|| Err(anyhow::anyhow!("our run is missing")));
                job.check(oracle.as_ref().err(), mine)
            }
        };
        let (outcome, seconds) = match outcome {
            Ok((comparison, seconds)) => (Ok(comparison), seconds),
            Err(e) => (Err(e), (None, None)),
        };
        let row = Row {
            name: name.clone(),
            lengths: extra.lengths.unwrap_or(PROMPT_LENGTHS),
            outcome,
            seconds,
        };
        if let Err(e) = &row.outcome {
            eprintln!("parity: {name}: {e:#}");
        }
        rows.push(row);
    }
    println!("\n{}", table(&rows));
    let counts = Counts {
        passed: rows.iter().filter(|r| r.passed()).count() as u64,
        failed: rows.iter().filter(|r| !r.passed()).count() as u64,
    };
    println!("parity: {} of {} models pass", counts.passed, rows.len());
    Ok(counts)
}

/// The oracle's prompts file.
#[derive(Debug, Serialize)]
pub(super) struct Prompts {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: usize,
    /// Quantized keys and values, both sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheBits>,
    /// Caches bounded to this many positions (`--max-kv-size`), both
    /// sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_kv_size: Option<usize>,
    /// A fine-tuned adapter applied at load, both sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_path: Option<PathBuf>,
    /// Processors and a sampler, both sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoding: Option<Decoding>,
}

/// What each program produced: the report's tokens and the logits.
#[derive(Debug)]
pub(super) struct Output {
    pub tokens: Vec<Vec<u32>>,
    /// Per run, [max_tokens, vocab] row-major.
    pub logits: Vec<Vec<f32>>,
}

#[derive(Debug, PartialEq)]
struct Comparison {
    runs: usize,
    runs_equal: usize,
    /// Left: mlx-lm's, right: ours.
    first_divergence: Option<Divergence>,
    max_abs_diff: f32,
    /// The sampler's distributions' largest difference, where compared.
    max_probs_diff: Option<f32>,
}

/// Each program's wall time (mlx-lm's, ours), where it ran; both run side
/// by side with other runs, so they are no benchmark.
type Seconds = (Option<f64>, Option<f64>);

/// Our run of a job: its logits file, report and wall time.
type Ours = (PathBuf, GreedyReport, f64);

struct Row {
    name: String,
    /// The prompt lengths it ran.
    lengths: &'static [usize],
    outcome: Result<Comparison>,
    seconds: Seconds,
}

impl Row {
    fn passed(&self) -> bool {
        matches!(&self.outcome, Ok(c) if c.first_divergence.is_none()
            && c.max_probs_diff.is_none_or(|d| d == 0.0))
    }
}

/// One checkpoint's run: its prompts (written for the oracle) and where
/// each program's output goes.
struct Job {
    /// The checkpoint mlx-lm runs.
    dir: PathBuf,
    /// What ours runs: the same checkpoint, or the same weights in
    /// another file ([`mlx_lm_on_the_same_weights`]).
    ours: PathBuf,
    work: PathBuf,
    vocab: usize,
    prompts: Prompts,
    prompts_path: PathBuf,
    oracle_prefix: PathBuf,
}

impl Job {
    /// Writes the prompts of the checkpoint at `dir` into `work` and
    /// clears the oracle's outputs of an earlier run.
    fn prepare(dir: &Path, work: &Path, extra: &Extra) -> Result<Job> {
        let work = work.to_owned();
        let vocab = vocab_size(dir)?;
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        let mut prompts = Prompts {
            kv_cache: extra.kv,
            max_kv_size: extra.max_kv_size,
            adapter_path: extra.adapter.clone(),
            decoding: extra.decoding.clone(),
            ..make_prompts(vocab)
        };
        if let Some(lengths) = extra.lengths {
            prompts.prompts.retain(|p| lengths.contains(&p.len()));
        }
        let prompts_path = work.join("prompts.json");
        std::fs::write(&prompts_path, serde_json::to_string(&prompts)?)?;
        let oracle_prefix = work.join("mlx-lm");
        for suffix in ORACLE_OUTPUTS {
            let path = with_suffix(&oracle_prefix, suffix);
            if path.exists() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        Ok(Job {
            dir: dir.to_owned(),
            ours: dir.to_owned(),
            work,
            vocab,
            prompts,
            prompts_path,
            oracle_prefix,
        })
    }

    /// Runs ours on the job: its logits file, report and wall time.
    fn run_ours(&self) -> Result<Ours> {
        let t = Instant::now();
        let (logits, report) = run_ours(
            &self.ours,
            self.prompts.prompts.clone(),
            MAX_TOKENS,
            &self.work.join("ours"),
            (self.prompts.kv_cache, self.prompts.max_kv_size),
            self.prompts.adapter_path.as_deref(),
            self.prompts.decoding.as_ref(),
        )?;
        Ok((logits, report, t.elapsed().as_secs_f64()))
    }

    /// Reads the oracle's output (its `.error` if it wrote one; `oracle`:
    /// how the oracle process failed, if it did) and compares it with
    /// `ours` ([`Job::run_ours`]); the comparison and each program's wall
    /// time.
    fn check(
        &self,
        oracle: Option<&anyhow::Error>,
        ours: Result<Ours>,
    ) -> Result<(Comparison, Seconds)> {
        let error = with_suffix(&self.oracle_prefix, ".error");
        if let Ok(message) = std::fs::read_to_string(&error) {
            bail!("the mlx-lm oracle failed: {}", message.trim());
        }
        let n = self.prompts.prompts.len();
        let theirs = read_program_output(&self.oracle_prefix, n, MAX_TOKENS, self.vocab)
            .with_context(|| match oracle {
                Some(e) => format!("mlx-lm's output (the oracle failed: {e:#})"),
                None => "mlx-lm's output".to_owned(),
            })?;
        let oracle_seconds = std::fs::read_to_string(with_suffix(&self.oracle_prefix, ".seconds"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let (logits, report, ours_seconds) = ours?;
        let ours = read_output(report, &logits, n, MAX_TOKENS, self.vocab)
            .context("our runner's output")?;
        let mut comparison = compare(&theirs, &ours);
        if self.prompts.decoding.is_some() {
            let shape = [MAX_TOKENS, self.vocab];
            let theirs = read_probs(&with_suffix(&self.oracle_prefix, ".safetensors"), n, shape)
                .context("mlx-lm's distributions")?;
            let ours = read_probs(&logits, n, shape).context("our distributions")?;
            comparison.max_probs_diff = Some(
                theirs
                    .iter()
                    .zip(&ours)
                    .map(|(a, b)| compare::max_difference(a, b))
                    .fold(0.0, f32::max),
            );
        }
        Ok((comparison, (oracle_seconds, Some(ours_seconds))))
    }
}

/// Ours on `ours` (a file holding the same weights in another layout: a
/// GGUF file) against mlx-lm on the checkpoint `dir`, the gate's prompts:
/// the verdict line (`ok` when tokens and logits are bit-identical).
pub(super) fn mlx_lm_on_the_same_weights(ours: &Path, dir: &Path, work: &Path) -> Result<String> {
    let python = venv::ensure()?;
    let mut job = Job::prepare(dir, work, &Extra::default())?;
    job.ours = ours.to_owned();
    let oracle = run_oracle(&python, std::iter::once(&job)).err();
    let (comparison, _) = job.check(oracle.as_ref(), job.run_ours())?;
    let n = job.prompts.prompts.len();
    Ok(match comparison.first_divergence {
        None if comparison.max_abs_diff == 0.0 => format!(
            "ok    {n} prompts x {MAX_TOKENS} tokens: mlx-lm's tokens, logits bit-identical"
        ),
        None => format!(
            "FAIL  the same tokens, logits apart by up to {}",
            format_diff(comparison.max_abs_diff)
        ),
        Some(d) => format!("FAIL  tokens differ: {d:?}"),
    })
}

/// What the oracle writes beside its output prefix.
const ORACLE_OUTPUTS: &[&str] = &[".json", ".safetensors", ".seconds", ".error"];

/// Runs the oracle once on every job; an error when it exits non-zero
/// (the jobs it failed wrote `.error` files, the others their outputs).
fn run_oracle<'j>(python: &Path, jobs: impl Iterator<Item = &'j Job>) -> Result<()> {
    let mut cmd = venv::python_command(python);
    cmd.arg(shell::root().join(ORACLE));
    for job in jobs {
        cmd.arg("--job")
            .arg(&job.dir)
            .arg(&job.prompts_path)
            .arg(&job.oracle_prefix);
    }
    shell::run(&mut cmd).context("the mlx-lm oracle failed")
}

/// Runs `parity_run` on `prompts`, the weights as stored; the
/// request and report go to `STEM.request.json` and `STEM.json`. Returns
/// the logits file and the report.
pub(super) fn run_ours(
    model: &Path,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
    stem: &Path,
    (kv_cache, max_kv_size): (Option<KvCacheBits>, Option<usize>),
    adapter: Option<&Path>,
    decoding: Option<&Decoding>,
) -> Result<(PathBuf, GreedyReport)> {
    let logits = with_suffix(stem, ".safetensors");
    let request = ParityRequest {
        model: model.to_owned(),
        dtype: Dtype::Keep,
        prompts,
        max_tokens,
        logits: logits.clone(),
        kv_cache,
        max_kv_size,
        adapter: adapter.map(Path::to_owned),
        decoding: decoding.cloned(),
    };
    let report = runs::example(&request, stem, &[])
        .context("our runner (spec-models example parity_run) failed")?;
    Ok((logits, report))
}

/// `vocab_size` of a checkpoint's config, top level or (multimodal configs)
/// under `text_config`.
pub(super) fn vocab_size(dir: &Path) -> Result<usize> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let config: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let vocab = config
        .get("vocab_size")
        .or_else(|| config.get("text_config").and_then(|t| t.get("vocab_size")));
    match vocab.and_then(Value::as_u64) {
        Some(v) if v > 0 => Ok(v as usize),
        _ => bail!("{}: no positive vocab_size", path.display()),
    }
}

/// Deterministic prompts of `PROMPT_LENGTHS`, token ids uniform in the vocabulary.
pub(super) fn make_prompts(vocab: usize) -> Prompts {
    let prompts = PROMPT_LENGTHS
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut rng = SplitMix64::keyed(PROMPT_SEED, &format!("prompt {i}"));
            (0..len).map(|_| rng.below(vocab as u64) as u32).collect()
        })
        .collect();
    Prompts {
        prompts,
        max_tokens: MAX_TOKENS,
        kv_cache: None,
        max_kv_size: None,
        adapter_path: None,
        decoding: None,
    }
}

/// Reads and validates what a program of the same outputs as `parity_run`
/// wrote: `PREFIX.json` and `PREFIX.safetensors`.
pub(super) fn read_program_output(
    prefix: &Path,
    prompts: usize,
    max_tokens: usize,
    vocab: usize,
) -> Result<Output> {
    let report = runs::read_report::<ParityRequest>(&with_suffix(prefix, ".json"))?;
    read_output(
        report,
        &with_suffix(prefix, ".safetensors"),
        prompts,
        max_tokens,
        vocab,
    )
}

/// Validates a report and reads its logits: one run per prompt,
/// `max_tokens` tokens each, `logits_{i}` float32 [max_tokens, vocab] and
/// nothing else but `probs_{i}` (read by [`read_probs`]).
pub(super) fn read_output(
    report: GreedyReport,
    st_path: &Path,
    prompts: usize,
    max_tokens: usize,
    vocab: usize,
) -> Result<Output> {
    if report.runs.len() != prompts {
        bail!("{} runs for {prompts} prompts", report.runs.len());
    }
    for (i, r) in report.runs.iter().enumerate() {
        if r.tokens.len() != max_tokens {
            bail!(
                "run {i} has {} tokens, expected {max_tokens}",
                r.tokens.len()
            );
        }
    }
    let bytes = std::fs::read(st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("parsing {}", st_path.display()))?;
    let expected: Vec<String> = (0..prompts).map(|i| format!("logits_{i}")).collect();
    let mut names: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|n| !n.starts_with("probs_"))
        .collect();
    names.sort_unstable();
    let mut want: Vec<&str> = expected.iter().map(String::as_str).collect();
    want.sort_unstable();
    if names != want {
        bail!(
            "{}: tensors {names:?}, expected {want:?}",
            st_path.display()
        );
    }
    let mut logits = Vec::with_capacity(prompts);
    for name in &expected {
        let (shape, values) =
            synth::read_f32(&st, name).with_context(|| st_path.display().to_string())?;
        if shape != [max_tokens, vocab] {
            bail!(
                "{}: `{name}` has shape {shape:?}, expected [{max_tokens}, {vocab}]",
                st_path.display()
            );
        }
        logits.push(values);
    }
    Ok(Output {
        tokens: report.tokens(),
        logits,
    })
}

/// The sampler's distributions a decoding run wrote: float32 `probs_{i}`
/// of `shape`, one per prompt.
fn read_probs(st_path: &Path, prompts: usize, shape: [usize; 2]) -> Result<Vec<Vec<f32>>> {
    let bytes = std::fs::read(st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("parsing {}", st_path.display()))?;
    (0..prompts)
        .map(|i| {
            let name = format!("probs_{i}");
            let (got, values) =
                synth::read_f32(&st, &name).with_context(|| st_path.display().to_string())?;
            if got != shape {
                bail!(
                    "{}: `{name}` has shape {got:?}, expected {shape:?}",
                    st_path.display()
                );
            }
            Ok(values)
        })
        .collect()
}

/// Token equality and the largest logit difference ([`compare`]).
/// Outputs come validated by `read_output`, so the shapes agree.
fn compare(oracle: &Output, ours: &Output) -> Comparison {
    let divergences = compare::token_runs(&oracle.tokens, &ours.tokens);
    let max_abs_diff = oracle
        .logits
        .iter()
        .zip(&ours.logits)
        .map(|(a, b)| compare::max_difference(a, b))
        .fold(0.0, f32::max);
    Comparison {
        runs: oracle.tokens.len(),
        runs_equal: oracle.tokens.len() - divergences.len(),
        first_divergence: divergences.first().copied(),
        max_abs_diff,
        max_probs_diff: None,
    }
}

fn format_diff(d: f32) -> String {
    if d == 0.0 {
        "0.0".to_owned()
    } else {
        format!("{d:.3e}")
    }
}

fn table(rows: &[Row]) -> String {
    let header = [
        "model",
        "prompts",
        "tokens equal",
        "max |logit diff|",
        "mlx-lm s",
        "ours s",
    ];
    let secs = |s: Option<f64>| s.map_or_else(|| "-".to_owned(), |s| format!("{s:.1}"));
    let body: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let (equal, diff) = match &r.outcome {
                Ok(c) => (
                    format!("{}/{}", c.runs_equal, c.runs),
                    match c.max_probs_diff {
                        None => format_diff(c.max_abs_diff),
                        Some(p) => format!(
                            "{} (sampler p: {})",
                            format_diff(c.max_abs_diff),
                            format_diff(p)
                        ),
                    },
                ),
                Err(_) => ("error".to_owned(), "-".to_owned()),
            };
            [
                r.name.clone(),
                r.lengths.len().to_string(),
                equal,
                diff,
                secs(r.seconds.0),
                secs(r.seconds.1),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            body.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join(" | ")
            .trim_end()
            .to_owned()
    };
    let mut out = line(&header);
    let _ = write!(
        out,
        "\n{}",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("-|-")
    );
    for r in &body {
        let _ = write!(
            out,
            "\n{}",
            line(&r.iter().map(String::as_str).collect::<Vec<_>>())
        );
    }
    for r in rows {
        match &r.outcome {
            Ok(Comparison {
                first_divergence: Some(d),
                ..
            }) => {
                let _ = write!(
                    out,
                    "\n{}: tokens diverge in prompt {} (length {}) at generated position {}: mlx-lm {:?} vs ours {:?}",
                    r.name,
                    d.run,
                    r.lengths.get(d.run).copied().unwrap_or(0),
                    d.position,
                    d.left,
                    d.right
                );
            }
            Err(e) => {
                let _ = write!(out, "\n{}: {e:#}", r.name);
            }
            Ok(Comparison {
                max_probs_diff: Some(p),
                ..
            }) if *p != 0.0 => {
                let _ = write!(
                    out,
                    "\n{}: the sampler's distributions differ by up to {p:e} (a filter cut differently)",
                    r.name
                );
            }
            Ok(_) => {}
        }
    }
    out.push_str(
        "\nnote: tokens must match; the logit difference is informational (same libmlx on both sides, \
         so 0.0 is expected: anything else is a different op sequence, fatal only once it flips a token)",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(tokens: Vec<Vec<u32>>, logits: Vec<Vec<f32>>) -> Output {
        Output { tokens, logits }
    }

    #[test]
    fn identical_outputs_compare_equal_with_zero_difference() {
        let a = output(
            vec![vec![1, 2, 3], vec![4, 5, 6]],
            vec![vec![0.5, f32::NAN], vec![-1.0, 2.0]],
        );
        let b = output(a.tokens.clone(), a.logits.clone());
        let c = compare(&a, &b);
        assert_eq!(
            c,
            Comparison {
                runs: 2,
                runs_equal: 2,
                first_divergence: None,
                max_abs_diff: 0.0,
                max_probs_diff: None,
            }
        );
    }

    #[test]
    fn first_divergence_and_max_difference_are_reported() {
        let a = output(
            vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]],
            vec![vec![0.0], vec![1.0], vec![2.0]],
        );
        let b = output(
            vec![vec![1, 2, 3], vec![4, 9, 0], vec![7, 8, 1]],
            vec![vec![0.0], vec![1.25], vec![2.5]],
        );
        let c = compare(&a, &b);
        assert_eq!(c.runs_equal, 1);
        assert_eq!(
            c.first_divergence,
            Some(Divergence {
                run: 1,
                position: 1,
                left: Some(5),
                right: Some(9)
            })
        );
        assert_eq!(c.max_abs_diff, 0.5);
    }

    #[test]
    fn a_nan_on_one_side_is_an_infinite_difference() {
        let a = output(vec![vec![0]], vec![vec![1.0]]);
        let b = output(vec![vec![0]], vec![vec![f32::NAN]]);
        assert_eq!(compare(&a, &b).max_abs_diff, f32::INFINITY);
    }

    #[test]
    fn prompts_are_deterministic_in_range_and_of_every_length() {
        let p = make_prompts(320);
        assert_eq!(
            p.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            PROMPT_LENGTHS
        );
        assert!(p.prompts.iter().flatten().all(|&t| t < 320));
        assert_eq!(p.prompts, make_prompts(320).prompts);
        assert!(PROMPT_LENGTHS.contains(&1) && PROMPT_LENGTHS.iter().any(|&l| l > 100));
    }

    fn scratch(label: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-parity-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    fn write_output(prefix: &Path, runs: &str, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
        std::fs::write(with_suffix(prefix, ".json"), runs).expect("json");
        let tensors: Vec<spec_fixtures::Tensor> = tensors
            .iter()
            .map(|(name, shape, v)| spec_fixtures::Tensor::f32(name, shape.clone(), v.clone()))
            .collect();
        spec_fixtures::write_tensors(&with_suffix(prefix, ".safetensors"), &tensors)
            .expect("safetensors");
    }

    #[test]
    fn outputs_are_read_and_validated() {
        let dir = scratch("read");
        let prefix = dir.join("out");
        let logits = |i: usize| (format!("logits_{i}"), vec![2, 3], vec![i as f32; 6]);
        write_output(
            &prefix,
            r#"{"runs": [{"tokens": [1, 2]}, {"tokens": [3, 4]}]}"#,
            &[logits(0), logits(1)],
        );
        let out = read_program_output(&prefix, 2, 2, 3).expect("valid output");
        assert_eq!(out.tokens, [vec![1, 2], vec![3, 4]]);
        assert_eq!(out.logits[1], vec![1.0; 6]);

        // Wrong vocabulary, token count, run count, stray tensor, unknown key.
        assert!(read_program_output(&prefix, 2, 2, 4).is_err());
        assert!(read_program_output(&prefix, 2, 3, 3).is_err());
        assert!(read_program_output(&prefix, 3, 2, 3).is_err());
        let extra = (String::from("extra"), vec![1], vec![0.0]);
        write_output(
            &prefix,
            r#"{"runs": [{"tokens": [1, 2]}, {"tokens": [3, 4]}]}"#,
            &[logits(0), logits(1), extra],
        );
        assert!(read_program_output(&prefix, 2, 2, 3).is_err());
        write_output(
            &prefix,
            r#"{"runs": [{"tokens": [1, 2], "t": 0}, {"tokens": [3, 4]}]}"#,
            &[logits(0), logits(1)],
        );
        assert!(read_program_output(&prefix, 2, 2, 3).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
