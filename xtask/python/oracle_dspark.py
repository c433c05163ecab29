"""Project-written reference of the DSpark drafter (no installable one
exists: DeepSpec is PyTorch and not on PyPI), in plain mlx ops, from the
facts of DeepSpec's `Gemma4DSparkModel` (the drafter's entry in
`docs/ARCHITECTURE.md`, `draft-deepspec`).

    oracle_dspark.py --drafter DIR --trace DIR --threshold T --out FILE [--keep]

Replays the rounds recorded by our `dspark_trace` example: rebuilds each
request's context from the recorded target taps (the prefill taps, then the
anchor plus the accepted rows of every verify window), and computes each
round's block independently: projectContext, the block forward, the Markov
pass and the confidence cut. Writes per round the block's tokens, the
confidence bits and the drafts kept, for the gate to compare bit for bit.

Float checkpoints run in float32; quantized ones are dequantized to float32
at load (the engine's default dtype policy) or, with `--keep`, kept packed:
`quantized_matmul` for linear layers and gathered-then-dequantized rows for
the embedding tables (the engine's `dtype=keep`).
"""

import argparse
import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np

F32 = mx.float32


def scalar(v):
    return mx.array(v, dtype=F32)


class Drafter:
    def __init__(self, path, keep=False):
        self.c = json.loads((path / "config.json").read_text())
        raw = mx.load(str(path / "model.safetensors"))
        q = self.c.get("quantization") or {}
        self.w, self.packed = {}, {}
        for name, a in raw.items():
            module, _, leaf = name.rpartition(".")
            if leaf in ("scales", "biases") and f"{module}.weight" in raw and f"{module}.scales" in raw:
                continue
            if leaf == "weight" and f"{module}.scales" in raw:
                p = q.get(module) if isinstance(q.get(module), dict) else q
                packed = (a, raw[f"{module}.scales"], raw[f"{module}.biases"], p["group_size"], p["bits"])
                if keep:
                    self.packed[module] = packed
                    continue
                a = mx.dequantize(*packed[:3], packed[3], packed[4])
            self.w[name] = a.astype(F32)
        c = self.c
        self.eps = c["rms_norm_eps"]
        self.heads, self.kv_heads, self.hd = c["num_attention_heads"], c["num_global_key_value_heads"], c["global_head_dim"]
        rope = c["rope_parameters"]["full_attention"]
        rotated = int(self.hd * rope.get("partial_rotary_factor", 1.0))
        exponents = mx.divide(mx.arange(0, rotated, 2, dtype=F32), self.hd)
        self.freqs = mx.concatenate([
            mx.multiply(scalar(rope.get("factor", 1.0)), mx.power(scalar(rope["rope_theta"]), exponents)),
            mx.full(((self.hd - rotated) // 2,), math.inf, dtype=F32),
        ])
        self.softcap = c.get("final_logit_softcapping")
        self.markov = c["markov_rank"] > 0
        self.conf_markov = c["enable_confidence_head"] and c["confidence_head_with_markov"]

    def lin(self, x, name):
        if name in self.packed:
            w, s, b, gs, bits = self.packed[name]
            return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)
        return mx.matmul(x, self.w[f"{name}.weight"].T)

    def rows(self, name, ids):
        """Rows of an embedding table (quantized ones: gather, then dequantize)."""
        if name in self.packed:
            w, s, b, gs, bits = self.packed[name]
            return mx.dequantize(mx.take(w, ids, axis=0), mx.take(s, ids, axis=0), mx.take(b, ids, axis=0), gs, bits)
        return mx.take(self.w[f"{name}.weight"], ids, axis=0)

    def norm(self, x, name):
        return mx.fast.rms_norm(x, self.w[f"{name}.weight"], self.eps)

    def rope(self, x, offset):
        return mx.fast.rope(x, self.hd, traditional=False, base=None, scale=1.0, offset=offset, freqs=self.freqs)

    def project(self, taps):
        return self.norm(self.lin(taps, "fc"), "hidden_norm")

    def context_kv(self, taps, offset):
        """Keys and values of new context rows, per layer."""
        x = self.project(taps)
        n = taps.shape[1]
        out = []
        for i in range(self.c["num_hidden_layers"]):
            p = f"layers.{i}.self_attn"
            k = self.lin(x, f"{p}.k_proj").reshape(1, n, self.kv_heads, self.hd)
            keys = self.rope(self.norm(k, f"{p}.k_norm").transpose(0, 2, 1, 3), offset)
            values = mx.fast.rms_norm(k, None, self.eps).transpose(0, 2, 1, 3)
            out.append((keys, values))
        return out

    def attention(self, i, x, ctx, offset):
        p = f"layers.{i}.self_attn"
        n = x.shape[1]
        q = self.norm(self.lin(x, f"{p}.q_proj").reshape(1, n, self.heads, self.hd), f"{p}.q_norm").transpose(0, 2, 1, 3)
        q = self.rope(q, offset)
        k = self.lin(x, f"{p}.k_proj").reshape(1, n, self.kv_heads, self.hd)
        keys = self.rope(self.norm(k, f"{p}.k_norm").transpose(0, 2, 1, 3), offset)
        values = mx.fast.rms_norm(k, None, self.eps).transpose(0, 2, 1, 3)
        if ctx is not None:
            keys = mx.concatenate([ctx[0], keys], axis=2)
            values = mx.concatenate([ctx[1], values], axis=2)
        o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=1.0)
        return self.lin(o.transpose(0, 2, 1, 3).reshape(1, n, -1), f"{p}.o_proj")

    @staticmethod
    def gelu_tanh(x):
        cubic = mx.multiply(scalar(0.044715), mx.power(x, scalar(3.0)))
        inner = mx.multiply(scalar(math.sqrt(2.0 / math.pi)), mx.add(x, cubic))
        return mx.multiply(mx.multiply(scalar(0.5), x), mx.add(scalar(1.0), mx.tanh(inner)))

    def block(self, ctx, ctx_len, anchor):
        c = self.c
        ids = mx.array([[anchor] + [c["mask_token_id"]] * (c["block_size"] - 1)], dtype=mx.uint32)
        h = mx.multiply(self.rows("embed_tokens", ids), scalar(math.sqrt(c["hidden_size"])))
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}"
            a = self.attention(i, self.norm(h, f"{p}.input_layernorm"), ctx[i] if ctx else None, ctx_len)
            h1 = mx.add(h, self.norm(a, f"{p}.post_attention_layernorm"))
            x = self.norm(h1, f"{p}.pre_feedforward_layernorm")
            x = self.lin(mx.multiply(self.gelu_tanh(self.lin(x, f"{p}.mlp.gate_proj")), self.lin(x, f"{p}.mlp.up_proj")), f"{p}.mlp.down_proj")
            h = mx.multiply(mx.add(h1, self.norm(x, f"{p}.post_feedforward_layernorm")), self.w[f"{p}.layer_scalar"])
        return self.norm(h, "norm")

    def logits(self, h):
        x = self.lin(h, "lm_head")
        if self.softcap is not None:
            s = scalar(self.softcap)
            x = mx.multiply(mx.tanh(mx.divide(x, s)), s)
        return x

    def propose(self, ctx, ctx_len, anchor):
        hidden = self.block(ctx, ctx_len, anchor)
        base = self.logits(hidden)
        tokens, prev = [], anchor
        for j in range(self.c["block_size"]):
            step = base[:, j, :]
            if self.markov:
                e = self.rows("markov_head.markov_w1", mx.array([prev], dtype=mx.uint32))
                step = mx.add(step, self.lin(e, "markov_head.markov_w2"))
            lp = mx.subtract(step, mx.logsumexp(step, axis=-1, keepdims=True))
            prev = int(mx.argmax(lp, axis=-1).item())
            tokens.append(prev)
        conf = None
        if self.c["enable_confidence_head"]:
            feats = hidden
            if self.conf_markov:
                prev_ids = mx.array([[anchor] + tokens[:-1]], dtype=mx.uint32)
                feats = mx.concatenate([hidden, self.rows("markov_head.markov_w1", prev_ids)], axis=-1)
            w, b = self.w["confidence_head.proj.weight"], self.w["confidence_head.proj.bias"]
            conf = np.array(mx.sigmoid(mx.addmm(b, feats, w.T)).astype(F32)).reshape(-1)
        return tokens, conf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--threshold", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep", action="store_true", help="run quantized weights packed (dtype=keep)")
    args = ap.parse_args()
    m = Drafter(args.drafter, keep=args.keep)
    trace = json.loads((args.trace / "trace.json").read_text())
    taps = mx.load(str(args.trace / "taps.safetensors"))
    threshold = np.float32(args.threshold)
    results = []
    for r, req in enumerate(trace["requests"]):
        ctx, ctx_len = None, 0

        def extend(rows):
            nonlocal ctx, ctx_len
            if rows.shape[1] == 0:
                return
            fresh = m.context_kv(rows, ctx_len)
            ctx = fresh if ctx is None else [
                (mx.concatenate([k0, k1], axis=2), mx.concatenate([v0, v1], axis=2)) for (k0, v0), (k1, v1) in zip(ctx, fresh)
            ]
            mx.eval(ctx)
            ctx_len += rows.shape[1]

        if f"r{r}.prefill" in taps:
            extend(taps[f"r{r}.prefill"])
        rounds = []
        for j, rnd in enumerate(req.get("rounds", [])):
            tokens, conf = m.propose(ctx, ctx_len, rnd["anchor"])
            keep = len(tokens)
            if conf is not None and threshold > 0:
                below = [i for i, c in enumerate(conf) if np.float32(c) < threshold]
                keep = below[0] if below else len(tokens)
            keep = min(keep, rnd["max_tokens"])
            rounds.append({
                "context_len": ctx_len,
                "block": tokens,
                "confidence_bits": None if conf is None else [int(np.float32(c).view(np.uint32)) for c in conf],
                "drafts": tokens[:keep],
            })
            extend(taps[f"r{r}.v{j}"][:, : rnd["accepted"] + 1, :])
        results.append({"rounds": rounds})
    args.out.write_text(json.dumps({"requests": results}))


if __name__ == "__main__":
    main()
