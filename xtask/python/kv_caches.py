"""The oracles' caches with keys and values quantized as the engine's
`--kv-bits` keeps them.

With "start" 0, every `KVCache` of the model's own `make_prompt_cache` is a
`QuantizedKVCache` from the first token (sliding layers keep their
`RotatingKVCache`): mlx-lm's own `--kv-bits` converts only after a forward,
so its first prefill chunk always reads float keys. With a positive start,
mlx-lm's own mechanism (`generate_step`'s `kv_bits`, `kv_group_size`,
`quantized_kv_start`) runs on the model's float caches: the engine's rule
(queries from the start on read the quantized keys) is what mlx-lm computes
when no prefill chunk crosses the start.
"""

from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache


def prompt_cache(model, kv_cache=None, max_kv_size=None):
    """`make_prompt_cache(model)`, each `KVCache` quantized from the first
    token where `kv_cache` ({"bits", "group_size", "start": 0}) asks, or
    bounded where `max_kv_size` does: a `RotatingKVCache(max_kv_size,
    keep=4)` for every `KVCache`, what `make_prompt_cache(model,
    max_kv_size)` builds for a model without a `make_cache` of its own
    (llama has one, which ignores the bound; the cache class is the same)."""
    caches = make_prompt_cache(model)
    if max_kv_size is not None:
        return [
            RotatingKVCache(max_size=int(max_kv_size), keep=4) if type(c) is KVCache else c
            for c in caches
        ]
    if kv_cache is None or int(kv_cache.get("start", 0)) > 0:
        return caches
    bits, group_size = int(kv_cache["bits"]), int(kv_cache["group_size"])
    return [
        QuantizedKVCache(group_size=group_size, bits=bits) if type(c) is KVCache else c
        for c in caches
    ]


def generate_kwargs(kv_cache=None):
    """`generate_step`'s conversion arguments for a positive start."""
    if kv_cache is None or int(kv_cache.get("start", 0)) == 0:
        return {}
    return {
        "kv_bits": int(kv_cache["bits"]),
        "kv_group_size": int(kv_cache["group_size"]),
        "quantized_kv_start": int(kv_cache["start"]),
    }
