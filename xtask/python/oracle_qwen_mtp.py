"""The MTP oracle of `cargo xtask gate mtp` for hybrid Qwen checkpoints
(`qwen3_5`, `qwen3_5_moe`, `qwen3_next` with `mtp.*` tensors): the MTP head
written with mlx-lm's own modules and mlx ops, on the same schedule as our
`draft-qwen3-mtp/examples/qwen_mtp_trace.rs`.

    oracle_qwen_mtp.py --model DIR --schedule FILE.json --out PREFIX

The target is mlx-lm's model (which drops `mtp.*` when loading). The head
is built here from the checkpoint's `mtp.*` tensors: mlx-lm's own decoder
layer class of the target, made as a full-attention layer (its MLP as that
class builds it for the config: an expert block when the model has
experts), the target's embedding and head, plus `fc` and three RMS norms.
A Hugging Face checkpoint (depthwise conv weights `[channels, 1, kernel]`)
stores zero-centred norm scales: every 1-D weight of a module of the head
whose name holds `norm` is shifted by one, as mlx-lm shifts the stack's; a fused
`experts.gate_up_proj` is split as mlx-lm splits the stack's. The
procedure (vLLM's `qwen3_next_mtp` / `qwen3_5_mtp` proposers' layout):

  mtp(tok, h): x = fc([rmsnorm(embed(tok), pre_fc_norm_embedding);
    rmsnorm(h, pre_fc_norm_hidden)]); out = norm(layer(x)); the head's own
    key/value cache, its rope position the cache offset.
  prefill: the prompt's tokens 1.. paired with the target's post-norm
    hidden states at 0..len-2.
  draft step (tok, h): tok' = argmax(log_softmax(lm_head(out))); the next
    h is out. The first h is the target's post-norm hidden that predicted
    the pending token.
  commit (n drafted, k accepted): trim the head's cache by n - 1, then run
    the head once over the k accepted tokens paired with the verified hidden
    states at window positions 0..k.

The target's caches go back to the round's start when drafts are refused
(mlx-lm's recurrent caches cannot be trimmed): restored from a snapshot
and the accepted tokens run again.

Writes PREFIX.json ({"rounds": [{"drafts", "k", "next", "offset"}]}) and
PREFIX.safetensors (keys_{r}, values_{r}: the head's cache after round r;
keys_prefill, values_prefill: after the prefill).
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import ArraysCache, KVCache
from mlx_lm.utils import load_model

from oracle_lm import _gather_qmm_without_global_scale  # noqa: F401  (applies the shim)


class MtpHead(nn.Module):
    def __init__(self, layer_cls, args):
        super().__init__()
        h = args.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.layers = [layer_cls(args, args.full_attention_interval - 1)]
        self.norm = nn.RMSNorm(h, eps=args.rms_norm_eps)


def text_parts(model):
    """(args, text model, head function) of mlx-lm's model."""
    lm = getattr(model, "language_model", model)
    args = lm.args
    inner = lm.model
    if args.tie_word_embeddings:
        return args, inner, inner.embed_tokens.as_linear
    return args, inner, lm.lm_head


def load_head(model_dir, model, config):
    args, inner, _ = text_parts(model)
    weights = {}
    conv_hf = False
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for name, value in mx.load(str(path)).items():
            if name.endswith("linear_attn.conv1d.weight") and value.ndim == 3 and value.shape[-1] != 1:
                conv_hf = True
            if name.startswith("mtp."):
                weights[name[len("mtp."):]] = value
    if not weights:
        raise SystemExit(f"{model_dir}: no MTP head (tensors mtp.*)")
    fused = "layers.0.mlp.experts.gate_up_proj"
    if fused in weights:
        gate_up = weights.pop(fused)
        mid = gate_up.shape[-2] // 2
        weights["layers.0.mlp.switch_mlp.gate_proj.weight"] = gate_up[..., :mid, :]
        weights["layers.0.mlp.switch_mlp.up_proj.weight"] = gate_up[..., mid:, :]
        weights["layers.0.mlp.switch_mlp.down_proj.weight"] = weights.pop("layers.0.mlp.experts.down_proj")
    experts = [k for k in weights if k.startswith("layers.0.mlp.experts.") and k.endswith(".weight")]
    if experts:
        # Hugging Face's per-expert tensors (qwen3_next): stacked.
        count = 1 + max(int(k.split(".")[4]) for k in experts)
        for n in ("gate_proj", "up_proj", "down_proj"):
            weights[f"layers.0.mlp.switch_mlp.{n}.weight"] = mx.stack(
                [weights.pop(f"layers.0.mlp.experts.{e}.{n}.weight") for e in range(count)])
    if conv_hf:
        for k in list(weights):
            module, _, leaf = k.rpartition(".")
            if "norm" in module.rpartition(".")[2] and leaf == "weight" and weights[k].ndim == 1:
                weights[k] = weights[k] + 1.0
    layer_cls = type(next(l for l in inner.layers if not l.is_linear))
    head = MtpHead(layer_cls, args)
    quant = config.get("quantization") or config.get("text_config", {}).get("quantization")
    if quant:
        def predicate(path, module):
            return hasattr(module, "to_quantized") and f"{path}.scales" in weights

        nn.quantize(head, group_size=quant["group_size"], bits=quant["bits"],
                    mode=quant.get("mode", "affine"), class_predicate=predicate)
    head.load_weights(list(weights.items()), strict=True)
    mx.eval(head.parameters())
    return head


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
    args, inner, head_fn = text_parts(model)
    head = load_head(a.model, model, config)
    layer = head.layers[0]
    mtp_cache = KVCache()

    def mtp_forward(tokens, hidden):
        e = head.pre_fc_norm_embedding(inner.embed_tokens(tokens))
        h = head.pre_fc_norm_hidden(hidden)
        x = head.fc(mx.concatenate([e, h], axis=-1))
        mask = create_attention_mask(x, mtp_cache)
        return head.norm(layer(x, mask, mtp_cache))

    def cache_rows():
        n = mtp_cache.offset
        return mtp_cache.keys[..., :n, :], mtp_cache.values[..., :n, :]

    arrays = {}
    cache = model.make_cache()
    prompt = spec["prompt"]
    hidden = inner(mx.array([prompt]), cache=cache)
    if len(prompt) > 1:
        mx.eval(mtp_forward(mx.array([prompt[1:]]), hidden[:, :-1, :]))
    arrays["keys_prefill"], arrays["values_prefill"] = cache_rows()
    anchor = hidden[:, -1:, :]
    pending = int(greedy(head_fn(anchor))[0, -1])
    rounds = []
    for r, (n, k) in enumerate(spec["rounds"]):
        tok, h, drafts = pending, anchor, []
        for _ in range(n):
            out = mtp_forward(mx.array([[tok]]), h)
            tok = int(greedy(head_fn(out))[0, -1])
            drafts.append(tok)
            h = out
        snapshot = [list(c.cache) if isinstance(c, ArraysCache) else None for c in cache]
        window = [pending] + drafts
        verified = inner(mx.array([window]), cache=cache)
        mx.eval(verified)
        k = min(k, len(drafts))
        nxt = int(greedy(head_fn(verified))[0, k])
        if k < len(drafts):
            for c, saved in zip(cache, snapshot):
                if saved is None:
                    c.trim(len(window))
                else:
                    c.cache = saved
            mx.eval(inner(mx.array([window[:k + 1]]), cache=cache))
        if len(drafts) > 1:
            mtp_cache.trim(len(drafts) - 1)
        if k > 0:
            mx.eval(mtp_forward(mx.array([drafts[:k]]), verified[:, :k, :]))
        arrays[f"keys_{r}"], arrays[f"values_{r}"] = cache_rows()
        rounds.append({"drafts": drafts, "k": k, "next": nxt, "offset": mtp_cache.offset})
        anchor = verified[:, k:k + 1, :]
        pending = nxt

    mx.save_safetensors(f"{a.out}.safetensors", arrays)
    Path(f"{a.out}.json").write_text(json.dumps({"rounds": rounds}) + "\n")


if __name__ == "__main__":
    main()
