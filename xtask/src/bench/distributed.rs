//! `cargo xtask bench distributed [--max-tokens N]`: the synthetic GLM (with
//! its MTP row; plainly, with prompt lookup and with `glm52-native-mtp`) and
//! SmolLM2-135M f32 (plainly, with prompt lookup and with its 4-bit drafter)
//! in one process and as pipelines of 1, 2 and 3 local ranks (ring on
//! loopback, one BLAS thread per rank): generation tokens per second,
//! pipeline passes per emitted token, bytes over all links per emitted
//! token, and whether the tokens equal the single process's.

use anyhow::{bail, Context, Result};

use crate::gate::distributed::{build, cases, generate, generate_args, Case};
use crate::{shell, venv};

pub fn run(args: &[String]) -> Result<()> {
    let max_tokens = match args {
        [] => 64,
        [flag, n] if flag == "--max-tokens" => n.parse().context("--max-tokens N")?,
        _ => bail!("usage: cargo xtask bench distributed [--max-tokens N]"),
    };
    let python = venv::ensure()?;
    let all = cases(
        &python,
        &shell::root().join("target").join("bench-distributed"),
    )?;
    build()?;
    println!(
        "CPU: {} ({} tokens, one BLAS thread per rank)",
        super::cpu_model(),
        max_tokens
    );
    println!(
        "{:<18} {:<18} {:>16} {:>9} {:>13} {:>17} {:>9}",
        "model", "provider", "ranks", "tokens/s", "passes/token", "link bytes/token", "identical"
    );
    for case in &all {
        for (id, extra) in &case.providers {
            bench(case, id, extra, max_tokens)?;
        }
    }
    Ok(())
}

fn bench(case: &Case, id: &str, extra: &[String], max_tokens: usize) -> Result<()> {
    let label = case.label;
    let args = generate_args(case, id, extra, max_tokens);
    let single = generate(1, false, &args)?;
    println!(
        "{label:<18} {id:<18} {:>16} {:>9.1} {:>13} {:>17} {:>9}",
        "one process", single.tokens_per_second, "-", "-", "-"
    );
    for ranks in [1, 2, 3] {
        let run = generate(ranks, true, &args)?;
        let (passes, bytes) = run.pipeline.unwrap_or((0, 0));
        let per = |x: u64| x as f64 / run.emitted.max(1) as f64;
        println!(
            "{label:<18} {id:<18} {:>16} {:>9.1} {:>13.3} {:>17.0} {:>9}",
            format!("{ranks}-rank pipeline"),
            run.tokens_per_second,
            per(passes),
            per(bytes),
            if run.tokens == single.tokens {
                "yes"
            } else {
                "NO"
            }
        );
    }
    Ok(())
}
