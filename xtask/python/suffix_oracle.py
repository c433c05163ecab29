"""Compares draft-suffix's trie proposals with ArcticInference's.

The reference is arctic-inference 0.3.0's standalone suffix tree
(`csrc/suffix_decoding`, built with nanobind into a module `_C`, no torch).
Random histories with repeats are inserted into both (and some sequences
removed again, as eviction does); after each change both propose for
random contexts with random limits. Our side is the example
`suffix_proposals` of crate draft-suffix: its request (a JSON file, the
type `run_protocol::suffix::TrieRequest`) names the operations, its report
on stdout (`TrieReport`) holds the proposals.

Usage: suffix_oracle.py EXT_DIR PROPOSALS_BIN [--seeds N]
Prints one line per disagreement and a summary; exits 1 on any.

Building the reference (no torch): unpack the sdist (`pip download --no-deps
--no-binary :all: --no-build-isolation --no-clean arctic-inference==0.3.0`
fails at its metadata step, which wants torch, but leaves the unpacked
source under /tmp/pip-download-*), `pip install nanobind` into a venv, then
`cmake -S SRC/csrc/suffix_decoding -B BUILD -DPython_EXECUTABLE=VENV/bin/python
&& cmake --build BUILD`: BUILD holds `_C*.so`, the EXT_DIR here.
"""

import argparse
import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile


def scenarios(seed):
    """Yields (depth, ops) with ops a list of ('seq', tokens), ('rm', k) and
    ('spec', max_tokens, factor, offset, min_prob, context)."""
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8, 24])
    vocab = rng.choice([3, 5, 12])
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 7))] for _ in range(4)]
    ops = []
    inserted = 0
    removed = set()
    for _ in range(rng.randrange(1, 6)):
        seq = []
        while len(seq) < rng.randrange(5, 60):
            if rng.random() < 0.5:
                seq.extend(rng.choice(phrases))
            else:
                seq.append(rng.randrange(vocab))
        ops.append(("seq", seq))
        inserted += 1
        if inserted > 1 and rng.random() < 0.3:
            k = rng.randrange(inserted)
            if k not in removed:
                removed.add(k)
                ops.append(("rm", k))
        for _ in range(8):
            context = []
            while len(context) < rng.randrange(1, depth + 3):
                if rng.random() < 0.5:
                    context.extend(rng.choice(phrases))
                else:
                    context.append(rng.randrange(vocab))
            ops.append(("spec", rng.randrange(1, 12), rng.choice([0.5, 1.0, 2.0]),
                        rng.choice([0.0, 1.0, -1.0]), rng.choice([0.0, 0.1, 0.3]), context))
    return depth, ops


def reference(module, depth, ops):
    """The reference's proposals; sequence ids count insertions from 0."""
    tree = module.SuffixTree(depth)
    inserted = 0
    out = []
    for op in ops:
        if op[0] == "seq":
            tree.extend(inserted, op[1])
            inserted += 1
        elif op[0] == "rm":
            tree.remove(op[1])
        else:
            _, max_tokens, factor, offset, min_prob, context = op
            d = tree.speculate(context, max_tokens, factor, offset, min_prob, False)
            out.append({"tokens": list(d.token_ids), "probs": list(d.probs),
                        "score": d.score, "match_len": d.match_len})
    return out


def request(depth, ops):
    """Our side's request (`run_protocol::suffix::TrieRequest`)."""
    out = []
    for op in ops:
        if op[0] == "seq":
            out.append({"seq": op[1]})
        elif op[0] == "rm":
            out.append({"rm": op[1]})
        else:
            _, max_tokens, factor, offset, min_prob, context = op
            out.append({"spec": {"max_tokens": max_tokens, "factor": factor, "offset": offset,
                                 "min_prob": min_prob, "context": context}})
    return {"depth": depth, "ops": out}


def ours(proposals_bin, work, depth, ops):
    """Our proposals, from the binary's report."""
    path = os.path.join(work, "request.json")
    with open(path, "w") as f:
        json.dump(request(depth, ops), f, indent=1)
    run = subprocess.run([proposals_bin, path], text=True, stdout=subprocess.PIPE, check=True)
    return json.loads(run.stdout)["proposals"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ext_dir")
    parser.add_argument("proposals_bin")
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, args.ext_dir)
    import _C  # noqa: E402  (the reference extension)

    total = same = 0
    work = tempfile.mkdtemp(prefix="suffix-oracle-")
    atexit.register(shutil.rmtree, work, True)
    for seed in range(args.seeds):
        depth, ops = scenarios(seed)
        want = reference(_C, depth, ops)
        got = ours(args.proposals_bin, work, depth, ops)
        if len(got) != len(want):
            sys.exit(f"seed {seed}: {len(got)} proposals from ours, {len(want)} from the reference")
        for i, (g, w) in enumerate(zip(got, want)):
            total += 1
            if (g["tokens"] == w["tokens"] and g["match_len"] == w["match_len"]
                    and all(abs(a - b) < 1e-5 for a, b in zip(g["probs"], w["probs"]))
                    and abs(g["score"] - w["score"]) < 1e-4):
                same += 1
            else:
                print(f"seed {seed} proposal {i}: ours {g}, reference {w}")
    print(f"{total} proposals: {same} equal to the reference, {total - same} differ")
    sys.exit(0 if same == total else 1)


if __name__ == "__main__":
    main()
