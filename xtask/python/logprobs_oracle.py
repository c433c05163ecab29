"""Our server's log-probabilities against mlx_lm.server's, same model files, same prompts.

usage: logprobs_oracle.py --ours URL --theirs URL --model DIR
Both servers answer greedy chat completions with `logprobs` and `top_logprobs: 5`;
the texts must be equal, and at every position the five alternatives equal as
(bytes, log-probability) pairs, log-probabilities within 1e-4. mlx_lm.server lists its
alternatives unsorted (argpartition), by token id and raw BPE string, and its per-token
`logprob` field was seen to disagree with its own text on this machine: its
`top_logprobs` are compared, mapped to bytes through the model's tokenizer. A request
that ended on end-of-sequence has one more entry there (the EOS token's), none in
OpenAI's shape: that entry must be the EOS and is left out.
Prints one line per prompt and `logprobs: N passed, M failed` last; exits 1 on any failure.
"""
import argparse
import json
import sys
import urllib.request

from transformers import AutoTokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors.",
]
TOP = 5
TOLERANCE = 1e-4


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer gate-key"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def byte_decoder():
    """GPT-2's byte-level alphabet, reversed: the BPE string's characters to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--theirs", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    decoder = byte_decoder()
    with open(f"{args.model}/config.json") as f:
        configured = json.load(f).get("eos_token_id")
    eos_ids = {tok.eos_token_id} | set(configured if isinstance(configured, list) else
                                       [] if configured is None else [configured])

    def their_bytes(token_id):
        piece = tok.convert_ids_to_tokens(token_id)
        return list(bytes(decoder[c] for c in piece))

    passed = failed = 0
    for prompt in PROMPTS:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                "temperature": 0, "logprobs": True, "top_logprobs": TOP}
        ours = post(f"{args.ours}/v1/chat/completions", dict(body, speculative=False))
        theirs = post(f"{args.theirs}/v1/chat/completions", dict(body, model="default_model"))
        try:
            a, b = ours["choices"][0], theirs["choices"][0]
            assert a["message"]["content"] == b["message"]["content"], \
                f"texts differ: {a['message']['content']!r} != {b['message']['content']!r}"
            ca, cb = a["logprobs"]["content"], b["logprobs"]["content"]
            if len(cb) == len(ca) + 1 and b["finish_reason"] == "stop":
                # mlx_lm.server lists the end-of-sequence token it stopped on;
                # OpenAI's shape (ours) lists the content's tokens only.
                assert max(cb[-1]["top_logprobs"], key=lambda e: e["logprob"])["id"] in eos_ids, cb[-1]
                cb = cb[:-1]
            assert len(ca) == len(cb), f"{len(ca)} positions against {len(cb)}"
            worst = 0.0
            for i, (pa, pb) in enumerate(zip(ca, cb)):
                mine = {tuple(e["bytes"]): e["logprob"] for e in pa["top_logprobs"]}
                other = {tuple(their_bytes(e["id"])): e["logprob"] for e in pb["top_logprobs"]}
                assert mine.keys() == other.keys(), f"position {i}: alternatives {mine} != {other}"
                for key, x in mine.items():
                    worst = max(worst, abs(x - other[key]))
                assert worst <= TOLERANCE, f"position {i}: log-probabilities differ by {worst}"
            passed += 1
            print(f"ok   {prompt!r}: {len(ca)} tokens, top {TOP} equal, max difference {worst:.2e}",
                  flush=True)
        except AssertionError as e:
            failed += 1
            print(f"FAIL {prompt!r}: {e}", flush=True)
    print(f"logprobs: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
