"""Fine-tuned adapters for a checkpoint, written by mlx-lm's own code as
`mlx_lm.lora` writes them: `cargo xtask gate parity`'s `--adapter-path` rows.

    synth_adapter.py MODEL_DIR OUT_DIR --kind lora|dora|full --layers N --seed S

The model goes through mlx-lm's own preparation for training (`freeze`,
then `linear_to_lora_layers` on its last N blocks for LoRA / DoRA, or those
blocks unfrozen for a full fine-tune), its trainable parameters are moved
off their starting values by seeded noise (a trained adapter's `lora_b`
is no longer zero), and `adapters.safetensors` holds exactly
`tree_flatten(model.trainable_parameters())`, beside the
`adapter_config.json` fields `load_adapters` reads. The layout is mlx-lm's,
not ours.
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load_model

LORA_PARAMETERS = {"rank": 8, "dropout": 0.0, "scale": 20.0}
NOISE = {"lora_b": 0.003, "m": 0.02, "full": 0.01}


def perturb(kind, name, value):
    """A trained-looking value: `lora_b` noise, DoRA's magnitudes scaled
    around 1, full weights nudged."""
    leaf = name.rsplit(".", 1)[-1]
    if kind == "full":
        return value + NOISE["full"] * mx.random.normal(value.shape, dtype=value.dtype)
    if leaf == "lora_b":
        return NOISE["lora_b"] * mx.random.normal(value.shape, dtype=value.dtype)
    if leaf == "m":
        return value * (1 + NOISE["m"] * mx.random.normal(value.shape, dtype=value.dtype))
    return value


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--kind", choices=["lora", "dora", "full"], required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()

    mx.random.seed(args.seed)
    model, _ = load_model(Path(args.model))
    model.freeze()
    if args.kind == "full":
        for layer in model.layers[-args.layers :]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(
            model, args.layers, LORA_PARAMETERS, use_dora=args.kind == "dora"
        )
    trainable = dict(tree_flatten(model.trainable_parameters()))
    if not trainable:
        raise SystemExit("no trainable parameters")
    adapted = {name: perturb(args.kind, name, v) for name, v in sorted(trainable.items())}
    mx.eval(adapted)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), adapted)
    config = {"fine_tune_type": args.kind, "num_layers": args.layers}
    if args.kind != "full":
        config["lora_parameters"] = LORA_PARAMETERS
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"synth_adapter: {args.kind}: {len(adapted)} tensors into {out}")


if __name__ == "__main__":
    main()
