"""mlx-lm's side of `cargo xtask gate parity`: greedy tokens and raw logits.

    oracle_lm.py --job DIR PROMPTS.json OUT_PREFIX [--job ...]

One process for every checkpoint of the gate (mlx-lm's import costs a
second a process). PROMPTS.json: {"prompts": [[token ids], ...],
"max_tokens": N, "kv_cache": {"bits": B, "group_size": G} (optional)}.

With "decoding" (`run_protocol::greedy::Decoding`), mlx-lm's own
`make_logits_processors` run before each choice (the logits recorded are
theirs after them) and each step's log-probabilities go through mlx-lm's
`make_sampler`, whose final `categorical_sampling` is replaced by one that
records the distribution it would draw from (`probs_{i}`, float32
[N, vocab]) and returns the argmax.

With "kv_cache" ({"bits", "group_size", "start"}), keys and values are
quantized as `kv_caches` says: from the first token (start 0), or by
mlx-lm's own conversion at the start. With "max_kv_size" N, every
`KVCache` is mlx-lm's `RotatingKVCache(N, keep=4)` (`kv_caches`). With
"adapter_path", the model loads with that fine-tuned adapter, as
`mlx_lm.utils.load(adapter_path=...)` does.

For each job and prompt: the tokens of mlx-lm's own `generate_step` with an
argmax sampler, exactly N of them (no EOS stop), and the raw logits of each
of its steps, taken by a logits processor that returns them unchanged (it
runs between the model's forward and `logits - logsumexp(logits)`, which
the sampler reads).

Writes OUT_PREFIX.json = {"runs": [{"tokens": [...]}, ...]},
OUT_PREFIX.safetensors with float32 `logits_{i}` of shape [N, vocab]
(row s: the logits that produced token s) and OUT_PREFIX.seconds (the
job's wall time). A job that fails writes OUT_PREFIX.error instead and the
others still run; the exit status is 1 if any failed.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import sample_utils
from mlx_lm.generate import generate_step
from mlx_lm.tuner.utils import load_adapters
from mlx_lm.utils import load_model

import row_order  # noqa: F401  (mlx-lm's sliding caches in time order, as ours)
from kv_caches import generate_kwargs, prompt_cache

PREFILL_STEP_SIZE = 2048  # generate_step's default


def _gather_qmm_without_global_scale():
    """mlx-lm 0.32.2's QuantizedSwitchLinear passes `global_scale=None` to
    `mx.gather_qmm`, which mlx 0.32.2 does not accept: quantized MoE models
    (glm_moe_dsa) fail in mlx-lm itself. Dropping the argument when it is
    None changes nothing else (None means no global scale)."""
    original = mx.gather_qmm

    def gather_qmm(*args, global_scale=None, **kwargs):
        if global_scale is not None:
            raise NotImplementedError("gather_qmm with a global scale needs a newer mlx")
        return original(*args, **kwargs)

    mx.gather_qmm = gather_qmm


_gather_qmm_without_global_scale()


def greedy(logprobs):
    return mx.argmax(logprobs, axis=-1)


def decoders(decoding):
    """mlx-lm's processors and a sampler recording its distributions."""
    if decoding is None:
        return [], None, None
    processors = sample_utils.make_logits_processors(
        logit_bias={int(t): float(b) for t, b in decoding["logit_bias"]} or None,
        **{
            f"{name}_penalty": decoding[name][0]
            for name in ("repetition", "presence", "frequency")
            if decoding[name] is not None
        },
        **{
            f"{name}_context_size": decoding[name][1]
            for name in ("repetition", "presence", "frequency")
            if decoding[name] is not None
        },
    )
    probs = []

    def recording(logits, temp):
        probs.append(mx.softmax(logits * (1.0 / temp), axis=-1, precise=True))
        return mx.argmax(logits, axis=-1)

    sample_utils.categorical_sampling = recording
    sampler = sample_utils.make_sampler(
        temp=decoding["temperature"],
        top_p=decoding["top_p"],
        min_p=decoding["min_p"],
        min_tokens_to_keep=decoding["min_tokens_to_keep"],
        top_k=decoding["top_k"],
        xtc_probability=decoding["xtc_probability"],
        xtc_threshold=decoding["xtc_threshold"],
        xtc_special_tokens=decoding["xtc_special_tokens"],
    )
    return processors, sampler, probs


def tokens_and_logits(model, prompt, max_tokens, kv_cache=None, decoding=None, max_kv_size=None):
    """generate_step's tokens, the logits each came from (after the
    processors) and, with decoding, the sampler's distributions."""
    seen = []
    processors, sampler, probs = decoders(decoding)

    def record(_tokens, logits):
        seen.append(logits)
        if sampler is not None:
            # generate_step's log-probabilities of these logits.
            sampler(logits - mx.logsumexp(logits, keepdims=True))
        return logits

    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=max_tokens,
        sampler=greedy,
        logits_processors=processors + [record],
        prefill_step_size=PREFILL_STEP_SIZE,
        prompt_cache=prompt_cache(model, kv_cache, max_kv_size),
        **generate_kwargs(kv_cache),
    )
    tokens = [int(token) for token, _ in steps]
    # generate_step computes one step ahead: the last is never sampled.
    rows = [row.astype(mx.float32).squeeze(0) for row in seen[: len(tokens)]]
    if probs is None:
        return tokens, mx.stack(rows), None
    dist = [p.astype(mx.float32).squeeze(0) for p in probs[: len(tokens)]]
    return tokens, mx.stack(rows), mx.stack(dist)


def run_job(model_dir, prompts_file, out):
    spec = json.loads(Path(prompts_file).read_text())
    prompts, max_tokens = spec["prompts"], int(spec["max_tokens"])
    if max_tokens < 1 or any(len(p) == 0 for p in prompts):
        raise ValueError("max_tokens must be positive and every prompt non-empty")

    t0 = time.perf_counter()
    model, _ = load_model(Path(model_dir))
    if spec.get("adapter_path"):
        model = load_adapters(model, spec["adapter_path"])
        model.eval()
    t_load = time.perf_counter() - t0

    runs, arrays = [], {}
    for i, prompt in enumerate(prompts):
        tokens, logits, probs = tokens_and_logits(
            model,
            prompt,
            max_tokens,
            spec.get("kv_cache"),
            spec.get("decoding"),
            spec.get("max_kv_size"),
        )
        if len(tokens) != max_tokens:
            raise RuntimeError(f"prompt {i}: generate_step gave {len(tokens)} tokens, not {max_tokens}")
        runs.append({"tokens": tokens})
        arrays[f"logits_{i}"] = logits
        if probs is not None:
            arrays[f"probs_{i}"] = probs

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(f"{out}.safetensors", arrays)
    Path(f"{out}.json").write_text(json.dumps({"runs": runs}) + "\n")
    total = time.perf_counter() - t0
    Path(f"{out}.seconds").write_text(f"{total}\n")
    print(
        f"oracle: {model_dir}: {len(prompts)} prompts x {max_tokens} tokens, "
        f"load {t_load:.2f} s, total {total:.2f} s",
        file=sys.stderr,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--job",
        nargs=3,
        action="append",
        required=True,
        metavar=("DIR", "PROMPTS", "OUT"),
        help="a checkpoint, its prompts file and the output prefix",
    )
    args = ap.parse_args()
    failed = 0
    for model_dir, prompts_file, out in args.job:
        try:
            run_job(model_dir, prompts_file, out)
        except Exception as e:  # noqa: BLE001  (one checkpoint's failure is its own)
            failed += 1
            message = f"{type(e).__name__}: {e}"
            print(f"oracle: {model_dir}: {message}", file=sys.stderr)
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(f"{out}.error").write_text(message + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
