"""The model publishers' reference code (transformers on torch, CPU) for gate
`reference`, in one process so torch is imported once.

    reference_lm.py PLAN.json

PLAN.json holds two lists:

- "write": [{"config": {...}, "seed": N, "dir": DIR, "original_format": B}]:
  a checkpoint saved the way a user gets one. `config` is a transformers
  config dict (its
  `model_type` picks the class); the model is a seeded random init, its
  weights redrawn at scales that keep activations and logits away from
  zero (transformers' own init, std 0.02, makes every logit nearly equal),
  then `save_pretrained(DIR)` writes the Hugging Face layout in float32
  (per-expert tensors as published, or with "original_format": false
  transformers' fused ones). A config with a `vision_config` is written as
  the multimodal model it describes (`AutoModelForImageTextToText`: the
  published checkpoint's class and tensor names, vision tower included).
- "run": [{"model": DIR, "prompts": FILE, "out": PREFIX}]: greedy decoding
  with transformers' model and cache. FILE is `{"prompts": [[ids]],
  "max_tokens": N}`; PREFIX.json gets `{"runs": [{"tokens": [...]}]}` and
  PREFIX.safetensors float32 `logits_{i}` [N, vocab], row s = the logits
  that chose token s (the layout of gate `parity`).

Gated DeltaNet (Qwen3-Next, Qwen3.5): transformers takes flash-linear-
attention's and causal-conv1d's kernels when those packages import, else its
own torch functions. The reference is the torch path on the CPU, checked
here (`torch_paths_only`): `causal_conv1d_fn` / `causal_conv1d_update` for
the conv, `torch_chunk_gated_delta_rule` (chunks of 64 positions) for a
prompt and `torch_recurrent_gated_delta_rule` (one position) for each
decoded token, each deterministic on one thread. Its hybrid cache
(`DynamicCache` with linear-attention layers holding the conv and recurrent
states) comes back from the model like any other.
"""

import importlib.util
import json
import sys
import zlib

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

torch.set_num_threads(1)


def generator(seed, name):
    g = torch.Generator()
    g.manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 63))
    return g


def redraw(name, t, seed):
    """New values for tensor `name`: a deterministic function of the seed,
    the name and the shape, independent of the order tensors come in."""
    g = generator(seed, name)
    noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
    if t.dim() == 1 or name.endswith("layer_scalar"):
        if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
            return 0.1 * noise
        # Norm scales and layer scalars: near one, not one, so a convention
        # that stores them with an offset (1 + w) would show.
        return 1.0 + 0.1 * noise
    # Linear and stacked-expert weights [..., out, in]: unit-variance
    # outputs. Embedding tables too: entries of 1/sqrt(hidden) keep the
    # token's own embedding from dominating the residual stream (with a tied
    # head and Gemma's sqrt(hidden) input scale, the model would otherwise
    # repeat its input token forever).
    return noise / t.shape[-1] ** 0.5


def torch_paths_only():
    """Refuses to run where transformers would take another Gated DeltaNet
    or conv implementation than its torch one (see the module docs)."""
    for package in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            sys.exit(f"package `{package}` is installed: transformers would use its kernels, not the torch reference")


def write(item):
    fields = dict(item["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(item["seed"])
    auto = AutoModelForImageTextToText if fields.get("vision_config") else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Every parameter, and the one buffer a checkpoint stores (GLM's
        # router bias); the others (RoPE tables, embedding scale) are derived.
        state = dict(model.named_parameters())
        state.update(
            (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
        )
        for name, t in sorted(state.items()):
            t.copy_(redraw(name, t, item["seed"]))
    model.save_pretrained(item["dir"], save_original_format=item["original_format"])


def greedy(model, prompt, max_tokens):
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    tokens, rows = [], []
    for step in range(max_tokens):
        row = out.logits[0, -1].float()
        token = int(torch.argmax(row))
        tokens.append(token)
        rows.append(row.clone())
        if step + 1 < max_tokens:
            out = model(
                input_ids=torch.tensor([[token]], dtype=torch.long),
                cache=cache,
                use_cache=True,
            )
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
    return tokens, torch.stack(rows)


def run(item):
    # The eager paths: the modeling files' own attention and per-expert
    # loop (the default `grouped_mm` experts kernel is another computation).
    model = AutoModelForCausalLM.from_pretrained(
        item["model"],
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
    )
    model.eval()
    with open(item["prompts"]) as f:
        prompts = json.load(f)
    runs, tensors = [], {}
    with torch.no_grad():
        for i, prompt in enumerate(prompts["prompts"]):
            tokens, logits = greedy(model, prompt, prompts["max_tokens"])
            runs.append({"tokens": tokens})
            tensors[f"logits_{i}"] = logits.contiguous()
    with open(item["out"] + ".json", "w") as f:
        json.dump({"runs": runs}, f)
    save_file(tensors, item["out"] + ".safetensors")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: reference_lm.py PLAN.json")
    torch_paths_only()
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    for item in plan.get("write", []):
        write(item)
    for item in plan.get("run", []):
        run(item)


if __name__ == "__main__":
    main()
