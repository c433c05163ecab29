"""Quantized copy of a float checkpoint, in mlx-lm's saved format.

    quantize_synth.py --src DIR --dst DIR --quantization JSON

JSON is mlx-lm's `quantization` block: defaults (`group_size`, `bits`, `mode`)
plus optional per-module overrides keyed by module path, e.g.
`{"group_size": 64, "bits": 4, "mode": "affine",
  "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "affine"}}`.

Quantization uses mlx ops only (`mx.quantize`) on the saved tensors. Every
Linear / Embedding weight (a 2-D `.weight`) and every stacked one (3-D:
MultiLinear, SwitchLinear; MoE routers excepted) becomes `weight` (uint32, packed),
`scales` and (affine mode) `biases`, as `nn.QuantizedLinear` / `nn.QuantizedEmbedding` hold
them; a weight whose input dimension is not a multiple of its group size stays
float, as `mlx_lm.utils.quantize_model` leaves it. The config gets the block as
both `quantization` and `quantization_config`, as mlx-lm writes it.

Then it checks its own output against mlx-lm: `mlx_lm.utils.load_model` must
load it (strict), and quantizing the float model with
`mlx_lm.utils.quantize_model` must give bit-identical parameters and the same
config block.
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, quantize_model

QUANT_KEYS = ("group_size", "bits", "mode")


def params_for(block, module):
    override = block.get(module)
    if override is not None:
        if not isinstance(override, dict):
            sys.exit(f"override for {module} must be an object, got {override!r}")
        return {"mode": "affine", **override}
    return {"group_size": block["group_size"], "bits": block["bits"], "mode": block.get("mode", "affine")}


def quantize_weights(weights, block):
    out = {}
    for name, w in weights.items():
        module, _, leaf = name.rpartition(".")
        # 3-D weights are stacked per head or per expert (MultiLinear,
        # SwitchLinear); an MoE router (`mlp.gate`) is not a quantizable module.
        if leaf != "weight" or w.ndim < 2 or module.endswith(".mlp.gate"):
            out[name] = w
            continue
        p = params_for(block, module)
        if w.shape[-1] % p["group_size"] != 0:
            out[name] = w
            continue
        wq, scales, *biases = mx.quantize(w, group_size=p["group_size"], bits=p["bits"], mode=p["mode"])
        out[f"{module}.weight"] = wq
        out[f"{module}.scales"] = scales
        if biases:  # affine only
            out[f"{module}.biases"] = biases[0]
    return out


def check_against_mlx_lm(src, dst, block, saved):
    """Our files must be what mlx-lm itself loads and would have written.
    GLM-5.2's IndexShare layouts (shared layers without indexer tensors,
    `indexer_types` in the config) load into mlx-lm 0.32.2 only non-strictly
    (it builds an indexer on every layer): there the parameters compared are
    those the files hold (`saved`)."""
    strict = "indexer_types" not in json.loads((src / "config.json").read_text())
    loaded, loaded_config = load_model(dst, strict=strict)
    ours = dict(tree_flatten(loaded.parameters()))

    model, config = load_model(src, strict=strict)
    overrides = {k: v for k, v in block.items() if k not in QUANT_KEYS}

    def predicate(path, module):
        return dict(overrides[path]) if path in overrides else True

    with contextlib.redirect_stdout(sys.stderr):  # its "[INFO] Quantized model ..." line
        model, ref_config = quantize_model(
            model, config, block["group_size"], block["bits"], mode=block.get("mode", "affine"),
            quant_predicate=predicate,
        )
    ref = dict(tree_flatten(model.parameters()))
    if not strict:
        ref = {k: v for k, v in ref.items() if k in saved}
        ours = {k: v for k, v in ours.items() if k in saved}
    if sorted(ref) != sorted(ours):
        sys.exit(f"parameter names differ from mlx-lm's: {sorted(set(ref) ^ set(ours))}")
    for name, r in ref.items():
        o = ours[name]
        if r.dtype != o.dtype or r.shape != o.shape or not mx.array_equal(r, o).item():
            sys.exit(f"{name}: differs from mlx-lm's quantize_model ({o.dtype}{o.shape} vs {r.dtype}{r.shape})")
    written = loaded_config["quantization"]
    if not strict:
        # mlx-lm drops the MTP row: entries for its modules are ours alone.
        modules = {path for path, _ in model.named_modules()}
        written = {k: v for k, v in written.items() if k in QUANT_KEYS or k in modules}
    if ref_config["quantization"] != written:
        sys.exit(f"quantization block {written} != mlx-lm's {ref_config['quantization']}")
    n_quantized = sum(1 for k in ours if k.endswith(".scales"))
    print(f"{dst}: {n_quantized} quantized modules, bit-identical to mlx_lm.utils.quantize_model", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dst", type=Path, required=True)
    ap.add_argument("--quantization", required=True, help="mlx-lm quantization block, JSON")
    args = ap.parse_args()

    block = json.loads(args.quantization)
    config = json.loads((args.src / "config.json").read_text())
    if "quantization" in config or "quantization_config" in config:
        sys.exit(f"{args.src} is already quantized")
    weights = mx.load(str(args.src / "model.safetensors"))

    args.dst.mkdir(parents=True, exist_ok=True)
    quantized = quantize_weights(weights, block)
    mx.save_safetensors(str(args.dst / "model.safetensors"), quantized, metadata={"format": "mlx"})
    config["quantization"] = block
    config["quantization_config"] = block
    (args.dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    check_against_mlx_lm(args.src, args.dst, block, set(quantized))


if __name__ == "__main__":
    main()
