"""Gate `gguf`'s check of a quantized GGUF file kept quantized: our loader
wrote the file as two mlx-lm directories (`mlx-spec convert` with and
without `--keep-quantization`); every quantized module of the kept one,
dequantized by MLX (`mx.dequantize`, the layout mlx-lm's quantized layers
read), equals the float32 one (ggml's values, as gate `gguf` checks them
against `gguf.quants.dequantize`) value for value, and every other tensor
equals its float32 counterpart.

    gguf_keep_check.py --keep DIR --float DIR

Prints what it compared; exits non-zero on the first difference.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", required=True, type=Path)
    ap.add_argument("--float", required=True, type=Path, dest="float32")
    args = ap.parse_args()
    kept = mx.load(str(args.keep / "model.safetensors"))
    dense = mx.load(str(args.float32 / "model.safetensors"))
    quant = json.loads((args.keep / "config.json").read_text()).get("quantization", {})
    by_bits = {}
    floats = {}
    for name, want in dense.items():
        module = name.removesuffix(".weight")
        if f"{module}.scales" in kept:
            spec = quant.get(module, quant)
            bits, group = spec["bits"], spec["group_size"]
            got = mx.dequantize(
                kept[name], kept[f"{module}.scales"], kept[f"{module}.biases"],
                group_size=group, bits=bits,
            )
            key = f"{bits}-bit ({kept[f'{module}.scales'].dtype} scales)"
            by_bits[key] = by_bits.get(key, 0) + 1
        else:
            got = kept[name]
            key = str(got.dtype)
            floats[key] = floats.get(key, 0) + 1
        a = np.array(got.astype(mx.float32))
        b = np.array(want)
        if a.shape != b.shape or not np.array_equal(a, b):
            where = "shape" if a.shape != b.shape else int(np.argmax(a.ravel() != b.ravel()))
            sys.exit(f"{name}: kept and float32 differ (at {where})")
    extra = set(kept) - set(dense) - {
        f"{n.removesuffix('.weight')}.{p}" for n in dense for p in ("scales", "biases")
    }
    if extra:
        sys.exit(f"kept tensors with no float32 counterpart: {sorted(extra)}")
    if not by_bits:
        sys.exit("nothing stayed quantized")
    print(f"quantized {by_bits}; float {floats}")


if __name__ == "__main__":
    main()
