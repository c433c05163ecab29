//! A group of processes and the operations over it.

use mlx_rs::{Array, Dtype};

use crate::ffi::{self, Collective, RawGroup};
use crate::{Backend, DistError};

/// The processes one backend connected (or a single process, when a
/// non-strict initialisation found no backend). Operations return lazy
/// arrays; evaluating them communicates.
#[derive(Debug)]
pub struct Group {
    raw: RawGroup,
    backend: Backend,
}

impl Group {
    pub(crate) fn new(raw: RawGroup, backend: Backend) -> Self {
        Self { raw, backend }
    }

    /// This process's rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.raw.rank().max(0) as usize
    }

    /// Processes in the group.
    pub fn size(&self) -> usize {
        self.raw.size().max(1) as usize
    }

    /// The backend asked for when the group was formed.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Splits the group: processes passing the same `color` form a subgroup,
    /// ordered by `key` (`None`: by rank). Not every backend can split (ring
    /// cannot): that is an error, never an abort.
    pub fn split(&self, color: i32, key: Option<i32>) -> Result<Group, DistError> {
        let key = key.unwrap_or(-1);
        self.raw
            .split(color, key)
            .map(|raw| Group::new(raw, self.backend))
            .map_err(|status| DistError::Op {
                op: "split",
                reason: format!(
                    "the `{}` backend refused to split (color {color}, key {key}; MLX status {status})",
                    self.backend
                ),
            })
    }

    fn collective(
        &self,
        op: Collective,
        name: &'static str,
        x: &Array,
    ) -> Result<Array, DistError> {
        ffi::collective(op, x, &self.raw).map_err(|status| DistError::Op {
            op: name,
            reason: format!(
                "MLX status {status} on an array of shape {:?} ({:?})",
                x.shape(),
                x.dtype()
            ),
        })
    }

    /// The element-wise sum of `x` over every process.
    pub fn all_sum(&self, x: &Array) -> Result<Array, DistError> {
        self.collective(Collective::AllSum, "all_sum", x)
    }

    /// Every process's `x`, concatenated on the first axis in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array, DistError> {
        self.collective(Collective::AllGather, "all_gather", x)
    }

    /// The element-wise maximum of `x` over every process.
    pub fn all_max(&self, x: &Array) -> Result<Array, DistError> {
        self.collective(Collective::AllMax, "all_max", x)
    }

    /// The element-wise minimum of `x` over every process.
    pub fn all_min(&self, x: &Array) -> Result<Array, DistError> {
        self.collective(Collective::AllMin, "all_min", x)
    }

    /// The sum over every process, of which this process keeps its slice of
    /// the first axis (which must divide by the group size). The ring
    /// backend of MLX 0.32.2 has none: refused before MLX sees it (MLX's own
    /// refusal comes only at evaluation, and a 2-rank ring was seen to hang).
    pub fn sum_scatter(&self, x: &Array) -> Result<Array, DistError> {
        if self.backend == Backend::Ring {
            return Err(DistError::Op {
                op: "sum_scatter",
                reason: "the ring backend has no sum_scatter (use all_sum and slice)".into(),
            });
        }
        let rows = x.shape().first().copied().unwrap_or(0);
        if x.ndim() == 0 || rows % self.size() as i32 != 0 {
            return Err(DistError::Op {
                op: "sum_scatter",
                reason: format!(
                    "the first axis of shape {:?} does not divide by the group size {}",
                    x.shape(),
                    self.size()
                ),
            });
        }
        self.collective(Collective::SumScatter, "sum_scatter", x)
    }

    fn peer(&self, op: &'static str, rank: usize) -> Result<i32, DistError> {
        if rank >= self.size() || rank == self.rank() {
            return Err(DistError::Op {
                op,
                reason: format!(
                    "rank {rank} is not another process of this group (rank {} of {})",
                    self.rank(),
                    self.size()
                ),
            });
        }
        Ok(rank as i32)
    }

    /// Sends `x` to process `dst`; evaluate the result to send.
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array, DistError> {
        let dst = self.peer("send", dst)?;
        ffi::send(x, dst, &self.raw).map_err(|status| DistError::Op {
            op: "send",
            reason: format!("MLX status {status} sending to rank {dst}"),
        })
    }

    /// Receives an array of `shape` and `dtype` from process `src`.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array, DistError> {
        let src = self.peer("recv", src)?;
        ffi::recv(shape, dtype, src, &self.raw).map_err(|status| DistError::Op {
            op: "recv",
            reason: format!("MLX status {status} receiving {shape:?} ({dtype:?}) from rank {src}"),
        })
    }

    /// Receives an array shaped and typed like `x` from process `src`.
    pub fn recv_like(&self, x: &Array, src: usize) -> Result<Array, DistError> {
        let src = self.peer("recv_like", src)?;
        ffi::recv_like(x, src, &self.raw).map_err(|status| DistError::Op {
            op: "recv_like",
            reason: format!("MLX status {status} receiving from rank {src}"),
        })
    }
}
