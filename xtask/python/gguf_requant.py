"""Gate `gguf`'s quantized files: each float32 GGUF file given (llama.cpp's
conversion of a synthetic checkpoint) rewritten with its weights in the
block types people download (a Q4_K_M-like mix: Q4_K, Q5_K, Q6_K, Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0), its metadata and other tensors as they were.

    gguf_requant.py --out DIR [--recipe mix|q4_k] FILE.gguf...

Writes DIR/<stem>-q.gguf (`mix`, the default) or DIR/<stem>-q4_k.gguf
(`q4_k`: every weight Q4_K, the output Q6_K: types MLX's own GGUF reader
reads, which refuses Q5_0, Q5_1, Q3_K and Q5_K). gguf-py quantizes the 32-value types; it has no
k-quant quantizer, so the k-quants are quantized here (each group's range
over its 6-bit or 8-bit scale, round to nearest): any valid block is a
valid file, and what a block means is `gguf.quants.dequantize`'s, which
every check compares against. Runs in the project's environment (PyPI
`gguf`).
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

# (tensor name suffix, type, or a type per layer): the first match wins;
# the rest (norms, the router, rope factors) stay as they are.
RECIPE = [
    ("token_embd.weight", T.Q4_K),
    ("output.weight", T.Q6_K),
    ("attn_q.weight", T.Q4_K),
    ("attn_k.weight", T.Q5_K),
    ("attn_v.weight", (T.Q8_0, T.Q6_K)),
    ("attn_output.weight", T.Q5_0),
    ("ffn_gate.weight", T.Q4_K),
    ("ffn_up.weight", T.Q5_1),
    ("ffn_down.weight", (T.Q4_0, T.Q5_K)),
    ("ffn_gate_exps.weight", T.Q4_K),
    ("ffn_up_exps.weight", T.Q5_K),
    ("ffn_down_exps.weight", (T.Q4_1, T.Q6_K)),
]


# Only types MLX's own GGUF reader reads.
Q4_K_RECIPE = [("output.weight", T.Q6_K)] + [
    (suffix, T.Q4_K) for suffix, _ in RECIPE if suffix != "output.weight"
]
RECIPES = {"mix": RECIPE, "q4_k": Q4_K_RECIPE}


def target_type(name, recipe):
    for suffix, qtype in recipe:
        if name == suffix or name.endswith("." + suffix):
            if isinstance(qtype, tuple):
                layer = re.match(r"blk\.(\d+)\.", name)
                return qtype[int(layer.group(1)) % len(qtype)] if layer else qtype[0]
            return qtype
    return None


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def k_scales(x, levels):
    """Per group of 32 (x: [blocks, 8, 32]): scales and mins on 6 bits over
    float16 super-block factors; the values on `levels` steps."""
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / levels
    mins = -lo
    d = (scale.max(axis=1) / 63).astype(np.float16)
    dmin = (mins.max(axis=1) / 63).astype(np.float16)
    safe = lambda v: np.where(v == 0, 1, v.astype(np.float32))[:, None]
    sc = np.clip(np.rint(scale / safe(d)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mins / safe(dmin)), 0, 63).astype(np.uint8)
    dl = d.astype(np.float32)[:, None] * sc
    ml = dmin.astype(np.float32)[:, None] * m
    q = np.rint((x + ml[:, :, None]) / np.where(dl == 0, 1, dl)[:, :, None])
    q = np.clip(np.where(dl[:, :, None] == 0, 0, q), 0, levels).astype(np.uint8)
    packed = np.zeros((x.shape[0], 12), np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return d, dmin, packed, q


def low_nibbles(q):
    """q: [blocks, 8, 32] of 4-bit values -> ggml's 128 bytes per block
    (groups 2k and 2k+1 share 32 bytes, low nibbles first)."""
    q = q & 15
    return (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(q.shape[0], 128)


def q4_k(x):
    d, dmin, packed, q = k_scales(x, 15)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), packed, low_nibbles(q)], axis=1)


def q5_k(x):
    d, dmin, packed, q = k_scales(x, 31)
    qh = np.zeros((x.shape[0], 32), np.uint8)
    for j in range(8):
        qh |= ((q[:, j, :] >> 4) & 1) << j
    return np.concatenate(
        [f16_bytes(d), f16_bytes(dmin), packed, qh, low_nibbles(q)], axis=1
    )


def q6_k(x):
    x = x.reshape(x.shape[0], 16, 16)
    amax = np.abs(x).max(axis=2)
    scale = amax / 31
    d = (scale.max(axis=1) / 127).astype(np.float16)
    safe_d = np.where(d == 0, 1, d.astype(np.float32))[:, None]
    sc = np.clip(np.rint(scale / safe_d), -128, 127).astype(np.int8)
    dl = d.astype(np.float32)[:, None] * sc
    q = np.rint(x / np.where(dl == 0, 1, dl)[:, :, None])
    q = (np.clip(np.where(dl[:, :, None] == 0, 0, q), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(x.shape[0], 256)
    ql = np.zeros((x.shape[0], 128), np.uint8)
    qh = np.zeros((x.shape[0], 64), np.uint8)
    for e in range(256):
        half, rest = divmod(e, 128)
        ql[:, half * 64 + rest % 64] |= (q[:, e] & 15) << (4 * (rest // 64))
        qh[:, half * 32 + rest % 32] |= (q[:, e] >> 4) << (2 * (rest // 32))
    return np.concatenate([ql, qh, sc.view(np.uint8), f16_bytes(d)], axis=1)


K_QUANTIZERS = {T.Q4_K: q4_k, T.Q5_K: q5_k, T.Q6_K: q6_k}


def encode(values, qtype):
    """values: float32 [..., row] -> uint8 [..., row bytes] of type qtype."""
    rows = values.reshape(-1, values.shape[-1])
    if qtype in K_QUANTIZERS:
        blocks = rows.reshape(-1, 8, 32).astype(np.float32)
        raw = K_QUANTIZERS[qtype](blocks)
        out = raw.reshape(rows.shape[0], -1)
    else:
        out = quantize(rows, qtype)
    return out.reshape(*values.shape[:-1], -1)


def copy_metadata(reader, writer):
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub)


def requant(src, dst, recipe):
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dst), arch)
    copy_metadata(reader, writer)
    counts = {}
    for tensor in reader.tensors:
        if tensor.tensor_type != T.F32:
            sys.exit(f"{src}: {tensor.name} is {tensor.tensor_type.name}, expected F32")
        shape = [int(n) for n in reversed(tensor.shape)]
        values = np.asarray(tensor.data, dtype=np.float32).reshape(shape)
        qtype = target_type(tensor.name, recipe)
        if qtype is None:
            writer.add_tensor(tensor.name, values)
            continue
        raw = encode(values, qtype)
        back = dequantize(raw, qtype).reshape(shape)
        # A sanity bound on our quantizer, not the check: each value within
        # a step of its group's range.
        if np.abs(back - values).max() > np.abs(values).max() * 0.5:
            sys.exit(f"{tensor.name}: {qtype.name} blocks far from the weights")
        writer.add_tensor(tensor.name, raw, raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"wrote {dst.name}: {summary}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="mix")
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "q" if args.recipe == "mix" else args.recipe
    for src in args.files:
        requant(src, args.out / f"{src.stem}-{suffix}.gguf", RECIPES[args.recipe])


if __name__ == "__main__":
    main()
