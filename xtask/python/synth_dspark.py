"""Derived synthetic DSpark drafters (the random one is written by
`xtask/src/synth_dspark.rs`).

    synth_dspark.py local-target --suffix NAME --scale S --src DIR --dst DIR
    synth_dspark.py fit --target DIR --src DIR --dst DIR
    synth_dspark.py cast --dtype bfloat16 --src DIR --dst DIR
    synth_dspark.py quantize --bits 4|8 --group-size 32|64 --src DIR --dst DIR

`local-target`: a copy of a float target whose tensors named `*NAME` are
scaled by S (its attention output projections or post-attention norms), so
that its next token depends mostly on the current one (a near-bigram target
a Markov-fitted drafter can follow).

`cast`: every floating-point tensor in the given dtype (real DSpark
checkpoints ship in bfloat16).

`fit`: the Markov head becomes a rank-`markov_rank` factorisation of the
target's single-token next-token logits (row t = the target's logits after
the one-token prompt [t]), so `markov_w2(markov_w1[prev])` approximates what
the target predicts after `prev`; `lm_head` is zeroed, so each draft token is
the target's bigram preference given the previous draft token.

`quantize`: mlx's affine `mx.quantize` on every 2-D weight whose last
dimension divides by the group size (mlx-lm's rule), `embed_tokens` and
`markov_head.markov_w1` included (quantized gather tables), except
`confidence_head.*`, kept float and recorded as `false` in the config's
`quantization` block the way mlx-lm records per-module exclusions.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model

KEEP_FLOAT = "confidence_head.proj"


def local_target(args):
    config = json.loads((args.src / "config.json").read_text())
    weights = mx.load(str(args.src / "model.safetensors"))
    scaled = 0
    for name in weights:
        if name.endswith(args.suffix):
            weights[name] = mx.multiply(weights[name], mx.array(args.scale, dtype=weights[name].dtype))
            scaled += 1
    if scaled == 0:
        sys.exit(f"no tensor of {args.src} ends with {args.suffix}")
    save(args.dst, weights, config)


def cast(args):
    config = json.loads((args.src / "config.json").read_text())
    dtype = getattr(mx, args.dtype)
    weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in mx.load(str(args.src / "model.safetensors")).items()}
    config["torch_dtype"] = args.dtype
    save(args.dst, weights, config)


def fit(args):
    config = json.loads((args.src / "config.json").read_text())
    weights = mx.load(str(args.src / "model.safetensors"))
    model, _ = load_model(args.target)
    vocab, rank = config["vocab_size"], config["markov_rank"]
    logits = model(mx.arange(vocab, dtype=mx.int32)[:, None])[:, 0, :].astype(mx.float32)
    table = np.array(logits, dtype=np.float64)
    u, s, vt = np.linalg.svd(table)
    root = np.sqrt(s[:rank])
    weights["markov_head.markov_w1.weight"] = mx.array((u[:, :rank] * root).astype(np.float32))
    weights["markov_head.markov_w2.weight"] = mx.array((vt[:rank].T * root).astype(np.float32))
    weights["lm_head.weight"] = mx.zeros_like(weights["lm_head.weight"])
    approx = (u[:, :rank] * s[:rank]) @ vt[:rank]
    agree = float(np.mean(approx.argmax(1) == table.argmax(1)))
    print(f"{args.dst}: rank-{rank} Markov head keeps the target's top token for {agree:.1%} of single-token prompts", file=sys.stderr)
    save(args.dst, weights, config)


def quantize(args):
    config = json.loads((args.src / "config.json").read_text())
    if "quantization" in config or "quantization_config" in config:
        sys.exit(f"{args.src} is already quantized")
    weights = mx.load(str(args.src / "model.safetensors"))
    out, quantized = {}, 0
    for name, w in weights.items():
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or w.ndim != 2 or module == KEEP_FLOAT or w.shape[-1] % args.group_size != 0:
            out[name] = w
            continue
        wq, scales, biases = mx.quantize(w, group_size=args.group_size, bits=args.bits, mode="affine")
        out[f"{module}.weight"], out[f"{module}.scales"], out[f"{module}.biases"] = wq, scales, biases
        quantized += 1
    block = {"group_size": args.group_size, "bits": args.bits, "mode": "affine", KEEP_FLOAT: False}
    config["quantization"] = block
    config["quantization_config"] = block
    print(f"{args.dst}: {quantized} modules quantized to {args.bits} bits, group {args.group_size}", file=sys.stderr)
    save(args.dst, out, config)


def save(dst, weights, config):
    dst.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("local-target")
    t.add_argument("--suffix", required=True)
    t.add_argument("--scale", type=float, required=True)
    c = sub.add_parser("cast")
    c.add_argument("--dtype", choices=("bfloat16", "float16"), required=True)
    f = sub.add_parser("fit")
    f.add_argument("--target", type=Path, required=True)
    q = sub.add_parser("quantize")
    q.add_argument("--bits", type=int, choices=(4, 8), required=True)
    q.add_argument("--group-size", type=int, choices=(32, 64), required=True)
    for p in (t, c, f, q):
        p.add_argument("--src", type=Path, required=True)
        p.add_argument("--dst", type=Path, required=True)
    args = ap.parse_args()
    {"local-target": local_target, "cast": cast, "fit": fit, "quantize": quantize}[args.cmd](args)


if __name__ == "__main__":
    main()
