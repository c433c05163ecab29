//! DFlash2's grouped dynamic causal convolution (`attention_conv`,
//! `mlp_conv` of each layer), in `model_mlx.py`'s op order.
//!
//! Over the block only (zero rows before its start), channel `c` of group
//! `g = c / group` at position `t` sums, for each tap `o` of `K`,
//! `base[o, c] * x[t - o, c]` then `dynamic[t, o, g] * x[t - o, c]`. The
//! static kernel is `base_kernel [2, K, H]`; the dynamic one comes from
//! `kernel_projection` (`[2 * K * G, H]`, `G = H / group`) of the normed
//! sublayer input: half 0 convolves that input (`prepare`), half 1 the
//! sublayer's output (`finish`), each with its own base half.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_like};
use mlx_rs::Array;
use spec_runtime::layers::Linear;
use spec_runtime::weights::WeightsView;

use crate::config::DFlash2Config;
use crate::DFlashError;

/// One `GroupedDynamicCausalConv`.
#[derive(Debug)]
pub(crate) struct GroupedConv {
    /// `[2, K, H]`.
    base_kernel: Array,
    kernel_projection: Linear,
    kernel: i32,
    group: i32,
}

impl GroupedConv {
    pub(crate) fn load(
        vb: &WeightsView<'_>,
        hidden: i32,
        c: &DFlash2Config,
    ) -> Result<Self, DFlashError> {
        let (kernel, group) = (c.conv_kernel_size, c.conv_group_size);
        let groups = hidden / group;
        Ok(Self {
            base_kernel: vb.take_cast("base_kernel", &[2, kernel, hidden])?,
            kernel_projection: Linear::load(
                &vb.pp("kernel_projection"),
                hidden,
                2 * kernel * groups,
                false,
            )?,
            kernel,
            group,
        })
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.base_kernel.nbytes() + self.kernel_projection.nbytes()
    }

    /// Convolves `x` `[B, L, H]` with half 0; returns the result and the
    /// dynamic kernel of half 1 `[B, L, K, G]` for [`Self::finish`].
    pub(crate) fn prepare(&self, x: &Array) -> Result<(Array, Array), DFlashError> {
        let s = x.shape();
        let groups = s[2] / self.group;
        let dynamic =
            self.kernel_projection
                .forward(x)?
                .reshape(&[s[0], s[1], 2, self.kernel, groups])?;
        let first = dynamic.index((.., .., 0, .., ..));
        let second = dynamic.index((.., .., 1, .., ..));
        let out = self.convolve(x, &first, &self.base_kernel.index(0))?;
        Ok((out, second))
    }

    /// Convolves the sublayer output `x` with half 1 (`dynamic` from
    /// [`Self::prepare`]).
    pub(crate) fn finish(&self, x: &Array, dynamic: &Array) -> Result<Array, DFlashError> {
        self.convolve(x, dynamic, &self.base_kernel.index(1))
    }

    /// `x` `[B, L, H]`, `dynamic` `[B, L, K, G]`, `base` `[K, H]`.
    fn convolve(&self, x: &Array, dynamic: &Array, base: &Array) -> Result<Array, DFlashError> {
        let s = x.shape();
        let (b, l, h) = (s[0], s[1], s[2]);
        let groups = h / self.group;
        let blocks = x.reshape(&[b, l, groups, self.group])?;
        let dynamic = dynamic.reshape(&[b, l, self.kernel, groups, 1])?;
        let mut out = zeros_like(&blocks)?;
        for offset in 0..self.kernel {
            let values = if offset == 0 {
                blocks.clone()
            } else {
                // Row `t` holds row `t - offset`, zeros before the block.
                let head = zeros_like(blocks.index((.., ..offset.min(l), .., ..)))?;
                let tail = blocks.index((.., ..(l - offset).max(0), .., ..));
                concatenate(&[&head, &tail], 1)?
            };
            let k = base
                .index(offset)
                .reshape(&[1, 1, groups, self.group])?
                .as_dtype(x.dtype())?;
            out = out.add(&k.multiply(&values)?)?;
            out = out.add(&dynamic.index((.., .., offset, .., ..)).multiply(&values)?)?;
        }
        Ok(out.reshape(&[b, l, h])?)
    }
}
