"""An agent harness against a live `mlx-spec serve`, with the official clients.

Each session is a support ticket worked as an agent loop does it: the tools are
declared on every request, the model calls a tool (forced with `tool_choice`), the
harness runs the tool and sends its result back (`role: "tool"` / a `tool_result`
block), and the model goes on, with the calls and results in the history.

usage:
  agent_loop.py check --base URL --api-key KEY [--providers P,Q,...]
      The scenario: one session through Chat Completions (`openai`) with
      speculation off and with each provider (default prompt-lookup,suffix): the
      transcripts must be identical and every call's arguments valid under its
      tool's schema. Then the same session through Messages (`anthropic`, plain
      and the second provider) and the Responses API (`openai`, turns chained by
      `previous_response_id`, one streamed; plain and the first provider): the
      same prompts, so each transcript must equal Chat Completions' plain one. Prints one line per check and `agent: N passed, M failed` last;
      exits 1 on any failure.
  agent_loop.py bench --servers plain=URL,prompt-lookup=URL,... --api-key KEY --sessions N --max-tokens M
      The `bench agent` workload, each ticket on every provider's server in turn
      (`plain` turns speculation off): prints one JSON line per request {provider,
      turn, tokens, seconds (the whole request, as the client waited),
      generation_seconds (the server's `timings`: after the first token),
      target_calls, output} and nothing else on stdout.
"""
import argparse
import json
import sys
import time

import anthropic
import jsonschema
import openai

# Order ids as the shop writes them ("#58243" or "58243"): a bounded string, as
# real tool schemas bound theirs.
ORDER_ID = {"type": "string", "pattern": "^#?[0-9]{5}$"}
TOOLS = [
    {"name": "get_order_status", "description": "Look up an order",
     "parameters": {"type": "object", "properties": {"order_id": ORDER_ID}, "required": ["order_id"]}},
    {"name": "refund_order", "description": "Refund part or all of an order",
     "parameters": {"type": "object", "properties": {"order_id": ORDER_ID,
                                                     "amount": {"type": "number"},
                                                     "reason": {"type": "string", "maxLength": 80}},
                    "required": ["order_id", "amount", "reason"]}},
    {"name": "search_products", "description": "Search the catalog",
     "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60},
                                                     "max_results": {"type": "integer"}},
                    "required": ["query"]}},
    {"name": "schedule_callback", "description": "Book a phone call with a customer",
     "parameters": {"type": "object", "properties": {"customer_id": {"type": "string", "pattern": "^C[0-9]{4}$"},
                                                     "time": {"type": "string", "maxLength": 25}},
                    "required": ["customer_id", "time"]}},
]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
OPENAI_TOOLS = [{"type": "function", "function": t} for t in TOOLS]
RESPONSES_TOOLS = [{"type": "function", **t} for t in TOOLS]
ANTHROPIC_TOOLS = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                   for t in TOOLS]
SYSTEM = ("You are a support agent for an online shop. Use the tools to look things up "
          "and act; answer the customer briefly.")
SQL_SCHEMA = ("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT);\n"
              "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total REAL, "
              "status TEXT, created_at DATE);")
NAMES = ["Alice Martin", "Bruno Costa", "Chen Wei", "Dana Novak", "Emeka Obi", "Fatima Zahra"]
PRODUCTS = ["espresso grinder", "garden hose", "wireless headphones", "standing desk"]
PROBLEMS = ["has not arrived after two weeks", "arrived damaged", "was charged twice"]
STATUSES = ["shipped", "pending", "delivered"]


def ticket(i):
    """The i-th ticket's values: fixed by i, varied across tickets."""
    return {"name": NAMES[i % len(NAMES)], "customer": 1000 + 37 * i, "order": 50000 + (7919 * i) % 50000,
            "product": PRODUCTS[i % len(PRODUCTS)], "problem": PROBLEMS[i % len(PROBLEMS)],
            "status": STATUSES[i % len(STATUSES)]}


def run_tool(name, args, t):
    """The harness's tools: answers fixed by the ticket and the arguments."""
    if name == "get_order_status":
        return json.dumps({"order_id": args.get("order_id"), "status": t["status"],
                           "product": t["product"], "updated": "2024-10-12"})
    if name == "refund_order":
        return json.dumps({"order_id": args.get("order_id"), "refunded": args.get("amount"), "ok": True})
    if name == "search_products":
        return json.dumps({"results": [t["product"], "spare " + t["product"]]})
    return json.dumps({"booked": True, "customer_id": args.get("customer_id"), "time": args.get("time")})


def user_turns(t):
    """The user's turns after the ticket, as the loop sends them."""
    return [
        f"Write the SQLite query that lists every order of customer {t['customer']}, newest first. "
        f"Schema:\n{SQL_SCHEMA}\nReturn only the SQL.",
        "Summarize the case for the ticket log in this format:\ncustomer: <name>\norder: <order id>\n"
        "issue: <one line>\nstatus: <order status>\nnext_step: <one line>",
    ]


def first_message(t):
    return (f"Ticket from {t['name']} (customer id C{t['customer']}): \"My order #{t['order']} "
            f"({t['product']}) {t['problem']}. Please help.\"")


def speculative(provider):
    return False if provider == "plain" else {"provider": provider}


class OpenAILoop:
    """One session through Chat Completions."""

    def __init__(self, client, model):
        self.client, self.model = client, model

    def session(self, t, provider, max_tokens, on_turn, strict=True):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first_message(t)}]
        transcript = []
        # Turn 1: the tool call, forced by name.
        r = self.call(messages, provider, max_tokens, on_turn, "tool",
                      tool_choice={"type": "function", "function": {"name": "get_order_status"}})
        choice = r.choices[0]
        if not strict and choice.finish_reason != "tool_calls":
            # The bench replays whatever the model wrote (the same with every
            # provider); the scenario requires the call.
            messages.append({"role": "assistant", "content": choice.message.content or ""})
            transcript.append(("text", choice.message.content))
            return self.go_on(t, messages, provider, max_tokens, on_turn, transcript)
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert calls and calls[0].function.name == "get_order_status", calls
        for c in calls:
            args = json.loads(c.function.arguments)
            jsonschema.validate(args, SCHEMAS[c.function.name])
            assert c.id and c.type == "function", c
            transcript.append(("call", c.function.name, args))
        messages.append({"role": "assistant", "content": choice.message.content,
                         "tool_calls": [c.model_dump() for c in calls]})
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c.id,
                             "content": run_tool(c.function.name, json.loads(c.function.arguments), t)})
        return self.go_on(t, messages, provider, max_tokens, on_turn, transcript)

    def go_on(self, t, messages, provider, max_tokens, on_turn, transcript):
        """The model goes on from the tool's result, then the user's turns."""
        for turn, text in [("after-tool", None)] + [("user", u) for u in user_turns(t)]:
            if text is not None:
                messages.append({"role": "user", "content": text})
            r = self.call(messages, provider, max_tokens, on_turn, turn, tool_choice="none")
            content = r.choices[0].message.content or ""
            assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0]
            transcript.append(("text", content))
            messages.append({"role": "assistant", "content": content})
        return transcript

    def call(self, messages, provider, max_tokens, on_turn, turn, **kw):
        start = time.monotonic()
        r = self.client.chat.completions.create(
            model=self.model, messages=messages, tools=OPENAI_TOOLS, max_tokens=max_tokens,
            temperature=0, extra_body={"speculative": speculative(provider)}, **kw)
        spec = r.model_extra.get("speculative")
        on_turn(turn, r.usage.completion_tokens, time.monotonic() - start,
                spec["target_calls"] if spec else r.usage.completion_tokens,
                r.choices[0].message.content or json.dumps(
                    [c.function.model_dump() for c in r.choices[0].message.tool_calls or []]),
                r.model_extra["timings"]["generation_seconds"])
        return r


class AnthropicLoop:
    """One session through the Messages API."""

    def __init__(self, client, model):
        self.client, self.model = client, model

    def session(self, t, provider, max_tokens, on_turn):
        messages = [{"role": "user", "content": first_message(t)}]
        transcript = []
        r = self.call(messages, provider, max_tokens, on_turn, "tool",
                      tool_choice={"type": "tool", "name": "get_order_status"})
        assert r.stop_reason == "tool_use", r
        uses = [b for b in r.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_order_status", r.content
        for u in uses:
            jsonschema.validate(u.input, SCHEMAS[u.name])
            assert u.id.startswith("toolu_"), u.id
            transcript.append(("call", u.name, u.input))
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": run_tool(u.name, u.input, t)} for u in uses]})
        for turn, text in [("after-tool", None)] + [("user", u) for u in user_turns(t)]:
            if text is not None:
                messages.append({"role": "user", "content": text})
            r = self.call(messages, provider, max_tokens, on_turn, turn, tool_choice={"type": "none"})
            assert r.stop_reason in ("end_turn", "max_tokens"), r
            content = "".join(b.text for b in r.content if b.type == "text")
            transcript.append(("text", content))
            messages.append({"role": "assistant", "content": content or "(no answer)"})
        return transcript

    def call(self, messages, provider, max_tokens, on_turn, turn, **kw):
        start = time.monotonic()
        r = self.client.messages.create(
            model=self.model, system=SYSTEM, messages=messages, tools=ANTHROPIC_TOOLS,
            max_tokens=max_tokens, extra_body={"speculative": speculative(provider), "temperature": 0},
            **kw)
        spec = (r.model_extra or {}).get("speculative")
        on_turn(turn, r.usage.output_tokens, time.monotonic() - start,
                spec["target_calls"] if spec else r.usage.output_tokens,
                json.dumps([b.model_dump(exclude_none=True) for b in r.content]), None)
        return r


class ResponsesLoop:
    """One session through the Responses API: each turn continues the last
    response by `previous_response_id` (the server keeps the conversation),
    the instructions sent again with each, the turn after the tool streamed;
    each turn's prompt counted first (`input_tokens`) as its usage says."""

    def __init__(self, client, model):
        self.client, self.model = client, model

    def session(self, t, provider, max_tokens):
        transcript = []
        r = self.call(first_message(t), provider, max_tokens, None,
                      tool_choice={"type": "function", "name": "get_order_status"})
        assert r.status == "completed", r
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_order_status", r.output
        for c in calls:
            args = json.loads(c.arguments)
            jsonschema.validate(args, SCHEMAS[c.name])
            assert c.call_id.startswith("call_") and c.id.startswith("fc_"), c
            transcript.append(("call", c.name, args))
        results = [{"type": "function_call_output", "call_id": c.call_id,
                    "output": run_tool(c.name, json.loads(c.arguments), t)} for c in calls]
        previous = r.id
        for turn, text in [("after-tool", results)] + [("user", u) for u in user_turns(t)]:
            r = self.call(text, provider, max_tokens, previous, stream=turn == "after-tool",
                          tool_choice="none")
            assert r.status in ("completed", "incomplete"), r
            assert all(o.type == "message" for o in r.output), r.output
            transcript.append(("text", r.output_text))
            if turn == "after-tool":
                # The stored input, as the client lists it.
                items = list(self.client.responses.input_items.list(r.id, order="asc"))
                assert [(i.type, i.call_id, i.output) for i in items] == \
                    [("function_call_output", x["call_id"], x["output"]) for x in results], items
            previous = r.id
        stored = self.client.responses.retrieve(previous)
        assert stored.id == previous and stored.output_text == transcript[-1][1], stored
        return transcript

    def call(self, input, provider, max_tokens, previous, stream=False, **kw):
        prompt = dict(model=self.model, input=input, instructions=SYSTEM, tools=RESPONSES_TOOLS,
                      previous_response_id=previous, **kw)
        # The prompt's tokens, counted without running it.
        counted = self.client.responses.input_tokens.count(**prompt).input_tokens
        args = dict(prompt, max_output_tokens=max_tokens, temperature=0,
                    extra_body={"speculative": speculative(provider)})
        final = self.client.responses.create(**args) if not stream else self.streamed(args)
        assert final.usage.input_tokens == counted, (final.usage, counted)
        return final

    def streamed(self, args):
        deltas, final = "", None
        # The client's stream helper checks the events' order and identities;
        # its final response is only a completed one's.
        with self.client.responses.stream(**args) as events:
            for e in events:
                if e.type == "response.output_text.delta":
                    deltas += e.delta
                elif e.type == "response.incomplete":
                    final = e.response
            final = final or events.get_final_response()
        assert deltas == final.output_text, (deltas, final.output_text)
        return final


def clients(base, api_key):
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=300)
    model = oa.models.list().data[0].id
    an = anthropic.Anthropic(base_url=base, api_key=api_key, max_retries=0, timeout=300)
    return OpenAILoop(oa, model), AnthropicLoop(an, model)


def check(args):
    loops = clients(args.base, args.api_key)
    results = []

    def record(name, fn):
        start = time.monotonic()
        try:
            fn()
            results.append(None)
            print(f"ok   {name} ({time.monotonic() - start:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            results.append(e)
            print(f"FAIL {name} ({time.monotonic() - start:.1f} s): {type(e).__name__}: {e}", flush=True)

    providers = args.providers.split(",")
    chat, messages = loops
    quiet = lambda *a: None  # noqa: E731
    reference = []

    def over_chat():
        plain = chat.session(ticket(1), "plain", 40, quiet)
        assert plain[0][0] == "call" and len(plain) == 4, plain
        reference.append(plain)
        for provider in providers:
            got = chat.session(ticket(1), provider, 40, quiet)
            assert got == plain, f"{provider} changed the transcript:\n{got}\n!=\n{plain}"
    record(f"agent loop over chat completions: forced call, tool result, two more turns; "
           f"{args.providers} equal plain", over_chat)

    # The other APIs render the same prompts: their transcripts must equal
    # Chat Completions' plain one, plain and with one provider each (every
    # provider ran above; the pipeline after the prompt is shared).
    def same_as_chat(api, session, provider):
        def check():
            assert reference, "the chat completions session failed"
            for p in ["plain", provider]:
                got = session(p)
                assert got == reference[0], f"{api} ({p}) differs from chat completions:\n{got}\n!=\n{reference[0]}"
        return check

    second = providers[1 % len(providers)]
    record(f"agent loop over messages: plain and {second} equal chat completions' plain transcript",
           same_as_chat("messages", lambda p: messages.session(ticket(1), p, 40, quiet), second))
    responses = ResponsesLoop(chat.client, chat.model)
    record("agent loop over responses (previous_response_id, one turn streamed, input_tokens "
           "equal to usage): plain and "
           f"{providers[0]} equal chat completions' plain transcript",
           same_as_chat("responses", lambda p: responses.session(ticket(1), p, 40), providers[0]))
    failed = sum(r is not None for r in results)
    print(f"agent: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def bench(args):
    """Each ticket runs on every provider's server in turn, so the machine's
    load falls on all of them alike."""
    servers = [entry.split("=", 1) for entry in args.servers.split(",")]
    loops = [(provider, clients(base, args.api_key)[0]) for provider, base in servers]

    def emitter(provider):
        def emit(turn, tokens, seconds, target_calls, output, generation_seconds):
            print(json.dumps({"provider": provider, "turn": turn, "tokens": tokens,
                              "seconds": seconds, "generation_seconds": generation_seconds,
                              "target_calls": target_calls, "output": output}), flush=True)
        return emit

    for i in range(args.sessions):
        for provider, loop in loops:
            loop.session(ticket(i), provider, args.max_tokens, emitter(provider), strict=False)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "bench"])
    ap.add_argument("--base", help="check: the server")
    ap.add_argument("--servers", help="bench: PROVIDER=URL,... (`plain` turns speculation off)")
    ap.add_argument("--providers", default="prompt-lookup,suffix",
                    help="check: the providers whose transcripts must equal plain's")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    sys.exit(check(args) if args.mode == "check" else bench(args))


if __name__ == "__main__":
    main()
