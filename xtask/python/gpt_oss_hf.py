"""A float `gpt_oss` checkpoint (mlx-lm's layout) rewritten as OpenAI ships
gpt-oss on the Hugging Face hub: every layer's experts in MX blocks
(`mx.quantize` in mxfp4: the packed words read as bytes, `[.., groups,
16]`), the gate and up projections fused into `gate_up_proj` with their
rows (and biases) alternating, `*_blocks` / `*_scales` / `*_bias` names,
and the config's `quantization_config` `{"quant_method": "mxfp4"}`;
everything else float. mlx-lm's `sanitize` undoes this at load.

    gpt_oss_hf.py --src FLOAT_DIR --dst DIR
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx


def interleave(a, b, axis):
    """Rows (or columns) of `a` and `b` in turn along `axis`."""
    both = mx.stack([a, b], axis=axis + 1 if axis >= 0 else axis)
    shape = list(a.shape)
    shape[axis] *= 2
    return both.reshape(shape)


def blocks(words):
    """MLX's packed words `[.., cols / 8]` as MX bytes `[.., groups, 16]`."""
    as_bytes = words.view(mx.uint8)
    return as_bytes.reshape(*as_bytes.shape[:-1], -1, 16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    args = ap.parse_args()
    src, dst = Path(args.src), Path(args.dst)
    dst.mkdir(parents=True, exist_ok=True)
    weights = mx.load(str(src / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    out = {}
    for name, w in weights.items():
        if ".mlp.experts." not in name:
            out[name] = w
    layers = config["num_hidden_layers"]
    for i in range(layers):
        p = f"model.layers.{i}.mlp.experts"
        q = {}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            wq, scales = mx.quantize(weights[f"{p}.{proj}.weight"], mode="mxfp4")
            q[proj] = (wq, scales)
        (gw, gs), (uw, us) = q["gate_proj"], q["up_proj"]
        out[f"{p}.gate_up_proj_blocks"] = blocks(interleave(gw, uw, -2))
        out[f"{p}.gate_up_proj_scales"] = interleave(gs, us, -2)
        out[f"{p}.gate_up_proj_bias"] = interleave(
            weights[f"{p}.gate_proj.bias"], weights[f"{p}.up_proj.bias"], -1
        )
        dw, ds = q["down_proj"]
        out[f"{p}.down_proj_blocks"] = blocks(dw)
        out[f"{p}.down_proj_scales"] = ds
        out[f"{p}.down_proj_bias"] = weights[f"{p}.down_proj.bias"]
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "mlx"})
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.suffix not in (".safetensors",) and f.name not in ("config.json", "xtask-stamp"):
            shutil.copy(f, dst / f.name)
    print(f"{dst}: {layers} layers of experts in MX blocks, Hugging Face's names")


if __name__ == "__main__":
    main()
