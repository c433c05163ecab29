"""mlx-lm's perplexity (`mlx_lm.perplexity`) on a local JSONL dataset: the
oracle of the perplexity gate.

mlx-lm's `load_data` reads a Hugging Face dataset; this builds its rows the
same way from the local records: mlx-lm's `create_dataset` tokenizes each
record, numpy's `permutation` under the seed orders them, they are joined
until `--num-samples` rows are filled (or the records end, for -1), cut into
rows. Then mlx-lm's own `eval_ppl` scores them.

usage: oracle_perplexity.py --model DIR --cases FILE
FILE: [{"data": JSONL, "sequence_length", "num_samples", "batch_size",
"seed"}, ...]. Prints one JSON list: {"ppl", "se", "rows"} for each case.
"""
import argparse
import json
import types

import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.perplexity import eval_ppl
from mlx_lm.tuner.datasets import create_dataset


def perplexity(model, tokenizer, case):
    with open(case["data"]) as f:
        records = [json.loads(line) for line in f if line.strip()]
    dataset = create_dataset(records, tokenizer, types.SimpleNamespace())
    np.random.seed(case["seed"])
    order = np.random.permutation(len(dataset)).tolist()
    length = case["sequence_length"]
    samples = case["num_samples"]
    wanted = length * samples if samples > 0 else float("inf")
    data = []
    for index in order:
        if len(data) >= wanted:
            break
        tokens, _ = dataset.process(dataset[index])
        data.extend(tokens)
    rows = mx.array(data[: (len(data) // length) * length]).reshape(-1, length)
    if samples > 0:
        rows = rows[:samples]
    ppl, se = eval_ppl(model, rows, batch_size=case["batch_size"])
    return {"ppl": ppl, "se": se, "rows": rows.shape[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    model, tokenizer = load(args.model)
    with open(args.cases) as f:
        cases = json.load(f)
    print(json.dumps([perplexity(model, tokenizer, case) for case in cases]))


if __name__ == "__main__":
    main()
