//! `cargo xtask gate structured`: constrained decoding on the real model
//! (SmolLM2-135M float32, `real_model.rs`), for the cases of
//! `structured_cases::gate` (JSON schemas, any JSON object, a Lark grammar,
//! a regex):
//! - our constrained greedy output equals mlx-lm 0.32.2's `generate_step`
//!   driven with the `llguidance` Python package as its logits processor
//!   (`xtask/python/oracle_structured.py`), on the same files, compiling
//!   the grammars our engine compiled (`StructuredReport::compiled`: JSON
//!   with spec-grammar's default layout, one source for it);
//! - constrained output is the same with forced-token drafts and with
//!   each provider that runs on it (prompt lookup, suffix decoding, and a
//!   draft model: the target itself, whose unconstrained drafts the
//!   constraint cuts), greedy and sampled with a seed;
//! - every answer that ended (not by length) satisfies its constraint: JSON
//!   parses and validates against its schema (`jsonschema`), a regex
//!   matches in full, the Lark grammar accepts.
//!
//! Our side is the `mlx-spec` example `structured_run`.

use anyhow::{Context, Result};
use run_protocol::structured::{
    OracleCase, OracleCases, OracleReport, RunConfig, StructuredReport, StructuredRequest,
};

use super::Counts;
use crate::structured_cases::{config, gate};
use crate::{real_model, runs, shell, venv};

const ORACLE: &str = "xtask/python/oracle_structured.py";
const MAX_TOKENS: usize = 40;
const SEED: u64 = 7;

/// The configurations: the greedy reference first, the sampled one after
/// the greedy ones.
fn configs(model: &std::path::Path) -> Vec<RunConfig> {
    let mut draft_model = config("draft-model", true, Some("draft-model"), true, None);
    draft_model
        .options
        .insert("model".to_owned(), model.display().to_string());
    vec![
        config("plain", true, None, false, None),
        config("forced", true, None, true, None),
        config("prompt-lookup", true, Some("prompt-lookup"), true, None),
        config("suffix", true, Some("suffix"), true, None),
        draft_model,
        config("sampled", true, None, false, Some(SEED)),
        config("sampled-forced", true, None, true, Some(SEED)),
        config(
            "sampled-prompt-lookup",
            true,
            Some("prompt-lookup"),
            true,
            Some(SEED),
        ),
    ]
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let model = real_model::ensure()?;
    shell::build().context("our runner (mlx-spec example structured_run)")?;
    let work = shell::root().join("target").join("gate-structured");
    std::fs::create_dir_all(&work)?;
    let cases = gate();
    let request = StructuredRequest {
        model: model.clone(),
        cases: cases.clone(),
        runs: configs(&model),
        max_tokens: MAX_TOKENS,
        repeats: 1,
    };
    let ours: StructuredReport = runs::example(&request, &work.join("ours"), &[])?;
    let plain = &ours.runs[0];
    let sampled = ours
        .runs
        .iter()
        .find(|r| r.name == "sampled")
        .context("no sampled run")?;
    let oracle_in = OracleCases {
        model: model.clone(),
        max_tokens: MAX_TOKENS,
        // The grammars as our engine compiled them (JSON with its default
        // layout), so the oracle builds the same ones.
        cases: cases
            .iter()
            .zip(&ours.prompts)
            .zip(&ours.compiled)
            .map(|((c, prompt), grammar)| OracleCase {
                name: c.name.clone(),
                prompt: prompt.clone(),
                grammar: grammar.clone(),
            })
            .collect(),
        check: plain
            .cases
            .iter()
            .enumerate()
            .filter(|(_, c)| c.finish == "eos")
            .map(|(i, c)| (i, c.text.clone()))
            .collect(),
    };
    let cases_file = work.join("oracle-cases.json");
    let oracle_file = work.join("oracle.json");
    std::fs::write(&cases_file, serde_json::to_string_pretty(&oracle_in)?)?;
    shell::run(
        std::process::Command::new(&python)
            .arg(shell::root().join(ORACLE))
            .arg(&cases_file)
            .arg(&oracle_file)
            .current_dir(shell::root().join("xtask").join("python")),
    )
    .context("the structured oracle (mlx-lm with llguidance)")?;
    let oracle: OracleReport = serde_json::from_str(&std::fs::read_to_string(&oracle_file)?)
        .with_context(|| format!("reading {}", oracle_file.display()))?;

    let mut counts = Counts::default();
    let mut checked = oracle.checked.iter();
    for (i, case) in cases.iter().enumerate() {
        let mut problems = Vec::new();
        let ours_plain = &plain.cases[i];
        if oracle.tokens.get(i) != Some(&ours_plain.tokens) {
            problems.push(format!(
                "plain tokens differ from mlx-lm + llguidance:\n  ours   {:?}\n  oracle {:?}",
                ours_plain.tokens,
                oracle.tokens.get(i)
            ));
        }
        let oracle_ended = oracle.tokens.get(i).is_some_and(|t| t.len() < MAX_TOKENS);
        if let (true, Some(Some(why))) = (oracle_ended, oracle.invalid.get(i)) {
            problems.push(format!("the oracle's own answer is invalid: {why}"));
        }
        if ours_plain.finish == "eos" {
            if let Some(Some(why)) = checked.next() {
                problems.push(format!(
                    "our answer {:?} is invalid: {why}",
                    ours_plain.text
                ));
            }
        }
        for run in ours
            .runs
            .iter()
            .filter(|r| r.name != "plain" && r.name != "sampled")
        {
            let reference = if run.name.starts_with("sampled") {
                sampled
            } else {
                plain
            };
            if run.cases[i].tokens != reference.cases[i].tokens {
                problems.push(format!(
                    "{} differs from {}: {:?} vs {:?}",
                    run.name, reference.name, run.cases[i].tokens, reference.cases[i].tokens
                ));
            }
        }
        let forced = &ours.runs[1].cases[i];
        eprintln!(
            "structured: {:<8} {:>2} tokens ({}), {} forced drafts ({} accepted), {} forwards plain, {} forced; {:?}",
            case.name,
            ours_plain.tokens.len(),
            ours_plain.finish,
            forced.forced_drafted,
            forced.forced_accepted,
            ours_plain.target_calls,
            forced.target_calls,
            ours_plain.text
        );
        if problems.is_empty() {
            counts.passed += 1;
        } else {
            eprintln!(
                "structured: {} FAILED:\n  {}",
                case.name,
                problems.join("\n  ")
            );
            counts.failed += 1;
        }
    }
    println!(
        "structured: {} of {} cases pass",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}
