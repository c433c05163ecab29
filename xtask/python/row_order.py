"""A numerics-only change to mlx-lm 0.32.2 that every oracle applies on import,
so mlx-lm computes the op sequence our engine does (row invariance, see
`docs/ARCHITECTURE.md`).

mlx-lm's `RotatingKVCache` (sliding-window layers) hands a single-token query
its ring buffer in storage order once the ring has wrapped, but a multi-token
window its keys in time order. Attention sums over keys in the order given,
so the same query gave different bits alone and inside a verify window. Our
sliding cache always gives time order; this makes mlx-lm's single-token path
do the same. The set of keys, the mask and every value are unchanged: only
the order of the floating-point sums.
"""

from mlx_lm.models.cache import RotatingKVCache


def _keys_and_values_in_time_order(self):
    if self.offset < self.keys.shape[2]:
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]
    return self._temporal_order(self.keys), self._temporal_order(self.values)


RotatingKVCache.keys_and_values = _keys_and_values_in_time_order
