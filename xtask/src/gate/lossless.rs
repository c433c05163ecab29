//! `cargo xtask gate lossless`: for every registered provider, on every gate
//! model, speculative greedy output equals plain greedy output token for
//! token (100%, not a percentage). Twice: with two BLAS threads and each
//! provider's default draft count (16 for prompt lookup, 3 for the others,
//! adaptive), and with one thread and fixed counts swapped (3 for prompt
//! lookup, 16 for the others), so every provider verifies windows of 4 and
//! of 17 rows. Each synthetic target runs 10 token-id prompts (half of them
//! repeating a phrase), the real model a dozen chat prompts (input-grounded,
//! open-ended and edit-and-return in turn); the second setting runs the first
//! 4 of each (16 drafts a round make the drafters slow).

use anyhow::{Context, Result};

use super::suite::{self, SpecRun};
use super::Counts;
use crate::{real_model, shell, venv};

const MAX_TOKENS: usize = 48;

/// A run setting: label suffix, environment, extra `spec_run` arguments, how
/// many of each synthetic case's prompts and of the real model's it runs,
/// whether GLM runs again with an EOS.
struct Setting {
    label: &'static str,
    env: &'static [(&'static str, &'static str)],
    drafts: &'static [&'static str],
    prompts: usize,
    real_prompts: usize,
    eos_runs: bool,
}

/// Real-model chat prompts of each kind (input-grounded, open-ended,
/// edit-and-return).
const REAL_PER_KIND: usize = 4;

const SETTINGS: &[Setting] = &[
    Setting {
        label: "",
        env: &[("OPENBLAS_NUM_THREADS", "2")],
        drafts: &[],
        prompts: usize::MAX,
        real_prompts: usize::MAX,
        eos_runs: true,
    },
    // Fixed draft lengths: every round verifies a window of 4 or 17 rows,
    // whatever the acceptance.
    Setting {
        label: "/1t",
        env: &[("OPENBLAS_NUM_THREADS", "1")],
        drafts: &[
            "--no-adaptive",
            "--num-draft",
            "16",
            "--num-draft",
            "prompt-lookup=3",
        ],
        prompts: 4,
        real_prompts: 4,
        eos_runs: false,
    },
];

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let prompts = suite::suite()?;
    // The kinds in turn, so the second setting's first few cover each;
    // edit-and-return prompts make prompt lookup draft and accept windows
    // of up to 16 tokens.
    let texts: Vec<String> = (0..REAL_PER_KIND)
        .flat_map(|i| {
            [
                &prompts.input_grounded,
                &prompts.open_ended,
                &prompts.edit_and_return,
            ]
            .into_iter()
            .filter_map(move |kind| kind.get(i).cloned())
        })
        .collect();
    let cases = suite::provider_cases(&python, &texts, 10)?;
    let work = shell::root().join("target").join("gate-lossless");

    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<22} {:<16} {:>8} {:>10} {:>11}",
        "model", "provider", "prompts", "identical", "acceptance"
    )];
    for setting in SETTINGS {
        for case in &cases {
            let n = if case.label == real_model::NAME {
                setting.real_prompts
            } else {
                setting.prompts
            };
            let label = &format!("{}{}", case.label, setting.label);
            let prompts = &first_prompts(&case.prompts, n);
            let (model, ids, options) = (&case.model, &case.providers, &case.options);
            let extra: Vec<&str> = ["--dtype", "keep"]
                .iter()
                .chain(setting.drafts)
                .copied()
                .collect();
            let file_label = label.replace('/', "-");
            let results = suite::spec_run(&SpecRun {
                model,
                prompts,
                providers: ids,
                options,
                extra: &extra,
                max_tokens: MAX_TOKENS,
                work: &work,
                label: &file_label,
                env: setting.env,
            })?;
            let Some(plain) = results.get("plain") else {
                anyhow::bail!("spec_run returned no plain runs")
            };
            let mut passes = vec![(label.clone(), results.clone())];
            if setting.eos_runs && label.starts_with("glm") {
                // Again with an EOS id the plain runs emit mid-way, so requests
                // end on EOS with drafts in flight.
                let eos = plain
                    .iter()
                    .filter_map(|r| r.tokens.get(MAX_TOKENS / 3))
                    .copied()
                    .next()
                    .context("no plain tokens")?
                    .to_string();
                let mut extra = extra.clone();
                extra.extend(["--eos", eos.as_str()]);
                let eos_label = format!("{label}+eos{eos}");
                let file_label = eos_label.replace('/', "-");
                let results = suite::spec_run(&SpecRun {
                    model,
                    prompts,
                    providers: ids,
                    options,
                    extra: &extra,
                    max_tokens: MAX_TOKENS,
                    work: &work,
                    label: &file_label,
                    env: setting.env,
                })?;
                let ended = results
                    .get("plain")
                    .map_or(0, |runs| runs.iter().filter(|r| r.finish == "Eos").count());
                eprintln!("lossless: {eos_label}: {ended} plain runs end on EOS");
                if ended == 0 {
                    counts.failed += 1;
                }
                passes.push((eos_label, results));
            }
            for (label, results) in &passes {
                let Some(plain) = results.get("plain") else {
                    anyhow::bail!("spec_run returned no plain runs")
                };
                for provider in case.speculative() {
                    let runs = results.get(provider).cloned().unwrap_or_default();
                    let mut identical = 0;
                    for (i, (a, b)) in plain.iter().zip(&runs).enumerate() {
                        if a.tokens == b.tokens {
                            identical += 1;
                        } else {
                            let at = a
                                .tokens
                                .iter()
                                .zip(&b.tokens)
                                .position(|(x, y)| x != y)
                                .unwrap_or(a.tokens.len().min(b.tokens.len()));
                            eprintln!("lossless: {label} / {provider}: prompt {i} differs at token {at}: plain {:?} vs {:?}", a.tokens.get(at), b.tokens.get(at));
                        }
                    }
                    let (drafted, accepted): (usize, usize) = runs
                        .iter()
                        .fold((0, 0), |(d, a), r| (d + r.drafted, a + r.accepted));
                    let all = identical == plain.len() && runs.len() == plain.len();
                    if all {
                        counts.passed += 1
                    } else {
                        counts.failed += 1
                    }
                    table.push(format!(
                        "{label:<22} {provider:<16} {:>8} {:>9}{} {:>10.1}%",
                        plain.len(),
                        identical,
                        if all { " " } else { "!" },
                        if drafted == 0 {
                            0.0
                        } else {
                            100.0 * accepted as f64 / drafted as f64
                        }
                    ));
                }
            }
        }
    }
    println!("\n{}", table.join("\n"));
    println!(
        "lossless: {} of {} model x provider pairs identical on every prompt",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// The first `n` prompts of a `{"prompts": [...]}` file.
fn first_prompts(prompts: &serde_json::Value, n: usize) -> serde_json::Value {
    let list: Vec<serde_json::Value> = prompts["prompts"]
        .as_array()
        .map(|a| a.iter().take(n).cloned().collect())
        .unwrap_or_default();
    serde_json::json!({ "prompts": list })
}
