"""Oracle for the `gemma4-assistant` provider: optiq 0.7.7's own code.

spec: runs `optiq.runtime.spec.spec_generate` (greedy, one target forward
per round) with the Gemma-4 target loaded by mlx-lm and the assistant loaded
by optiq's `GemmaAssistantDrafter.from_pretrained`, for every prompt and
gamma, and writes the emitted tokens and optiq's stats (drafted, accepted,
target calls) as JSON.

step: runs `GemmaAssistantDrafter.forward` on the inputs of a safetensors
file (`emb.N`, `hidden.N`, `sk.N`, `sv.N`, `fk.N`, `fv.N`, `pos.N`) and
writes `logits.N` and `next_hidden.N`, for a bitwise comparison of one
drafter step.

Run with the project venv's python (venv::python_command preloads the
OpenBLAS our engine uses, so equal op sequences give equal bits).
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model
from optiq.runtime.spec import GemmaAssistantDrafter, SpecConfig, spec_generate

import row_order  # noqa: F401  (mlx-lm's sliding caches in time order, as ours)


class IdsTokenizer:
    """spec_generate tokenizes a prompt string; ours are token ids already."""

    eos_token_id = None

    def __init__(self, ids):
        self.ids = ids

    def encode(self, _prompt):
        return list(self.ids)

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def run_spec(args):
    target, _ = load_model(Path(args.target))
    drafter = GemmaAssistantDrafter.from_pretrained(args.assistant)
    prompts = json.loads(Path(args.prompts).read_text())["prompts"]
    runs = []
    for gamma in [int(g) for g in args.gammas.split(",")]:
        for i, p in enumerate(prompts):
            # eos -1: never matches, as our gate runs without an EOS.
            cfg = SpecConfig(gamma=gamma, max_tokens=args.max_tokens, eos_token_id=-1)
            tokens, stats = [], None
            for ev in spec_generate(target, drafter, IdsTokenizer(p["ids"]), "", cfg):
                if ev.kind == "token":
                    tokens.append(ev.token_id)
                else:
                    stats = ev.stats
            runs.append({
                "gamma": gamma,
                "prompt": i,
                "tokens": tokens,
                "drafted": stats.n_drafted,
                "accepted": stats.n_accepted,
                "target_calls": stats.n_target_calls,
            })
    Path(args.out).write_text(json.dumps({"runs": runs}))


def run_step(args):
    drafter = GemmaAssistantDrafter.from_pretrained(args.assistant)
    inputs = mx.load(args.inputs)
    out = {}
    n = len([k for k in inputs if k.startswith("emb.")])
    for i in range(n):
        shared_kv = {
            "sliding_attention": (inputs[f"sk.{i}"], inputs[f"sv.{i}"]),
            "full_attention": (inputs[f"fk.{i}"], inputs[f"fv.{i}"]),
        }
        logits, hidden = drafter.forward(
            last_token_emb=inputs[f"emb.{i}"],
            target_hidden=inputs[f"hidden.{i}"],
            shared_kv=shared_kv,
            position=int(inputs[f"pos.{i}"].item()),
        )
        out[f"logits.{i}"] = logits
        out[f"next_hidden.{i}"] = hidden
    mx.eval(out)
    mx.save_safetensors(args.out, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["spec", "step"])
    ap.add_argument("--assistant", required=True)
    ap.add_argument("--target")
    ap.add_argument("--prompts")
    ap.add_argument("--gammas", default="1,2,3")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--inputs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.mode == "spec":
        run_spec(args)
    else:
        run_step(args)


if __name__ == "__main__":
    main()
