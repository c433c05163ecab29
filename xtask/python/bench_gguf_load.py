"""`cargo xtask bench gguf-load`'s measurements: peak resident memory of
loading a GGUF model and decoding a few tokens, our engine kept quantized
(`--keep-dtype`) against the same file as float32 and against MLX's own GGUF
reader (`mx.load`, what a loader built on it holds), each in a process of its
own (the peak of a fresh process's one child, `RUSAGE_CHILDREN`).

    bench_gguf_load.py --engine MLX_SPEC --tokenizer-from GGUF --out DIR
                       [--prompt P] [--max-tokens N]

The model (written once into DIR): a llama of about 140M parameters (hidden
1024, 8 layers, MLP 2816, 16 heads of 64, 4 key/value heads) with random
weights and the tokenizer of `--tokenizer-from` (vocabulary 49152), float32,
then rewritten by `gguf_requant.py` in its Q4_K_M-like mix and all in Q4_K
(the output Q6_K; what MLX's own reader reads: it refuses the mix's Q5_0,
Q5_1 and Q5_K).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

HIDDEN, LAYERS, MLP, HEADS, KV_HEADS = 1024, 8, 2816, 16, 4


def write_model(path, tokenizer_from):
    src = GGUFReader(str(tokenizer_from))
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    w = GGUFWriter(str(path), "llama")
    for f in src.fields.values():
        if f.name.startswith("tokenizer."):
            vt = f.types[0]
            sub = f.types[-1] if vt == GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), vt, sub)
    head_dim = HIDDEN // HEADS
    for key, value in [
        ("block_count", LAYERS), ("embedding_length", HIDDEN),
        ("feed_forward_length", MLP), ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS), ("context_length", 2048),
        ("rope.dimension_count", head_dim),
    ]:
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    rng = np.random.default_rng(0)

    def tensor(name, *shape, std=0.02):
        w.add_tensor(name, rng.standard_normal(shape, dtype=np.float32) * std)

    tensor("token_embd.weight", vocab, HIDDEN)
    tensor("output_norm.weight", HIDDEN, std=1.0)
    for layer in range(LAYERS):
        p = f"blk.{layer}."
        tensor(p + "attn_norm.weight", HIDDEN, std=1.0)
        tensor(p + "ffn_norm.weight", HIDDEN, std=1.0)
        tensor(p + "attn_q.weight", HIDDEN, HIDDEN)
        tensor(p + "attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(p + "attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(p + "attn_output.weight", HIDDEN, HIDDEN)
        tensor(p + "ffn_gate.weight", MLP, HIDDEN)
        tensor(p + "ffn_up.weight", MLP, HIDDEN)
        tensor(p + "ffn_down.weight", HIDDEN, MLP)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def measure(cmd):
    """Runs `cmd` as a child of a fresh Python process that reports the
    child's own peak (RUSAGE_CHILDREN of a process with one child)."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "t = time.monotonic()\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "dt = time.monotonic() - t\n"
        "sys.stderr.write(r.stderr.decode()[-2000:] if r.returncode else '')\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, dt, r.returncode)\n"
        "sys.stdout.write(r.stdout.decode())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *map(str, cmd)],
                          capture_output=True, text=True)
    first, _, rest = done.stdout.partition("\n")
    kb, seconds, code = first.split()
    if code != "0":
        sys.exit(f"`{' '.join(map(str, cmd))}` failed:\n{done.stderr}")
    return int(kb) / 1024, float(seconds), rest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True, type=Path)
    ap.add_argument("--tokenizer-from", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prompt", default="The lighthouse keeper opened the bottle and read")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dense = args.out / "bench-llama-140m.gguf"
    mix = args.out / "bench-llama-140m-q.gguf"
    q4_k = args.out / "bench-llama-140m-q4_k.gguf"
    if not (mix.exists() and q4_k.exists()):
        write_model(dense, args.tokenizer_from)
        requant = Path(__file__).with_name("gguf_requant.py")
        for recipe in ("mix", "q4_k"):
            subprocess.run([sys.executable, requant, "--out", args.out,
                            "--recipe", recipe, dense], check=True)

    def generate(model, *flags):
        return [args.engine, "generate", "--model", model, "--prompt", args.prompt,
                "--max-tokens", str(args.max_tokens), *flags]

    mlx_reader = [sys.executable, "-c",
                  "import sys, mlx.core as mx; mx.eval(list(mx.load(sys.argv[1]).values()))"]
    # (name, file, command, the row its ratio is against)
    rows = [
        ("ours, float32", mix, generate(mix), None),
        ("ours, --keep-dtype", mix, generate(mix, "--keep-dtype"), 0),
        ("ours, float32", q4_k, generate(q4_k), None),
        ("ours, --keep-dtype", q4_k, generate(q4_k, "--keep-dtype"), 2),
        ("mx.load alone (MLX's reader)", q4_k, mlx_reader + [q4_k], 2),
        ("ours, float32", dense, generate(dense), None),
    ]
    results = []
    for name, model, cmd, _ in rows:
        results.append(measure(cmd)[:2])
    print(f"\n{'file':<28} {'MB':>6}  {'configuration':<30} {'peak RSS MB':>11} "
          f"{'vs float32':>10} {'wall s':>7}")
    for (name, model, _, base), (mb, seconds) in zip(rows, results):
        ratio = f"{mb / results[base][0]:.2f}x" if base is not None else "-"
        size = model.stat().st_size / 2**20
        print(f"{model.name:<28} {size:>6.1f}  {name:<30} {mb:>11.1f} {ratio:>10} {seconds:>7.2f}")


if __name__ == "__main__":
    main()
