//! Routed experts streamed from disk: the byte ranges of every expert's
//! tensors in the checkpoint's own safetensors shards (taken from the
//! headers `weights-guard` checked, and checked again against the shapes
//! and dtypes the loader validated), read on demand into a resident tier
//! bounded in bytes (least recently used evicted first). A
//! [`StreamedExperts`] is one layer's experts; a forward asks it for the
//! experts its picks name ([`StreamedExperts::gather`]) and gets them
//! stacked compactly, in sorted id order, with the picks renumbered to
//! match (see `switch_glu`).
//!
//! Layouts: mlx-lm's stacked `switch_mlp.{gate,up,down}_proj` (float or
//! quantized in any mode; one expert is a slice of the stack), Hugging
//! Face's per-expert `experts.{e}.*_proj.weight` and its fused
//! `experts.gate_up_proj` / `experts.down_proj` (float, as the resident
//! loader accepts them).

mod extent;
mod readers;
mod tier;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mlx_ext::quant::{Packed, QuantParams};
use mlx_rs::{Array, Dtype};

use crate::stacked::{Stacked, Stored};
use crate::weights::{weight_files, WeightsView};
use crate::{DtypePolicy, ModelError};
use extent::{Extent, Shard};
use readers::Readers;
pub use readers::READERS;
use tier::Tier;
pub use tier::{ExpertStats, ResidentExpert};

/// The command-line option that sizes the tier (errors name it).
pub const TIER_OPTION: &str = "--expert-cache-bytes";

/// A checkpoint's shards opened for range reads, the resident tier every
/// streamed layer shares, and the reader threads that fill it.
#[derive(Debug)]
pub struct ExpertStore {
    shards: Arc<[Shard]>,
    /// Tensor name -> (shard, absolute byte offset, byte length).
    ranges: HashMap<String, (usize, u64, u64)>,
    tier: Mutex<Tier>,
    next_layer: AtomicUsize,
    readers: Readers,
}

impl ExpertStore {
    /// Opens the safetensors shards of `dir` (checked by `weights-guard`)
    /// with a tier of `capacity` bytes.
    pub fn open(dir: &Path, capacity: usize) -> Result<Arc<Self>, ModelError> {
        let mut shards = Vec::new();
        let mut ranges = HashMap::new();
        for file in weight_files(dir)? {
            let summary =
                weights_guard::check_safetensors(&file, &weights_guard::Limits::default())
                    .map_err(|e| ModelError::WeightsCheck {
                        path: file.clone(),
                        context: "",
                        source: e.into(),
                    })?;
            let data_start = 8 + summary.header_len;
            let index = shards.len();
            for t in &summary.tensors {
                ranges.insert(
                    t.name.clone(),
                    (index, data_start + t.data_offsets[0], t.byte_len()),
                );
            }
            shards.push(Shard::open(&file, data_start + summary.data_len)?);
        }
        Ok(Arc::new(Self {
            shards: shards.into(),
            ranges,
            tier: Mutex::new(Tier::new(capacity)),
            next_layer: AtomicUsize::new(0),
            readers: Readers::new(READERS),
        }))
    }

    /// The tier's counters.
    pub fn stats(&self) -> ExpertStats {
        self.lock().stats()
    }

    fn lock(&self) -> MutexGuard<'_, Tier> {
        // Entries go in whole: a panic elsewhere leaves the tier usable.
        self.tier.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where each of the `n` experts of tensor `name` (`array`, taken and
    /// checked by the loader) lies: expert `e` owns the `e`-th of `n` equal
    /// chunks, and of its chunk the part `part.0` of `part.1` equal parts
    /// (a fused `gate_up_proj` holds gate then up), read as `shape`. The
    /// header's byte length must be what the checked tensor holds.
    fn slices(
        &self,
        name: &str,
        array: &Array,
        n: i32,
        part: (u64, u64),
        shape: &[i32],
    ) -> Result<Vec<Extent>, ModelError> {
        let &(shard, offset, len) =
            self.ranges
                .get(name)
                .ok_or_else(|| ModelError::ExpertRead {
                    path: Default::default(),
                    tensor: name.to_owned(),
                    message: "not in any shard's header".into(),
                })?;
        let path = || self.shards[shard].path.clone();
        if len != array.nbytes() as u64 || n <= 0 || len % n as u64 != 0 {
            return Err(ModelError::ExpertRead {
                path: path(),
                tensor: name.to_owned(),
                message: format!(
                    "the header gives {len} bytes, the tensor {:?} {:?} holds {}",
                    array.dtype(),
                    array.shape(),
                    array.nbytes()
                ),
            });
        }
        let chunk = len / n as u64;
        let (num, den) = part;
        let (skip, size) = (chunk * num / den, chunk / den);
        Ok((0..n as u64)
            .map(|e| Extent {
                shard,
                offset: offset + e * chunk + skip,
                len: size,
                dtype: array.dtype(),
                shape: shape.to_vec(),
                tensor: name.to_owned(),
            })
            .collect())
    }
}

/// One projection of a layer's experts: per expert, where its parts lie.
#[derive(Debug)]
struct Projection {
    params: Option<QuantParams>,
    weight: Vec<Extent>,
    scales: Vec<Extent>,
    biases: Vec<Extent>,
}

impl Projection {
    /// `vb`'s stacked `[n, out, in]` projection (float or quantized).
    fn stacked(
        store: &ExpertStore,
        vb: &WeightsView<'_>,
        n: i32,
        out_dim: i32,
        in_dim: i32,
    ) -> Result<Self, ModelError> {
        let whole = (0, 1);
        let one = |a: &Array| [&[1], &a.shape()[1..]].concat();
        if vb.is_quantized()? {
            let packed = vb.take_packed(&[n], out_dim, in_dim)?;
            let part =
                |leaf: &str, a: &Array| store.slices(&vb.stored_name(leaf), a, n, whole, &one(a));
            return Ok(Self {
                params: Some(packed.params()),
                weight: part("weight", packed.weight())?,
                scales: part("scales", packed.scales())?,
                biases: match packed.biases() {
                    Some(b) => part("biases", b)?,
                    None => Vec::new(),
                },
            });
        }
        let w = vb.take_shaped("weight", &[n, out_dim, in_dim])?;
        Ok(Self::dense(store.slices(
            &vb.stored_name("weight"),
            &w,
            n,
            whole,
            &one(&w),
        )?))
    }

    fn dense(weight: Vec<Extent>) -> Self {
        Self {
            params: None,
            weight,
            scales: Vec::new(),
            biases: Vec::new(),
        }
    }

    /// Expert `e`'s bytes: its weight, then its scales and biases where
    /// quantized (on a reader thread).
    fn read_bytes(&self, e: usize, shards: &[Shard]) -> Result<Vec<Vec<u8>>, ModelError> {
        [&self.weight, &self.scales, &self.biases]
            .iter()
            .filter_map(|v| v.get(e))
            .map(|x| x.read_bytes(shards))
            .collect()
    }

    /// Expert `e`'s stack of one from the bytes [`Projection::read_bytes`]
    /// gave, converted as `policy` says.
    fn assemble(
        &self,
        e: usize,
        bytes: &[Vec<u8>],
        policy: DtypePolicy,
    ) -> Result<Stacked, ModelError> {
        let mut parts = [&self.weight, &self.scales, &self.biases]
            .into_iter()
            .filter_map(|v| v.get(e))
            .zip(bytes)
            .map(|(x, b)| x.to_array(b));
        let weight = parts
            .next()
            .transpose()?
            .ok_or_else(|| ModelError::ExpertRead {
                path: Default::default(),
                tensor: String::new(),
                message: format!("no expert {e}"),
            })?;
        let stored = match (self.params, parts.next().transpose()?) {
            (Some(params), Some(scales)) => Stored::Quantized(Packed::from_parts(
                weight,
                scales,
                parts.next().transpose()?,
                params,
            )?),
            _ => Stored::Dense(weight),
        };
        Stacked::from_stored(stored, policy)
    }

    fn bytes(&self, e: usize) -> u64 {
        [&self.weight, &self.scales, &self.biases]
            .iter()
            .filter_map(|v| v.get(e))
            .map(|x| x.len)
            .sum()
    }

    /// Bytes expert `e` holds once converted as `policy` says.
    fn resident_bytes(&self, e: usize, policy: DtypePolicy, out_dim: i32, in_dim: i32) -> u64 {
        let float32 = policy == DtypePolicy::Float32
            && (self.params.is_some()
                || self
                    .weight
                    .first()
                    .is_some_and(|w| w.dtype != Dtype::Float32));
        if float32 {
            4 * out_dim as u64 * in_dim as u64
        } else {
            self.bytes(e)
        }
    }
}

/// One layer's routed experts, streamed from the store.
#[derive(Debug)]
pub struct StreamedExperts {
    store: Arc<ExpertStore>,
    id: usize,
    /// The module path (`model.layers.3.mlp`), for errors.
    module: String,
    experts: i32,
    policy: DtypePolicy,
    /// `gate_proj`, `up_proj`, `down_proj` (shared with reader threads).
    projections: Arc<[Projection; 3]>,
}

impl StreamedExperts {
    /// Registers the routed experts under `vb` (the module holding them:
    /// mlx-lm's stacked `{stacked}.{gate,up,down}_proj`, or Hugging Face's
    /// `experts.*`): their tensors are taken from the store (shapes, dtypes
    /// and quantization checked as the resident loader checks them) but
    /// never read; their byte ranges are kept, under the names the files
    /// give them. An expert larger than the tier is an error naming
    /// [`TIER_OPTION`].
    pub fn register(
        store: &Arc<ExpertStore>,
        vb: &WeightsView<'_>,
        stacked: &str,
        experts: i32,
        intermediate: i32,
        hidden: i32,
    ) -> Result<Self, ModelError> {
        let (n, i, h) = (experts, intermediate, hidden);
        let stacked = vb.pp(stacked);
        let hf = vb.pp("experts");
        let unsupported = || ModelError::Quantized {
            module: hf.prefix().to_owned(),
            message: "quantized Hugging Face `mlp.experts` is not supported (use float weights)"
                .into(),
        };
        let projections = if stacked.contains("gate_proj.weight") {
            [
                Projection::stacked(store, &stacked.pp("gate_proj"), n, i, h)?,
                Projection::stacked(store, &stacked.pp("up_proj"), n, i, h)?,
                Projection::stacked(store, &stacked.pp("down_proj"), n, h, i)?,
            ]
        } else if hf.contains("gate_up_proj") || hf.contains("down_proj") {
            if hf.contains("gate_up_proj.scales") || hf.contains("down_proj.scales") {
                return Err(unsupported());
            }
            let gate_up = hf.take_shaped("gate_up_proj", &[n, 2 * i, h])?;
            let down = hf.take_shaped("down_proj", &[n, h, i])?;
            let name = hf.stored_name("gate_up_proj");
            [
                Projection::dense(store.slices(&name, &gate_up, n, (0, 2), &[1, i, h])?),
                Projection::dense(store.slices(&name, &gate_up, n, (1, 2), &[1, i, h])?),
                Projection::dense(store.slices(
                    &hf.stored_name("down_proj"),
                    &down,
                    n,
                    (0, 1),
                    &[1, h, i],
                )?),
            ]
        } else {
            let per_expert = |m: &str, out_dim: i32, in_dim: i32| {
                let mut extents = Vec::with_capacity(n.max(0) as usize);
                for e in 0..n {
                    let p = hf.pp(e).pp(m);
                    if p.contains("scales") {
                        return Err(unsupported());
                    }
                    let w = p.take_shaped("weight", &[out_dim, in_dim])?;
                    extents.extend(store.slices(
                        &p.stored_name("weight"),
                        &w,
                        1,
                        (0, 1),
                        &[1, out_dim, in_dim],
                    )?);
                }
                Ok(Projection::dense(extents))
            };
            [
                per_expert("gate_proj", i, h)?,
                per_expert("up_proj", i, h)?,
                per_expert("down_proj", h, i)?,
            ]
        };
        let policy = vb.policy();
        let this = Self {
            store: Arc::clone(store),
            id: store.next_layer.fetch_add(1, Ordering::Relaxed),
            module: vb.prefix().to_owned(),
            experts,
            policy,
            projections: Arc::new(projections),
        };
        let dims = [(i, h), (i, h), (h, i)];
        let needed: u64 = (0..n.max(0) as usize)
            .map(|e| {
                this.projections
                    .iter()
                    .zip(dims)
                    .map(|(p, (o, k))| p.resident_bytes(e, policy, o, k))
                    .sum()
            })
            .max()
            .unwrap_or(0);
        let capacity = store.lock().capacity() as u64;
        if capacity < needed {
            return Err(ModelError::ExpertTier {
                option: TIER_OPTION,
                capacity,
                needed,
                module: this.module,
            });
        }
        Ok(this)
    }

    /// The experts `picks` names (`[.., k]`), made resident: their `gate`,
    /// `up` and `down` stacked in ascending id order, and the picks
    /// renumbered to each id's rank among them (a monotonic map, so the
    /// sorted form's order is kept). [`StreamedExperts::start`] then
    /// [`PendingExperts::finish`].
    pub fn gather(&self, picks: &Array) -> Result<Gathered, ModelError> {
        self.start(picks)?.finish()
    }

    /// Reads the picks to the host, takes the resident experts from the
    /// tier and hands every read the others need to the store's reader
    /// threads at once; the caller may dispatch other work before
    /// [`PendingExperts::finish`] waits for them.
    pub fn start(&self, picks: &Array) -> Result<PendingExperts<'_>, ModelError> {
        // Row-major on the host (a router's picks are a strided slice).
        let picks = picks.as_dtype(Dtype::Uint32)?.contiguous()?;
        picks.eval()?;
        let ids: Vec<u32> = picks
            .try_as_slice::<u32>()
            .map_err(|e| ModelError::ExpertRead {
                path: Default::default(),
                tensor: self.module.clone(),
                message: format!("the router's picks cannot be read: {e}"),
            })?
            .to_vec();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        if let Some(&bad) = unique.iter().find(|&&e| e as i64 >= self.experts as i64) {
            return Err(ModelError::ExpertPick {
                module: self.module.clone(),
                expert: bad,
                experts: self.experts,
            });
        }
        let slots: Vec<Option<ResidentExpert>> = {
            let mut tier = self.store.lock();
            unique.iter().map(|&e| tier.get((self.id, e))).collect()
        };
        let (done, arrivals) = channel();
        let mut waiting = 0;
        for (slot, &e) in unique.iter().enumerate() {
            if slots[slot].is_some() {
                continue;
            }
            let shards = Arc::clone(&self.store.shards);
            let projections = Arc::clone(&self.projections);
            let done = done.clone();
            self.store.readers.submit(move || {
                let started = Instant::now();
                let bytes = projections
                    .iter()
                    .map(|p| p.read_bytes(e as usize, &shards))
                    .collect();
                let _ = done.send(Arrival {
                    slot,
                    bytes,
                    seconds: started.elapsed(),
                });
            });
            waiting += 1;
        }
        Ok(PendingExperts {
            layer: self,
            ids,
            shape: picks.shape().to_vec(),
            unique,
            slots,
            arrivals,
            waiting,
        })
    }

    /// Expert `e` from the bytes its reads gave, kept in the tier.
    fn admit(&self, e: u32, arrival: Arrival) -> Result<ResidentExpert, ModelError> {
        let bytes = arrival.bytes?;
        let index = e as usize;
        let [gate, up, down] = &*self.projections;
        let part = |i: usize| bytes.get(i).map(Vec::as_slice).unwrap_or_default();
        let expert = ResidentExpert {
            gate: gate.assemble(index, part(0), self.policy)?,
            up: up.assemble(index, part(1), self.policy)?,
            down: down.assemble(index, part(2), self.policy)?,
        };
        let read: u64 = self.projections.iter().map(|p| p.bytes(index)).sum();
        let mut tier = self.store.lock();
        tier.stats.misses += 1;
        tier.stats.bytes_read += read;
        tier.stats.read_seconds += arrival.seconds.as_secs_f64();
        tier.insert((self.id, e), expert.clone());
        Ok(expert)
    }
}

/// A layer's experts stacked for one forward, and the picks renumbered.
pub type Gathered = (Stacked, Stacked, Stacked, Array);

/// One expert's bytes, per projection, back from a reader thread.
struct Arrival {
    slot: usize,
    bytes: Result<Vec<Vec<Vec<u8>>>, ModelError>,
    seconds: Duration,
}

/// A gather whose reads are under way ([`StreamedExperts::start`]).
pub struct PendingExperts<'a> {
    layer: &'a StreamedExperts,
    ids: Vec<u32>,
    shape: Vec<i32>,
    unique: Vec<u32>,
    slots: Vec<Option<ResidentExpert>>,
    arrivals: Receiver<Arrival>,
    waiting: usize,
}

impl std::fmt::Debug for PendingExperts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingExperts")
            .field("module", &self.layer.module)
            .field("unique", &self.unique)
            .field("waiting", &self.waiting)
            .finish()
    }
}

impl PendingExperts<'_> {
    /// Waits for the reads, keeps what they gave in the tier (a failed
    /// read fails this forward and leaves the tier as it was for that
    /// expert) and stacks the experts.
    pub fn finish(mut self) -> Result<Gathered, ModelError> {
        let layer = self.layer;
        let waited = Instant::now();
        let mut failed = None;
        for _ in 0..self.waiting {
            let Ok(arrival) = self.arrivals.recv() else {
                break;
            };
            let slot = arrival.slot;
            match layer.admit(self.unique[slot], arrival) {
                Ok(expert) => self.slots[slot] = Some(expert),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        layer.store.lock().stats.wait_seconds += waited.elapsed().as_secs_f64();
        if let Some(e) = failed {
            return Err(e);
        }
        let resident: Vec<ResidentExpert> = self
            .slots
            .into_iter()
            .collect::<Option<_>>()
            .ok_or_else(|| ModelError::ExpertRead {
                path: Default::default(),
                tensor: layer.module.clone(),
                message: "a reader thread stopped before its read finished".into(),
            })?;
        let stack = |f: fn(&ResidentExpert) -> &Stacked| {
            Stacked::concat(&resident.iter().map(f).collect::<Vec<_>>())
        };
        let unique = &self.unique;
        let remapped: Vec<u32> = self
            .ids
            .iter()
            .map(|e| unique.partition_point(|u| u < e) as u32)
            .collect();
        Ok((
            stack(|r| &r.gate)?,
            stack(|r| &r.up)?,
            stack(|r| &r.down)?,
            Array::from_slice(&remapped, &self.shape),
        ))
    }
}

#[cfg(test)]
mod tests;
