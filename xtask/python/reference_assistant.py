"""Reference for the `gemma4-assistant` provider's constant-position mode:
transformers 5.24's own `SinglePositionMultiTokenCandidateGenerator` with its
Gemma-4 target (`Gemma4ForCausalLM`) and assistant
(`Gemma4AssistantForCausalLM` / `Gemma4UnifiedAssistantForCausalLM`), run in
the reference environment (torch, float32, CPU).

The synthetic checkpoints are mapped into transformers here:
- target: the `gemma4` wrapper's `text_config` becomes a `Gemma4TextConfig`
  and `model.language_model.*` tensors become `model.*` (the KV-shared
  layers' key/value tensors, which transformers does not build, are dropped;
  the head is tied);
- assistant: its config gets the `text_config` keys transformers requires of
  an assistant and our loader does not read (no per-layer inputs, no MoE,
  no double-wide MLP, every layer KV-shared); tensor names are already
  transformers'.

For each prompt: one prefill forward of the whole prompt (as the generator's
first iteration), then `get_candidates` with the pending token our engine
chose (`--ours`), drafting `--steps` tokens. The target state handed to the
generator is the prefill's: its last post-norm hidden, the full-attention
donor's every position, and the sliding donor cut to the newest
`sliding_window - 1` positions, which is what a sliding cache keeps for the
next query (transformers' own `DynamicSlidingWindowLayer` keeps that many;
the prefill forward returns every prompt position, and the assistant's
bidirectional sliding mask, `|q - kv| <= window`, would reach
`sliding_window + 1` of them). The drafts over the uncut prefill output are
written too (`raw_tokens`), for information.

Why the state after a prefill: after a round with a rejected draft,
transformers' loop hands the drafter the verify forward's keys and values,
the rejected drafts' rows included (one full-attention row, at the pending
token's index, and up to gamma sliding rows), which no target cache holds;
after a prefill its inputs are exactly the cached prompt.

Writes JSON `{"rounds": [{"pending", "target_pending", "hidden", "tokens",
"logits", "raw_tokens"}]}`.
"""
import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
    GenerationConfig,
)
from transformers.generation.candidate_generator import (
    SinglePositionMultiTokenCandidateGenerator,
)

WRAPPER_PREFIX = "model.language_model."


def load_target(directory):
    config = json.loads((directory / "config.json").read_text())
    text = config.get("text_config", config)
    text = {k: v for k, v in text.items() if k not in ("model_type", "architectures", "torch_dtype")}
    model = Gemma4ForCausalLM(Gemma4TextConfig(**text)).eval()
    tensors = load_file(str(directory / "model.safetensors"))
    prefix = WRAPPER_PREFIX if "text_config" in config else "model."
    state = {
        "model." + k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)
    }
    own = model.state_dict()
    dropped = [k for k in state if k not in own]
    for k in dropped:
        # Key/value weights of KV-shared layers: transformers builds none.
        if ".self_attn.k_" not in k and ".self_attn.v_" not in k:
            raise SystemExit(f"target tensor {k} has no place in transformers' Gemma4ForCausalLM")
        del state[k]
    missing = model.load_state_dict(state, strict=False).missing_keys
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if missing != ["lm_head.weight"] or not tied:
        raise SystemExit(f"target tensors missing in the mapping (tied head: {tied}): {missing}")
    return model, text


def load_assistant(directory):
    config = json.loads((directory / "config.json").read_text())
    model_type = config.pop("model_type")
    for key in ("architectures", "torch_dtype"):
        config.pop(key, None)
    text = config["text_config"]
    text.update(
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        enable_moe_block=False,
        use_double_wide_mlp=False,
        num_kv_shared_layers=len(text["layer_types"]),
    )
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config)).eval()
    result = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if result.unexpected_keys or result.missing_keys != ["lm_head.weight"] or not tied:
        raise SystemExit(f"assistant tensors do not map (tied head: {tied}): {result}")
    return model


def draft(target, assistant, steps, prompt, pending, outputs):
    assistant.generation_config.num_assistant_tokens = steps
    generator = SinglePositionMultiTokenCandidateGenerator(
        assistant,
        target.get_input_embeddings(),
        GenerationConfig(max_length=len(prompt) + steps + 2),
    )
    input_ids = torch.tensor([prompt + [pending]])
    candidates, logits = generator.get_candidates(
        input_ids,
        model_kwargs={"attention_mask": torch.ones_like(input_ids)},
        model_outputs=outputs,
        is_first_iteration=False,
        n_last_matches=0,
    )
    return candidates[0, len(prompt) + 1:].tolist(), logits[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--assistant", required=True, type=Path)
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--ours", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    target, text = load_target(args.target)
    assistant = load_assistant(args.assistant)
    window = text["sliding_window"]
    prompts = json.loads(args.prompts.read_text())["prompts"]
    ours = json.loads(args.ours.read_text())["rounds"]
    rounds = []
    with torch.no_grad():
        for p, mine in zip(prompts, ours):
            prompt = [int(i) for i in p["ids"]]
            ids = torch.tensor([prompt])
            outputs = target(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                use_cache=True,
                output_hidden_states=True,
                return_shared_kv_states=True,
            )
            pending = int(mine["pending"])
            raw_tokens, _ = draft(target, assistant, args.steps, prompt, pending, outputs)
            keys, values = outputs.shared_kv_states["sliding_attention"]
            keep = min(len(prompt), window - 1)
            outputs.shared_kv_states["sliding_attention"] = (keys[:, :, -keep:], values[:, :, -keep:])
            tokens, logits = draft(target, assistant, args.steps, prompt, pending, outputs)
            rounds.append({
                "pending": pending,
                "target_pending": int(outputs.logits[0, -1].argmax()),
                "hidden": outputs.hidden_states[-1][0, -1].tolist(),
                "tokens": tokens,
                "logits": logits.tolist(),
                "raw_tokens": raw_tokens,
            })
    args.out.write_text(json.dumps({"rounds": rounds}))


if __name__ == "__main__":
    main()
