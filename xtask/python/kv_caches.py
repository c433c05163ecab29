"""The oracles' caches with keys and values quantized as the engine's
`--kv-bits` keeps them: every `KVCache` of the model's own
`make_prompt_cache` replaced by a `QuantizedKVCache` from the first token
(sliding layers keep their `RotatingKVCache`). mlx-lm's own `--kv-bits`
converts its caches only after a forward, once they hold
`--quantized-kv-start` positions.
"""

from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache


def prompt_cache(model, kv_cache=None):
    """`make_prompt_cache(model)`, each `KVCache` quantized where
    `kv_cache` ({"bits": B, "group_size": G}) asks."""
    caches = make_prompt_cache(model)
    if kv_cache is None:
        return caches
    bits, group_size = int(kv_cache["bits"]), int(kv_cache["group_size"])
    return [
        QuantizedKVCache(group_size=group_size, bits=bits) if type(c) is KVCache else c
        for c in caches
    ]
