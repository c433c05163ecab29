"""Drives a live `mlx-spec serve` with the official `openai` client, then a
schema-driven fuzz run (schemathesis) and a bounded load test.

usage: server_check.py --base http://127.0.0.1:PORT --api-key KEY --capacity K
Prints one line per check (with its seconds) and `server: N passed, M failed` last; exits 1 on
any failure.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import openai

RESULTS = []


def check(name, fn):
    start = time.monotonic()
    try:
        fn()
        RESULTS.append((name, None))
        print(f"ok   {name} ({time.monotonic() - start:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        RESULTS.append((name, e))
        print(f"FAIL {name} ({time.monotonic() - start:.1f} s): {type(e).__name__}: {e}", flush=True)


def metric(base, name):
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{re.escape(name)} (\d+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--capacity", type=int, required=True)
    ap.add_argument("--schemathesis", required=True)
    args = ap.parse_args()
    base = args.base
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=args.api_key, max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    chat = lambda **kw: client.chat.completions.create(model=model, **kw)  # noqa: E731
    q = [{"role": "user", "content": "What is the capital of France?"}]

    def non_streaming_chat():
        r = chat(messages=q, max_tokens=24, temperature=0)
        assert "Paris" in r.choices[0].message.content, r
        assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 20
        spec = r.model_extra["speculative"]
        assert spec["provider"] == "prompt-lookup" and spec["target_calls"] > 0, spec

    def streaming_chat_with_usage():
        stream = chat(messages=q, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "Paris" in text, text
        ids = {c.id for c in chunks}
        assert len(ids) == 1, ids
        finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finals and finals[-1].choices[0].finish_reason in ("stop", "length")
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    def chat_template_is_applied():
        # With the template, the system message steers the answer; the
        # prompt token count covers the template's markup.
        r = chat(messages=[{"role": "system", "content": "Answer with one word."}] + q, max_tokens=8, temperature=0)
        assert r.usage.prompt_tokens > len("What is the capital of France?".split()) + 10

    def per_request_provider_switch():
        off = chat(messages=q, max_tokens=16, temperature=0, extra_body={"speculative": False})
        assert off.model_extra["speculative"] is None
        on = chat(messages=q, max_tokens=16, temperature=0, extra_body={"speculative": {"provider": "prompt-lookup", "num_draft_tokens": 2, "min_ngram": "1"}})
        assert on.model_extra["speculative"]["provider"] == "prompt-lookup"
        assert on.choices[0].message.content == off.choices[0].message.content, "speculation changed greedy output"

    def suffix_drafts_from_an_earlier_request():
        # A question no other check asks: suffix's global tree starts without it.
        m = [{"role": "user", "content": "Write a JSON object with keys name and city for a customer in Lisbon."}]
        off = chat(messages=m, max_tokens=24, temperature=0, extra_body={"speculative": False})
        on = [chat(messages=m, max_tokens=24, temperature=0, extra_body={"speculative": {"provider": "suffix"}})
              for _ in range(2)]
        for r in on:
            assert r.model_extra["speculative"]["provider"] == "suffix"
            assert r.choices[0].message.content == off.choices[0].message.content, "speculation changed greedy output"
        first, second = (r.model_extra["speculative"]["accepted"] for r in on)
        assert second > first, f"accepted {first} then {second}: the first answer was not drafted from"

    def stop_sequences():
        r = chat(messages=q, max_tokens=24, temperature=0, stop=["Paris"])
        assert "Paris" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop", r

    def max_tokens_is_exact():
        r = chat(messages=[{"role": "user", "content": "Count from one to fifty in words."}], max_tokens=5, temperature=0)
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length", r.usage

    def completions_endpoint():
        r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=6, temperature=0)
        assert r.choices[0].text.strip(), r
        s = list(client.completions.create(model=model, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text

    def n_choices_and_batched_prompts():
        # Choice i of a seeded request is the one-choice request with seed + i.
        two = chat(messages=q, max_tokens=8, temperature=1.0, seed=11, n=2)
        assert [c.index for c in two.choices] == [0, 1], two
        alone = chat(messages=q, max_tokens=8, temperature=1.0, seed=12)
        assert two.choices[1].message.content == alone.choices[0].message.content, (two, alone)
        prompts = ["The capital of France is", "The capital of Italy is"]
        # Four choices past the key's three places: refused whole, holding none.
        try:
            client.completions.create(model=model, prompt=prompts, n=2, max_tokens=4, temperature=0)
        except openai.RateLimitError:
            pass
        else:
            raise AssertionError(f"{2 * len(prompts)} choices past {args.capacity} places accepted")
        r = client.completions.create(model=model, prompt=prompts, max_tokens=4, temperature=0, echo=True)
        texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
        assert texts[0].startswith(prompts[0]) and texts[1].startswith(prompts[1]), texts
        one = client.completions.create(model=model, prompt=prompts[1], max_tokens=4, temperature=0)
        assert texts[1] == prompts[1] + one.choices[0].text, (texts, one)

    def echo_logprobs_score_the_prompt():
        # lm-evaluation-harness's scoring request: the prompt's tokens first,
        # each with the distribution a one-token request on the text before it sees.
        p = "The capital of France is Paris"
        r = client.completions.create(model=model, prompt=p, max_tokens=1, temperature=0, echo=True, logprobs=2)
        lp = r.choices[0].logprobs
        ids = lp.model_extra["token_ids"]
        assert r.choices[0].text.startswith(p) and lp.token_logprobs[0] is None and len(ids) > 4, lp
        assert all(x < 0 for x in lp.token_logprobs[1:]), lp.token_logprobs
        for k in (1, len(ids) - 2):
            one = client.completions.create(model=model, prompt=ids[:k], max_tokens=1, temperature=0, logprobs=2)
            assert one.choices[0].logprobs.top_logprobs[0] == lp.top_logprobs[k], (k, one.choices[0].logprobs, lp)

    def prediction_is_drafted_from():
        # OpenAI's predicted outputs through the client's own `prediction`.
        m = [{"role": "user", "content": "Write a haiku about autumn leaves."}]
        plain = chat(messages=m, max_tokens=32, temperature=0, extra_body={"speculative": False})
        text = plain.choices[0].message.content
        r = chat(messages=m, max_tokens=32, temperature=0, prediction={"type": "content", "content": text})
        assert r.choices[0].message.content == text, (r, text)
        details = r.usage.completion_tokens_details
        assert details.accepted_prediction_tokens >= r.usage.completion_tokens // 2, r.usage
        assert r.model_extra["speculative"]["provider"] == "prompt-lookup", r.model_extra

    def errors_map_to_client_exceptions():
        for kw, exc in [
            (dict(temperature=5), openai.BadRequestError),
            (dict(top_p=1.5), openai.BadRequestError),
            (dict(max_tokens=10**7), openai.BadRequestError),
            (dict(extra_body={"speculative": {"provider": "no-such"}}), openai.BadRequestError),
        ]:
            try:
                chat(messages=q, **kw)
            except exc as e:
                assert e.status_code == 400 and e.body and "message" in e.body, e
            else:
                raise AssertionError(f"{kw} was accepted")
        try:
            client.chat.completions.create(model="another-model", messages=q)
        except openai.NotFoundError:
            pass
        else:
            raise AssertionError("unknown model accepted")
        bad = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
        except openai.AuthenticationError:
            pass
        else:
            raise AssertionError("wrong key accepted")
        try:
            chat(messages=[{"role": "user", "content": "hi " * 9000}], max_tokens=1)
        except openai.BadRequestError as e:
            assert "context" in str(e), e
        else:
            raise AssertionError("over-long prompt accepted")

    def token_id(entry):
        return entry.model_extra["id"]

    def logprobs_consistent_and_unchanged_by_speculation():
        kw = dict(messages=q, max_tokens=16, temperature=0, logprobs=True, top_logprobs=5)
        off = chat(**kw, extra_body={"speculative": False})
        content = off.choices[0].logprobs.content
        assert len(content) == off.usage.completion_tokens, (len(content), off.usage)
        for e in content:
            assert len(e.top_logprobs) == 5, e
            # Greedy: the chosen token is the most likely one.
            assert token_id(e.top_logprobs[0]) == token_id(e) and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5, e
            lps = [t.logprob for t in e.top_logprobs]
            assert lps == sorted(lps, reverse=True), lps
            assert sum(math.exp(lp) for lp in lps) <= 1 + 1e-4, lps
        assert bytes(b for e in content for b in e.bytes).decode() == off.choices[0].message.content
        for spec in ({"provider": "prompt-lookup", "num_draft_tokens": 3, "min_ngram": "1"}, {"provider": "suffix"}):
            on = chat(**kw, extra_body={"speculative": spec})
            other = on.choices[0].logprobs.content
            assert [token_id(e) for e in other] == [token_id(e) for e in content], spec
            worst = max(abs(a.logprob - b.logprob) for a, b in zip(content, other))
            assert worst < 1e-3, f"{spec}: log-probabilities differ by {worst}"
        chunks = list(chat(**kw, stream=True, extra_body={"speculative": False}))
        streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
        assert [(token_id(e), e.logprob) for e in streamed] == [(token_id(e), e.logprob) for e in content]

    def completions_logprobs_legacy_shape():
        kw = dict(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=3)
        r = client.completions.create(**kw)
        lp = r.choices[0].logprobs
        n = r.usage.completion_tokens
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n, lp
        assert "".join(lp.tokens) == r.choices[0].text
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        for top, chosen in zip(lp.top_logprobs, lp.token_logprobs):
            assert 1 <= len(top) <= 3 and abs(max(top.values()) - chosen) < 1e-5, (top, chosen)
        s = list(client.completions.create(**kw, stream=True))
        streamed = [t for c in s if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        assert streamed == lp.tokens, (streamed, lp.tokens)

    def logit_bias_bans_and_forces():
        kw = dict(messages=q, max_tokens=6, temperature=0, logprobs=True)
        free = [token_id(e) for e in chat(**kw).choices[0].logprobs.content]
        banned = [token_id(e) for e in chat(**kw, logit_bias={str(free[0]): -100}).choices[0].logprobs.content]
        assert free[0] not in banned, (free, banned)
        forced = [token_id(e) for e in chat(**kw, logit_bias={"1000": 100}).choices[0].logprobs.content]
        assert forced == [1000] * 6, forced
        # Composed with speculation: the same tokens.
        spec = {"speculative": {"provider": "prompt-lookup", "num_draft_tokens": 3, "min_ngram": "1"}}
        again = [token_id(e) for e in chat(**kw, logit_bias={str(free[0]): -100}, extra_body=spec).choices[0].logprobs.content]
        assert again == banned, (again, banned)

    def penalties_and_xtc_as_mlx_lm_server_takes_them():
        kw = dict(messages=q, max_tokens=24, temperature=0, logprobs=True)
        free = [token_id(e) for e in chat(**kw).choices[0].logprobs.content]
        # OpenAI's own fields, and mlx_lm.server's in the body.
        # Context 0: the whole history, the chat template's too (the answer
        # is too short to repeat itself in 20 tokens).
        for penalty in (dict(frequency_penalty=1.5, extra_body={"frequency_context_size": 0}),
                        dict(presence_penalty=-2.0, extra_body={"presence_context_size": 0}),
                        dict(extra_body={"repetition_penalty": 1.8, "repetition_context_size": 0})):
            off = [token_id(e) for e in chat(**kw, **penalty).choices[0].logprobs.content]
            assert off != free, (penalty, off)
            body = dict(penalty.get("extra_body", {}))
            rest = {k: v for k, v in penalty.items() if k != "extra_body"}
            for spec in ({"provider": "prompt-lookup", "num_draft_tokens": 3, "min_ngram": "1"}, {"provider": "suffix"}):
                on = chat(**kw, **rest, extra_body={**body, "speculative": spec}).choices[0].logprobs.content
                assert [token_id(e) for e in on] == off, (penalty, spec)
        # XTC always applied, nearly greedy: where two or more of the top
        # tokens are above the threshold, the token chosen is never one XTC
        # removes (all of them but the least likely; newline and end tokens
        # are spared). Without XTC it would be the most likely one.
        xtc = dict(messages=q, max_tokens=16, temperature=0.05, seed=5, logprobs=True, top_logprobs=5,
                   extra_body={"xtc_probability": 1.0, "xtc_threshold": 0.05})
        content = chat(**xtc).choices[0].logprobs.content
        cuts = 0
        for e in content:
            above = [token_id(t) for t in e.top_logprobs if math.exp(t.logprob) > 0.05]
            if len(above) >= 2 and e.token not in ("\n", "<|im_end|>"):
                cuts += 1
                assert token_id(e) not in above[:-1], (e, above)
        assert cuts > 0, "no step had two tokens above the threshold: the check saw nothing"

    def response_format_constrains_the_answer():
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                  "country": {"type": "string", "maxLength": 20}},
                  "required": ["city", "country"], "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
        m = [{"role": "user", "content": "Name the capital of France and its country as JSON."}]
        off = chat(messages=m, max_tokens=48, temperature=0, response_format=fmt, extra_body={"speculative": False})
        value = json.loads(off.choices[0].message.content)
        try:
            import jsonschema
            jsonschema.validate(value, schema)
        except ImportError:
            assert set(value) == {"city", "country"}, value
        assert off.choices[0].finish_reason == "stop", off
        for spec in ({"provider": "prompt-lookup", "num_draft_tokens": 4, "min_ngram": "1"}, {"provider": "suffix"}):
            on = chat(messages=m, max_tokens=48, temperature=0, response_format=fmt, extra_body={"speculative": spec})
            assert on.choices[0].message.content == off.choices[0].message.content, spec
        r = chat(messages=[{"role": "user", "content": "Pick a number."}], max_tokens=8, temperature=0,
                 extra_body={"response_format": {"type": "regex", "regex": "[0-9]{3}"}})
        assert re.fullmatch(r"[0-9]{3}", r.choices[0].message.content), r
        r = chat(messages=[{"role": "user", "content": "Is Paris in France?"}], max_tokens=8, temperature=0,
                 extra_body={"response_format": {"type": "grammar", "grammar": 'start: "yes" | "no"'}})
        assert r.choices[0].message.content in ("yes", "no"), r

    def bad_values_are_400s_beside_a_good_request():
        good = dict(messages=[{"role": "user", "content": "Write a short poem about the sea."}], max_tokens=24, temperature=0)
        alone = chat(**good).choices[0].message.content
        result = {}

        def run_good():
            s = chat(**good, stream=True)
            result["text"] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)

        runner = threading.Thread(target=run_good)
        runner.start()
        bad = [
            dict(logprobs=True, top_logprobs=21),
            dict(top_logprobs=3),
            dict(logit_bias={"0": 101}),
            dict(logit_bias={"abc": 1}),
            dict(logit_bias={"99999999": 1}),
            dict(response_format={"type": "xml"}),
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}),
            dict(extra_body={"response_format": {"type": "regex", "regex": "[0-9"}}),
            dict(extra_body={"response_format": {"type": "grammar", "grammar": "start: ("}}),
            dict(extra_body={"repetition_penalty": -1}),
            dict(extra_body={"frequency_penalty": 1, "frequency_context_size": -1}),
            dict(extra_body={"xtc_threshold": 0.7}),
        ]
        try:
            for kw in bad:
                try:
                    chat(messages=q, max_tokens=4, **kw)
                except openai.BadRequestError as e:
                    assert e.status_code == 400 and e.body.get("param") in ("logprobs", "top_logprobs", "logit_bias", "response_format", "repetition_penalty", "frequency_context_size", "xtc_threshold"), (kw, e.body)
                else:
                    raise AssertionError(f"{kw} was accepted")
            try:
                client.completions.create(model=model, prompt="hi", max_tokens=4, logprobs=21)
            except openai.BadRequestError as e:
                assert e.body.get("param") == "logprobs", e.body
            else:
                raise AssertionError("completions logprobs=21 was accepted")
        finally:
            runner.join(timeout=300)
        assert result.get("text") == alone, (result, alone)

    def disconnect_frees_the_slot():
        before = metric(base, "mlx_spec_client_disconnects_total")
        stream = chat(messages=[{"role": "user", "content": "Write a very long story."}], max_tokens=400, temperature=0, stream=True)
        for i, _ in enumerate(stream):
            if i >= 2:
                break
        stream.close()
        deadline = time.time() + 20
        while metric(base, "mlx_spec_client_disconnects_total") == before:
            assert time.time() < deadline, "the engine never noticed the disconnect"
            time.sleep(0.1)
        assert metric(base, "mlx_spec_in_flight") == 0

    def model_weights_are_reported():
        # SmolLM2-135M in any format we load is far above 10 MB.
        assert metric(base, "mlx_spec_model_weights_bytes") > 10_000_000

    def load_and_429():
        idle = metric(base, "mlx_spec_mlx_active_memory_bytes")
        # The prefix cache keeps finished requests' caches on purpose: what
        # it holds is not a leak.
        idle_cached = metric(base, "mlx_spec_prefix_cache_bytes")
        errors, done, rejected = [], [], []

        def worker(i):
            try:
                s = chat(messages=[{"role": "user", "content": f"Tell me fact number {i} about the sea."}], max_tokens=24, temperature=0, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
                done.append(text)
            except openai.RateLimitError:
                rejected.append(i)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        # Exactly K concurrent streams: every one completes.
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.capacity)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors and not rejected and len(done) == args.capacity, (errors, rejected, len(done))
        # Beyond the bound: some get 429.
        done.clear()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.capacity * 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert rejected, "no request got 429 past the queue bound"
        assert len(done) + len(rejected) == args.capacity * 3
        deadline = time.time() + 20
        while metric(base, "mlx_spec_in_flight") != 0:
            assert time.time() < deadline
            time.sleep(0.1)
        after = metric(base, "mlx_spec_mlx_active_memory_bytes")
        cached = metric(base, "mlx_spec_prefix_cache_bytes") - idle_cached
        assert after - cached <= idle * 1.02 + (1 << 20), (
            f"active memory {idle} -> {after} ({cached} more in the prefix cache)"
        )

    def schema_fuzz_finds_no_5xx():
        cmd = [args.schemathesis, "run", f"{base}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "15",
               "--seed", "7", "--request-timeout", "120", "--workers", "1", "-H", f"Authorization: Bearer {args.api_key}"]
        # The hooks bound the tokens a fuzzed request may generate (see the file).
        hooks = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server_fuzz_hooks.py")
        env = dict(os.environ, SCHEMATHESIS_HOOKS=hooks)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-25:])
        assert r.returncode == 0, tail
        print(tail, flush=True)

    for name, fn in [
        ("non-streaming chat", non_streaming_chat),
        ("streaming chat with usage", streaming_chat_with_usage),
        ("chat template applied", chat_template_is_applied),
        ("per-request provider switch", per_request_provider_switch),
        ("suffix drafts from an earlier request", suffix_drafts_from_an_earlier_request),
        ("stop sequences", stop_sequences),
        ("max_tokens exact", max_tokens_is_exact),
        ("completions endpoint", completions_endpoint),
        ("n choices, batched prompts, echo", n_choices_and_batched_prompts),
        ("echo with logprobs scores the prompt", echo_logprobs_score_the_prompt),
        ("prediction is drafted from, the answer unchanged", prediction_is_drafted_from),
        ("logprobs consistent, unchanged by speculation", logprobs_consistent_and_unchanged_by_speculation),
        ("completions logprobs: legacy shape, streamed", completions_logprobs_legacy_shape),
        ("logit_bias bans and forces tokens", logit_bias_bans_and_forces),
        ("penalties and XTC as mlx_lm.server takes them", penalties_and_xtc_as_mlx_lm_server_takes_them),
        ("response_format constrains the answer", response_format_constrains_the_answer),
        ("bad values are 400s beside a good request", bad_values_are_400s_beside_a_good_request),
        ("errors map to client exceptions", errors_map_to_client_exceptions),
        ("client disconnect frees the slot", disconnect_frees_the_slot),
        ("model weights reported in /metrics", model_weights_are_reported),
        ("load: K streams complete, 429 beyond, memory back", load_and_429),
        ("schemathesis: no 5xx", schema_fuzz_finds_no_5xx),
    ]:
        check(name, fn)
    failed = sum(1 for _, e in RESULTS if e)
    print(f"server: {len(RESULTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
