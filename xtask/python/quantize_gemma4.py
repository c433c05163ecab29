"""Quantized copy of a synthetic Gemma-4 checkpoint, made by mlx-lm itself.

    quantize_gemma4.py --src DIR --dst DIR --group-size N --bits B

Loads SRC with `mlx_lm.utils.load_model` (which applies the architecture's
`sanitize`: the wrapper's renames, the split of fused expert projections),
quantizes it with `mlx_lm.utils.quantize_model` (the model's own quant
predicate: 8-bit routers), and saves weights and config in mlx-lm's format.
Then it loads DST back (strict) and checks every parameter equals the
in-memory quantized model's.
"""

import argparse
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, quantize_model, save_config, save_model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dst", type=Path, required=True)
    ap.add_argument("--group-size", type=int, required=True)
    ap.add_argument("--bits", type=int, required=True)
    args = ap.parse_args()

    model, config = load_model(args.src)
    model, config = quantize_model(model, config, args.group_size, args.bits, mode="affine")
    expected = dict(tree_flatten(model.parameters()))
    save_model(args.dst, model)
    save_config(config, args.dst / "config.json")

    loaded, _ = load_model(args.dst)
    got = dict(tree_flatten(loaded.parameters()))
    if sorted(got) != sorted(expected):
        sys.exit(f"reloaded parameter names differ: {sorted(set(got) ^ set(expected))}")
    for name, e in expected.items():
        if not mx.array_equal(e, got[name]).item():
            sys.exit(f"{name}: reloaded value differs")
    n = sum(1 for k in got if k.endswith(".scales"))
    print(f"{args.dst}: {n} quantized modules (group {args.group_size}, {args.bits} bits)", file=sys.stderr)


if __name__ == "__main__":
    main()
