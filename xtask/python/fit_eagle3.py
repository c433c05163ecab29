"""A synthetic EAGLE-3 head trained on its target's own greedy text, for
`cargo xtask bench eagle3` (the random heads the gate uses accept next to
nothing, so a benchmark of them would measure nothing). Runs in the
reference environment (torch, transformers, SpecForge 0.2.0).

    fit_eagle3.py --target DIR --steps N --src DIR --dst DIR

The head in DIR (`--src`, written by xtask with every weight random) is
built as SpecForge's `LlamaForCausalLMEagle3` (as `reference_eagle3.py`
builds it) and trained the way SpecForge trains heads, on a small scale:
the target (transformers' llama, float32) greedily continues seeded random
prompts; its features at each position are the inputs of the layers
`eagle_aux_hidden_state_layer_ids` names, concatenated; row `j` of the
head's sequence is (token `j + 1`, fc(features at `j`)) and its output
learns token `j + 2`; the next steps feed the head's own output back (rows after the
target rows up to `j`, with tokens `j + 2`, `j + 3`, ..) and learn the
token after each, as the chain drafts (`DEPTH` steps in all). The draft vocabulary becomes the
`draft_vocab_size` tokens the training text uses most (`d2t`, `t2d`
rewritten), as SpecForge builds it. The target's embedding stays frozen and
is not written. Prints on standard error how often the head's first draft and its later
ones equal the target's tokens on held-out text.
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # eager: no compiler on the CPU

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.llama.configuration_llama import LlamaConfig

from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

SEED = 20261205
SEQUENCES = 96
HELD_OUT = 16
CONTINUE = 40
BATCH = 8
CHAIN_ROWS = 4
# Chain steps trained (the first over whole texts, the others at CHAIN_ROWS rows).
DEPTH = 4


def greedy_texts(target, vocab, rng):
    texts = []
    with torch.no_grad():
        for _ in range(SEQUENCES):
            seq = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(6, 14)))]
            for _ in range(CONTINUE):
                logits = target(torch.tensor([seq])).logits
                seq.append(int(torch.argmax(logits[0, -1])))
            texts.append(seq)
    return texts


def features(target, seq, aux):
    with torch.no_grad():
        hs = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i] for i in aux], dim=-1)


def draft_maps(texts, vocab, draft_vocab):
    counts = np.bincount(np.concatenate([np.array(t) for t in texts]), minlength=vocab)
    top = sorted(np.argsort(-counts, kind="stable")[:draft_vocab].tolist())
    d2t = torch.tensor([t - i for i, t in enumerate(top)], dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[top] = True
    return d2t, t2d, {t: i for i, t in enumerate(top)}


def causal(n):
    return torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]


def run(model, tokens, hidden):
    n = tokens.shape[1]
    return model.backbone(
        input_embeds=model.embed_input_ids(tokens),
        hidden_states=hidden,
        cache_hidden=None,
        attention_mask=causal(n),
        position_ids=torch.arange(n)[None],
    )


def labels_of(tokens, to_draft):
    return torch.tensor([to_draft.get(int(t), -100) for t in tokens])


def losses(model, seq, feats, to_draft, rng, count=None):
    """The first and second steps' losses (and hit counts) on one text."""
    t = torch.tensor([seq])
    h = model.project_hidden_states(feats)
    # Rows j = 0..T-3: (token j + 1, fc(features j)), learning token j + 2.
    out = run(model, t[:, 1:-1], h[:, :-2])
    logits = model.compute_logits(out)[0]
    first = labels_of(seq[2:], to_draft)
    loss1 = F.cross_entropy(logits, first, ignore_index=-100)
    hits1 = ((logits.argmax(-1) == first) & (first >= 0)).sum().item()
    # The chain's later steps at a few rows: the target rows up to j, then
    # the head's own outputs with tokens j + 2, j + 3, .., learning the token
    # after each (teacher forcing, as SpecForge's training-time test).
    last = len(seq) - 1 - DEPTH
    rows = rng.choice(last, size=min(count or CHAIN_ROWS, last), replace=False)
    loss2, hits2, n2 = 0.0, 0, 0
    for j in rows.tolist():
        tokens, hidden, prev = t[:, 1 : j + 2], h[:, : j + 1], out[:, j : j + 1]
        for d in range(2, DEPTH + 1):
            tokens = torch.cat([tokens, t[:, j + d : j + d + 1]], dim=1)
            hidden = torch.cat([hidden, prev], dim=1)
            prev = run(model, tokens, hidden)[:, -1:]
            row = model.compute_logits(prev)[0, 0]
            want = labels_of([seq[j + d + 1]], to_draft)
            if want[0] >= 0:
                loss2 = loss2 + F.cross_entropy(row[None], want)
                hits2 += int(int(row.argmax()) == int(want[0]))
            n2 += 1
    return loss1, loss2 / max(n2, 1), hits1, len(seq) - 2, hits2, n2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--dst", type=Path, required=True)
    a = p.parse_args()
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    config = json.loads((a.src / "config.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    for param in target.parameters():
        param.requires_grad_(False)
    vocab, draft_vocab = config["vocab_size"], config["draft_vocab_size"]
    aux = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    texts = greedy_texts(target, vocab, rng)
    d2t, t2d, to_draft = draft_maps(texts[HELD_OUT:], vocab, draft_vocab)
    feats = [features(target, s, aux) for s in texts]

    cfg = LlamaConfig(**config)
    cfg.draft_vocab_size = draft_vocab
    model = LlamaForCausalLMEagle3(cfg, attention_backend="sdpa").float()
    state = load_file(str(a.src / "model.safetensors"))
    own_keys = set(state)
    state["d2t"], state["t2d"] = d2t, t2d
    if "embed_tokens.weight" not in state:
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    model.load_state_dict(state, strict=True)
    if "embed_tokens.weight" not in own_keys:
        model.embed_tokens.weight.requires_grad_(False)
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.Adam(trainable, lr=3e-3)

    def held_out():
        model.eval()
        h1 = n1 = h2 = n2 = 0
        with torch.no_grad():
            for s, f in zip(texts[:HELD_OUT], feats[:HELD_OUT]):
                _, _, a1, b1, a2, b2 = losses(model, s, f, to_draft, np.random.default_rng(0), count=12)
                h1, n1, h2, n2 = h1 + a1, n1 + b1, h2 + a2, n2 + b2
        model.train()
        return h1 / max(n1, 1), h2 / max(n2, 1)

    before = held_out()
    model.train()
    for step in range(a.steps):
        opt.zero_grad()
        total = 0.0
        for i in rng.integers(HELD_OUT, len(texts), size=BATCH).tolist():
            l1, l2, *_ = losses(model, texts[i], feats[i], to_draft, rng)
            total = total + l1 + 0.5 * l2
        total = total / BATCH
        total.backward()
        opt.step()
        if step % 100 == 0 or step == a.steps - 1:
            print(f"step {step}: loss {total.detach().item():.3f}", file=sys.stderr)
    after = held_out()
    trained = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k in own_keys}
    a.dst.mkdir(parents=True, exist_ok=True)
    save_file(trained, str(a.dst / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(a.src / "config.json", a.dst / "config.json")
    print(
        f"{a.dst}: {a.steps} steps; held out, the first draft equals the target's token "
        f"{before[0]:.0%} -> {after[0]:.0%}, drafts 2 to {DEPTH} {before[1]:.0%} -> {after[1]:.0%}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
