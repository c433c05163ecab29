"""The MTP oracle of `cargo xtask gate mtp`: GLM-5.x native MTP drafting and
absorption written with mlx ops, on the same schedule as our
`draft-glm52-mtp/examples/mtp_trace.rs`.

    oracle_mtp.py --model DIR --schedule FILE.json --out PREFIX

The target is mlx-lm's `glm_moe_dsa` (which drops the MTP row when loading).
The MTP row is built here from the checkpoint's `model.layers.{N}.*`
tensors: mlx-lm's own `DeepseekV32DecoderLayer` for the decoder layer, with
the DSA indexer replaced by one that selects nothing (the row attends
densely), its own KV cache, plus enorm / hnorm / eh_proj / shared_head.norm
and the target's embedding and head. The procedure (the facts of
`shared/notes/reference-semantics.md`, "GLM-5.2 native MTP"):

  draft step (tok, h): e = rmsnorm(embed(tok), enorm); hn = rmsnorm(h, hnorm);
    out = layer(eh_proj([e; hn])); tok' = argmax(log_softmax(lm_head(
    rmsnorm(out, shared_head.norm)))); the next h is out. The first h is the
    target's post-norm hidden that predicted the pending token.
  commit (n drafted, k accepted): trim the MTP cache by n - 1, then run the
    layer once over the k accepted tokens paired with the verified hidden
    states at window positions 0..k (causal mask).

Writes PREFIX.json ({"rounds": [{"drafts", "k", "next", "offset"}]}) and
PREFIX.safetensors (latent_{r}, rope_{r}: the MTP cache after round r).
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import CacheList, KVCache, make_prompt_cache
from mlx_lm.models.deepseek_v32 import DeepseekV32DecoderLayer
from mlx_lm.utils import load_model

from oracle_lm import _gather_qmm_without_global_scale  # noqa: F401  (applies the shim)


class NoIndexer(nn.Module):
    """The MTP row attends densely: no key selection."""

    def __call__(self, x, qr, mask, cache=None):
        return None


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
    quant = config.get("quantization")
    if quant:
        def predicate(path, module):
            if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
                return False
            override = quant.get(f"{prefix}{path}")
            return dict(override) if isinstance(override, dict) else True

        nn.quantize(row, group_size=quant["group_size"], bits=quant["bits"], mode=quant.get("mode", "affine"),
                    class_predicate=predicate)
    row.load_weights(list(weights.items()), strict=True)
    row.layer.self_attn.indexer = NoIndexer()
    mx.eval(row.parameters())
    return row


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
    model, _ = load_model(a.model)
    row = load_mtp_row(a.model, model.args, config)
    embed, head = model.model.embed_tokens, model.lm_head

    # The row's cache: latent + rope; the second slot only satisfies
    # mlx-lm's attention, which ties the indexer cache to the latent one.
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

    cache = make_prompt_cache(model)
    hidden = model.model(mx.array([spec["prompt"]]), cache=cache)
    anchor = hidden[:, -1:, :]
    pending = int(greedy(head(anchor))[0, -1])
    rounds, arrays = [], {}
    for r, (n, k) in enumerate(spec["rounds"]):
        tok, h, drafts = pending, anchor, []
        for _ in range(n):
            out = mtp_forward(mx.array([[tok]]), h)
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
            mtp_cache[0].trim(len(drafts) - 1)
        if k > 0:
            mx.eval(mtp_forward(mx.array([drafts[:k]]), verified[:, :k, :]))
        latent, rope = mtp_cache[0].keys, mtp_cache[0].values
        offset = mtp_cache[0].offset
        arrays[f"latent_{r}"] = latent[..., :offset, :]
        arrays[f"rope_{r}"] = rope[..., :offset, :]
        rounds.append({"drafts": drafts, "k": k, "next": nxt, "offset": offset})
        anchor = verified[:, k:k + 1, :]
        pending = nxt

    mx.save_safetensors(f"{a.out}.safetensors", arrays)
    Path(f"{a.out}.json").write_text(json.dumps({"rounds": rounds}) + "\n")


if __name__ == "__main__":
    main()
