"""The DFlash gate's oracle: z-lab's own MLX drafter (`dflash` 0.1.0,
`dflash/model_mlx.py`: `load_draft`, `DFlashDraftModel.bind`, its forward
with the KV cache `make_cache` builds) replaying the rounds our
`dflash_trace` example recorded.

    oracle_dflash.py --drafter DIR --target DIR --trace DIR --out FILE

Per request it feeds the drafter, round by round, the target taps our run
recorded (the prefill's, then the pending token's and the accepted drafts'
rows of each verify window) exactly as `model_mlx.py`'s generation loop
feeds its `hidden`, with the block `[anchor] + [mask] * (width - 1)` (the
width our round used: `min(block_size, drafts asked + 1)`, as its loop
shrinks the last block), and takes the greedy drafts (`argmax` of the
masks' logits; a `DFlash2DraftModel` proposes through its own `propose`,
the candidate selector's greedy chain). Writes per round the context length and the drafts, for the
gate to compare with ours.

`load_draft` fetches with `huggingface_hub.snapshot_download`; here that
name is pointed at the local directory (no network). The target is loaded
with mlx-lm's `load_model`, for the embeddings and head the drafter binds.
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

from dflash import model_mlx


def load_drafter(path):
    model_mlx.snapshot_download = lambda repo, **_: str(repo)
    return model_mlx.load_draft(str(path))


def replay(draft, trace, taps):
    mask = int(draft.config.mask_token_id)
    block_size = int(draft.config.block_size)
    out = []
    for i, run in enumerate(trace["requests"]):
        cache = draft.make_cache()
        width = len(draft.config.target_layer_ids) * draft.config.hidden_size
        hidden = taps.get(f"r{i}.prefill", mx.zeros((1, 0, width), dtype=mx.float32))
        rounds = []
        for j, r in enumerate(run["rounds"]):
            w = min(block_size, r["max_tokens"] + 1)
            block = mx.array([[r["anchor"]] + [mask] * (w - 1)])
            if isinstance(draft, model_mlx.DFlash2DraftModel):
                tokens, _, _ = draft.propose(block, hidden, cache, 0.0, logits_start=1)
                drafts = tokens[0].tolist()
            else:
                logits = draft(block, hidden, cache, logits_start=1)
                drafts = mx.argmax(logits, axis=-1)[0].tolist()
            rounds.append({
                "context_len": cache[0].offset,
                "block": drafts,
                "confidence_bits": None,
                "drafts": drafts,
            })
            verified = taps.get(f"r{i}.v{j}")
            if verified is not None:
                hidden = verified[:, : r["accepted"] + 1]
        out.append({"rounds": rounds})
    return {"requests": out}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--drafter", type=Path, required=True)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--trace", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    target, _ = load_model(a.target)
    draft = load_drafter(a.drafter).bind(target)
    trace = json.loads((a.trace / "trace.json").read_text())
    taps = mx.load(str(a.trace / "taps.safetensors"))
    a.out.write_text(json.dumps(replay(draft, trace, taps)))


if __name__ == "__main__":
    main()
