//! `--pipeline` (under `mlx-spec launch`), the distributed setting of
//! `generate` and `serve`: join the group, load this rank's slice of the
//! model, and either become the head target (rank 0, which talks to the
//! user or the network clients) or run the follower loop until the head
//! ends.

use std::path::Path;

use anyhow::{bail, Context, Result};
use mlx_rs::{Array, Dtype};
use spec_core::{BatchRow, CacheSet, SpecError, Target};
use spec_models::pipeline::{load_stage, PipelineSlice, Stage};
use spec_models::{DtypePolicy, ModelError};
use spec_pipeline::{authenticate, run_follower, PipelineSecret, PipelineTarget};

use crate::cmd_launch::join_options;
use crate::load_args::LoadArgs;

/// The distributed setting, one parser for every command that takes it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PipelineArgs {
    /// Run the model as a pipeline over the ranks of `mlx-spec launch`:
    /// each rank holds a slice of the layers; rank 0 (the last layers, the
    /// head and the drafters) talks to the user or the clients, the others
    /// serve it until it ends.
    #[arg(long)]
    pub pipeline: bool,
    /// Fault injection for the tests: `RANK:N` makes that rank exit with
    /// status 3 when its stage is asked for forward N + 1.
    #[arg(long, hide = true, value_name = "RANK:N", requires = "pipeline")]
    pub pipeline_fault: Option<String>,
}

/// This process's rank as `mlx-spec launch` sets it (`MLX_RANK`, checked
/// against the ring hostfile), known before joining: only rank 0 may take
/// the user's input or bind a socket.
pub fn rank_from_env() -> Result<usize> {
    let (_, rank, _) = mlx_distributed::Hostfile::from_env().context(
        "--pipeline runs under `mlx-spec launch` (or with its MLX_HOSTFILE and MLX_RANK)",
    )?;
    Ok(rank)
}

/// Runs this rank (not rank 0) of a pipeline until the head shuts it down.
pub fn follow(path: &Path, dtype: DtypePolicy, args: &PipelineArgs, load: &LoadArgs) -> Result<()> {
    match start(path, dtype, args, load)? {
        None => Ok(()),
        Some(_) => bail!("this process is rank 0 of the pipeline, not a follower"),
    }
}

/// Joins the group and loads this rank's layers of `path` (its routed
/// experts streamed through a tier of its own where `experts` says).
/// Rank 0 gets its head target; every other rank serves the head here and
/// returns `None` when the head shuts the pipeline down.
pub fn start(
    path: &Path,
    dtype: DtypePolicy,
    args: &PipelineArgs,
    load: &LoadArgs,
) -> Result<Option<PipelineTarget>> {
    let fault = args
        .pipeline_fault
        .as_deref()
        .map(parse_fault)
        .transpose()?;
    // MLX's ring refuses a ring of one: a pipeline of one rank is this
    // process alone, with the whole model.
    let alone = mlx_distributed::Hostfile::from_env().is_ok_and(|(h, _, _)| h.ranks.len() == 1);
    let group = if alone {
        None
    } else {
        // The secret is read before joining: a rank without it fails at
        // once, naming how to start it, rather than after its peers wait.
        let secret = PipelineSecret::from_env()?;
        let group = mlx_distributed::init(&join_options()).context("joining the pipeline")?;
        crate::cmd_launch::joined();
        // Before any weight is loaded or any pipeline message is read.
        authenticate(&group, &secret)?;
        Some(group)
    };
    let (rank, size) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()));
    let slice = PipelineSlice::new(rank, size)?;
    let options = load.options(dtype, None)?;
    let stage = load_stage(path, &options, slice)
        .with_context(|| format!("rank {rank}: loading {}", path.display()))?;
    let stage: Box<dyn Stage> = match fault {
        Some((r, after)) if r == rank => Box::new(Faulty {
            inner: stage,
            left: std::sync::atomic::AtomicU64::new(after),
        }),
        _ => stage,
    };
    let layers = stage.layer_range();
    crate::cmd_launch::eprint_whole(format_args!(
        "rank {rank} of {size}: layers {}..{} of {}, weights {} bytes",
        layers.start,
        layers.end,
        stage.target().info().num_layers,
        stage.target().weights_bytes()
    ));
    let Some(group) = group else {
        return Ok(Some(PipelineTarget::alone(stage)?));
    };
    if rank == 0 {
        return Ok(Some(PipelineTarget::new(stage, group)?));
    }
    let report = run_follower(stage.as_ref(), &group)?;
    tracing::info!(
        rank,
        forwards = report.forwards,
        tokens = report.tokens,
        bytes = report.bytes_sent,
        "pipeline follower done"
    );
    Ok(None)
}

/// The head's line after a generation: passes per emitted token and the
/// bytes the links carried.
pub fn report(head: &PipelineTarget, emitted: usize) -> String {
    let s = head.stats();
    let per = |x: u64| x as f64 / emitted.max(1) as f64;
    format!(
        "Pipeline: {} ranks, {} passes ({:.3} per emitted token), {} link bytes ({:.0} per emitted token)",
        head.ranks(),
        s.passes,
        per(s.passes),
        s.link_bytes,
        per(s.link_bytes)
    )
}

fn parse_fault(s: &str) -> Result<(usize, u64)> {
    let parsed = s
        .split_once(':')
        .and_then(|(r, n)| Some((r.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some(p) => Ok(p),
        None => bail!("--pipeline-fault `{s}`: expected RANK:N"),
    }
}

/// A stage whose process exits (status 3) at a given forward: the tests'
/// rank that dies mid-generation.
#[derive(Debug)]
struct Faulty {
    inner: Box<dyn Stage>,
    left: std::sync::atomic::AtomicU64,
}

impl Stage for Faulty {
    fn slice(&self) -> PipelineSlice {
        self.inner.slice()
    }
    fn layer_range(&self) -> std::ops::Range<usize> {
        self.inner.layer_range()
    }
    fn rank_layers(&self, rank: usize) -> Result<std::ops::Range<usize>, ModelError> {
        self.inner.rank_layers(rank)
    }
    fn stage_caches(&self) -> CacheSet {
        self.inner.stage_caches()
    }
    fn hidden_dtype(&self) -> Result<Dtype, SpecError> {
        self.inner.hidden_dtype()
    }
    fn run_stage(
        &self,
        input: Option<&Array>,
        rows: &mut [BatchRow<'_>],
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        use std::sync::atomic::Ordering;
        if self.left.fetch_sub(1, Ordering::Relaxed) == 0 {
            eprintln!("rank {}: exiting (--pipeline-fault)", self.slice().rank());
            std::process::exit(3);
        }
        self.inner.run_stage(input, rows, taps)
    }
    fn finish(&self, h: &Array) -> Result<Array, SpecError> {
        self.inner.finish(h)
    }
    fn target(&self) -> &(dyn Target + Send) {
        self.inner.target()
    }
}
