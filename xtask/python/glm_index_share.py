"""GLM-5.2's IndexShare on mlx-lm 0.32.2's `glm_moe_dsa` (which has an
indexer on every layer), for the project-written oracles.

The schedule comes from transformers' own `GlmMoeDsaConfig` (the reference;
its configuration class imports without torch): layer i is "full" (its own
DSA indexer and indexer cache) or "shared" (it attends to the keys the
previous full layer picked, in mlx-lm's single-query form as in its window
form). Full layers' indexer key norm uses the reference's epsilon (1e-6)
whenever the config carries a GLM-5.2 key; GLM-5 configs keep mlx-lm's
`nn.LayerNorm` default (1e-5).
"""

import mlx.core as mx
import mlx.nn as nn

GLM52_KEYS = (
    "indexer_types",
    "index_topk_pattern",
    "index_topk_freq",
    "index_skip_topk_offset",
    "index_share_for_mtp_iteration",
)
REFERENCE_INDEXER_NORM_EPS = 1e-6


def is_glm52_schema(config):
    """Whether the config carries any GLM-5.2 IndexShare key (a null
    pattern counts as absent, as for our loader)."""
    return any(config.get(k) is not None for k in GLM52_KEYS)


def indexer_types(config):
    """The reference's per-layer schedule ("full" / "shared")."""
    from transformers.models.glm_moe_dsa.configuration_glm_moe_dsa import GlmMoeDsaConfig

    keys = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    if keys.get("index_topk_pattern") is None:
        keys.pop("index_topk_pattern", None)
    return list(GlmMoeDsaConfig(**keys).indexer_types)


class _Picks:
    """The last full layer's top-k, handed to the shared layers after it."""

    value = None


class RecordingIndexer(nn.Module):
    """A full layer's mlx-lm indexer that records what it picks."""

    def __init__(self, inner, picks):
        super().__init__()
        self.inner = inner
        self._picks = picks

    def __call__(self, x, qr, mask, cache=None):
        picked = self.inner(x, qr, mask, cache=cache)
        self._picks.value = picked
        return picked


class SharedIndexer(nn.Module):
    """A shared layer: no indexer of its own, the previous full layer's picks."""

    def __init__(self, picks):
        super().__init__()
        self._picks = picks

    def __call__(self, x, qr, mask, cache=None):
        return self._picks.value


def install(model, config):
    """Makes a loaded mlx-lm `glm_moe_dsa` model run the config's IndexShare
    schedule; GLM-5 configs (no IndexShare key) are left as mlx-lm runs them."""
    if not is_glm52_schema(config):
        return
    types = indexer_types(config)
    picks = _Picks()
    for layer, kind in zip(model.model.layers, types):
        attn = layer.self_attn
        if kind == "full":
            attn.indexer.k_norm.eps = REFERENCE_INDEXER_NORM_EPS
            attn.indexer = RecordingIndexer(attn.indexer, picks)
        else:
            attn.indexer = SharedIndexer(picks)


def make_cache(model, config):
    """mlx-lm's prompt cache, with a never-written stand-in for the indexer
    cache of each shared layer (mlx-lm's attention ties the indexer cache to
    the latent one with `mx.depends`)."""
    caches = model.make_cache()
    if is_glm52_schema(config):
        for c, kind in zip(caches, indexer_types(config)):
            if kind == "shared":
                c[1].keys = c[1].values = mx.zeros((1,))
    return caches
