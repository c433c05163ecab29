"""Runs one chat conversation against an OpenAI-compatible server with the
official `openai` client, streaming, one turn after another: each turn sends
the whole history (the user turns given, the server's own answers) and
records the time to the first content token and to the end of the stream.

usage: bench_chat_client.py --base http://127.0.0.1:PORT --model NAME
           --turns FILE.json --max-tokens N
FILE.json holds the user turns (a list of strings). Prints one JSON object:
{"turns": [{"ttft": s, "total": s, "prompt_tokens": n|null,
"cached_tokens": n|null, "answer": text}, ...]}.
"""
import argparse
import json
import time

import openai


def turn(client, model, messages, max_tokens):
    start = time.perf_counter()
    first = None
    pieces = []
    usage = None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text = choice.delta.content if choice.delta else None
            if text:
                if first is None:
                    first = time.perf_counter() - start
                pieces.append(text)
    total = time.perf_counter() - start
    prompt_tokens = getattr(usage, "prompt_tokens", None) if usage else None
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = getattr(details, "cached_tokens", None) if details else None
    return {
        "ttft": first if first is not None else total,
        "total": total,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "answer": "".join(pieces),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--turns", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    args = parser.parse_args()
    with open(args.turns) as f:
        users = json.load(f)
    client = openai.OpenAI(base_url=args.base + "/v1", api_key="unused", timeout=600)
    messages = []
    results = []
    for text in users:
        messages.append({"role": "user", "content": text})
        result = turn(client, args.model, messages, args.max_tokens)
        messages.append({"role": "assistant", "content": result["answer"]})
        results.append(result)
    print(json.dumps({"turns": results}))


if __name__ == "__main__":
    main()
