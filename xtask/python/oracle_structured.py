"""The oracle of `cargo xtask gate structured`: mlx-lm 0.32.2's own
`generate_step`, greedy, with the `llguidance` Python package (the engine
our crate embeds, same version) as its logits processor.

    oracle_structured.py CASES.json OUT.json

CASES.json is `run_protocol::structured::OracleCases`: the model directory,
max_tokens, the cases (prompt token ids and a grammar: json_schema /
json_object / lark / regex, as our engine compiled it: a JSON constraint
arrives as the schema with spec-grammar's default layout under `x-guidance`,
so both sides build the same grammar) and texts of ours to validate. OUT.json is
`OracleReport`: the greedy tokens per case (EOS excluded), whether each of
its outputs is valid, and a verdict for each text to check.

The processor masks every step's logits with the matcher's state after the
tokens generated so far (refused tokens at -inf, in the logits' dtype, as
our engine does); generation stops at an EOS token, at max_tokens, or once
the matcher is stopped (nothing but EOS may follow; our engine ends there
without asking the model). Validity: the text parses as JSON and validates
against the case's schema with `jsonschema` (JSON cases); a regex case must
match in full; a Lark case is valid when the matcher accepts it.
"""

import json
import re
import sys

import jsonschema
import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.utils import load
import row_order  # noqa: F401  (mlx-lm's sliding caches in time order, as ours)


def grammar_of(g):
    kind = g["kind"]
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(g["schema"])
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}')
    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(g["grammar"])
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(g["regex"])
    raise ValueError(f"unknown grammar kind {kind}")


def matcher(tok, grammar):
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    if m.is_error():
        raise ValueError(m.get_error())
    return m


def masker(tok, grammar, prompt_len, vocab):
    """A logits processor: the mask of the matcher after the generated tokens."""
    m = matcher(tok, grammar)
    seen = [0]
    bitmask = llguidance.numpy.allocate_token_bitmask(1, tok.vocab_size)

    def process(tokens, logits):
        generated = tokens[prompt_len:].tolist()
        for t in generated[seen[0]:]:
            if not m.consume_token(t):
                raise RuntimeError(f"the matcher refused generated token {t}: {m.get_error()}")
        seen[0] = len(generated)
        llguidance.numpy.fill_next_token_bitmask(m, bitmask, 0)
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:vocab]
        allowed = np.zeros(vocab, dtype=bool)
        allowed[: bits.size] = bits.astype(bool)
        refused = mx.array(-np.inf, dtype=logits.dtype)
        return mx.where(mx.array(allowed)[None], logits, refused)

    return process


def greedy(logprobs):
    return mx.argmax(logprobs, axis=-1)


def generate(model, tok, case, eos, max_tokens, vocab):
    grammar = grammar_of(case["grammar"])
    prompt = case["prompt"]
    stop = matcher(tok, grammar)
    out = []
    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=max_tokens,
        sampler=greedy,
        logits_processors=[masker(tok, grammar, len(prompt), vocab)],
    )
    for token, _ in steps:
        token = int(token)
        if token in eos:
            break
        out.append(token)
        stop.consume_token(token)
        if stop.is_stopped() or len(out) == max_tokens:
            break
    return out


def invalid(case, text, tok):
    """None when `text` satisfies the case's constraint, else why not."""
    g = case["grammar"]
    kind = g["kind"]
    if kind in ("json_schema", "json_object"):
        try:
            value = json.loads(text)
        except ValueError as e:
            return f"not JSON: {e}"
        schema = json.loads(g["schema"]) if kind == "json_schema" else {"type": "object"}
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as e:
            return f"fails the schema: {e.message}"
        return None
    if kind == "regex":
        return None if re.fullmatch(g["regex"], text, re.DOTALL) else "does not match the regex"
    m = matcher(tok, grammar_of(g))
    if not m.consume_tokens(tok.tokenize_str(text)) or not m.is_accepting():
        return "the grammar does not accept it"
    return None


def main():
    cases_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.load(open(cases_path))
    model, hf = load(spec["model"])
    eos = set(hf.eos_token_ids)
    tok = llguidance.hf.from_tokenizer(hf._tokenizer, eos_token=sorted(eos))
    vocab = model.args.vocab_size
    tokens, verdicts = [], []
    for case in spec["cases"]:
        out = generate(model, tok, case, eos, spec["max_tokens"], vocab)
        tokens.append(out)
        verdicts.append(invalid(case, hf.decode(out), tok))
        print(f"oracle: {case['name']}: {len(out)} tokens", file=sys.stderr)
    checked = [invalid(spec["cases"][i], text, tok) for i, text in spec["check"]]
    json.dump({"tokens": tokens, "invalid": verdicts, "checked": checked}, open(out_path, "w"))


if __name__ == "__main__":
    main()
