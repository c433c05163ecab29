"""Drives a live `mlx-spec serve` through Anthropic's Messages API with the
official `anthropic` client (2.16): a text answer, the same answer streamed
(event order checked on the raw stream), a tool round trip (a forced
`tool_use` whose input validates against its schema, then a `tool_result`
turn), `output_config.format`, `count_tokens` against the answer's usage,
speculation equal to none, errors in Anthropic's shape, `x-api-key`.

usage: anthropic_check.py --base http://127.0.0.1:PORT --api-key KEY
Prints one line per check and `anthropic: N passed, M failed` last; exits 1
on any failure.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request

import anthropic
import jsonschema

RESULTS = []
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {"type": "object",
                     "properties": {"city": {"type": "string"},
                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                     "required": ["city", "unit"]},
}
GREEDY = {"temperature": 0}


def check(name, fn):
    start = time.monotonic()
    try:
        fn()
        RESULTS.append((name, None))
        print(f"ok   {name} ({time.monotonic() - start:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        RESULTS.append((name, e))
        print(f"FAIL {name} ({time.monotonic() - start:.1f} s): {type(e).__name__}: {e}", flush=True)


def raw(base, path, body, headers):
    """POSTs `body`: the status and the response's text."""
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sse_events(text):
    """`(event name, data)` of each event of an SSE body."""
    events = []
    for chunk in text.split("\n\n"):
        name, data = None, []
        for line in chunk.splitlines():
            if line.startswith("event:"):
                name = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].strip())
        if name:
            events.append((name, json.loads("\n".join(data))))
    return events


def check_order(events):
    """Anthropic's event order: message_start, ping, blocks with indices
    0, 1, ... each started, given deltas and stopped in turn, message_delta,
    message_stop."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[1] == "ping", names
    assert names[-2:] == ["message_delta", "message_stop"], names
    open_index, next_index = None, 0
    for name, data in events[2:-2]:
        assert data["type"] == name, (name, data)
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index, names
            open_index, next_index = data["index"], next_index + 1
        elif name == "content_block_delta":
            assert data["index"] == open_index, names
        elif name == "content_block_stop":
            assert data["index"] == open_index, names
            open_index = None
        else:
            raise AssertionError(f"unexpected event {name}: {names}")
    assert open_index is None, names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--api-key", required=True)
    args = ap.parse_args()
    base, key = args.base, args.api_key
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
    model = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{base}/v1/models", headers={"authorization": f"Bearer {key}"}), timeout=30).read())["data"][0]["id"]
    create = lambda **kw: client.messages.create(model=model, **kw)  # noqa: E731
    answer = {}

    def text_answer():
        r = create(messages=QUESTION, max_tokens=24, extra_body=GREEDY)
        assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), r
        assert [b.type for b in r.content] == ["text"], r.content
        assert "Paris" in r.content[0].text, r.content
        assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None, r
        assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 10, r.usage
        assert r.usage.output_tokens > 0, r.usage
        assert r.model == model, r.model
        spec = r.model_extra["speculative"]
        assert spec is None or spec["target_calls"] > 0, spec
        answer["text"], answer["usage"] = r.content[0].text, r.usage

    def streamed_answer():
        with client.messages.stream(model=model, messages=QUESTION, max_tokens=24,
                                    extra_body=GREEDY) as stream:
            types = [e.type for e in stream]
            final = stream.get_final_message()
        assert final.content[0].text == answer["text"], (final.content, answer)
        assert types[0] == "message_start" and "content_block_delta" in types, types
        status, body = raw(base, "/v1/messages", {"model": model, "messages": QUESTION, "max_tokens": 24,
                                                  "stream": True, **GREEDY}, {"x-api-key": key})
        assert status == 200, body
        events = sse_events(body)
        check_order(events)
        text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
        assert text == answer["text"], (text, answer)
        delta = [d for n, d in events if n == "message_delta"][0]
        assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens"), delta
        assert delta["usage"]["output_tokens"] == answer["usage"].output_tokens, delta

    def stop_sequence():
        # A word from the middle of the plain answer ends the same answer there.
        text = answer["text"]
        words = [w for w in text.split() if len(w) > 2]
        assert len(words) >= 2, text
        stop = words[len(words) // 2]
        r = create(messages=QUESTION, max_tokens=24, stop_sequences=[stop], extra_body=GREEDY)
        assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, r
        assert r.content[0].text == text[:text.index(stop)], (r.content, text, stop)

    def tool_round_trip():
        history = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = create(messages=history, tools=[WEATHER], max_tokens=60,
                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, extra_body=GREEDY)
        assert r.stop_reason == "tool_use", r
        uses = [b for b in r.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_"), r.content
        for u in uses:
            jsonschema.validate(u.input, WEATHER["input_schema"])
        # The same call streamed: its input arrives as input_json_delta pieces.
        with client.messages.stream(model=model, messages=history, tools=[WEATHER], max_tokens=60,
                                    tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                                    extra_body=GREEDY) as stream:
            events = list(stream)
            final = stream.get_final_message()
        assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
        streamed = [b for b in final.content if b.type == "tool_use"]
        assert [b.input for b in streamed] == [u.input for u in uses], (streamed, uses)
        assert final.stop_reason == "tool_use", final
        history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": "18 degrees and sunny"} for u in uses]})
        after = create(messages=history, tools=[WEATHER], max_tokens=40,
                       tool_choice={"type": "none"}, extra_body=GREEDY)
        assert after.stop_reason in ("end_turn", "max_tokens"), after
        assert [b.type for b in after.content] == ["text"] and after.content[0].text.strip(), after.content

    def structured_output():
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"], "additionalProperties": False}
        r = create(messages=[{"role": "user", "content": "Name the capital of France as JSON."}],
                   max_tokens=40, extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema",
                                                                                     "schema": schema}}})
        jsonschema.validate(json.loads(r.content[0].text), schema)

    def count_tokens():
        counted = client.messages.count_tokens(model=model, messages=QUESTION)
        usage = answer["usage"]
        assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0), (counted, usage)
        system = client.messages.count_tokens(model=model, messages=QUESTION, system="Be brief.")
        with_tools = client.messages.count_tokens(model=model, messages=QUESTION, tools=[WEATHER],
                                                  system="Be brief.")
        assert with_tools.input_tokens > system.input_tokens, (with_tools, system)

    def speculation_changes_nothing():
        ask = [{"role": "user", "content": "Repeat this list: apple, banana, cherry, apple, banana, cherry."}]
        outputs = []
        for spec in [False, {"provider": "prompt-lookup"}, {"provider": "suffix"}]:
            r = create(messages=ask, max_tokens=40, extra_body={**GREEDY, "speculative": spec})
            outputs.append([b.model_dump() for b in r.content])
        assert outputs[0] == outputs[1] == outputs[2], outputs

    def errors_in_anthropics_shape():
        try:
            create(messages=[{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "x"}]}], max_tokens=8)
            raise AssertionError("a tool_result without its tool_use was accepted")
        except anthropic.BadRequestError as e:
            assert e.body["type"] == "error", e.body
            assert e.body["error"]["type"] == "invalid_request_error", e.body
            assert "tool_use_id" in e.body["error"]["message"], e.body
        try:
            create(messages=QUESTION, max_tokens=8, tools=[WEATHER],
                   tool_choice={"type": "tool", "name": "get_time"})
            raise AssertionError("tool_choice naming an unknown tool was accepted")
        except anthropic.BadRequestError as e:
            assert "get_time" in e.body["error"]["message"], e.body
        status, body = raw(base, "/v1/messages", {"model": model, "messages": QUESTION},
                           {"x-api-key": key})
        error = json.loads(body)
        assert status == 400 and error["error"]["type"] == "invalid_request_error", body
        assert "max_tokens" in error["error"]["message"], body

    def x_api_key():
        keyed = anthropic.Anthropic(base_url=base, api_key=None, default_headers={"x-api-key": key},
                                    max_retries=0, timeout=300)
        r = keyed.messages.create(model=model, messages=QUESTION, max_tokens=4)
        assert r.content, r
        wrong = anthropic.Anthropic(base_url=base, api_key=None, default_headers={"x-api-key": "wrong"},
                                    max_retries=0, timeout=30)
        try:
            wrong.messages.create(model=model, messages=QUESTION, max_tokens=4)
            raise AssertionError("a wrong x-api-key was accepted")
        except anthropic.AuthenticationError as e:
            assert e.body["error"]["type"] == "authentication_error", e.body
        status, _ = raw(base, "/v1/messages/count_tokens", {"model": model, "messages": QUESTION}, {})
        assert status == 401, status

    check("messages: a text answer with usage and speculation stats", text_answer)
    check("messages: the same answer streamed, events in Anthropic's order, ping included", streamed_answer)
    check("messages: stop_sequences end with stop_reason stop_sequence", stop_sequence)
    check("messages: a forced tool_use validates against its schema, streamed alike; a tool_result turn goes on",
          tool_round_trip)
    check("messages: output_config.format constrains the answer to the schema", structured_output)
    check("count_tokens: the prompt the answer's usage counted; tools add to it", count_tokens)
    check("messages: prompt lookup and suffix answer exactly as without speculation", speculation_changes_nothing)
    check("messages: bad requests are 400s in Anthropic's shape naming the field", errors_in_anthropics_shape)
    check("auth: x-api-key accepted, a wrong one a 401 authentication_error", x_api_key)
    failed = sum(1 for _, e in RESULTS if e is not None)
    print(f"anthropic: {len(RESULTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
