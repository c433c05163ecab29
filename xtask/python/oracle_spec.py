"""mlx-lm's speculative decoding (`speculative_generate_step`, what
`mlx_lm.generate --draft-model` runs) on token-id prompts: the oracle of the
draft-model parity gate.

usage: oracle_spec.py --model DIR --draft-model DIR --prompts FILE --num-draft N
                      --max-tokens N --eos ID[,ID...] --out FILE
FILE: {"prompts": [[ids...], ...]}; output {"runs": [{"tokens": [...]}]}, each
cut before the first EOS as mlx-lm's stream_generate stops there.
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import speculative_generate_step
from mlx_lm.utils import load_model

import row_order  # noqa: F401  (mlx-lm's sliding caches in time order, as ours)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--num-draft", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--eos", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    eos = {int(t) for t in args.eos.split(",") if t}
    model, _ = load_model(Path(args.model))
    draft, _ = load_model(Path(args.draft_model))
    prompts = json.load(open(args.prompts))["prompts"]
    runs = []
    for ids in prompts:
        tokens = []
        for token, _, _ in speculative_generate_step(
            mx.array(ids, mx.uint32),
            model,
            draft,
            num_draft_tokens=args.num_draft,
            max_tokens=args.max_tokens,
            sampler=lambda x: mx.argmax(x, axis=-1),
        ):
            token = int(token)
            if token in eos:
                break
            tokens.append(token)
        runs.append({"tokens": tokens})
    json.dump({"runs": runs}, open(args.out, "w"))


if __name__ == "__main__":
    main()
