"""The reference of `cargo xtask gate eagle3`: SpecForge 0.2.0's EAGLE-3
draft model (`specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3`,
torch on the CPU, in the reference environment) replaying the rounds our
`eagle3_trace` ran, from the target features it recorded.

    reference_eagle3.py PLAN.json

PLAN.json: {"run": [{"head", "target", "schedule", "tensors", "report",
"out"}, ...]}, every run in one process (importing torch is the slow part).

The head is built from its `config.json` (a `LlamaConfig` with
`draft_vocab_size`) and loaded strictly from its safetensors; a head
without `embed_tokens` takes the target's (`model.embed_tokens.weight`), as
serving engines do. SpecForge has no decoding loop for EAGLE-3 (it trains
heads), so the chain is written here from its modules: every draft step
runs the head's decoder layer (`backbone`, causal mask, positions from 0)
over the whole sequence of rows, without a cache:

  rows: (token j + 1, fc(features at j)) for the prompt's positions but the
    last; the anchor is fc(features at the last position).
  draft step (tok, h): out = backbone over rows + [(tok, h)] at its last
    position; logits = compute_logits(out) over the draft vocabulary; the
    draft id is their argmax, the token draft id + d2t[draft id]; the next
    h is out.
  commit (k accepted): rows gain (pending, anchor) and the k accepted
    tokens with fc(verified window features at 0..k); the anchor becomes
    fc(features at k); the next pending token is the target's (our report).

Writes PREFIX.json ({"rounds": [{"drafts", "k", "next", "offset"}]}) and
PREFIX.safetensors (`logits_{r}`: round r's draft logits, a row per draft).
"""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # eager: no compiler on the CPU

import torch
from safetensors.torch import load_file, save_file
from transformers.models.llama.configuration_llama import LlamaConfig

from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3


def load_head(head_dir, target_dir):
    config = json.loads((head_dir / "config.json").read_text())
    cfg = LlamaConfig(**config)
    cfg.draft_vocab_size = config["draft_vocab_size"]
    model = LlamaForCausalLMEagle3(cfg, attention_backend="sdpa").float().eval()
    state = {}
    for path in sorted(head_dir.glob("*.safetensors")):
        state.update(load_file(str(path)))
    if "embed_tokens.weight" not in state:
        target = {}
        for path in sorted(target_dir.glob("*.safetensors")):
            target.update(load_file(str(path)))
        state["embed_tokens.weight"] = target["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model


def replay(head, target, schedule, tensors, report, out):
    model = load_head(Path(head), Path(target))
    spec = json.loads(Path(schedule).read_text())
    ours = json.loads(Path(report).read_text())["rounds"]
    recorded = load_file(str(tensors))
    prompt = spec["prompt"]
    d2t = model.d2t

    tokens, hiddens = [], []

    def run(extra_tokens, extra_hiddens):
        ids = torch.tensor([tokens + extra_tokens])
        h = torch.cat(hiddens + extra_hiddens, dim=0)[None]
        n = ids.shape[1]
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        out = model.backbone(
            input_embeds=model.embed_input_ids(ids),
            hidden_states=h,
            cache_hidden=None,
            attention_mask=mask,
            position_ids=torch.arange(n)[None],
        )
        return out[0, -1:]

    projected = model.project_hidden_states(recorded["taps_prefill"])[0]
    for j in range(len(prompt) - 1):
        tokens.append(prompt[j + 1])
        hiddens.append(projected[j:j + 1])
    anchor = projected[-1:]
    pending = int(recorded["pending"][0])
    rounds, arrays = [], {}
    for r, (n, k) in enumerate(spec["rounds"]):
        tok, h, drafts, logits = pending, anchor, [], []
        extra_t, extra_h = [], []
        for _ in range(n):
            extra_t.append(tok)
            extra_h.append(h)
            result = run(extra_t, extra_h)
            row = model.compute_logits(result)[0]
            d = int(torch.argmax(row))
            tok = d + int(d2t[d])
            drafts.append(tok)
            logits.append(row)
            h = result
        k = min(k, len(drafts))
        verified = model.project_hidden_states(recorded[f"taps_{r}"])[0]
        tokens.append(pending)
        hiddens.append(anchor)
        for i in range(k):
            tokens.append(drafts[i])
            hiddens.append(verified[i:i + 1])
        anchor = verified[k:k + 1]
        nxt = ours[r]["next"]
        arrays[f"logits_{r}"] = torch.stack(logits).contiguous()
        rounds.append({"drafts": drafts, "k": k, "next": nxt, "offset": len(tokens)})
        pending = nxt

    save_file(arrays, f"{out}.safetensors")
    Path(f"{out}.json").write_text(json.dumps({"rounds": rounds}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    for job in json.loads(a.plan.read_text())["run"]:
        replay(**job)


if __name__ == "__main__":
    main()
