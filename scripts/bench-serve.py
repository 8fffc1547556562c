#!/usr/bin/env python3
"""Continuous-batching benchmark: 1, 4 and 8 concurrent streaming clients against `strata serve`.

Starts the server itself (the strata binary given by --strata), sends each client's requests
back to back for the same number of rounds, and reports per level: aggregate generated tok/s
(all tokens / wall time), per-stream tok/s (each request's tokens after the first / its decode
time, median), and time to first token (median, p90). Speed is a ratio against the 1-client
row of the same run. Standard library only.

    python3 scripts/bench-serve.py --strata target/release/strata [--levels 1,4,8] [--json out.json]
"""
import argparse
import concurrent.futures
import json
import statistics
import time
import urllib.request

from serve_process import serving, stream_chunks

PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain how a steam engine works, step by step.",
    "Describe a journey across the mountains in winter.",
    "Write a detailed recipe for bread, with every step.",
]


def stream_one(url, model, prompt, max_tokens):
    body = {
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0.7, "seed": 1, "stream": True, "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    tokens = 0
    for chunk in stream_chunks(url, "/v1/chat/completions", body):
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for ch in chunk.get("choices", []):
            if ch["delta"].get("content") and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    first = first or end
    return {"ttft": first - t0, "tokens": tokens, "decode_s": end - first}


def level(url, model, clients, rounds, max_tokens):
    def client(i):
        return [stream_one(url, model, PROMPTS[(i + r) % len(PROMPTS)], max_tokens) for r in range(rounds)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        runs = [x for xs in ex.map(client, range(clients)) for x in xs]
    wall = time.perf_counter() - t0
    total = sum(r["tokens"] for r in runs)
    per = [(r["tokens"] - 1) / r["decode_s"] for r in runs if r["tokens"] > 1 and r["decode_s"] > 0]
    ttfts = sorted(r["ttft"] for r in runs)
    return {
        "clients": clients, "requests": len(runs), "tokens": total, "wall_s": wall,
        "aggregate_tok_s": total / wall, "per_stream_tok_s": statistics.median(per),
        "ttft_ms_median": 1e3 * statistics.median(ttfts),
        "ttft_ms_p90": 1e3 * ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="target/release/strata")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    with serving(a.strata, a.model, "--threads", str(a.threads), "--parallel", str(max(levels))) as url:
        stream_one(url, a.model, PROMPTS[0], 8)  # warm-up
        rows = [level(url, a.model, n, a.rounds, a.max_tokens) for n in levels]
    base = rows[0]["aggregate_tok_s"]
    print("| clients | requests | aggregate tok/s | vs 1 client | per-stream tok/s | TTFT median ms | TTFT p90 ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        r["speedup"] = r["aggregate_tok_s"] / base
        print(f"| {r['clients']} | {r['requests']} | {r['aggregate_tok_s']:.1f} | {r['speedup']:.2f}x | "
              f"{r['per_stream_tok_s']:.1f} | {r['ttft_ms_median']:.0f} | {r['ttft_ms_p90']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "max_tokens": a.max_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
