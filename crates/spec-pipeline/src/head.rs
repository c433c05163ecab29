//! Rank 0's view of a pipeline as a [`Target`]: it holds the last layers,
//! the final norm and the head (and any drafter), tells the other ranks
//! what to run, receives the hidden states of the layers before its own and
//! finishes the forward.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use mlx_distributed::Group;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{
    BatchOutput, BatchRow, CacheSet, LayerCache, RowForm, SpecError, Target, TargetInfo,
    TargetOutput,
};
use spec_models::pipeline::Stage;
use spec_runtime::layers::concat_taps;

use crate::link::{recv, send_command};
use crate::protocol::{taps_below, Command, RowCommand};
use crate::remote::{RemoteSet, Sets};
use crate::{PipelineError, PipelineHealth};

/// Traffic of a pipeline so far, counted on rank 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Forwards through the whole pipeline (one per target forward).
    pub passes: u64,
    /// Tokens run through it.
    pub tokens: u64,
    /// Bytes sent over all links together: each command once per link
    /// (relayed down the ranks) and each rank's hidden states once.
    pub link_bytes: u64,
}

/// Rank 0 of a pipeline, as a target.
#[derive(Debug)]
pub struct PipelineTarget {
    stage: Box<dyn Stage>,
    /// The other ranks (`None`: a pipeline of this process alone).
    group: Option<Group>,
    hidden: i32,
    dtype: Dtype,
    sets: Sets,
    stats: Mutex<PipelineStats>,
    shut: AtomicBool,
    health: PipelineHealth,
}

impl PipelineTarget {
    /// Rank 0's `stage` over `group` (the other ranks run
    /// [`run_follower`](crate::run_follower) with theirs).
    pub fn new(stage: Box<dyn Stage>, group: Group) -> Result<Self, PipelineError> {
        let slice = stage.slice();
        if group.rank() != 0 || slice.rank() != 0 || slice.size() != group.size() {
            return Err(PipelineError::Setup(format!(
                "the head is rank 0 of {} with the slice of rank 0; this is rank {} of {} with the slice of rank {} of {}",
                group.size(),
                group.rank(),
                group.size(),
                slice.rank(),
                slice.size()
            )));
        }
        Self::build(stage, Some(group))
    }

    /// A pipeline of one rank: `stage` holds every layer (MLX's ring
    /// refuses a ring of one, so no group is joined).
    pub fn alone(stage: Box<dyn Stage>) -> Result<Self, PipelineError> {
        let slice = stage.slice();
        if slice.size() != 1 {
            return Err(PipelineError::Setup(format!(
                "a pipeline of one rank needs the whole model, not the slice of rank {} of {}",
                slice.rank(),
                slice.size()
            )));
        }
        Self::build(stage, None)
    }

    fn build(stage: Box<dyn Stage>, group: Option<Group>) -> Result<Self, PipelineError> {
        let hidden = i32::try_from(stage.target().info().hidden_size)
            .map_err(|_| PipelineError::Setup("hidden size does not fit int32".into()))?;
        let dtype = stage
            .hidden_dtype()
            .map_err(|source| PipelineError::Stage { rank: 0, source })?;
        Ok(Self {
            stage,
            group,
            hidden,
            dtype,
            sets: Sets::default(),
            stats: Mutex::new(PipelineStats::default()),
            shut: AtomicBool::new(false),
            health: PipelineHealth::default(),
        })
    }

    /// Ranks in the pipeline.
    pub fn ranks(&self) -> usize {
        self.group.as_ref().map_or(1, Group::size)
    }

    /// The traffic so far.
    pub fn stats(&self) -> PipelineStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Whether the pipeline still runs, as a handle for another thread (a
    /// server stops when it breaks).
    pub fn health(&self) -> PipelineHealth {
        self.health.clone()
    }

    /// Tells the other ranks to exit (they free their caches and return);
    /// once: dropping the target afterwards sends nothing more. Dropping a
    /// target that was not shut down sends it then (errors logged). A
    /// broken pipeline sends nothing: its ranks see their lost neighbours.
    pub fn shutdown(&self) -> Result<(), PipelineError> {
        let Some(group) = &self.group else {
            return Ok(());
        };
        if self.health.broken().is_some() {
            return Ok(());
        }
        if group.size() > 1 && !self.shut.swap(true, Ordering::Relaxed) {
            let (header, body) = Command::Shutdown.encode()?;
            send_command(group, &header, &body, 1)?;
        }
        Ok(())
    }

    /// One pass over the pipeline.
    fn step(&self, rows: &mut [BatchRow<'_>], taps: &[usize]) -> Result<BatchOutput, SpecError> {
        if let Some(first) = self.health.broken() {
            return Err(PipelineError::Broken(first).into());
        }
        let layers = self.stage.target().info().num_layers;
        if let Some(&index) = taps.iter().find(|&&t| t >= layers) {
            return Err(spec_core::InputError::TapOutOfRange { index, layers }.into());
        }
        if rows.is_empty() {
            return Err(spec_core::InputError::EmptyBatch.into());
        }
        // Each row's own caches, without the handle on the remote ones.
        let mut locals = Vec::with_capacity(rows.len());
        let mut handles = Vec::with_capacity(rows.len());
        for row in rows.iter_mut() {
            let mut layers = std::mem::take(row.caches).into_layers();
            let is_handle = layers
                .last()
                .and_then(|c| c.as_any())
                .is_some_and(|a| a.is::<RemoteSet>());
            match layers.pop().filter(|_| is_handle) {
                Some(handle) => {
                    handles.push(handle);
                    locals.push(CacheSet::new(layers));
                }
                None => {
                    *row.caches = CacheSet::new(layers);
                    restore(rows, locals, handles);
                    return Err(spec_core::InputError::ForeignCache(
                        "these caches were not made by this pipeline target".into(),
                    )
                    .into());
                }
            }
        }
        let result = self.pass(rows, &mut locals, &handles, taps);
        restore(rows, locals, handles);
        Ok(result?)
    }

    fn pass(
        &self,
        rows: &[BatchRow<'_>],
        locals: &mut [CacheSet],
        handles: &[Box<dyn LayerCache>],
        taps: &[usize],
    ) -> Result<BatchOutput, PipelineError> {
        let stage_err = |source| PipelineError::Stage { rank: 0, source };
        let mut order = taps.to_vec();
        order.sort_unstable();
        order.dedup();
        let mut spans = Vec::with_capacity(rows.len());
        let mut at = 0;
        for row in rows {
            spans.push(at..at + row.tokens.len());
            at += row.tokens.len();
        }
        let total = at;
        let mut link_bytes = 0;
        let size = self.ranks();
        let start = self.stage.layer_range().start;
        // Taken alone too, where nobody hears them, so they never pile up.
        let pending = self.sets.take();
        let input = if let Some(group) = self.group.as_ref().filter(|_| size > 1) {
            let command = Command::Forward {
                rows: rows
                    .iter()
                    .zip(locals.iter())
                    .zip(handles)
                    .map(|((row, local), handle)| RowCommand {
                        set: handle
                            .as_any()
                            .and_then(|a| a.downcast_ref::<RemoteSet>())
                            .map_or(u32::MAX, |h| h.id),
                        offset: local.offset(),
                        form: row.form,
                        tokens: row.tokens.to_vec(),
                    })
                    .collect(),
                taps: order.clone(),
                freed: pending.freed,
                copies: pending.copies,
            };
            let (header, body) = command.encode()?;
            let width = self.hidden * (1 + taps_below(&order, start) as i32);
            let exchanged = send_command(group, &header, &body, 1).and_then(|sent| {
                let x = recv(group, &[1, total as i32, width], self.dtype, 1)?;
                Ok((sent, x))
            });
            let (sent, x) = exchanged.map_err(|e| self.health.mark(e))?;
            link_bytes += (size - 1) * sent;
            // Every link carries the hidden states plus the taps below it.
            let per_value = x.nbytes() / x.size().max(1);
            link_bytes += (1..size)
                .map(|r| {
                    let below = taps_below(&order, self.layers_of(r).start);
                    (1 + below) * total * self.hidden as usize * per_value
                })
                .sum::<usize>();
            Some(x)
        } else {
            None
        };
        let below = taps_below(&order, start);
        let h = self.hidden;
        let (h_in, mut all_taps) = match &input {
            Some(x) if below > 0 => {
                let received = (0..below)
                    .map(|k| {
                        let k = k as i32;
                        (
                            order[k as usize],
                            x.index((.., .., h * (k + 1)..h * (k + 2))),
                        )
                    })
                    .collect();
                (Some(x.index((.., .., ..h))), received)
            }
            other => (other.clone(), Vec::new()),
        };
        let mut batch: Vec<BatchRow<'_>> = rows
            .iter()
            .zip(locals.iter_mut())
            .map(|(r, caches)| BatchRow {
                tokens: r.tokens,
                caches,
                form: r.form,
            })
            .collect();
        let (out, tapped) = self
            .stage
            .run_stage(h_in.as_ref(), &mut batch, &order)
            .map_err(stage_err)?;
        all_taps.extend(tapped);
        let hidden = self.stage.finish(&out).map_err(stage_err)?;
        let taps = concat_taps(taps, &all_taps).map_err(|e| stage_err(e.into()))?;
        if let Ok(mut s) = self.stats.lock() {
            s.passes += 1;
            s.tokens += total as u64;
            s.link_bytes += link_bytes as u64;
        }
        Ok(BatchOutput {
            hidden,
            taps,
            spans,
        })
    }

    /// The layers of rank `r` (for the traffic count).
    fn layers_of(&self, r: usize) -> std::ops::Range<usize> {
        self.stage.rank_layers(r).unwrap_or(0..0)
    }

    fn one_row(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
        form: RowForm,
    ) -> Result<TargetOutput, SpecError> {
        if tokens.ndim() != 2 || tokens.shape()[0] != 1 {
            return Err(spec_core::InputError::shape(
                "a pipeline forward's tokens",
                "[1, L]",
                tokens.shape(),
            )
            .into());
        }
        let ids = tokens.as_dtype(Dtype::Uint32)?;
        ids.eval()?;
        let ids = ids.as_slice::<u32>().to_vec();
        if ids.is_empty() {
            return Err(spec_core::InputError::NoTokens { what: "a forward" }.into());
        }
        let mut rows = [BatchRow {
            tokens: &ids,
            caches,
            form,
        }];
        let out = self.step(&mut rows, taps)?;
        Ok(TargetOutput {
            hidden: out.hidden,
            taps: out.taps,
        })
    }
}

impl Drop for PipelineTarget {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "telling the pipeline's other ranks to exit failed");
        }
    }
}

/// Puts each row's handle back after its own caches, level with them.
fn restore(rows: &mut [BatchRow<'_>], locals: Vec<CacheSet>, handles: Vec<Box<dyn LayerCache>>) {
    for ((row, local), handle) in rows.iter_mut().zip(locals).zip(handles) {
        if let Some(remote) = handle.as_any().and_then(|a| a.downcast_ref::<RemoteSet>()) {
            remote.set_offset(local.offset());
        }
        let mut layers = local.into_layers();
        layers.push(handle);
        *row.caches = CacheSet::new(layers);
    }
}

impl Target for PipelineTarget {
    fn info(&self) -> &TargetInfo {
        self.stage.target().info()
    }

    fn make_caches(&self) -> CacheSet {
        let mut layers = self.stage.stage_caches().into_layers();
        let id = self.sets.next_id();
        layers.push(Box::new(RemoteSet::new(id, self.sets.clone())));
        CacheSet::new(layers)
    }

    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.one_row(tokens, caches, taps, RowForm::Prefill)
    }

    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.one_row(tokens, caches, taps, RowForm::Decode)
    }

    fn forward_batch(
        &self,
        rows: &mut [BatchRow<'_>],
        taps: &[usize],
    ) -> Result<BatchOutput, SpecError> {
        self.step(rows, taps)
    }

    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.stage.target().logits(hidden)
    }

    fn logits_before_softcap(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.stage.target().logits_before_softcap(hidden)
    }

    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        self.stage.target().embed(tokens)
    }

    /// This rank's weights only.
    fn weights_bytes(&self) -> usize {
        self.stage.target().weights_bytes()
    }

    /// The rank-0 model (a GLM's MTP row and head live here).
    fn as_any(&self) -> &dyn std::any::Any {
        self.stage.target().as_any()
    }
}
