//! `cargo xtask gate perplexity`: `mlx-spec perplexity` against
//! `mlx_lm.perplexity` on the real model's float32 files: datasets in
//! mlx-lm's three formats made from the prompt suite, rows built as mlx-lm
//! builds them (`xtask/python/oracle_perplexity.py`: mlx-lm's own dataset
//! classes, numpy's permutation) and scored by mlx-lm's own `eval_ppl`. The
//! rows counted and the perplexity and its standard error, to the three
//! decimals both print, must agree.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::suite;
use super::Counts;
use crate::{real_model, shell, venv};

const ORACLE: &str = "xtask/python/oracle_perplexity.py";

/// A dataset and the settings it is scored under.
struct Case {
    name: &'static str,
    length: usize,
    /// -1: every whole row.
    samples: i64,
    batch: usize,
    seed: u32,
}

const CASES: &[Case] = &[
    Case {
        name: "text",
        length: 128,
        samples: 6,
        batch: 4,
        seed: 123,
    },
    Case {
        name: "chat",
        length: 96,
        samples: -1,
        batch: 8,
        seed: 7,
    },
    Case {
        name: "completions",
        length: 64,
        samples: 5,
        batch: 2,
        seed: 123,
    },
];

/// The case's records: the suite's prompts as texts, as user turns answered
/// by the next prompt's opening (the first 12: every row of them is
/// scored), or as prompt and completion.
fn records(name: &str, texts: &[String]) -> Vec<Value> {
    let texts = if name == "chat" {
        &texts[..texts.len().min(12)]
    } else {
        texts
    };
    let answer = |i: usize| {
        let next = &texts[(i + 1) % texts.len()];
        next.chars().take(160).collect::<String>()
    };
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| match name {
            "text" => json!({"text": text}),
            "chat" => json!({"messages": [
                {"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": text},
                {"role": "assistant", "content": answer(i)},
            ]}),
            _ => json!({"prompt": text, "completion": answer(i)}),
        })
        .collect()
}

/// `Perplexity: P ± E` and `Loaded N samples` from our output.
fn ours(stdout: &str) -> Result<(f64, f64, usize)> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Perplexity: "))
        .context("no `Perplexity:` line")?;
    let (ppl, se) = line.split_once(" ± ").context("no `±`")?;
    let rows = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Loaded "))
        .and_then(|l| l.strip_suffix(" samples"))
        .context("no `Loaded N samples` line")?;
    Ok((ppl.parse()?, se.parse()?, rows.parse()?))
}

/// Whether `printed` (three decimals) is `exact` rounded, allowing the
/// float32 sums' order at the rounding edge.
fn agrees(printed: f64, exact: f64) -> bool {
    (printed - exact).abs() <= 5e-4 + 1e-6 * exact.abs()
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    suite::build_runner()?;
    let model = real_model::ensure()?;
    let prompts = suite::suite()?;
    let texts: Vec<String> = prompts
        .input_grounded
        .iter()
        .chain(&prompts.open_ended)
        .chain(&prompts.edit_and_return)
        .cloned()
        .collect();
    let work = shell::root().join("target").join("gate-perplexity");
    std::fs::create_dir_all(&work)?;
    let mut cases = Vec::new();
    let mut results = Vec::new();
    for case in CASES {
        let data = work.join(format!("{}.jsonl", case.name));
        let lines: Vec<String> = records(case.name, &texts)
            .iter()
            .map(Value::to_string)
            .collect();
        std::fs::write(&data, lines.join("\n") + "\n")?;
        let out = shell::bin("mlx-spec")
            .arg("perplexity")
            .arg("--model")
            .arg(&model)
            .arg("--data-path")
            .arg(&data)
            .args([
                "--sequence-length",
                &case.length.to_string(),
                "--num-samples",
                &case.samples.to_string(),
                "--batch-size",
                &case.batch.to_string(),
                "--seed",
                &case.seed.to_string(),
            ])
            .output()
            .context("running mlx-spec perplexity")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "mlx-spec perplexity ({}) failed: {}",
                case.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        results.push(ours(&stdout).with_context(|| format!("our output: {stdout}"))?);
        cases.push(json!({
            "data": data, "sequence_length": case.length, "num_samples": case.samples,
            "batch_size": case.batch, "seed": case.seed,
        }));
    }
    let cases_file = work.join("cases.json");
    std::fs::write(&cases_file, serde_json::to_string(&cases)?)?;
    let oracle = venv::python_command(&python)
        .arg(shell::root().join(ORACLE))
        .arg("--model")
        .arg(&model)
        .arg("--cases")
        .arg(&cases_file)
        .output()
        .context("running the perplexity oracle")?;
    let text = String::from_utf8_lossy(&oracle.stdout);
    if !oracle.status.success() {
        bail!(
            "the perplexity oracle failed: {}",
            String::from_utf8_lossy(&oracle.stderr)
        );
    }
    let theirs: Vec<Value> = serde_json::from_str(text.lines().last().unwrap_or_default())
        .with_context(|| format!("the oracle's output: {text}"))?;
    if theirs.len() != CASES.len() {
        bail!(
            "the oracle answered {} of {} cases",
            theirs.len(),
            CASES.len()
        );
    }
    let mut counts = Counts::default();
    for ((case, (ppl, se, rows)), theirs) in CASES.iter().zip(results).zip(&theirs) {
        let their = |key: &str| theirs[key].as_f64().unwrap_or(f64::NAN);
        let ok =
            rows as f64 == their("rows") && agrees(ppl, their("ppl")) && agrees(se, their("se"));
        println!(
            "perplexity: {}: {} rows of {}: ours {ppl:.3} ± {se:.3}, mlx-lm {:.6} ± {:.6} ({} rows): {}",
            case.name,
            rows,
            case.length,
            their("ppl"),
            their("se"),
            their("rows"),
            if ok { "equal" } else { "DIFFERENT" }
        );
        if ok {
            counts.passed += 1;
        } else {
            counts.failed += 1;
        }
    }
    Ok(counts)
}
