"""The reference side of `cargo xtask gate gguf`: one GGUF file holding a
tensor of every ggml type mlx-spec loads, and each tensor dequantized to
float32 by `gguf.quants.dequantize` (PyPI `gguf`, the reference Python port
of ggml's dequantization).

    gguf_types.py --out DIR

Writes DIR/types.gguf and DIR/<tensor name>.f32 (float32, little-endian,
row-major). Float types and the types gguf-py can quantize start from random
floats; the k-quants (no quantizer in gguf-py) are random blocks whose
float16 scale fields are set to finite values.
"""

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

ROWS = 3
COLS = 512  # two k-quant super-blocks per row

# Byte offsets of the float16 fields in each k-quant block.
K_HALF_FIELDS = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
QUANTIZED = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def k_blocks(rng, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for at in K_HALF_FIELDS[qtype]:
        halves = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, at:at + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(ROWS, -1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261201)
    writer = GGUFWriter(str(out / "types.gguf"), "llama")
    tensors = {}
    floats = rng.standard_normal((ROWS, COLS)).astype(np.float32) * 0.1
    tensors["t.f32"] = (floats, None)
    for qtype in QUANTIZED:
        tensors[f"t.{qtype.name.lower()}"] = (quantize(floats, qtype), qtype)
    for qtype in K_HALF_FIELDS:
        tensors[f"t.{qtype.name.lower()}"] = (k_blocks(rng, qtype), qtype)
    for name, (data, qtype) in tensors.items():
        if qtype is None:
            writer.add_tensor(name, data)
            reference = data
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)
            reference = dequantize(data, qtype)
        reference = np.ascontiguousarray(reference, dtype=np.float32).reshape(ROWS, COLS)
        if not np.isfinite(reference).all():
            raise SystemExit(f"{name}: the reference holds non-finite values")
        reference.astype("<f4").tofile(out / f"{name}.f32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {len(tensors)} tensors to {out / 'types.gguf'}")


if __name__ == "__main__":
    main()
