"""mlx's side of `cargo xtask gate quantize`: our quantized checkpoints
against `mx.quantize` and against mlx-lm's own quantizer.

    quantize_check.py --runs RUNS.json --out RESULTS.json

RUNS.json: {"runs": [{"name", "src", "ours", "ref", "mode", "bits",
"group_size", "prompts": [[ids]...], "max_tokens"}]}. For each run:

  1. every tensor of `ours` against `src`: a quantized module's weight,
     scales and (affine mode) biases must equal `mx.quantize(src weight)`
     with the mode and parameters its config block gives it (bit for bit,
     same dtype); every other tensor must be the source tensor unchanged;
  2. `ref` is written by mlx-lm from `src` with the same mode, bits and group
     size: `mlx_lm.convert.convert(..., quantize=True, q_mode=mode)` when the
     source has a tokenizer, else the same steps without one
     (`quantize_mlx_lm.convert_steps`); the two
     directories must hold the same tensors (names, dtypes, shapes, bits),
     the same config (`quantization` blocks included) and the same index;
  3. mlx-lm loads `ours` (strict) and greedy-generates the same tokens from
     it as from `ref`.

"same_files": false skips the file comparison of step 2, for checkpoints
mlx-lm's `sanitize` rewrites at load (renames, dropped tensors).
"sanitized_source": true checks step 1 against what mlx-lm's `sanitize`
makes of `src` (its loaded model's parameters): for checkpoints both
quantizers restack first (`qwen3_moe`'s per-expert tensors).

A run with "kind": "fuse" is `fuse_check.py`'s (`mlx-spec fuse` against
`mlx_lm.fuse`).

A run with "kind": "drafter" (a DSpark drafter, which mlx-lm cannot load)
does step 1, then (when "expected" is set) compares tensors and the
`quantization` block with "expected", the same drafter quantized by the
project's Python quantizer (`synth_dspark.py quantize`, `mx.quantize` under
the seed's policy).

Writes RESULTS.json: {"results": [{"name", "ok", "checks": [...],
"errors": [...], "tokens": [[...]]}]}; it fails only if it cannot run.
"""

import argparse
import contextlib
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

import mlx.core as mx
from mlx_lm.convert import convert
from mlx_lm.generate import generate_step
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model
from quantize_mlx_lm import convert_steps


def load_dir(path):
    path = Path(path)
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else sorted(
        p.name for p in path.glob("*.safetensors")
    )
    tensors = {}
    for f in files:
        tensors.update(mx.load(str(path / f)))
    return tensors


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and mx.array_equal(a, b).item()


def params_for(block, module):
    entry = block.get(module)
    if isinstance(entry, dict):
        return entry["group_size"], entry["bits"], entry.get("mode", "affine")
    return block["group_size"], block["bits"], block.get("mode", "affine")


def source_tensors(run):
    """The source's tensors, or with `sanitized_source` what mlx-lm's
    `sanitize` makes of them (its loaded model's parameters)."""
    if not run.get("sanitized_source"):
        return load_dir(run["src"])
    model, _ = load_model(Path(run["src"]))
    return dict(tree_flatten(model.parameters()))


def check_against_mx_quantize(run, errors):
    src, ours = source_tensors(run), load_dir(run["ours"])
    block = json.loads((Path(run["ours"]) / "config.json").read_text())["quantization"]
    expected_names, quantized = set(), 0
    for name, w in src.items():
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and f"{module}.scales" in ours:
            group_size, bits, mode = params_for(block, module)
            wq, scales, *biases = mx.quantize(w, group_size=group_size, bits=bits, mode=mode)
            parts = [("weight", wq), ("scales", scales)] + [("biases", b) for b in biases]
            for suffix, want in parts:
                got = ours.get(f"{module}.{suffix}")
                if got is None or not same(got, want):
                    errors.append(f"{module}.{suffix} differs from mx.quantize ({mode}, group {group_size}, {bits} bits)")
                expected_names.add(f"{module}.{suffix}")
            quantized += 1
        else:
            if name not in ours or not same(ours[name], w):
                errors.append(f"{name} is not the source tensor unchanged")
            expected_names.add(name)
    if set(ours) != expected_names:
        errors.append(f"unexpected tensors: {sorted(set(ours) ^ expected_names)[:8]}")
    if quantized == 0:
        errors.append("nothing was quantized")
    return f"{quantized} modules equal mx.quantize bit for bit, {len(src) - quantized} tensors unchanged"


def mlx_lm_reference(run):
    src, ref = Path(run["src"]), Path(run["ref"])
    mode = run.get("mode", "affine")
    if ref.exists():
        shutil.rmtree(ref)
    if (src / "tokenizer.json").exists():
        with contextlib.redirect_stdout(sys.stderr):
            convert(
                str(src), str(ref), quantize=True, q_group_size=run["group_size"], q_bits=run["bits"], q_mode=mode
            )
        return f"mlx_lm.convert -q --q-mode {mode}"
    convert_steps(src, ref, run["group_size"], run["bits"], mode)
    return f"mlx_lm.convert -q --q-mode {mode}'s steps (no tokenizer)"


def compare_with_reference(run, errors):
    ours, ref = load_dir(run["ours"]), load_dir(run["ref"])
    if set(ours) != set(ref):
        errors.append(f"tensor names differ from mlx-lm's: {sorted(set(ours) ^ set(ref))[:8]}")
    for name in sorted(set(ours) & set(ref)):
        if not same(ours[name], ref[name]):
            errors.append(f"{name}: {ours[name].dtype}{ours[name].shape} differs from mlx-lm's {ref[name].dtype}{ref[name].shape}")
    c_ours = json.loads((Path(run["ours"]) / "config.json").read_text())
    c_ref = json.loads((Path(run["ref"]) / "config.json").read_text())
    for key in sorted(set(c_ours) | set(c_ref)):
        if c_ours.get(key) != c_ref.get(key):
            errors.append(f"config `{key}`: ours {c_ours.get(key)!r}, mlx-lm {c_ref.get(key)!r}")
    i_ours = json.loads((Path(run["ours"]) / "model.safetensors.index.json").read_text())
    i_ref = json.loads((Path(run["ref"]) / "model.safetensors.index.json").read_text())
    if i_ours != i_ref:
        errors.append(f"index differs: ours {i_ours['metadata']}, mlx-lm {i_ref['metadata']}")
    return f"{len(ours)} tensors, config and index identical to mlx-lm's"


def compare_with_expected(run, errors):
    ours, expected = load_dir(run["ours"]), load_dir(run["expected"])
    if set(ours) != set(expected):
        errors.append(f"tensor names differ from the expected: {sorted(set(ours) ^ set(expected))[:8]}")
    for name in sorted(set(ours) & set(expected)):
        if not same(ours[name], expected[name]):
            errors.append(f"{name} differs from the expected drafter's")
    c_ours = json.loads((Path(run["ours"]) / "config.json").read_text())
    c_expected = json.loads((Path(run["expected"]) / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        if c_ours.get(key) != c_expected.get(key):
            errors.append(f"config `{key}`: ours {c_ours.get(key)!r}, expected {c_expected.get(key)!r}")
    return f"{len(ours)} tensors and the quantization block equal {run['expected']}'s"


def greedy_tokens(path, prompts, max_tokens):
    model, _ = load_model(Path(path))  # strict: every tensor used, none missing
    out = []
    for prompt in prompts:
        steps = generate_step(mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1))
        out.append([int(t) for t, _ in steps])
    return out


def same_tokens(run, checks, errors):
    """mlx-lm's greedy tokens from `ours`, which must be those it generates
    from `ref` (it loads ours strictly)."""
    tokens = greedy_tokens(run["ours"], run["prompts"], run["max_tokens"])
    ref_tokens = greedy_tokens(run["ref"], run["prompts"], run["max_tokens"])
    if tokens != ref_tokens:
        errors.append(f"mlx-lm generates {tokens} from ours but {ref_tokens} from its own")
    else:
        checks.append(f"mlx-lm loads ours and generates its own tokens ({len(tokens)} prompts x {run['max_tokens']})")
    return tokens


def check(run):
    if run.get("kind") == "fuse":
        from fuse_check import check as check_fuse

        return check_fuse(run)
    checks, errors, tokens = [], [], []
    start = time.perf_counter()
    try:
        checks.append(check_against_mx_quantize(run, errors))
        if run.get("kind") == "drafter":
            if run.get("expected"):
                checks.append(compare_with_expected(run, errors))
            return {"name": run["name"], "ok": not errors, "checks": checks, "errors": errors, "tokens": tokens}
        how = mlx_lm_reference(run)
        checks.append(f"reference by {how}")
        if run.get("same_files", True):
            checks.append(compare_with_reference(run, errors))
        else:
            checks.append("files not compared: mlx-lm's sanitize rewrites this checkpoint at load")
        tokens = same_tokens(run, checks, errors)
    except Exception:  # noqa: BLE001 - reported per run, the gate counts it
        errors.append(traceback.format_exc())
    checks.append(f"checked in {time.perf_counter() - start:.1f} s")
    return {"name": run["name"], "ok": not errors, "checks": checks, "errors": errors, "tokens": tokens}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = json.loads(args.runs.read_text())["runs"]
    results = [check(run) for run in runs]
    args.out.write_text(json.dumps({"results": results}, indent=1))


if __name__ == "__main__":
    main()
