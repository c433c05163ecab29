"""A synthetic DFlash drafter trained on its target's own greedy text, for
`cargo xtask bench dflash` (the random drafters the gate uses accept next to
nothing, so a benchmark of them would measure nothing).

    fit_dflash.py --target DIR --steps N [--lr R] --src DIR --dst DIR

The drafter in DIR (`--src`, written by xtask with every weight random) is
loaded with z-lab's own `model_mlx.py` (`load_draft`, bound to the target's
embeddings and head, loaded with mlx-lm) and trained as DFlash drafters are:
the target greedily continues seeded random prompts shaped as the bench's
(3 to 43 tokens, half of them repeating a phrase) by 64 tokens; for
positions `p` of those continuations the drafter sees the target's taps of tokens `0..p`
(its `target_layer_ids`, as `model_mlx.py`'s hooks record them) and the
block `[token p, mask, ..]`, and learns the target's tokens `p+1..` with a
cross-entropy loss weighted down the block as DFlash's training weights it
(Adam, fixed seed). The target's embeddings and head stay
frozen (the drafter shares them). Writes the drafter's own tensors under
their names in the source file, the same config; prints on standard error
how often its greedy block agrees with the target, per block position, on
held-out positions.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from dflash import model_mlx

SEED = 20261205
SEQUENCES = 200
HELD_OUT = 20
CONTINUE = 64
BATCH = 8
# Block positions' loss weights decay as exp(-(k - 1) / DECAY).
DECAY = 4.0


def load_drafter(path):
    model_mlx.snapshot_download = lambda repo, **_: str(repo)
    return model_mlx.load_draft(str(path))


def greedy_texts(target, vocab, rng):
    """Seeded random prompts, each greedily continued by the target."""
    texts = []
    for _ in range(SEQUENCES):
        seq = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(3, 44)))]
        if rng.integers(0, 2):
            seq = seq + seq[: len(seq) // 2] + seq
        prompt_len = len(seq)
        for _ in range(CONTINUE):
            logits = target(mx.array(seq)[None])
            seq.append(int(mx.argmax(logits[0, -1]).item()))
        texts.append((seq, prompt_len))
    return texts


def samples(target, texts, block):
    """(taps of tokens 0..p, block tokens, the target's next tokens) per
    position p of each continuation with a whole block after it."""
    out = []
    for seq, prompt_len in texts:
        target(mx.array(seq)[None])
        taps = mx.concatenate(target._hidden_states, axis=-1)
        mx.eval(taps)
        for p in range(prompt_len, len(seq) - block + 1):
            out.append((taps[:, :p], seq[p], mx.array(seq[p + 1 : p + block])))
    return out


def block_logits(draft, sample, mask, block):
    taps, anchor, _ = sample
    tokens = mx.array([[anchor] + [mask] * (block - 1)])
    return draft(tokens, taps, draft.make_cache(), logits_start=1)[0]


def agreement(draft, held_out, mask, block):
    hits = np.zeros(block - 1)
    for s in held_out:
        guess = np.array(mx.argmax(block_logits(draft, s, mask, block), axis=-1))
        hits += guess == np.array(s[2])
    return hits / max(len(held_out), 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--dst", type=Path, required=True)
    a = p.parse_args()
    mx.random.seed(SEED)
    rng = np.random.default_rng(SEED)
    target, _ = load_model(a.target)
    target.freeze()
    draft = load_drafter(a.src).bind(target)
    config = json.loads((a.src / "config.json").read_text())
    mask, block = int(draft.config.mask_token_id), int(draft.config.block_size)
    model_mlx._patch_model(target, list(draft.config.target_layer_ids))
    texts = greedy_texts(target, int(config["vocab_size"]), rng)
    train = samples(target, texts[HELD_OUT:], block)
    held_out = samples(target, texts[:HELD_OUT], block)
    draft.train()

    # DFlash's position weights: a block position's loss decays with its
    # distance from the anchor (a later draft counts only if the earlier
    # ones were accepted).
    weights = mx.exp(-mx.arange(block - 1, dtype=mx.float32) / DECAY)
    weights = weights / weights.sum()

    def loss(model, batch):
        total = mx.array(0.0)
        for s in batch:
            per = nn.losses.cross_entropy(block_logits(model, s, mask, block), s[2])
            total = total + (per * weights).sum()
        return total / len(batch)

    before = agreement(draft, held_out, mask, block)
    step = nn.value_and_grad(draft, loss)
    opt = optim.Adam(learning_rate=a.lr)
    for i in range(a.steps):
        batch = [train[int(j)] for j in rng.integers(0, len(train), size=BATCH)]
        value, grads = step(draft, batch)
        opt.update(draft, grads)
        mx.eval(draft.parameters(), opt.state, value)
        if i % 100 == 0 or i == a.steps - 1:
            print(f"step {i}: loss {value.item():.3f}", file=sys.stderr)
    draft.eval()
    after = agreement(draft, held_out, mask, block)
    own = dict(tree_flatten(draft.parameters()))
    weights = mx.load(str(a.src / "model.safetensors"))
    missing = [k for k in weights if k not in own]
    if missing:
        sys.exit(f"the trained drafter has no tensors {missing}")
    fitted = {k: own[k].astype(weights[k].dtype) for k in weights}
    a.dst.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(a.dst / "model.safetensors"), fitted, metadata={"format": "mlx"})
    (a.dst / "config.json").write_text(json.dumps(config, indent=2))
    fmt = lambda xs: " ".join(f"{x:.0%}" for x in xs)
    print(
        f"{a.dst}: {len(train)} training positions, {a.steps} steps; greedy block agrees with the target per position, held out: before {fmt(before)}; after {fmt(after)}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
