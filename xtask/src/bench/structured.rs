//! `cargo xtask bench structured [--repeats N] [--max-tokens N]`: JSON-schema
//! extraction prompts written for it (`structured_cases::bench`, 21
//! schema-heavy ones) on SmolLM2-135M float32, greedy: unconstrained plain
//! (the reference), constrained plain, constrained with forced-token drafts,
//! and constrained with prompt lookup and with suffix decoding (forced
//! tokens after their drafts). Prints, per configuration, tokens/s (and its
//! ratio to the reference and to constrained plain), tokens per target
//! forward, the constraint's microseconds per emitted token apart
//! (llguidance's: masks, draft checks, forced tokens; ours: the masks
//! applied to the logits) and the share of emitted tokens that were forced
//! drafts. Each configuration's fastest repeat counts. Targets (issue 31):
//! constrained plain >= 0.95x unconstrained plain; forced-token drafts >=
//! 1.5x constrained plain. JSON is laid out as `json.dumps` writes it (the
//! engine's default: every separator and key forced);
//! `--flexible-whitespace` gives each schema llguidance's flexible layout
//! instead (its `x-guidance` option), where the model chooses whitespace.

use anyhow::{bail, Result};
use run_protocol::structured::{Grammar, RunReport, StructuredRequest};

use crate::structured_cases::{bench, config};
use crate::{real_model, runs, shell};

pub fn run(args: &[String]) -> Result<()> {
    let mut repeats = 2;
    let mut max_tokens = 96;
    let mut flexible = false;
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        let value = |v: Option<&String>| -> Result<usize> {
            match v.map(|s| s.parse::<usize>()) {
                Some(Ok(n)) if n > 0 => Ok(n),
                _ => bail!("{a} takes a positive number"),
            }
        };
        match a.as_str() {
            "--repeats" => repeats = value(rest.next())?,
            "--max-tokens" => max_tokens = value(rest.next())?,
            "--flexible-whitespace" => flexible = true,
            other => {
                bail!(
                    "unknown option {other} (known: --repeats N, --max-tokens N, --flexible-whitespace)"
                )
            }
        }
    }
    let model = real_model::ensure()?;
    shell::build()?;
    let work = shell::root().join("target").join("bench-structured");
    std::fs::create_dir_all(&work)?;
    let mut cases = bench();
    if flexible {
        for case in &mut cases {
            flexible_whitespace(&mut case.grammar)?;
        }
    }
    let request = StructuredRequest {
        model,
        cases,
        runs: vec![
            config("unconstrained", false, None, false, None),
            config("constrained", true, None, false, None),
            config("forced", true, None, true, None),
            config("prompt-lookup", true, Some("prompt-lookup"), true, None),
            config("suffix", true, Some("suffix"), true, None),
        ],
        max_tokens,
        repeats,
    };
    let cases = request.cases.len();
    let report = runs::example(&request, &work.join("run"), &[])?;
    let Some(reference) = report.runs.first() else {
        bail!("no runs reported");
    };
    let constrained = report.runs.get(1).unwrap_or(reference);
    println!(
        "bench structured: {cases} JSON-schema prompts{}, SmolLM2-135M float32, greedy, up to {max_tokens} tokens, best of {repeats}; CPU: {}",
        if flexible { " (flexible whitespace)" } else { "" },
        super::cpu_model()
    );
    println!(
        "{:<14} {:>7} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "config",
        "tokens",
        "tok/s",
        "x plain",
        "x constr",
        "tok/fwd",
        "llg us/t",
        "mask us/t",
        "forced"
    );
    for run in &report.runs {
        let t = totals(run);
        let per_token = |seconds: f64| seconds * 1e6 / t.tokens.max(1) as f64;
        println!(
            "{:<14} {:>7} {:>8.1} {:>8.2} {:>9.2} {:>9.2} {:>9.0} {:>9.0} {:>7.0}%",
            run.name,
            t.tokens,
            t.rate,
            t.rate / totals(reference).rate,
            t.rate / totals(constrained).rate,
            t.tokens as f64 / t.forwards.max(1) as f64,
            per_token(t.grammar_seconds),
            per_token(t.mask_apply_seconds),
            100.0 * t.forced as f64 / t.tokens.max(1) as f64,
        );
    }
    let same = report.runs[1..].iter().all(|r| {
        r.cases
            .iter()
            .zip(&constrained.cases)
            .all(|(a, b)| a.tokens == b.tokens)
    });
    println!(
        "constrained outputs identical across configurations: {}",
        if same { "yes" } else { "NO" }
    );
    if !same {
        bail!("a constrained configuration changed the output");
    }
    Ok(())
}

/// Gives a JSON schema llguidance's flexible layout (its `x-guidance`
/// option `whitespace_flexible`, which the engine's default leaves off):
/// the model then chooses the whitespace after `{`, `,` and `:`.
fn flexible_whitespace(grammar: &mut Grammar) -> Result<()> {
    if let Grammar::JsonSchema { schema } = grammar {
        let mut value: serde_json::Value = serde_json::from_str(schema)?;
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "x-guidance".to_owned(),
                serde_json::json!({ "whitespace_flexible": true }),
            );
        }
        *schema = value.to_string();
    }
    Ok(())
}

struct Totals {
    tokens: usize,
    forwards: usize,
    forced: usize,
    grammar_seconds: f64,
    mask_apply_seconds: f64,
    rate: f64,
}

fn totals(run: &RunReport) -> Totals {
    let tokens: usize = run.cases.iter().map(|c| c.tokens.len()).sum();
    Totals {
        tokens,
        forwards: run.cases.iter().map(|c| c.target_calls).sum(),
        forced: run.cases.iter().map(|c| c.forced_accepted).sum(),
        grammar_seconds: run.cases.iter().map(|c| c.grammar_seconds).sum(),
        mask_apply_seconds: run.cases.iter().map(|c| c.mask_apply_seconds).sum(),
        rate: tokens as f64 / run.seconds.max(1e-9),
    }
}
