"""A quantized copy of a float checkpoint, written by mlx-lm itself.

    quantize_mlx_lm.py --src DIR --dst DIR --quantization JSON

JSON holds `mode` (affine, mxfp4, nvfp4, mxfp8) and optionally `group_size`
and `bits` (absent: the mode's defaults, as `mlx_lm.convert --q-mode` takes
them), plus per-module entries keyed by module path (`{"group_size",
"bits", "mode"}`), which become the `quant_predicate` mlx-lm's mixed recipes
use: those modules get their own parameters (their own mode too), the rest
the defaults.

The steps are `mlx_lm.convert -q`'s without the tokenizer it needs
(`convert_steps`, also used by `quantize_check.py`): `load_model`, convert's
cast to the config's `torch_dtype`, `quantize_model`, `save_model`,
`save_config`. Then DST is loaded back (strict) and every parameter must equal
the quantized model's.
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.convert import MODEL_CONVERSION_DTYPES
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

from oracle_lm import _gather_qmm_without_global_scale  # noqa: F401  (quantized MoE layers run)

DEFAULT_KEYS = ("group_size", "bits", "mode")


def convert_steps(src, dst, group_size, bits, mode="affine", quant_predicate=None):
    """`mlx_lm.convert(src, dst, quantize=True, ...)` minus the tokenizer;
    returns the quantized model."""
    with contextlib.redirect_stdout(sys.stderr):  # its "[INFO] ..." lines
        model, config = load_model(Path(src), lazy=True)
        dtype = config.get("torch_dtype")
        if dtype in MODEL_CONVERSION_DTYPES:
            dtype = getattr(mx, dtype)
            cast = getattr(model, "cast_predicate", lambda _: True)
            model.update(
                tree_map_with_path(
                    lambda k, v: v.astype(dtype) if cast(k) and mx.issubdtype(v.dtype, mx.floating) else v,
                    model.parameters(),
                )
            )
        model, config = quantize_model(model, config, group_size, bits, mode=mode, quant_predicate=quant_predicate)
        save_model(Path(dst), model, donate_model=False)
        save_config(config, config_path=Path(dst) / "config.json")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dst", type=Path, required=True)
    ap.add_argument("--quantization", required=True, help="mode, defaults and per-module entries, JSON")
    args = ap.parse_args()

    spec = json.loads(args.quantization)
    overrides = {k: v for k, v in spec.items() if k not in DEFAULT_KEYS}
    predicate = (lambda path, _: dict(overrides[path]) if path in overrides else True) if overrides else None
    model = convert_steps(
        args.src, args.dst, spec.get("group_size"), spec.get("bits"), spec.get("mode", "affine"), predicate
    )
    expected = dict(tree_flatten(model.parameters()))
    loaded, config = load_model(args.dst)
    got = dict(tree_flatten(loaded.parameters()))
    if sorted(got) != sorted(expected):
        sys.exit(f"reloaded parameter names differ: {sorted(set(got) ^ set(expected))[:8]}")
    for name, e in expected.items():
        if e.dtype != got[name].dtype or not mx.array_equal(e, got[name]).item():
            sys.exit(f"{name}: reloaded value differs")
    named = [k for k in config["quantization"] if k not in DEFAULT_KEYS]
    n = sum(1 for k in got if k.endswith(".scales"))
    print(f"{args.dst}: {n} modules quantized by mlx-lm ({config['quantization']['mode']}, {len(named)} per-module entries)", file=sys.stderr)


if __name__ == "__main__":
    main()
