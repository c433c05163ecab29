"""mlx-lm's side of the fuse cases of `cargo xtask gate quantize`: our fused
checkpoints against `mlx_lm.fuse`'s.

Its runs come through `quantize_check.py` (`"kind": "fuse"`): {"name",
"model", "adapter", "ours", "ref", "dequantize", "prompts": [[ids]...],
"max_tokens"}. For each run:

  1. `ref` is written by mlx-lm's own fuse command (`mlx_lm.fuse.main` with
     its command line: `--model`, `--adapter-path`, `--save-path`, and
     `--dequantize` where asked) where the model has a tokenizer, else by
     the same steps without one (`fuse_steps`);
  2. `ours` (written by `mlx-spec fuse` from the same files) must hold the
     same tensors (names, dtypes, shapes, bits) and the same `quantization`
     block (or none);
  3. mlx-lm loads `ours` (strict) and greedy-generates the same tokens from
     it as from `ref`.

Each result: {"name", "ok", "checks": [...], "errors": [...], "tokens":
mlx-lm's from ours}.
"""

import contextlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_unflatten
from mlx_lm import fuse
from mlx_lm.utils import dequantize_model, load_adapters, load_model, save_config, save_model
from quantize_check import load_dir, same, same_tokens


def fuse_steps(run):
    """`mlx_lm.fuse.main` minus the tokenizer (the synthetic checkpoints
    have none)."""
    model, config = load_model(Path(run["model"]))
    model = load_adapters(model, run["adapter"])
    model.eval()
    fused = [(n, m.fuse(dequantize=run["dequantize"])) for n, m in model.named_modules() if hasattr(m, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    if run["dequantize"]:
        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    save_model(Path(run["ref"]), model, donate_model=False)
    save_config(config, config_path=Path(run["ref"]) / "config.json")


def mlx_lm_fuse(run):
    if not (Path(run["model"]) / "tokenizer_config.json").exists():
        fuse_steps(run)
        return "mlx_lm.fuse's steps (no tokenizer)"
    argv = ["mlx_lm.fuse", "--model", run["model"], "--adapter-path", run["adapter"], "--save-path", run["ref"]]
    if run["dequantize"]:
        argv.append("--dequantize")
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            fuse.main()
    finally:
        sys.argv = saved
    return "mlx_lm.fuse"


def compare(run, errors):
    ours, ref = load_dir(run["ours"]), load_dir(run["ref"])
    if set(ours) != set(ref):
        errors.append(
            f"tensor names differ: only ours {sorted(set(ours) - set(ref))[:8]}, "
            f"only mlx-lm's {sorted(set(ref) - set(ours))[:8]}"
        )
    differing = [n for n in sorted(set(ours) & set(ref)) if not same(ours[n], ref[n])]
    for name in differing[:8]:
        a, b = ours[name], ref[name]
        detail = f"{a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        if a.shape == b.shape and a.dtype == b.dtype and mx.issubdtype(a.dtype, mx.floating):
            detail += f", max |diff| {mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item():.3e}"
        errors.append(f"`{name}` differs from mlx-lm's: {detail}")
    c_ours = json.loads((Path(run["ours"]) / "config.json").read_text())
    c_ref = json.loads((Path(run["ref"]) / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        if c_ours.get(key) != c_ref.get(key):
            errors.append(f"config `{key}`: ours {c_ours.get(key)!r}, mlx-lm {c_ref.get(key)!r}")
    return f"{len(ours)} tensors ({len(ours) - len(differing)} bit-identical to mlx-lm's), quantization block equal"


def check(run):
    checks, errors, tokens = [], [], []
    start = time.perf_counter()
    try:
        checks.append(f"reference by {mlx_lm_fuse(run)}")
        checks.append(compare(run, errors))
        tokens = same_tokens(run, checks, errors)
    except Exception:  # noqa: BLE001 - reported per run, the gate counts it
        errors.append(traceback.format_exc())
    checks.append(f"checked in {time.perf_counter() - start:.1f} s")
    return {"name": run["name"], "ok": not errors, "checks": checks, "errors": errors, "tokens": tokens}

