//! `cargo xtask bench <name>`: benchmarks printing ratios against a
//! reference run made in the same invocation.

mod agent;
mod agentic;
mod agentic_workload;
mod assistant;
mod batch_forward;
mod chat;
mod decode;
mod dflash;
mod distributed;
mod dspark;
mod eagle3;
mod experts;
mod fitted;
mod gguf_load;
mod hybrid;
mod serve;
pub(crate) mod serve_http;
mod serve_plot;
mod shared_prefill;
mod spec;
mod structured;

use anyhow::{bail, Result};

use crate::{prereqs, shell};

pub fn run(args: &[String]) -> Result<()> {
    let (name, rest) = match args.split_first() {
        Some((name, rest)) => (name.as_str(), rest),
        None => bail!(
            "usage: cargo xtask bench <blas|decode|spec|agent|agentic|chat|dspark|dflash|eagle3|experts|gguf-load|assistant|batch-forward|distributed|serve|shared-prefill|structured> [options]"
        ),
    };
    // Benchmarks time our own code too: the release build.
    shell::use_release();
    prereqs::ensure()?;
    match name {
        // The BLAS itself: our GEMM front forwards every product to it
        // (`bench decode` compares the front with OpenBLAS).
        "blas" => shell::run(
            shell::cargo()
                .args([
                    "run",
                    "--release",
                    "--quiet",
                    "-p",
                    "mlx-ext",
                    "--example",
                    "bench_blas",
                    "--",
                ])
                .args(rest)
                .env("MLX_SPEC_GEMM", "blas"),
        ),
        "decode" => decode::run(rest),
        "hybrid" => hybrid::run(rest),
        "spec" => spec::run(rest),
        "agent" => agent::run(rest),
        "agentic" => agentic::run(rest),
        "chat" => chat::run(rest),
        "dspark" => dspark::run(rest),
        "dflash" => dflash::run(rest),
        "eagle3" => eagle3::run(rest),
        "experts" => experts::run(rest),
        "gguf-load" => gguf_load::run(rest),
        "assistant" => assistant::run(rest),
        "batch-forward" => batch_forward::run(rest),
        "distributed" => distributed::run(rest),
        "serve" => serve::run(rest),
        "shared-prefill" => shared_prefill::run(rest),
        "structured" => structured::run(rest),
        other => {
            bail!("unknown benchmark `{other}` (known: blas, decode, hybrid, spec, agent, agentic, chat, dspark, dflash, eagle3, experts, gguf-load, assistant, batch-forward, distributed, serve, shared-prefill, structured)")
        }
    }
}

/// The CPU, as `/proc/cpuinfo` names it (kernels and timings differ by CPU).
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}
