//! `mlx-spec`: the command-line host of the engine.

mod answer_printer;
mod cmd_benchmark;
mod cmd_cache_prompt;
mod cmd_chat;
mod cmd_convert;
mod cmd_fuse;
mod cmd_generate;
mod cmd_launch;
mod cmd_perplexity;
mod cmd_quantize;
mod constraint_args;
mod draft_args;
mod grammar;
mod json_arg;
mod load_args;
mod local_engine;
mod memory_plan;
mod model_source;
mod perplexity_data;
mod pipeline_rank;
mod prefill_args;
mod prompt_cache_dir;
mod providers;
mod random;
mod sampling_args;
mod server;
mod signals;

/// A subcommand's flags parsed alone, for their unit tests.
#[cfg(test)]
fn parse_flags<A: clap::Args>(args: &[&str]) -> A {
    #[derive(clap::Parser)]
    struct Cli<A: clap::Args> {
        #[command(flatten)]
        flags: A,
    }
    <Cli<A> as clap::Parser>::try_parse_from(
        std::iter::once("mlx-spec").chain(args.iter().copied()),
    )
    .expect("parse")
    .flags
}

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mlx-spec", version, about = "Speculative decoding on MLX")]
struct Cli {
    /// What to log on standard error, as mlx-lm's `--log-level` (any case):
    /// debug, info, warning, error or critical. Default: `MLX_SPEC_LOG`
    /// (a `tracing` filter), else warning.
    #[arg(long, global = true, value_parser = parse_log_level)]
    log_level: Option<&'static str>,
    #[command(subcommand)]
    command: Command,
}

/// mlx-lm's (Python's) level names as `tracing` levels.
fn parse_log_level(name: &str) -> Result<&'static str, String> {
    match name.to_ascii_lowercase().as_str() {
        "debug" => Ok("debug"),
        "info" => Ok("info"),
        "warning" | "warn" => Ok("warn"),
        "error" | "critical" => Ok("error"),
        _ => Err(format!(
            "`{name}` is no log level (debug, info, warning, error, critical)"
        )),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Generate(cmd_generate::Args),
    /// Chat at the terminal (as `mlx_lm.chat`): each turn's answer
    /// speculated, the conversation's caches kept between turns.
    Chat(cmd_chat::Args),
    /// Time prompt processing and generation (as `mlx_lm.benchmark`), with
    /// `--draft` against plain decoding.
    Benchmark(cmd_benchmark::Args),
    /// A model's perplexity on a local dataset (as `mlx_lm.perplexity`).
    Perplexity(cmd_perplexity::Args),
    /// Prefill a prompt and save its caches in mlx-lm's prompt-cache format.
    CachePrompt(cmd_cache_prompt::Args),
    /// Convert a GGUF file into an mlx-lm / Hugging Face model directory.
    Convert(cmd_convert::Args),
    /// Quantize a model directory in mlx-lm's format (as `mlx_lm.convert -q`).
    Quantize(cmd_quantize::Args),
    /// Fuse a fine-tuned adapter into its base model (as `mlx_lm.fuse`).
    Fuse(cmd_fuse::Args),
    /// Quantize a DSpark drafter (confidence head kept full precision), then reload it.
    QuantizeDrafter(cmd_quantize::DrafterArgs),
    /// List the draft providers this program links, with their descriptions.
    Providers,
    /// Serve an OpenAI-compatible API with per-request speculation.
    Serve(server::Args),
    /// Start the ranks of a distributed job (as `mlx.launch`).
    Launch(cmd_launch::Args),
    /// Check a distributed group (run it under `launch`): rank 0 reports.
    DistributedCheck(cmd_launch::CheckArgs),
}

fn main() {
    let cli = Cli::parse();
    let filter = match cli.log_level {
        Some(level) => level.into(),
        None => tracing_subscriber::EnvFilter::try_from_env("MLX_SPEC_LOG")
            .unwrap_or_else(|_| "warn".into()),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result: Result<()> = match cli.command {
        Command::Generate(args) => cmd_generate::run(args),
        Command::Chat(args) => cmd_chat::run(args),
        Command::Benchmark(args) => cmd_benchmark::run(args),
        Command::Perplexity(args) => cmd_perplexity::run(args),
        Command::CachePrompt(args) => cmd_cache_prompt::run(args),
        Command::Convert(args) => cmd_convert::run(args),
        Command::Quantize(args) => cmd_quantize::run(args),
        Command::QuantizeDrafter(args) => cmd_quantize::run_drafter(args),
        Command::Fuse(args) => cmd_fuse::run(args),
        Command::Serve(args) => server::run(args),
        Command::Launch(args) => cmd_launch::run(args),
        Command::DistributedCheck(args) => cmd_launch::check(args),
        Command::Providers => {
            providers::print();
            Ok(())
        }
    };
    if let Err(err) = result {
        eprintln!("error: {}", spec_core::error::report(err.as_ref()));
        std::process::exit(1);
    }
}
