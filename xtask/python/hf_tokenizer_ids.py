"""Gate `gguf`'s exported-tokenizer check: each directory holds a tokenizer
our engine wrote as Hugging Face files (`tokenizer.json`,
`tokenizer_config.json`) from a GGUF file's metadata; transformers loads it
as mlx-lm does (`AutoTokenizer.from_pretrained`) and encodes the texts
without special tokens. Writes `{"cases": [[ids of each text], ...]}`.

Usage: hf_tokenizer_ids.py JOBS.json OUT.json, JOBS.json being
`{"cases": [{"dir": DIR, "texts": [...]}, ...]}`.
"""

import json
import sys

from transformers import AutoTokenizer


def main():
    jobs_path, out_path = sys.argv[1:3]
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    cases = []
    for job in jobs["cases"]:
        tokenizer = AutoTokenizer.from_pretrained(job["dir"])
        cases.append([tokenizer.encode(t, add_special_tokens=False) for t in job["texts"]])
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f)


if __name__ == "__main__":
    main()
