//! `cargo xtask gate batch`: on every gate model, every provider's requests
//! run again all together through one scheduler (`spec_run` with a `batch`: one
//! new request per step, providers interleaved, at most 6 active, every
//! fifth request cancelling itself half-way) and each gives the tokens and
//! log-probabilities it gives alone; a cancelled one gives a prefix of
//! them. Greedy on every model, seeded sampling with rejection verification
//! on the real one (`suffix` there without its global tree: what it drafts
//! from depends on which requests finished first, and sampled tokens depend
//! on the drafts). Where a run differs, the largest difference of the
//! emitted tokens' log-probabilities is printed. Then `glm52` again with its
//! routed experts streamed through a tier of one layer's experts
//! (`suite::streamed_case`), plain and prompt lookup: batched equal to
//! alone, and plain alone equal to the resident model's, bit for bit.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use run_protocol::providers::{PROMPT_LOOKUP, SUFFIX};
use run_protocol::spec::{Batch, Finish, Generation, Sampling, SpecReport, Verify, PLAIN};

use super::compare;
use super::suite;
use super::Counts;
use crate::{real_model, shell, venv};

const MAX_TOKENS: usize = 24;

/// spec_run's batched mode: one new request per step, at most 6 active,
/// every fifth cancelling itself half-way.
const BATCH: Batch = Batch {
    stagger: 1,
    max_batch: 6,
    cancel_every: 5,
};

/// Every run's BLAS threads.
const THREADS: suite::Env = &[("OPENBLAS_NUM_THREADS", "2")];

/// The real model's prompts the sampled run takes: one of each kind (the
/// list is 2 input-grounded, 1 open-ended, 2 edit-and-return).
const SAMPLED_PROMPTS: [usize; 3] = [0, 2, 3];

/// Seeded sampling, verified by rejection sampling.
const SAMPLED: Sampling = Sampling {
    temperature: 0.7,
    seed: 5,
    verify: Verify::Rejection,
};

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let prompts = suite::suite()?;
    let texts: Vec<String> = prompts
        .input_grounded
        .iter()
        .take(2)
        .chain(prompts.open_ended.iter().take(1))
        .chain(prompts.edit_and_return.iter().take(2))
        .cloned()
        .collect();
    let mut cases = suite::provider_cases(&python, &texts, 5)?;
    cases.push(suite::streamed_case(
        &cases,
        usize::MAX,
        &[PLAIN, PROMPT_LOOKUP],
    )?);
    // Plain runs alone by label, for the streamed case's check.
    let mut plain_of: BTreeMap<String, Vec<Generation>> = BTreeMap::new();
    let work = shell::root().join("target").join("gate-batch");

    // Every run planned, then run side by side (`suite::spec_runs`), then
    // checked in the order planned.
    let mut planned = Vec::new();
    for case in &cases {
        let label = &case.label;
        // Seeded sampling on the real model only.
        let mut settings = vec![(label.clone(), None)];
        if label == real_model::NAME {
            settings.push((format!("{label}+sampled"), Some(SAMPLED)));
        }
        for (run_label, sampling) in settings {
            let prompts = match sampling {
                None => case.prompts.clone(),
                Some(_) => SAMPLED_PROMPTS
                    .iter()
                    .filter_map(|&i| case.prompts.get(i).cloned())
                    .collect(),
            };
            let mut request = case.request(prompts, MAX_TOKENS);
            request.batch = Some(BATCH);
            if let Some(sampling) = sampling {
                request.sampling = sampling;
                // `suffix` drafts from the requests that finished before:
                // alone they finish one by one, in a batch together, so its
                // drafts differ. Greedy tokens do not depend on the drafts;
                // sampled ones do (rejection sampling draws against them), so
                // the sampled run keeps its global tree empty and compares
                // the per-request tree.
                request.option(SUFFIX, "max_tree_tokens", "0");
            }
            planned.push((case, run_label, request));
        }
    }
    let reports = suite::spec_runs(
        planned
            .iter()
            .map(|(_, label, request)| (label.clone(), request.clone(), THREADS))
            .collect(),
        &work,
    )?;

    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<24} {:<16} {:>8} {:>10} {:>10} {:>14}",
        "model", "provider", "requests", "identical", "cancelled", "max |dlogprob|"
    )];
    for ((case, run_label, _), results) in planned.iter().zip(reports) {
        if let Some(resident) = case.resident_of(&cases) {
            let want = plain_of
                .get(&resident.label)
                .context("the resident case runs first")?;
            let row = compare_resident(run_label, want, results.alone(PLAIN));
            counts.count(row.all);
            table.push(row.line);
        }
        plain_of.insert(run_label.clone(), results.alone(PLAIN).to_vec());
        for provider in &case.providers {
            let row = compare_batched(run_label, provider, &results);
            counts.count(row.all);
            table.push(row.line);
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

/// Compares a streamed target's plain runs alone with the resident
/// model's: the same tokens and log-probabilities, bit for bit.
fn compare_resident(label: &str, resident: &[Generation], streamed: &[Generation]) -> Row {
    let mut identical = 0;
    let mut max_diff = 0.0f32;
    for (i, (a, b)) in resident.iter().zip(streamed).enumerate() {
        let diff = compare::max_difference(&a.logprobs, &b.logprobs);
        max_diff = max_diff.max(diff);
        if a.tokens == b.tokens && diff == 0.0 {
            identical += 1;
        } else {
            eprintln!("batch: {label}: request {i} differs from the resident model's");
        }
    }
    let all =
        identical == resident.len() && streamed.len() == resident.len() && !resident.is_empty();
    Row {
        line: format!(
            "{label:<24} {:<16} {:>8} {:>9}{} {:>10} {:>14.3e}",
            "plain=resident",
            streamed.len(),
            identical,
            if all { " " } else { "!" },
            0,
            max_diff
        ),
        all,
    }
}

/// Compares `provider`'s batched runs with its runs alone.
fn compare_batched(label: &str, provider: &str, results: &SpecReport) -> Row {
    let alone = results.alone(provider);
    let batched = results.batched(provider);
    let mut identical = 0;
    let mut cancelled = 0;
    let mut max_diff = 0.0f32;
    for (i, (a, b)) in alone.iter().zip(batched).enumerate() {
        let cut = b.finish == Finish::Cancelled;
        cancelled += usize::from(cut);
        let same = if cut {
            a.tokens.starts_with(&b.tokens)
        } else {
            a.tokens == b.tokens
        };
        // Over the tokens both emitted.
        let diff = compare::max_difference(&a.logprobs, &b.logprobs);
        max_diff = max_diff.max(diff);
        if same && diff == 0.0 {
            identical += 1;
        } else {
            let at = compare::first_difference(&a.tokens, &b.tokens)
                .unwrap_or(a.logprobs.len().min(b.logprobs.len()));
            eprintln!(
                "batch: {label} / {provider}: request {i} differs at token {at}: alone {:?} vs batched {:?} ({:?})",
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
