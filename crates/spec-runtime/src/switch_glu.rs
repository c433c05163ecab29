//! mlx-lm's `SwitchGLU`: each token through the experts its router picked,
//! a gated MLP per expert (`down(act(gate(x)) * up(x))`) over stacked
//! weights, with the picks sorted by expert once there are
//! [`SORT_FROM`] or more of them (then `gather_mm` reads each expert's
//! weights once). The sorted form rounds a token differently from the
//! unsorted one, so a host that needs a token's bits not to depend on what
//! shares its forward (a verify window) asks for the unsorted form.
//!
//! The experts are resident (stacked at load) or streamed from disk
//! (`experts`): then each forward makes the experts its picks name
//! resident, stacks them compactly in ascending id order and renumbers the
//! picks by rank among them. The renumbering is monotonic, so the sorted
//! form orders the picks as it would over the whole stack, and each
//! expert's weights are the same bytes: the output equals the resident
//! model's bit for bit (tests below).
//!
//! A fine-tuned adapter's LoRA updates of the stacks (`crate::adapter`,
//! mlx-lm's `LoRASwitchLinear`) stay resident and are gathered by the
//! picks' own expert ids.

use mlx_rs::ops::{argsort_axis, floor_divide};
use mlx_rs::Array;

use crate::adapter::SwitchLowRank;
use crate::experts::{ExpertStore, PendingExperts, StreamedExperts};
use crate::layers::Activation;
use crate::stacked::Stacked;
use crate::weights::WeightsView;
use crate::ModelError;

/// mlx-lm sorts the picks by expert from this many on.
pub const SORT_FROM: usize = 64;

/// The experts' projections, in the order mlx-lm's sanitize stacks them.
pub const PROJECTIONS: [&str; 3] = ["up_proj", "down_proj", "gate_proj"];

/// Hugging Face's per-expert names of projection `proj` under `mlp`
/// (`{mlp}.experts.{e}.{proj}.weight`), experts `0..experts` in order.
pub fn per_expert_names(mlp: &str, proj: &str, experts: i32) -> Vec<String> {
    (0..experts)
        .map(|e| format!("{mlp}.experts.{e}.{proj}.weight"))
        .collect()
}

/// mlx-lm's name of the stacked projection `proj` under `mlp`
/// (`{mlp}.switch_mlp.{proj}.weight`).
pub fn stacked_name(mlp: &str, proj: &str) -> String {
    format!("{mlp}.switch_mlp.{proj}.weight")
}

/// Routed experts: stacked `gate_proj`, `up_proj`, `down_proj`, resident
/// or streamed.
#[derive(Debug)]
pub struct SwitchGlu {
    experts: Experts,
    activation: Activation,
    /// An adapter's updates of `gate_proj`, `up_proj`, `down_proj`.
    low_rank: Box<[Option<SwitchLowRank>; 3]>,
    /// The projections' per-expert biases (`gate_proj.bias`, `up_proj`'s,
    /// `down_proj`'s: mlx-lm's `SwitchGLU(bias=True)`, gpt-oss), resident
    /// whether the weights are or not.
    biases: Option<Box<[Array; 3]>>,
}

/// A forward between [`SwitchGlu::start`] and [`SwitchGlu::finish`].
#[derive(Debug)]
pub enum Started<'a> {
    /// Resident experts: the picks, as given.
    Resident(Array),
    /// Streamed experts: their reads under way, and the picks.
    Streamed(PendingExperts<'a>, Array),
}

#[derive(Debug)]
enum Experts {
    Resident {
        gate: Stacked,
        up: Stacked,
        down: Stacked,
    },
    Streamed(StreamedExperts),
}

impl SwitchGlu {
    /// Loads `gate_proj`, `up_proj` and `down_proj` under `vb` for
    /// `experts` experts of width `intermediate` over `hidden`.
    pub fn load(
        vb: &WeightsView<'_>,
        experts: i32,
        intermediate: i32,
        hidden: i32,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            experts: Experts::Resident {
                gate: Stacked::load(&vb.pp("gate_proj"), experts, intermediate, hidden)?,
                up: Stacked::load(&vb.pp("up_proj"), experts, intermediate, hidden)?,
                down: Stacked::load(&vb.pp("down_proj"), experts, hidden, intermediate)?,
            },
            activation,
            low_rank: Self::low_rank(vb, experts, intermediate, hidden)?,
            biases: Self::biases(vb, experts, intermediate, hidden)?,
        })
    }

    /// The three projections' biases under `vb`, where it holds them.
    fn biases(
        vb: &WeightsView<'_>,
        experts: i32,
        intermediate: i32,
        hidden: i32,
    ) -> Result<Option<Box<[Array; 3]>>, ModelError> {
        if !vb.pp("gate_proj").contains("bias") {
            return Ok(None);
        }
        let (n, i, h) = (experts, intermediate, hidden);
        let bias = |m: &str, width: i32| vb.pp(m).take_cast("bias", &[n, width]);
        Ok(Some(Box::new([
            bias("gate_proj", i)?,
            bias("up_proj", i)?,
            bias("down_proj", h)?,
        ])))
    }

    /// An adapter's updates of the three stacks under `vb`, where it has
    /// them.
    fn low_rank(
        vb: &WeightsView<'_>,
        experts: i32,
        intermediate: i32,
        hidden: i32,
    ) -> Result<Box<[Option<SwitchLowRank>; 3]>, ModelError> {
        let (n, i, h) = (experts, intermediate, hidden);
        Ok(Box::new([
            SwitchLowRank::load(&vb.pp("gate_proj"), n, i, h)?,
            SwitchLowRank::load(&vb.pp("up_proj"), n, i, h)?,
            SwitchLowRank::load(&vb.pp("down_proj"), n, h, i)?,
        ]))
    }

    /// [`SwitchGlu::load`] with every projection kept at 8 bits
    /// ([`Stacked::load_8bit`]; errors name `option`).
    pub fn load_8bit(
        vb: &WeightsView<'_>,
        experts: i32,
        intermediate: i32,
        hidden: i32,
        activation: Activation,
        option: &str,
    ) -> Result<Self, ModelError> {
        let (n, i, h) = (experts, intermediate, hidden);
        Ok(Self {
            experts: Experts::Resident {
                gate: Stacked::load_8bit(&vb.pp("gate_proj"), n, i, h, option)?,
                up: Stacked::load_8bit(&vb.pp("up_proj"), n, i, h, option)?,
                down: Stacked::load_8bit(&vb.pp("down_proj"), n, h, i, option)?,
            },
            activation,
            low_rank: Self::low_rank(vb, n, i, h)?,
            biases: Self::biases(vb, n, i, h)?,
        })
    }

    /// Bits per weight of resident quantized experts (`None`: dense or
    /// streamed).
    pub fn bits(&self) -> Option<i32> {
        match &self.experts {
            Experts::Resident { gate, .. } => gate.bits(),
            Experts::Streamed(_) => None,
        }
    }

    /// The routed experts under `vb` (the module holding mlx-lm's stacked
    /// `{stacked}.*` or Hugging Face's `experts.*`) left on disk and
    /// streamed through `store`'s tier (see [`StreamedExperts::register`]).
    pub fn streamed(
        store: &std::sync::Arc<ExpertStore>,
        vb: &WeightsView<'_>,
        stacked: &str,
        experts: i32,
        intermediate: i32,
        hidden: i32,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            experts: Experts::Streamed(StreamedExperts::register(
                store,
                vb,
                stacked,
                experts,
                intermediate,
                hidden,
            )?),
            activation,
            low_rank: Self::low_rank(&vb.pp(stacked), experts, intermediate, hidden)?,
            biases: Self::biases(&vb.pp(stacked), experts, intermediate, hidden)?,
        })
    }

    /// Bytes held (streamed experts: none; the tier counts its own).
    pub fn nbytes(&self) -> usize {
        let low_rank: usize = self.low_rank.iter().flatten().map(|l| l.nbytes()).sum();
        let biases: usize = self
            .biases
            .iter()
            .flat_map(|b| b.iter())
            .map(|b| b.nbytes())
            .sum();
        low_rank
            + biases
            + match &self.experts {
                Experts::Resident { gate, up, down } => gate.nbytes() + up.nbytes() + down.nbytes(),
                Experts::Streamed(_) => 0,
            }
    }

    /// Whether `picks` expert picks take the sorted form.
    pub fn sorts(picks: usize) -> bool {
        picks >= SORT_FROM
    }

    /// Each token of `x` (`[.., hidden]`) through its `picks` (`[.., k]`
    /// expert indices): `[.., k, hidden]`. `may_sort`: take the sorted form
    /// once there are enough picks, as mlx-lm does for exactly these
    /// tokens; `false` keeps every token in the unsorted form.
    pub fn forward(&self, x: &Array, picks: &Array, may_sort: bool) -> Result<Array, ModelError> {
        let started = self.start(picks)?;
        self.finish(x, started, may_sort)
    }

    /// The first half of [`SwitchGlu::forward`]: streamed experts read
    /// the picks and start reading what the tier lacks; the caller may
    /// dispatch other work (a shared expert) before [`SwitchGlu::finish`].
    pub fn start<'a>(&'a self, picks: &Array) -> Result<Started<'a>, ModelError> {
        Ok(match &self.experts {
            Experts::Resident { .. } => Started::Resident(picks.clone()),
            Experts::Streamed(streamed) => Started::Streamed(streamed.start(picks)?, picks.clone()),
        })
    }

    /// The second half of [`SwitchGlu::forward`].
    pub fn finish(
        &self,
        x: &Array,
        started: Started<'_>,
        may_sort: bool,
    ) -> Result<Array, ModelError> {
        match (&self.experts, started) {
            (Experts::Resident { gate, up, down }, Started::Resident(picks)) => {
                self.apply([gate, up, down], x, [&picks, &picks], may_sort)
            }
            (_, Started::Streamed(pending, picks)) => {
                let (gate, up, down, ranks) = pending.finish()?;
                self.apply([&gate, &up, &down], x, [&ranks, &picks], may_sort)
            }
            (Experts::Streamed(_), Started::Resident(_)) => Err(ModelError::ExpertRead {
                path: Default::default(),
                tensor: String::new(),
                message: "streamed experts finished without starting their reads".into(),
            }),
        }
    }

    /// The gated expert MLP over `[gate, up, down]` stacks that `picks`
    /// index (`[stack indices, expert ids]`: the same for resident
    /// experts, ranks among the compact stack and ids for streamed ones;
    /// the adapter's updates are gathered by id).
    fn apply(
        &self,
        [gate, up, down]: [&Stacked; 3],
        x: &Array,
        [picks, ids]: [&Array; 2],
        may_sort: bool,
    ) -> Result<Array, ModelError> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        let sort = may_sort && Self::sorts(picks.size());
        let shape = picks.shape().to_vec();
        let (x, idx, ids, inverse) = if sort {
            let k = shape.last().copied().unwrap_or(1);
            let flat = picks.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inverse = argsort_axis(&order, 0)?;
            let rows = x
                .flatten(0, -3)?
                .take_axis(floor_divide(&order, Array::from_int(k))?, 0)?;
            let ids = ids.flatten(None, None)?.take_axis(&order, 0)?;
            (rows, flat.take_axis(&order, 0)?, ids, Some(inverse))
        } else {
            (x, picks.clone(), ids.clone(), None)
        };
        let [gate_lr, up_lr, down_lr] = &*self.low_rank;
        let adapt = |update: &Option<SwitchLowRank>, x: &Array, y: Array| match update {
            Some(update) => update.apply(x, &ids, sort, y),
            None => Ok(y),
        };
        // mlx-lm's `SwitchLinear`: the picked experts' bias after the
        // product (before an adapter's update), gathered by expert id.
        let biased = |which: usize, y: Array| -> Result<Array, ModelError> {
            match &self.biases {
                Some(b) => Ok(y.add(b[which].take_axis(&ids, 0)?.expand_dims(-2)?)?),
                None => Ok(y),
            }
        };
        let up = adapt(up_lr, &x, biased(1, up.gather(&x, &idx, sort)?)?)?;
        let gate = adapt(gate_lr, &x, biased(0, gate.gather(&x, &idx, sort)?)?)?;
        let hidden = self.activation.gated(&gate, &up)?;
        let mut y = adapt(
            down_lr,
            &hidden,
            biased(2, down.gather(&hidden, &idx, sort)?)?,
        )?;
        if let Some(inverse) = inverse {
            let mut unflat = shape;
            unflat.extend_from_slice(&y.shape()[1..]);
            y = y.take_axis(&inverse, 0)?.reshape(&unflat)?;
        }
        Ok(y.squeeze_axes(&[-2])?)
    }
}
