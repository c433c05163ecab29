//! `cargo xtask gate distributed`: pipelines of 2 and 3 local ranks
//! (`mlx-spec launch --np N -- generate --pipeline`, the ring backend on
//! loopback) give the single-process tokens and log-probabilities, token for
//! token, on SmolLM2 (f32), on the synthetic GLM with its MTP row and on
//! the hybrid `qwen3-next` (Gated DeltaNet states on every rank):
//! plainly and with every provider that applies (prompt lookup, the gates'
//! drafter model, `glm52-native-mtp` on GLM; `eagle3` and `dflash` (a DFlash2
//! drafter with a sliding layer) on a four-layer llama their synthetic heads were drawn for). Prints each rank's weight
//! bytes beside the whole model's. Then each model is served pipelined
//! (`serve --pipeline` over 2 ranks, `distributed_serve.rs`): concurrent
//! requests, one per provider, share its passes and answer as one process
//! answers each alone. The fault cases (a rank dying mid-generation or
//! mid-serve, a head dying under its follower) are the cargo tests of
//! `crates/mlx-spec/tests/cli_pipeline.rs` and `server_pipeline.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use run_protocol::providers::{DFLASH, DRAFT_MODEL, EAGLE3, GLM52_NATIVE_MTP, PROMPT_LOOKUP};
use run_protocol::spec::PLAIN;

use super::{distributed_serve, suite, Counts};
use crate::{real_model, shell, synth, venv};

pub const MAX_TOKENS: usize = 20;

/// Every rank shares this machine's cores: one BLAS thread each (OpenBLAS
/// workers spin while they wait and starve the other ranks).
pub const ENV: &[(&str, &str)] = &[("OPENBLAS_NUM_THREADS", "1")];

/// One model the gate runs: its directory, prompt arguments, how it loads
/// (arguments `generate` and `serve` both take) and providers (`id`, extra
/// arguments).
pub struct Case {
    pub label: &'static str,
    pub model: PathBuf,
    pub prompt: Vec<String>,
    pub load: Vec<String>,
    pub providers: Vec<(&'static str, Vec<String>)>,
}

/// What one `generate` printed.
#[derive(Debug)]
pub struct Run {
    /// The text and the per-token lines (`--logprobs`).
    pub tokens: String,
    /// Emitted tokens.
    pub emitted: usize,
    /// Generation tokens per second (the summary line).
    pub tokens_per_second: f64,
    /// `(passes, link bytes)` of the pipeline line.
    pub pipeline: Option<(u64, u64)>,
    /// Weight bytes of each rank, by rank.
    pub rank_weights: Vec<u64>,
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let cases = cases(
        &python,
        &shell::root().join("target").join("gate-distributed"),
    )?;
    build()?;
    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<18} {:<18} {:>5} {:>9} {:>14} {:>28}",
        "model", "provider", "ranks", "identical", "passes/token", "weights per rank (bytes)"
    )];
    for case in &cases {
        let mut whole = None;
        for (id, extra) in &case.providers {
            let args = generate_args(case, id, extra, MAX_TOKENS);
            let single = generate(1, false, &args)
                .with_context(|| format!("{} {id}: single process", case.label))?;
            for ranks in [1, 2, 3] {
                let t = Instant::now();
                let outcome = generate(ranks, true, &args);
                let seconds = t.elapsed().as_secs_f64();
                match outcome {
                    Ok(run) => {
                        let same = run.tokens == single.tokens && !run.tokens.trim().is_empty();
                        if same {
                            counts.passed += 1;
                        } else {
                            counts.failed += 1;
                            eprintln!(
                                "distributed: {} {id} {ranks} ranks differs:\n--- single\n{}\n--- pipeline\n{}",
                                case.label, single.tokens, run.tokens
                            );
                        }
                        if ranks == 1 {
                            whole = run.rank_weights.first().copied();
                        }
                        let passes = run
                            .pipeline
                            .map_or(f64::NAN, |(p, _)| p as f64 / run.emitted.max(1) as f64);
                        let weights = run
                            .rank_weights
                            .iter()
                            .map(|w| match whole {
                                Some(all) => {
                                    format!("{w} ({:.0}%)", 100.0 * *w as f64 / all as f64)
                                }
                                None => w.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(", ");
                        table.push(format!(
                            "{:<18} {:<18} {:>5} {:>9} {:>14.3} {:>28}   {seconds:.1}s",
                            case.label,
                            id,
                            ranks,
                            if same { "yes" } else { "NO" },
                            passes,
                            weights
                        ));
                    }
                    Err(e) => {
                        counts.failed += 1;
                        eprintln!("distributed: {} {id} {ranks} ranks: {e:#}", case.label);
                        table.push(format!(
                            "{:<18} {:<18} {:>5} {:>9}",
                            case.label, id, ranks, "error"
                        ));
                    }
                }
            }
        }
        match distributed_serve::run(case) {
            Ok(outcome) => {
                counts.count(outcome.same);
                table.push(outcome.line);
            }
            Err(e) => {
                counts.failed += 1;
                eprintln!("distributed: {} batched serve: {e:#}", case.label);
                table.push(format!(
                    "{:<18} {:<18} {:>5} {:>9}",
                    case.label, "batch", 2, "error"
                ));
            }
        }
    }
    println!("\n{}", table.join("\n"));
    println!(
        "distributed: {} of {} pipelines (and pipelined servers) equal the single process token for token",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// Builds `mlx-spec` (see [`shell::build`]).
pub fn build() -> Result<()> {
    shell::build()
}

/// SmolLM2 (f32) with prompt lookup and its 4-bit drafter; the synthetic GLM
/// with prompt lookup, a 4-bit GLM drafter and its MTP row; the hybrid
/// `qwen3-next` (recurrent layers on both ranks) with prompt lookup and its
/// 4-bit copy as drafter; the four-layer llama with its EAGLE-3 head (the
/// fused features tapped on the ranks that hold their layers).
pub fn cases(python: &Path, work: &Path) -> Result<Vec<Case>> {
    let mut synthetic = synth::ensure(python)?;
    synthetic.extend(crate::synth_qwen3_next::ensure(
        &synth::models_dir(),
        python,
    )?);
    let dir_of = |name: &str| {
        synthetic
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("no synthetic {name} checkpoint"))
    };
    let real = real_model::ensure()?;
    let drafter = suite::real_drafter(python)?;
    let glm = with_tokenizer(&dir_of("glm")?, &work.join("glm"))?;
    let glm_drafter = dir_of("glm-q4g64")?;
    let glm_tier = (4 * float32_expert_bytes(&glm)?).to_string();
    let hybrid = with_tokenizer(&dir_of("qwen3-next")?, &work.join("qwen3-next"))?;
    let hybrid_drafter = dir_of("qwen3-next-q4g32")?;
    let (eagle3_target, eagle3_heads) = crate::synth_eagle3::ensure()?;
    let eagle3_target = with_tokenizer(&eagle3_target, &work.join("eagle3-target"))?;
    let eagle3_head = eagle3_heads
        .first()
        .map(|(_, dir)| dir.clone())
        .context("no synthetic EAGLE-3 head")?;
    // A DFlash2 drafter made for the same four-layer target (taps of its
    // second and fourth layers: one on each rank of a two-rank pipeline),
    // its second layer sliding over a window the prompt and answer outgrow.
    let dflash = crate::synth_dflash::ensure(&spec_fixtures::dflash::Dflash {
        name: "dflash2-eagle3-target",
        taps: &[1, 3],
        target_layers: 4,
        dflash2: Some(spec_fixtures::dflash::SMALL_DFLASH2),
        sliding: Some(spec_fixtures::dflash::Sliding {
            window: 16,
            layers: &[1],
        }),
        ..spec_fixtures::dflash::GATE_LLAMA
    })?;
    let path = |p: &Path| p.to_string_lossy().into_owned();
    Ok(vec![
        Case {
            label: real_model::NAME,
            model: real,
            prompt: vec![
                "--prompt".into(),
                "Repeat this line twice: the quick brown fox jumps over the lazy dog.".into(),
            ],
            load: vec![],
            providers: vec![
                (PLAIN, vec![]),
                (PROMPT_LOOKUP, vec![]),
                (DRAFT_MODEL, vec!["--draft-model".into(), path(&drafter)]),
            ],
        },
        Case {
            label: "glm",
            model: glm.clone(),
            prompt: word_prompt(),
            load: vec![],
            providers: vec![
                (PLAIN, vec![]),
                (PROMPT_LOOKUP, vec![]),
                (
                    DRAFT_MODEL,
                    vec!["--draft-model".into(), path(&glm_drafter)],
                ),
                (GLM52_NATIVE_MTP, vec![]),
            ],
        },
        // Each rank streams its layers' routed experts through a tier of
        // four (of the 16 its two sparse layers hold); the MTP row's stay
        // resident at 8 bits.
        Case {
            label: "glm-streamed",
            model: glm,
            prompt: word_prompt(),
            load: ["--expert-cache-bytes", &glm_tier, "--mtp-expert-bits", "8"]
                .map(String::from)
                .to_vec(),
            providers: vec![
                (PLAIN, vec![]),
                (PROMPT_LOOKUP, vec![]),
                (GLM52_NATIVE_MTP, vec![]),
            ],
        },
        Case {
            label: "qwen3-next",
            model: hybrid,
            prompt: word_prompt(),
            load: vec![],
            providers: vec![
                (PLAIN, vec![]),
                (PROMPT_LOOKUP, vec![]),
                (
                    DRAFT_MODEL,
                    vec!["--draft-model".into(), path(&hybrid_drafter)],
                ),
            ],
        },
        Case {
            label: "eagle3-target",
            model: eagle3_target,
            prompt: word_prompt(),
            load: vec![],
            providers: vec![
                (PLAIN, vec![]),
                (EAGLE3, vec!["--draft-model".into(), path(&eagle3_head)]),
                (DFLASH, vec!["--draft-model".into(), path(&dflash)]),
            ],
        },
    ])
}

/// One routed expert's bytes (gate, up and down) of the float32 GLM at
/// `dir`, from its `config.json`.
fn float32_expert_bytes(dir: &Path) -> Result<usize> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let config: serde_json::Value = serde_json::from_str(&text)?;
    let dim = |key: &str| {
        config[key]
            .as_u64()
            .map(|v| v as usize)
            .with_context(|| format!("{}: no `{key}`", path.display()))
    };
    Ok(3 * dim("hidden_size")? * dim("moe_intermediate_size")? * 4)
}

/// The synthetic checkpoints' prompt: their word-level tokenizer's ids, a
/// phrase repeated (prompt lookup finds it).
fn word_prompt() -> Vec<String> {
    [
        "--no-chat-template",
        "--prompt",
        "w5 w6 w7 w8 w9 w5 w6 w7 w8 w9 w5 w6",
    ]
    .map(String::from)
    .to_vec()
}

/// `generate`'s arguments for a case and provider.
pub fn generate_args(case: &Case, id: &str, extra: &[String], max_tokens: usize) -> Vec<String> {
    let mut args = vec![
        "generate".to_owned(),
        "--model".into(),
        case.model.to_string_lossy().into_owned(),
        "--max-tokens".into(),
        max_tokens.to_string(),
        "--logprobs".into(),
    ];
    args.extend(case.prompt.iter().cloned());
    args.extend(case.load.iter().cloned());
    if id != PLAIN {
        args.extend(["--draft".to_owned(), id.to_owned()]);
    }
    args.extend(extra.iter().cloned());
    args
}

/// Runs `generate` in one process, or as a pipeline of `ranks` under
/// `launch`.
pub fn generate(ranks: usize, pipeline: bool, args: &[String]) -> Result<Run> {
    let exe = shell::out_dir().join("mlx-spec");
    let mut cmd = Command::new(&exe);
    if pipeline {
        cmd.args(["launch", "--np", &ranks.to_string(), "--"]);
    }
    cmd.args(args);
    if pipeline {
        cmd.arg("--pipeline");
    }
    cmd.envs(ENV.iter().copied());
    let out = cmd
        .output()
        .with_context(|| format!("starting {}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("generate failed ({}): {stderr}", out.status);
    }
    parse(&stdout, &stderr)
}

fn parse(stdout: &str, stderr: &str) -> Result<Run> {
    let parts: Vec<&str> = stdout.split("==========").collect();
    let [text, lines, summary, ..] = parts.as_slice() else {
        bail!("generate printed no --logprobs section:\n{stdout}");
    };
    let emitted = lines.lines().filter(|l| !l.trim().is_empty()).count();
    let tokens_per_second = summary
        .split("Generation: ")
        .nth(1)
        .and_then(|s| s.split(", ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .context("no generation speed in the summary")?;
    let number_after = |line: &str, key: &str| -> Option<u64> {
        line.split(key)
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let pipeline = summary
        .lines()
        .find(|l| l.starts_with("Pipeline: "))
        .and_then(|l| Some((number_after(l, "ranks, ")?, number_after(l, "), ")?)));
    let mut rank_weights: Vec<(u64, u64)> = stderr
        .lines()
        .filter(|l| l.contains(": layers"))
        .filter_map(|l| {
            let at = l.rfind("rank ")?;
            let l = &l[at..];
            let rank = number_after(l, "rank ")?;
            Some((rank, number_after(l, "weights ")?))
        })
        .collect();
    rank_weights.sort_unstable();
    rank_weights.dedup_by_key(|(r, _)| *r);
    Ok(Run {
        tokens: format!("{text}=========={lines}"),
        emitted,
        tokens_per_second,
        pipeline,
        rank_weights: rank_weights.into_iter().map(|(_, w)| w).collect(),
    })
}

/// A view of a synthetic checkpoint with a word-level tokenizer of its
/// vocabulary (`w0`, `w1`, ..): `generate` needs one.
fn with_tokenizer(model: &Path, dir: &Path) -> Result<PathBuf> {
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json"))?)?;
    let vocab = config["vocab_size"]
        .as_u64()
        .context("the checkpoint's config has no vocab_size")?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(model)? {
        let entry = entry?;
        std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name()))?;
    }
    let words: serde_json::Map<String, serde_json::Value> = (0..vocab)
        .map(|i| (format!("w{i}"), serde_json::json!(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": words, "unk_token": "w0"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())?;
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_tokens_speed_pipeline_and_weights() {
        let stdout = "w1 w2\n==========\n -0.1\t1\t\"w1\"\n -0.2\t2\t\"w2\"\n==========\n\
            Prompt: 3 tokens, 9.0 tokens-per-sec | Generation: 2 tokens, 4.500 tokens-per-sec | Peak memory: 0.1 GB\n\
            Pipeline: 2 ranks, 3 passes (1.500 per emitted token), 640 link bytes (320 per emitted token)\n";
        let stderr = "rank 0 of 2: layers 1..2 of 2, weights 100 bytes\n[rank 1] rank 1 of 2: layers 0..1 of 2, weights 90 bytes\n";
        let run = parse(stdout, stderr).expect("parse");
        assert_eq!(run.emitted, 2);
        assert_eq!(run.tokens_per_second, 4.5);
        assert_eq!(run.pipeline, Some((3, 640)));
        assert_eq!(run.rank_weights, [100, 90]);
        assert!(parse("no sections", "").is_err());
    }
}
