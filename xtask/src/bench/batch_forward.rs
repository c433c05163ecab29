//! `cargo xtask bench batch-forward`: one packed `Target::forward_batch`
//! over several requests' decoding rows against the same rows run one after
//! another (`Target::decode` each), on the real model: rows of 1 token
//! (plain decoding), of 4 (a verify window) and of mixed lengths (1 to 17:
//! prompt lookup's verify windows, `batch_time`'s `mixed`), 1, 4 and 8 requests at
//! offsets near 100, median ms per step and the ratio, then the fastest
//! step of each (on a shared machine, the cost without the neighbours' load).
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

/// One configuration's times (ms): median and fastest step, packed and one
/// by one.
#[derive(Debug, PartialEq)]
struct Step {
    rows: usize,
    window: String,
    packed: f64,
    alone: f64,
    packed_min: f64,
    alone_min: f64,
}

/// A `step R x W: P ms packed, A ms alone, best PM / AM ms` line of
/// `batch_time`.
fn step(line: &str) -> Option<Step> {
    let rest = line.strip_prefix("step ")?;
    let (shape, times) = rest.split_once(": ")?;
    let (rows, window) = shape.split_once(" x ")?;
    let (packed, rest) = times.split_once(" ms packed, ")?;
    let (alone, best) = rest.split_once(" ms alone, best ")?;
    let (packed_min, alone_min) = best.strip_suffix(" ms")?.split_once(" / ")?;
    Some(Step {
        rows: rows.parse().ok()?,
        window: window.to_owned(),
        packed: packed.parse().ok()?,
        alone: alone.parse().ok()?,
        packed_min: packed_min.parse().ok()?,
        alone_min: alone_min.parse().ok()?,
    })
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
        .args([
            "--rows",
            "1,4,8",
            "--windows",
            "1,4,mixed",
            "--offset",
            "100",
        ])
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
        "{:>5} {:>15} {:>10} {:>14} {:>7} {:>12} {:>12} {:>7}",
        "rows",
        "tokens per row",
        "packed ms",
        "one by one ms",
        "ratio",
        "best packed",
        "best 1-by-1",
        "ratio"
    );
    for s in steps {
        println!(
            "{:>5} {:>15} {:>10.2} {:>14.2} {:>6.2}x {:>12.2} {:>12.2} {:>6.2}x",
            s.rows,
            s.window,
            s.packed,
            s.alone,
            s.alone / s.packed,
            s.packed_min,
            s.alone_min,
            s.alone_min / s.packed_min
        );
    }
    println!("ratio: one by one / packed (above 1: the packed forward is faster)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{step, Step};

    #[test]
    fn reads_step_lines() {
        assert_eq!(
            step("step 4 x 1: 12.500 ms packed, 40.250 ms alone, best 10.000 / 30.500 ms"),
            Some(Step {
                rows: 4,
                window: "1".into(),
                packed: 12.5,
                alone: 40.25,
                packed_min: 10.0,
                alone_min: 30.5
            })
        );
        assert_eq!(step("window 4: 1 ms"), None);
    }
}
