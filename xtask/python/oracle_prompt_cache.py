"""mlx-lm's side of `cargo xtask gate prompt-cache`: prompt-cache files
written with mlx-lm 0.32.2's `save_prompt_cache` and read with its
`load_prompt_cache`.

    oracle_prompt_cache.py --model DIR --spec SPEC.json --write FILE
    oracle_prompt_cache.py --model DIR --spec SPEC.json --read FILE --out PREFIX

SPEC.json: {"prefix": [ids], "suffix": [ids], "max_tokens": N,
"kv_cache": {"bits": B, "group_size": G} (optional: `kv_caches.prompt_cache`'s
quantized caches), "max_kv_size": N (optional: its bounded caches, every
forward then one token at a time: mlx-lm's single-token path keeps the first
positions in view, its multi-token path past the bound does not)}.

--write caches `prefix` as `mlx_lm.cache_prompt` does (a fresh
`make_prompt_cache`, `generate_step(..., max_tokens=0)`: every prefix token
runs, the last one alone) and saves it with the metadata `cache_prompt`
writes. --read runs `prefix + suffix` from a fresh cache (run 0), `suffix`
from the file's cache (run 1) and `suffix` from a cache prefilled with
`prefix` as for a file, without the file (run 2), each with generate_step's
schedule (all but
the last prompt token in chunks of 2048, the last alone, then N greedy
steps), and writes PREFIX.json = {"runs": [{"tokens": [...]}, ...]} and
PREFIX.safetensors with float32 `logits_{i}` of shape [N, vocab].
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache
from mlx_lm.utils import load_model

import row_order  # noqa: F401  (mlx-lm's sliding caches in time order, as ours)
from kv_caches import prompt_cache

PREFILL_STEP_SIZE = 2048  # generate_step's default


def run(model, cache, prompt, max_tokens, step=PREFILL_STEP_SIZE):
    """generate_step's schedule on `cache` (prompt chunks of `step`),
    keeping each step's logits."""
    prompt = mx.array(prompt)
    rows, tokens = [], []
    with mx.stream(generation_stream):
        while prompt.size > 1:
            n = min(step, prompt.size - 1)
            model(prompt[:n][None], cache=cache)
            mx.eval([c.state for c in cache])
            prompt = prompt[n:]
        y = prompt
        for _ in range(max_tokens):
            logits = model(y[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            y = mx.argmax(logprobs, axis=-1)
            mx.eval(y, logits)
            rows.append(logits.astype(mx.float32).squeeze(0))
            tokens.append(y.item())
    return tokens, mx.stack(rows)


def cached_prefix(model, prefix, kv_cache, max_kv_size, step):
    """`mlx_lm.cache_prompt`'s cache of `prefix`."""
    cache = prompt_cache(model, kv_cache, max_kv_size)
    steps = generate_step(mx.array(prefix), model, max_tokens=0, prompt_cache=cache, prefill_step_size=step)
    for _ in steps:
        pass
    return cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--write", type=Path)
    ap.add_argument("--read", type=Path)
    ap.add_argument("--out")
    args = ap.parse_args()
    spec = json.loads(args.spec.read_text())
    model, _ = load_model(args.model)
    max_kv_size = spec.get("max_kv_size")
    step = 1 if max_kv_size is not None else PREFILL_STEP_SIZE

    if args.write is not None:
        cache = cached_prefix(model, spec["prefix"], spec.get("kv_cache"), max_kv_size, step)
        metadata = {"model": str(args.model), "tokenizer_config": json.dumps({"trust_remote_code": False})}
        save_prompt_cache(str(args.write), cache, metadata)
        return

    if args.read is None or args.out is None:
        sys.exit("give --write FILE, or --read FILE and --out PREFIX")
    loaded, metadata = load_prompt_cache(str(args.read), return_metadata=True)
    if "model" not in metadata:
        sys.exit(f"{args.read}: no model in the metadata")
    # An ArraysCache (a recurrent layer's states) keeps no offset: it must
    # hold its states; the other caches tell the offset.
    if any(type(c).__name__ == "ArraysCache" and any(a is None for a in c.cache) for c in loaded):
        sys.exit(f"{args.read}: an ArraysCache without its states")
    offsets = {
        c.caches[0].offset if hasattr(c, "caches") else c.offset
        for c in loaded
        if type(c).__name__ != "ArraysCache"
    }
    if offsets != {len(spec["prefix"])}:
        sys.exit(f"{args.read}: offsets {offsets}, the prefix has {len(spec['prefix'])} tokens")
    runs, arrays = [], {}
    whole = spec["prefix"] + spec["suffix"]
    kv_cache = spec.get("kv_cache")
    split = cached_prefix(model, spec["prefix"], kv_cache, max_kv_size, step)
    runs_of = [
        (prompt_cache(model, kv_cache, max_kv_size), whole),
        (loaded, spec["suffix"]),
        (split, spec["suffix"]),
    ]
    for i, (cache, prompt) in enumerate(runs_of):
        tokens, logits = run(model, cache, prompt, int(spec["max_tokens"]), step)
        runs.append({"tokens": tokens})
        arrays[f"logits_{i}"] = logits
    mx.save_safetensors(f"{args.out}.safetensors", arrays)
    Path(f"{args.out}.json").write_text(json.dumps({"runs": runs}) + "\n")


if __name__ == "__main__":
    main()
