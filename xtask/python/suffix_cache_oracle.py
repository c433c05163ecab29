"""Gate `suffix`, cache level: draft-suffix's proposals over whole request
histories against arctic-inference 0.3.0's `SuffixDecodingCache.speculate`.

Histories: sessions of agent-like requests generated from a seed (tool-call
skeletons, SQL over one schema, code-edit boilerplate, with per-request
values), so later requests find earlier outputs in the global tree. Our
side is the example `suffix_cache_trace` (crate draft-suffix): it runs each
session (its request, a JSON file of the type
`run_protocol::suffix::CacheRequest`) through one provider, greedy
acceptance against the recorded output, and reports (`CacheReport`, on
stdout) each draft (position, limit, tokens) and, after each request, which
requests its global tree holds. The reference replays the
same rounds (same contexts, same limits) on a `SuffixDecodingCache`.

Runs (each printed with its counts):
- `exact`: the reference driven with our semantics where they differ by
  design: a request's output joins the global tree when it completes (we
  extend the cache's global tree then, not per round), and the reference
  evicts exactly the requests our token budget evicted. Every proposal
  must be equal: this run decides the gate.
- `incremental`: the reference as shipped updates the global tree after
  every round (`add_active_response`), so a running request also drafts
  from its own output through the global tree. Differences are counted and
  printed, not failed.
- `fifo`: the reference's own eviction, by request count, oldest first
  (`max_cached_requests`, set to the mean number our budget held), instead
  of our token budget with least-recently-used eviction. Counted, not
  failed.

Usage: suffix_cache_oracle.py ARCTIC_SRC TRACE_BIN [--sessions N]
(ARCTIC_SRC: the unpacked sdist with the built `_C` module placed in
`arctic_inference/suffix_decoding/`). Prints `suffix cache: P passed, F
failed` last (one test per session of the `exact` run).
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

DEPTH = 24
FACTOR = 1.0
OFFSET = 0.0
MIN_PROB = 0.1
NUM_DRAFT = 16
BUDGET = 400  # tokens: a session's requests overflow it, so eviction runs


def session(seed):
    """A session: (prompt, output) token lists shaped like agent traffic.
    Template phrases are shared across requests; slots take per-request
    values, so outputs repeat in part."""
    rng = random.Random(seed)
    vocab = 2000
    phrase = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    skeletons = [phrase(rng.randrange(4, 14)) for _ in range(12)]
    system = phrase(30)
    requests = []
    for _ in range(rng.randrange(10, 18)):
        kind = rng.sample(range(len(skeletons)), 4)
        prompt = system + phrase(rng.randrange(5, 25))
        output = []
        for k in kind:
            output += skeletons[k]
            output += phrase(rng.randrange(1, 4))  # the request's own values
            if rng.random() < 0.3:
                output += prompt[-rng.randrange(2, 5):]  # quotes the question
        requests.append((prompt, output[: rng.randrange(20, 80)]))
    return requests


def ours(trace_bin, work, requests):
    """Our rounds and cached requests, each by request index."""
    path = os.path.join(work, "request.json")
    with open(path, "w") as f:
        json.dump({
            "config": {"depth": DEPTH, "budget": BUDGET, "factor": FACTOR, "offset": OFFSET,
                       "min_prob": MIN_PROB, "num_draft": NUM_DRAFT},
            "requests": [{"prompt": p, "output": o} for p, o in requests],
        }, f, indent=1)
    run = subprocess.run([trace_bin, path], text=True, stdout=subprocess.PIPE, check=True)
    report = json.loads(run.stdout)["requests"]
    rounds = {r: t["rounds"] for r, t in enumerate(report)}
    cached = {r: t["cached"] for r, t in enumerate(report)}
    return rounds, cached


def replay(cache_cls, requests, rounds, mode, cached=None, max_requests=-1):
    """The reference's proposals at our rounds; mode `exact`, `incremental`
    or `fifo` (see the module doc)."""
    cache = cache_cls(max_tree_depth=DEPTH, max_cached_requests=max_requests)
    out = []
    for r, (prompt, output) in enumerate(requests):
        cache.start_request(r, prompt)
        done = 0
        for rnd in rounds[r]:
            pos = rnd["pos"]
            if pos > done:
                new = output[done:pos]
                if mode == "incremental":
                    cache.add_active_response(r, new)
                else:
                    # The local tree only: the output joins the global tree
                    # when the request completes, as ours does.
                    cache._local_trees[r].extend(0, new)
                done = pos
            if rnd["max"] == 0:
                continue
            draft = cache.speculate(r, prompt + output[:pos], max_spec_tokens=rnd["max"],
                                    max_spec_factor=FACTOR, max_spec_offset=OFFSET,
                                    min_token_prob=MIN_PROB)
            out.append((r, pos, list(draft.token_ids), rnd["tokens"]))
        if mode == "incremental":
            cache.add_active_response(r, output[done:])
        else:
            cache._global_tree.extend(cache._req_to_seq_id[r], output)
        cache.stop_request(r)
        if mode == "exact":
            for gone in set(cache.cached_requests) - set(cached[r]):
                cache.evict_cached_response(gone)
            if sorted(cache.cached_requests) != sorted(cached[r]):
                sys.exit(f"request {r}: the reference holds {sorted(cache.cached_requests)}, "
                         f"ours {cached[r]}")
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("arctic_src")
    parser.add_argument("trace_bin")
    parser.add_argument("--sessions", type=int, default=40)
    args = parser.parse_args()
    sys.path.insert(0, args.arctic_src)
    from arctic_inference.suffix_decoding.cache import SuffixDecodingCache  # noqa: E402

    totals = {"exact": [0, 0], "incremental": [0, 0], "fifo": [0, 0]}
    passed = failed = 0
    drafted = evicted = 0
    shown = 0
    work = tempfile.mkdtemp(prefix="suffix-cache-oracle-")
    atexit.register(shutil.rmtree, work, True)
    for seed in range(args.sessions):
        requests = session(seed)
        rounds, cached = ours(args.trace_bin, work, requests)
        held = max(1, round(sum(len(c) for c in cached.values()) / len(cached)))
        drafted += sum(1 for rs in rounds.values() for rnd in rs if rnd["tokens"])
        evicted += len(requests) - len(cached[len(requests) - 1])
        for mode in totals:
            got = replay(SuffixDecodingCache, requests, rounds, mode, cached,
                         held if mode == "fifo" else -1)
            differ = [g for g in got if g[2] != g[3]]
            totals[mode][0] += len(got)
            totals[mode][1] += len(differ)
            if mode == "exact":
                if differ:
                    failed += 1
                    for r, pos, ref, our in differ[:3]:
                        if shown < 10:
                            print(f"session {seed} request {r} at {pos}: "
                                  f"reference {ref}, ours {our}")
                            shown += 1
                else:
                    passed += 1
    print(f"{args.sessions} sessions, {drafted} non-empty proposals of ours, "
          f"{evicted} requests evicted by our budget of {BUDGET} tokens")
    for mode, (total, differ) in totals.items():
        what = {
            "exact": "our semantics on the reference cache (end-of-request join, our evictions)",
            "incremental": "documented difference: the reference's global tree grows every "
                           "round (ours when a request completes)",
            "fifo": "documented difference: the reference evicts by request count, oldest "
                    "first (ours: token budget, least recently used)",
        }[mode]
        print(f"{mode:<12} {total:>6} proposals, {total - differ:>6} equal, "
              f"{differ:>5} differ  ({what})")
    print(f"suffix cache: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
