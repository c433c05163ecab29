"""The MTP oracle of `cargo xtask gate mtp`: GLM-5.x native MTP drafting and
absorption written with mlx ops, on the same schedule as our
`draft-glm52-mtp/examples/mtp_trace.rs`.

    oracle_mtp.py --model DIR --schedule FILE.json --out PREFIX

The target is mlx-lm's `glm_moe_dsa` (which drops the MTP row when loading),
with GLM-5.2's IndexShare installed when the config has it
(`glm_index_share.py`). The MTP row is built here from the checkpoint's
`model.layers.{N}.*` tensors: mlx-lm's own `DeepseekV32DecoderLayer` for the
decoder layer, its own latent cache, plus enorm / hnorm / eh_proj /
shared_head.norm and the target's embedding and head. When the row carries
`self_attn.indexer.*` (GLM-5.2 does) its own DSA indexer runs with its own
indexer cache (key norm epsilon as the target's full layers); otherwise the
indexer is replaced by one that selects nothing (the row attends densely).
The procedure (GLM-5.2's native MTP as the seed runs it; `docs/GLM.md`):

  draft step (tok, h): e = rmsnorm(embed(tok), enorm); hn = rmsnorm(h, hnorm);
    out = layer(eh_proj([e; hn])); tok' = argmax(log_softmax(lm_head(
    rmsnorm(out, shared_head.norm)))); the next h is out. The first h is the
    target's post-norm hidden that predicted the pending token.
  index_share_for_mtp_iteration (with an MTP indexer): step 0 of a round
    runs the indexer and its picks are kept; step j > 0 (at position
    first + j) attends to those picks followed by positions first+1..first+j
    (a dense step 0 stays dense); its key still enters the indexer cache.
  commit (n drafted, k accepted): trim the MTP caches by n - 1, then run the
    layer once over the k accepted tokens paired with the verified hidden
    states at window positions 0..k (causal mask).

Writes PREFIX.json ({"rounds": [{"drafts", "k", "next", "offset"}]}) and
PREFIX.safetensors (latent_{r}, rope_{r}: the MTP cache after round r;
index_{r}: the MTP indexer's keys, when the row has an indexer).
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import CacheList, KVCache
from mlx_lm.models.deepseek_v32 import DeepseekV32DecoderLayer
from mlx_lm.utils import load_model

import glm_index_share
from oracle_lm import _gather_qmm_without_global_scale  # noqa: F401  (applies the shim)


class NoIndexer(nn.Module):
    """The MTP row attends densely: no key selection."""

    def __call__(self, x, qr, mask, cache=None):
        return None


class MtpIndexer(nn.Module):
    """The MTP row's own indexer; `force` (when set) replaces its picks (the
    keys still enter its cache), `last` holds what it picked last."""

    FREE = object()

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.force = MtpIndexer.FREE
        self.last = None

    def __call__(self, x, qr, mask, cache=None):
        picked = self.inner(x, qr, mask, cache=cache)
        self.last = picked
        return picked if self.force is MtpIndexer.FREE else self.force


class SharedHead(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class MtpRow(nn.Module):
    def __init__(self, args):
        super().__init__()
        h = args.hidden_size
        self.enorm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.hnorm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = DeepseekV32DecoderLayer(args, args.num_hidden_layers)
        self.shared_head = SharedHead(args)


def load_mtp_row(model_dir, args, config):
    n = args.num_hidden_layers
    prefix = f"model.layers.{n}."
    weights = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for name, value in mx.load(str(path)).items():
            if not name.startswith(prefix):
                continue
            key = name[len(prefix):]
            if not key.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head.")):
                key = "layer." + key
            weights[key] = value
    if not weights:
        raise SystemExit(f"{model_dir}: no MTP row (tensors {prefix}*)")
    row = MtpRow(args)
    has_indexer = any(k.startswith("layer.self_attn.indexer.") for k in weights)
    if not has_indexer:
        row.layer.self_attn.indexer = NoIndexer()
    quant = config.get("quantization")
    if quant:
        def predicate(path, module):
            if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
                return False
            # The row's own names: the decoder layer sits at `layer.` here.
            saved = path[len("layer."):] if path.startswith("layer.") else path
            override = quant.get(f"{prefix}{saved}")
            return dict(override) if isinstance(override, dict) else True

        nn.quantize(row, group_size=quant["group_size"], bits=quant["bits"], mode=quant.get("mode", "affine"),
                    class_predicate=predicate)
    row.load_weights(list(weights.items()), strict=True)
    if has_indexer:
        if glm_index_share.is_glm52_schema(config):
            row.layer.self_attn.indexer.k_norm.eps = glm_index_share.REFERENCE_INDEXER_NORM_EPS
        row.layer.self_attn.indexer = MtpIndexer(row.layer.self_attn.indexer)
    mx.eval(row.parameters())
    return row, has_indexer


def greedy(logits):
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(logprobs, axis=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--schedule", type=Path, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    spec = json.loads(a.schedule.read_text())
    config = json.loads((a.model / "config.json").read_text())
    glm52 = glm_index_share.is_glm52_schema(config)
    # Shared layers have no indexer tensors: mlx-lm's model keeps its
    # unused initial indexers there (replaced by `install`).
    model, _ = load_model(a.model, strict=not glm52)
    glm_index_share.install(model, config)
    row, has_indexer = load_mtp_row(a.model, model.args, config)
    embed, head = model.model.embed_tokens, model.lm_head
    share = has_indexer and bool(config.get("index_share_for_mtp_iteration", False))
    indexer = row.layer.self_attn.indexer

    # The row's cache: latent + rope, and its indexer's keys; without an
    # indexer the second slot only satisfies mlx-lm's attention, which ties
    # the indexer cache to the latent one.
    if has_indexer:
        mtp_cache = CacheList(KVCache(), KVCache())
    else:
        unused = KVCache()
        unused.keys = unused.values = mx.zeros((1,))
        mtp_cache = CacheList(KVCache(), unused)

    def mtp_forward(tokens, hidden):
        e = row.enorm(embed(tokens))
        h = row.hnorm(hidden)
        x = row.eh_proj(mx.concatenate([e, h], axis=-1))
        length = tokens.shape[1]
        mask = create_causal_mask(length, mtp_cache[0].offset) if length > 1 else None
        return row.layer(x, mask, mtp_cache)

    cache = glm_index_share.make_cache(model, config)
    hidden = model.model(mx.array([spec["prompt"]]), cache=cache)
    anchor = hidden[:, -1:, :]
    pending = int(greedy(head(anchor))[0, -1])
    rounds, arrays = [], {}
    for r, (n, k) in enumerate(spec["rounds"]):
        tok, h, drafts = pending, anchor, []
        first, picks = mtp_cache[0].offset, None
        for step in range(n):
            if share and step > 0:
                position = mtp_cache[0].offset
                drafted = mx.arange(first + 1, position + 1).astype(picks.dtype) if picks is not None else None
                indexer.force = None if picks is None else mx.concatenate(
                    [picks, drafted.reshape(1, 1, 1, -1)], axis=-1)
            out = mtp_forward(mx.array([[tok]]), h)
            if has_indexer:
                if step == 0:
                    picks = indexer.last
                indexer.force = MtpIndexer.FREE
            tok = int(greedy(head(row.shared_head.norm(out)))[0, -1])
            drafts.append(tok)
            h = out
        verified = model.model(mx.array([[pending] + drafts]), cache=cache)
        k = min(k, len(drafts))
        nxt = int(greedy(head(verified))[0, k])
        if k < len(drafts):
            for c in cache:
                c.trim(len(drafts) - k)
        if len(drafts) > 1:
            mtp_cache.trim(len(drafts) - 1)
        if k > 0:
            mx.eval(mtp_forward(mx.array([drafts[:k]]), verified[:, :k, :]))
        latent, rope = mtp_cache[0].keys, mtp_cache[0].values
        offset = mtp_cache[0].offset
        arrays[f"latent_{r}"] = latent[..., :offset, :]
        arrays[f"rope_{r}"] = rope[..., :offset, :]
        if has_indexer:
            if mtp_cache[1].offset != offset:
                raise SystemExit(f"round {r}: indexer cache {mtp_cache[1].offset} rows, latent {offset}")
            arrays[f"index_{r}"] = mtp_cache[1].keys[..., :offset, :]
        rounds.append({"drafts": drafts, "k": k, "next": nxt, "offset": offset})
        anchor = verified[:, k:k + 1, :]
        pending = nxt

    mx.save_safetensors(f"{a.out}.safetensors", arrays)
    Path(f"{a.out}.json").write_text(json.dumps({"rounds": rounds}) + "\n")


if __name__ == "__main__":
    main()
