//! `cargo xtask bench batch-forward`: one packed `Target::forward_batch`
//! over several requests' decoding rows against the same rows run one after
//! another (`Target::decode` each), on the real model: rows of 1 token
//! (plain decoding) and of 4 (a verify window), 1, 4 and 8 requests at
//! offsets near 100, median ms per step and the ratio.
//!
//! Options: `--model DIR` (default: SmolLM2-135M in float32), `--repeats N`
//! (steps per configuration, default 9).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{real_model, shell};

fn parse(args: &[String]) -> Result<(Option<PathBuf>, usize)> {
    let (mut model, mut repeats) = (None, 9);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => model = Some(PathBuf::from(value()?)),
            "--repeats" => repeats = value()?.parse().context("--repeats")?,
            other => bail!("unknown option {other} (known: --model, --repeats)"),
        }
    }
    if repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    Ok((model, repeats))
}

/// `(rows, window, packed ms, alone ms)` from a `step R x W: P ms packed,
/// A ms alone` line of `batch_time`.
fn step(line: &str) -> Option<(usize, usize, f64, f64)> {
    let rest = line.strip_prefix("step ")?;
    let (shape, times) = rest.split_once(": ")?;
    let (rows, window) = shape.split_once(" x ")?;
    let (packed, alone) = times.split_once(" ms packed, ")?;
    Some((
        rows.parse().ok()?,
        window.parse().ok()?,
        packed.parse().ok()?,
        alone.strip_suffix(" ms alone")?.parse().ok()?,
    ))
}

pub fn run(args: &[String]) -> Result<()> {
    let (model, repeats) = parse(args)?;
    let model = match model {
        Some(m) => m,
        None => real_model::ensure()?,
    };
    shell::run(shell::cargo().args([
        "build",
        "--release",
        "-q",
        "-p",
        "spec-models",
        "--example",
        "batch_time",
    ]))?;
    let exe = shell::root()
        .join("target")
        .join("release")
        .join("examples")
        .join("batch_time");
    let out = Command::new(exe)
        .arg("--model")
        .arg(&model)
        .args(["--rows", "1,4,8", "--windows", "1,4", "--offset", "100"])
        .args(["--repeats", &repeats.to_string()])
        .output()
        .context("starting batch_time")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "batch_time failed:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let steps: Vec<_> = text.lines().filter_map(step).collect();
    if steps.is_empty() {
        bail!("no step lines in batch_time's output:\n{text}");
    }
    println!(
        "\nbatched forward on {} (median of {repeats} steps, offsets 100+), CPU: {}",
        model.display(),
        super::cpu_model()
    );
    println!(
        "{:>5} {:>15} {:>10} {:>14} {:>7}",
        "rows", "tokens per row", "packed ms", "one by one ms", "ratio"
    );
    for (rows, window, packed, alone) in steps {
        println!(
            "{rows:>5} {window:>15} {packed:>10.2} {alone:>14.2} {:>6.2}x",
            alone / packed
        );
    }
    println!("ratio: one by one / packed (above 1: the packed forward is faster)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::step;

    #[test]
    fn reads_step_lines() {
        assert_eq!(
            step("step 4 x 1: 12.500 ms packed, 40.250 ms alone"),
            Some((4, 1, 12.5, 40.25))
        );
        assert_eq!(step("window 4: 1 ms"), None);
    }
}
