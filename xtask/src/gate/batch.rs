//! `cargo xtask gate batch`: on every gate model, every provider's requests
//! run again all together through one scheduler (`spec_run --batch`: one
//! new request per step, providers interleaved, at most 6 active, every
//! fifth request cancelling itself half-way) and each gives the tokens and
//! log-probabilities it gives alone; a cancelled one gives a prefix of
//! them. Greedy on every model, seeded sampling with rejection verification
//! on the real one (`suffix` there without its global tree: what it drafts
//! from depends on which requests finished first, and sampled tokens depend
//! on the drafts). Where a run differs, the largest difference of the
//! emitted tokens' log-probabilities is printed.

use std::collections::BTreeMap;

use anyhow::Result;

use super::suite::{self, RunResult, SpecRun};
use super::Counts;
use crate::{real_model, shell, venv};

const MAX_TOKENS: usize = 24;

/// `spec_run`'s batched-mode arguments.
const BATCH: &[&str] = &[
    "--batch",
    "1",
    "--max-batch",
    "6",
    "--batch-cancel-every",
    "5",
];

/// Seeded sampling, verified by rejection sampling.
const SAMPLED: &[&str] = &["--temp", "0.7", "--seed", "5", "--verify", "rejection"];

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let prompts = suite::suite()?;
    let texts: Vec<String> = prompts
        .input_grounded
        .iter()
        .take(3)
        .chain(prompts.open_ended.iter().take(2))
        .chain(prompts.edit_and_return.iter().take(2))
        .cloned()
        .collect();
    let cases = suite::provider_cases(&python, &texts, 5)?;
    let work = shell::root().join("target").join("gate-batch");

    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<24} {:<16} {:>8} {:>10} {:>10} {:>14}",
        "model", "provider", "requests", "identical", "cancelled", "max |dlogprob|"
    )];
    for case in &cases {
        let (label, model, prompts, ids) =
            (&case.label, &case.model, &case.prompts, &case.providers);
        let options = &case.options;
        // Seeded sampling on the real model only.
        let sampled = label == real_model::NAME;
        let mut settings = vec![(label.clone(), Vec::new())];
        if sampled {
            settings.push((format!("{label}+sampled"), SAMPLED.to_vec()));
        }
        for (run_label, sampling) in settings {
            // `suffix` drafts from the requests that finished before: alone
            // they finish one by one, in a batch together, so its drafts
            // differ. Greedy tokens do not depend on the drafts; sampled ones
            // do (rejection sampling draws against them), so the sampled run
            // keeps its global tree empty and compares the per-request tree.
            let mut options = options.clone();
            if !sampling.is_empty() {
                options.push("suffix:max_tree_tokens=0".to_owned());
            }
            let extra: Vec<&str> = ["--dtype", "keep"]
                .iter()
                .chain(BATCH)
                .chain(&sampling)
                .copied()
                .collect();
            let results = suite::spec_run(&SpecRun {
                model,
                prompts,
                providers: ids,
                options: &options,
                extra: &extra,
                max_tokens: MAX_TOKENS,
                work: &work,
                label: &run_label,
                env: &[("OPENBLAS_NUM_THREADS", "2")],
            })?;
            for provider in ids {
                let row = compare(&run_label, provider, &results);
                if row.all {
                    counts.passed += 1;
                } else {
                    counts.failed += 1;
                }
                table.push(row.line);
            }
        }
    }
    println!("\n{}", table.join("\n"));
    println!(
        "batch: {} of {} model x provider pairs equal alone on every request",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// One table row and whether every request matched.
struct Row {
    line: String,
    all: bool,
}

/// Compares `provider`'s batched runs with its runs alone.
fn compare(label: &str, provider: &str, results: &BTreeMap<String, Vec<RunResult>>) -> Row {
    let alone = results.get(provider).cloned().unwrap_or_default();
    let batched = results
        .get(&format!("batch:{provider}"))
        .cloned()
        .unwrap_or_default();
    let mut identical = 0;
    let mut cancelled = 0;
    let mut max_diff = 0.0f32;
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        let cut = b.finish == "Cancelled";
        cancelled += usize::from(cut);
        let same = if cut {
            a.tokens.starts_with(&b.tokens)
        } else {
            a.tokens == b.tokens
        };
        let n = a.logprobs.len().min(b.logprobs.len());
        let lp_same = a.logprobs[..n]
            .iter()
            .zip(&b.logprobs[..n])
            .all(|(x, y)| x.to_bits() == y.to_bits());
        for (x, y) in a.logprobs[..n].iter().zip(&b.logprobs[..n]) {
            max_diff = max_diff.max((x - y).abs());
        }
        if same && lp_same {
            identical += 1;
        } else {
            let at = a
                .tokens
                .iter()
                .zip(&b.tokens)
                .position(|(x, y)| x != y)
                .unwrap_or(n);
            eprintln!(
                "batch: {label} / {provider}: request {i} differs at token {at}: alone {:?} vs batched {:?} ({})",
                a.tokens.get(at),
                b.tokens.get(at),
                b.finish
            );
        }
    }
    let all = identical == alone.len() && batched.len() == alone.len() && !alone.is_empty();
    Row {
        line: format!(
            "{label:<24} {provider:<16} {:>8} {:>9}{} {:>10} {:>14.3e}",
            alone.len(),
            identical,
            if all { " " } else { "!" },
            cancelled,
            max_diff
        ),
        all,
    }
}
