//! `cargo xtask gate lossless`: for every registered provider, on every gate
//! model, speculative greedy output equals plain greedy output token for
//! token (100%, not a percentage). Twice: with two BLAS threads and each
//! provider's default draft count (16 for prompt lookup, 3 for the others,
//! adaptive), and with one thread and fixed counts swapped (3 for prompt
//! lookup, 16 for the others), so every provider verifies windows of 4 and
//! of 17 rows. Each synthetic target runs 8 token-id prompts (half of them
//! repeating a phrase), the real model 6 chat prompts (input-grounded,
//! open-ended and edit-and-return in turn); the second setting runs the first
//! 2 synthetic prompts, not the real model, `glm`, `gemma4-text` or the
//! quantized GLM copies (16 drafts a round make them slow; `glm52`,
//! `gemma4-shared` and `gemma4-moe` hold their layers; the `invariance` gate covers
//! every window length of 1 to 33 rows, theirs included, with one thread
//! and two). A third setting keeps the targets' keys and values in 4 bits
//! from position 24 (`--kv-bits 4 --quantized-kv-start 24`) on the real
//! model (3 prompts, one of each kind; the real model with a LoRA adapter
//! on its last 8 blocks too) and the synthetic qwen3 (2). Then `glm52`
//! again with its routed experts streamed
//! through a tier of one layer's experts (`suite::streamed_case`): plain,
//! prompt lookup and `glm52-native-mtp` (8-bit MTP experts) on its first
//! prompts, plain equal to the resident model's plain output. The runs go
//! side by side (`suite::spec_runs`), checked in the order planned.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use run_protocol::providers::{GLM52_NATIVE_MTP, PROMPT_LOOKUP};
use run_protocol::spec::{tokens, Finish, Generation, SpecReport, SpecRequest, PLAIN};
use run_protocol::KvCacheBits;

use super::compare;
use super::suite;
use super::Counts;
use crate::{adapters, real_model, shell, venv};

const MAX_TOKENS: usize = 48;

/// Prompts of the streamed-expert case (`suite::streamed_case`; half of
/// them repeat a phrase): every provider's output equals plain streamed
/// output, which equals the resident model's.
const STREAMED_PROMPTS: usize = 4;

/// A run setting: label suffix, environment, draft counts, how many of each
/// synthetic case's prompts and of the real model's it runs, whether GLM
/// runs again with an EOS.
struct Setting {
    label: &'static str,
    env: &'static [(&'static str, &'static str)],
    /// Fixed draft counts, not adapted: every provider's, and prompt
    /// lookup's; `None`: each provider's default, adaptive.
    fixed: Option<(usize, usize)>,
    prompts: usize,
    real_prompts: usize,
    eos_runs: bool,
    /// Cases this setting leaves out.
    skip: &'static [&'static str],
    /// The only cases it runs (empty: every case not skipped).
    only: &'static [&'static str],
    /// The target's keys and values kept quantized.
    kv_cache: Option<KvCacheBits>,
    /// A fine-tuned adapter on the real model (`adapters::ensure`'s kind
    /// and blocks); the other cases run without.
    adapter: Option<(&'static str, usize)>,
    /// The target's caches bounded to this many positions
    /// (`--max-kv-size`).
    max_kv_size: Option<usize>,
}

/// Real-model chat prompts of each kind (input-grounded, open-ended,
/// edit-and-return).
const REAL_PER_KIND: usize = 2;

const SETTINGS: &[Setting] = &[
    Setting {
        label: "",
        env: &[("OPENBLAS_NUM_THREADS", "2")],
        fixed: None,
        prompts: usize::MAX,
        real_prompts: usize::MAX,
        eos_runs: true,
        skip: &[],
        only: &[],
        kv_cache: None,
        adapter: None,
        max_kv_size: None,
    },
    // Fixed draft lengths: every round verifies a window of 4 or 17 rows,
    // whatever the acceptance.
    // The real model's rows in windows of every length to 33, with one
    // thread and two, are `invariance`'s: this setting runs the synthetic
    // targets only, and of the GLM / Gemma-4 targets (the slowest cases
    // with 16 drafts a round) only `glm52` (GLM-5.2's layers with its MTP
    // row), `gemma4-shared` and `gemma4-moe` (Gemma-4's sliding and full
    // layers with KV sharing, and with experts): `invariance` covers every
    // target's windows of 1 to 33 rows with one thread and two.
    Setting {
        label: "/1t",
        env: &[("OPENBLAS_NUM_THREADS", "1")],
        fixed: Some((16, 3)),
        prompts: 2,
        real_prompts: 0,
        eos_runs: false,
        skip: &["glm-q8g32", "glm52-mxfp4", "glm", "gemma4-text"],
        only: &[],
        kv_cache: None,
        adapter: None,
        max_kv_size: None,
    },
    // Keys and values in 4 bits (`--kv-bits 4 --kv-group-size 32`) from
    // position 24 (`--quantized-kv-start 24`) on the llama-family targets a
    // group of 32 fits (head dimensions 64 and 32): the real model's chat
    // prompts cross the start in their prefill, the synthetic ones in their
    // answers, so verify windows run over float keys, quantized ones and
    // both; every provider gives plain decoding's tokens.
    Setting {
        label: "/kv4",
        env: &[("OPENBLAS_NUM_THREADS", "2")],
        fixed: None,
        prompts: 2,
        real_prompts: 3,
        eos_runs: false,
        skip: &[],
        only: &[real_model::NAME, "qwen3"],
        kv_cache: Some(KvCacheBits {
            bits: 4,
            group_size: 32,
            start: 24,
        }),
        // The real model here also carries a LoRA adapter on its last 8
        // blocks (`parity` checks it against mlx-lm's): the low-rank
        // products run in every verify window too.
        adapter: Some(("lora", 8)),
        max_kv_size: None,
    },
    // Caches bounded to 40 positions (`--max-kv-size 40`, the first 4 kept)
    // on llama-family targets: the real model's chat prompt is longer
    // than the bound (its prefill already drops positions), the synthetic
    // ones' answers run past it, so verify windows and rollbacks happen
    // after the window moved; every provider gives plain decoding's tokens.
    Setting {
        label: "/maxkv",
        env: &[("OPENBLAS_NUM_THREADS", "2")],
        fixed: None,
        prompts: 2,
        real_prompts: 1,
        eos_runs: false,
        skip: &[],
        only: &[real_model::NAME, "qwen3"],
        kv_cache: None,
        adapter: None,
        max_kv_size: Some(40),
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
    let mut cases = suite::provider_cases(&python, &texts, 8)?;
    cases.push(suite::streamed_case(
        &cases,
        STREAMED_PROMPTS,
        &[PLAIN, PROMPT_LOOKUP, GLM52_NATIVE_MTP],
    )?);
    // Plain runs by label and setting, for the streamed case's check.
    let mut plain_of: BTreeMap<String, Vec<Generation>> = BTreeMap::new();
    let work = shell::root().join("target").join("gate-lossless");

    // Every run planned first, then run side by side (`runs::parallel`),
    // then checked in the order planned.
    let mut planned: Vec<Planned> = Vec::new();
    for setting in SETTINGS {
        for case in &cases {
            let n = if case.label == real_model::NAME {
                setting.real_prompts
            } else {
                setting.prompts
            };
            let left_out = setting.skip.contains(&case.label.as_str())
                || !(setting.only.is_empty() || setting.only.contains(&case.label.as_str()));
            if n == 0 || left_out {
                continue;
            }
            let adapter = setting.adapter.filter(|_| case.label == real_model::NAME);
            let label = match adapter {
                Some((kind, layers)) => format!("{}{}+{kind}{layers}", case.label, setting.label),
                None => format!("{}{}", case.label, setting.label),
            };
            let mut request =
                case.request(case.prompts.iter().take(n).cloned().collect(), MAX_TOKENS);
            request.kv_cache = setting.kv_cache;
            request.max_kv_size = setting.max_kv_size;
            if let Some((kind, layers)) = adapter {
                let real = real_model::ensure()?;
                request.adapter = Some(adapters::ensure(
                    &python,
                    &real,
                    real_model::NAME,
                    kind,
                    layers,
                )?);
            }
            if let Some((all, lookup)) = setting.fixed {
                request.adaptive = false;
                request.num_draft = Some(all);
                request
                    .num_draft_of
                    .insert(PROMPT_LOOKUP.to_owned(), lookup);
            }
            planned.push(Planned {
                setting,
                case,
                prompts: n,
                label,
                request,
            });
        }
    }
    let firsts = suite::spec_runs(
        planned
            .iter()
            .map(|p| (p.label.clone(), p.request.clone(), p.setting.env))
            .collect(),
        &work,
    )?;
    // Again with an EOS id the plain runs emit mid-way, so requests end on
    // EOS with drafts in flight.
    let mut eos_runs = Vec::new();
    let mut eos_of = Vec::new();
    for (p, results) in planned.iter().zip(&firsts) {
        if !(p.setting.eos_runs && p.label.starts_with("glm") && !p.case.streams()) {
            eos_of.push(None);
            continue;
        }
        let eos = results
            .alone(PLAIN)
            .iter()
            .filter_map(|r| r.tokens.get(MAX_TOKENS / 3))
            .copied()
            .next()
            .context("no plain tokens")?;
        let mut request = p.request.clone();
        request.eos.push(eos);
        eos_of.push(Some(eos_runs.len()));
        eos_runs.push((format!("{}+eos{eos}", p.label), request, p.setting.env));
    }
    let eos_labels: Vec<String> = eos_runs.iter().map(|(l, _, _)| l.clone()).collect();
    let mut eos_results: Vec<Option<SpecReport>> = suite::spec_runs(eos_runs, &work)?
        .into_iter()
        .map(Some)
        .collect();

    let mut counts = Counts::default();
    let mut table = vec![format!(
        "{:<22} {:<16} {:>8} {:>10} {:>11}",
        "model", "provider", "prompts", "identical", "acceptance"
    )];
    for ((p, results), eos) in planned.iter().zip(firsts).zip(eos_of) {
        let (case, label, n) = (p.case, &p.label, p.prompts);
        if let Some(resident) = case.resident_of(&cases) {
            let want = plain_of
                .get(&format!("{}{}", resident.label, p.setting.label))
                .context("the resident case runs first")?;
            let got = results.alone(PLAIN);
            let identical = identical_runs(label, PLAIN, "the resident model", want, got);
            let all = identical == got.len() && got.len() == n.min(case.prompts.len());
            counts.count(all);
            table.push(format!(
                "{label:<22} {:<16} {:>8} {:>9}{}",
                "plain=resident",
                got.len(),
                identical,
                if all { " " } else { "!" },
            ));
        }
        plain_of.insert(label.clone(), results.alone(PLAIN).to_vec());
        let mut passes = vec![(label.clone(), results)];
        if let Some(i) = eos {
            let eos_label = eos_labels[i].clone();
            let results = eos_results[i]
                .take()
                .context("each EOS run is checked once")?;
            let ended = results
                .alone(PLAIN)
                .iter()
                .filter(|r| r.finish == Finish::Eos)
                .count();
            eprintln!("lossless: {eos_label}: {ended} plain runs end on EOS");
            if ended == 0 {
                counts.failed += 1;
            }
            passes.push((eos_label, results));
        }
        for (label, results) in &passes {
            let plain = results.alone(PLAIN);
            if plain.is_empty() {
                anyhow::bail!("spec_run returned no plain runs")
            }
            for provider in case.speculative() {
                let runs = results.alone(provider);
                let identical = identical_runs(label, provider, "plain", plain, runs);
                let (drafted, accepted): (usize, usize) = runs
                    .iter()
                    .fold((0, 0), |(d, a), r| (d + r.drafted, a + r.accepted));
                let all = identical == plain.len() && runs.len() == plain.len();
                counts.count(all);
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
    println!("\n{}", table.join("\n"));
    println!(
        "lossless: {} of {} model x provider pairs identical on every prompt",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// One planned run: its setting, case, prompt count, label and request.
struct Planned<'a> {
    setting: &'a Setting,
    case: &'a suite::Case,
    prompts: usize,
    label: String,
    request: SpecRequest,
}

/// How many of `got`'s runs give `want`'s tokens (pairwise, as far as the
/// shorter goes); each that does not is printed, naming what it was
/// compared with.
fn identical_runs(
    label: &str,
    provider: &str,
    against: &str,
    want: &[Generation],
    got: &[Generation],
) -> usize {
    let differing = compare::token_runs(&tokens(want), &tokens(got));
    for d in &differing {
        eprintln!(
            "lossless: {label} / {provider}: prompt {} differs from {against} at token {}: {:?} vs {:?}",
            d.run, d.position, d.left, d.right
        );
    }
    want.len().min(got.len()) - differing.len().min(want.len().min(got.len()))
}
