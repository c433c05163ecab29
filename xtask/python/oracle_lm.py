"""mlx-lm's side of `cargo xtask gate parity`: greedy tokens and raw logits.

    oracle_lm.py --model DIR --prompts PROMPTS.json --out OUT_PREFIX

PROMPTS.json: {"prompts": [[token ids], ...], "max_tokens": N}.

For each prompt:
  (a) the tokens of mlx-lm's own `generate_step` with an argmax sampler,
      exactly N of them (no EOS stop);
  (b) the raw logits of each step, from a loop with generate_step's exact
      schedule: prompt[:-1] prefilled through a fresh `make_prompt_cache`
      cache in chunks of `prefill_step_size`, then the last prompt token
      alone, then each generated token alone. The token of a step is the
      argmax of `logits - logsumexp(logits)`, as generate_step samples it;
      the loop's tokens must equal (a).

Writes OUT_PREFIX.json = {"runs": [{"tokens": [...]}, ...]} and
OUT_PREFIX.safetensors with float32 `logits_{i}` of shape [N, vocab]
(row s: the logits that produced token s).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

import row_order  # noqa: F401  (mlx-lm's sliding caches in time order, as ours)

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


def reference_tokens(model, prompt, max_tokens):
    steps = generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=greedy, prefill_step_size=PREFILL_STEP_SIZE
    )
    return [int(token) for token, _ in steps]


def logits_loop(model, prompt, max_tokens):
    """generate_step's schedule, keeping each step's logits."""
    cache = make_prompt_cache(model)
    prompt = mx.array(prompt)
    rows, tokens = [], []
    with mx.stream(generation_stream):
        while prompt.size > 1:
            n = min(PREFILL_STEP_SIZE, prompt.size - 1)
            model(prompt[:n][None], cache=cache)
            mx.eval([c.state for c in cache])
            prompt = prompt[n:]
        y = prompt
        for _ in range(max_tokens):
            logits = model(y[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            y = greedy(logprobs)
            mx.eval(y, logits)
            rows.append(logits.astype(mx.float32).squeeze(0))
            tokens.append(y.item())
    return tokens, mx.stack(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", required=True, help="output prefix: writes PREFIX.json and PREFIX.safetensors")
    args = ap.parse_args()

    spec = json.loads(args.prompts.read_text())
    prompts, max_tokens = spec["prompts"], int(spec["max_tokens"])
    if max_tokens < 1 or any(len(p) == 0 for p in prompts):
        sys.exit("max_tokens must be positive and every prompt non-empty")

    t0 = time.perf_counter()
    model, _ = load_model(args.model)
    t_load = time.perf_counter() - t0

    runs, arrays = [], {}
    for i, prompt in enumerate(prompts):
        expected = reference_tokens(model, prompt, max_tokens)
        tokens, logits = logits_loop(model, prompt, max_tokens)
        if tokens != expected:
            at = next(s for s, (a, b) in enumerate(zip(tokens, expected)) if a != b)
            sys.exit(
                f"prompt {i}: the logits loop diverged from generate_step at step {at} "
                f"({tokens[at]} vs {expected[at]})"
            )
        runs.append({"tokens": tokens})
        arrays[f"logits_{i}"] = logits

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(f"{args.out}.safetensors", arrays)
    Path(f"{args.out}.json").write_text(json.dumps({"runs": runs}) + "\n")
    total = time.perf_counter() - t0
    print(
        f"oracle: {args.model}: {len(prompts)} prompts x {max_tokens} tokens, "
        f"load {t_load:.2f} s, total {total:.2f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
