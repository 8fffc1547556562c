#!/usr/bin/env python3
"""Tool-call latency: what running grammar-forced tokens in one pass saves, against `strata serve`.

Starts the server itself (the strata binary given by --strata) and sends the same greedy
tool-call requests (tool_choice "required") twice over, interleaved: once plainly, where the
tokens the grammar forces run through the model in one pass, and once with `logprobs: true`,
which makes the server step every token (forced ones have no logits of their own). The
logprobs request also computes a log-softmax per token, so the same pair is measured on a plain
chat request with no grammar, where nothing is forced: that row is the cost of logprobs alone.
Reports median latency per request kind and the ratios. Standard library only.

    python3 scripts/bench-tools.py --strata target/release/strata [--rounds 5]
"""
import argparse
import json
import statistics
import time
import urllib.request

from serve_process import serving

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_trip", "description": "Book a trip",
        "parameters": {"type": "object", "properties": {
            "traveller": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": False},
            "stops": {"type": "array", "items": {"type": "string", "maxLength": 20},
                      "minItems": 1, "maxItems": 3},
            "class": {"enum": ["economy", "business"]}},
            "required": ["traveller", "stops", "class"], "additionalProperties": False}}},
]

REQUESTS = {
    "tool call (get_weather)": {
        "messages": [{"role": "user", "content": "What's the weather in Paris, in celsius?"}],
        "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    "tool call (book_trip)": {
        "messages": [{"role": "user", "content": "Book a business trip for Ann, 34, to Rome and Oslo."}],
        "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "book_trip"}}},
    "plain chat (nothing forced)": {
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}]},
}


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.loads(r.read())
    return time.perf_counter() - t0, answer["usage"]["completion_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="target/release/strata")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    times = {(k, lp): [] for k in REQUESTS for lp in (False, True)}
    tokens = {}
    with serving(a.strata, a.model, "--threads", str(a.threads)) as url:
        for r in range(a.rounds + 1):
            for kind, body in REQUESTS.items():
                for lp in (False, True):
                    req = dict(body, model=a.model, max_tokens=a.max_tokens, temperature=0)
                    if lp:
                        req["logprobs"] = True
                    dt, n = post(url, req)
                    if r > 0:  # round 0 warms up
                        times[(kind, lp)].append(dt)
                        tokens[(kind, lp)] = n
    print("| request | tokens | one pass for forced tokens, ms | every token stepped (logprobs), ms | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind in REQUESTS:
        fast = statistics.median(times[(kind, False)]) * 1e3
        slow = statistics.median(times[(kind, True)]) * 1e3
        n = f"{tokens[(kind, False)]} / {tokens[(kind, True)]}"
        print(f"| {kind} | {n} | {fast:.0f} | {slow:.0f} | {slow / fast:.2f}x |")


if __name__ == "__main__":
    main()
