//! `cargo xtask bench blas`: float32 matmul GFLOP/s on the BLAS this build
//! wired (OpenBLAS) and, in the same run, on the MLX wheel's bundled
//! reference BLAS (a child process with `LD_LIBRARY_PATH` pointing at the
//! wheel's own `libmlx`), printed side by side as a ratio. `cargo xtask bench
//! blas` runs it with `MLX_SPEC_GEMM=blas`, so the wired column is the BLAS
//! and not our GEMM front (which the runtime line names).
//!
//! Flags: `--sizes 512,1024,2048`, `--min-seconds S` (time per size),
//! `--no-reference` (skip the reference run), `--child` (internal).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_rs::Array;

struct Args {
    sizes: Vec<i32>,
    min_seconds: f64,
    reference: bool,
    child: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        sizes: vec![512, 1024, 2048],
        min_seconds: 1.0,
        reference: true,
        child: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--sizes" => {
                let list = it.next().context("--sizes needs a list such as 512,1024")?;
                args.sizes = list
                    .split(',')
                    .map(|s| s.trim().parse::<i32>())
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("--sizes {list}: expected integers"))?;
            }
            "--min-seconds" => {
                let v = it.next().context("--min-seconds needs a value")?;
                args.min_seconds = v.parse().with_context(|| format!("--min-seconds {v}"))?;
            }
            "--no-reference" => args.reference = false,
            "--child" => args.child = true,
            other => {
                bail!("unknown argument `{other}` (known: --sizes, --min-seconds, --no-reference)")
            }
        }
    }
    Ok(args)
}

/// GFLOP/s of an n x n float32 matmul: one warm-up, then repeats until
/// `min_seconds` have passed (at least one timed run).
fn gflops(n: i32, min_seconds: f64) -> Result<f64> {
    let a = mlx_rs::random::normal::<f32>(&[n, n], None, None, None)?;
    let b = mlx_rs::random::normal::<f32>(&[n, n], None, None, None)?;
    a.eval()?;
    b.eval()?;
    a.matmul(&b)?.eval()?;
    let mut runs = 0u32;
    let start = Instant::now();
    while runs == 0 || start.elapsed() < Duration::from_secs_f64(min_seconds) {
        let c: Array = a.matmul(&b)?;
        c.eval()?;
        runs += 1;
    }
    let secs = start.elapsed().as_secs_f64() / f64::from(runs);
    Ok(2.0 * f64::from(n).powi(3) / secs / 1e9)
}

fn blas_name() -> String {
    match mlx_ext::runtime::info().blas {
        mlx_ext::runtime::Blas::OpenBlas(config) => format!("OpenBLAS ({config})"),
        mlx_ext::runtime::Blas::Other => "reference BLAS (MLX wheel)".to_owned(),
    }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let sizes = args
        .sizes
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if args.child {
        println!("blas {}", blas_name());
        for &n in &args.sizes {
            println!("size {n} {}", gflops(n, args.min_seconds)?);
        }
        return Ok(());
    }

    println!("{}", mlx_ext::runtime::info());
    let wired: Vec<(i32, f64)> = args
        .sizes
        .iter()
        .map(|&n| Ok((n, gflops(n, args.min_seconds)?)))
        .collect::<Result<_>>()?;
    let wired_name = blas_name();

    let reference_dir = mlx_sys::build_info::REFERENCE_LIB_DIR;
    let reference = if !args.reference {
        None
    } else if reference_dir.is_empty() {
        println!("(no reference run: this build does not use the MLX wheel with OpenBLAS)");
        None
    } else {
        let exe = std::env::current_exe().context("locating this benchmark")?;
        let out = Command::new(exe)
            .args([
                "--child",
                "--sizes",
                &sizes,
                "--min-seconds",
                &args.min_seconds.to_string(),
            ])
            .env("LD_LIBRARY_PATH", reference_dir)
            .output()
            .context("running the reference-BLAS child")?;
        if !out.status.success() {
            bail!(
                "reference run failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("blas "))
            .unwrap_or("?")
            .to_owned();
        if name.starts_with("OpenBLAS") {
            bail!("the reference run still loaded OpenBLAS; LD_LIBRARY_PATH={reference_dir} was not honoured");
        }
        let rows: Vec<(i32, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("size "))
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
            })
            .collect();
        Some((name, rows))
    };

    println!("\nf32 matmul, n x n @ n x n (GFLOP/s)");
    println!("  wired:     {wired_name}");
    if let Some((name, _)) = &reference {
        println!("  reference: {name}");
    }
    println!(
        "{:>6} {:>12} {:>12} {:>8}",
        "n", "wired", "reference", "ratio"
    );
    for (n, g) in &wired {
        let r = reference
            .as_ref()
            .and_then(|(_, rows)| rows.iter().find(|(m, _)| m == n).map(|(_, r)| *r));
        match r {
            Some(r) => println!("{n:>6} {g:>12.2} {r:>12.2} {:>7.1}x", g / r),
            None => println!("{n:>6} {g:>12.2} {:>12} {:>8}", "-", "-"),
        }
    }
    Ok(())
}
