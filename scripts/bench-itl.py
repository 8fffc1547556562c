#!/usr/bin/env python3
"""Inter-token latency of live streams while a long prompt is admitted (chunked prefill).

Starts `strata serve`, runs 8 streaming clients generating long answers, and once all are
streaming sends one request with a prompt of about 2,000 tokens. Reports the 8 streams'
inter-token gaps (median and p99) over the window from the long request's arrival until its
first token, and over the same length of time before it, and the p99/median ratio.

    python3 scripts/bench-itl.py --strata target/release/strata [--threads 2] [--streams 8]
"""
import argparse
import statistics
import sys
import threading
import time

from serve_process import serving, stream_chunks

MODEL = "smollm2-135m-instruct"


def stream(url, i, tokens, stamps, started):
    body = {"model": MODEL, "messages": [{"role": "user", "content":
            f"Write a very long story number {i} about a lighthouse keeper and the sea."}],
            "max_tokens": tokens, "temperature": 0.7, "seed": i, "stream": True}
    first = True
    for chunk in stream_chunks(url, "/v1/chat/completions", body):
        if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            stamps.append(time.perf_counter())
            if first:
                started.release()
                first = False


def gaps(all_stamps, a, b):
    out = []
    for s in all_stamps:
        inside = [t for t in s if a <= t <= b]
        out += [y - x for x, y in zip(inside, inside[1:])]
    return out


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    a = ap.parse_args()
    words = ("the keeper climbed the stairs and lit the lamp above the grey water " * 200).split()
    long_prompt = " ".join(words[: int(a.prompt_tokens * 0.9)])
    with serving(a.strata, MODEL, "--threads", a.threads, "--parallel", str(a.streams + 1),
                 "--ctx-size", "4096") as url:
        stamps = [[] for _ in range(a.streams)]
        started = threading.Semaphore(0)
        threads = [threading.Thread(target=stream, args=(url, i, 600, stamps[i], started))
                   for i in range(a.streams)]
        for t in threads:
            t.start()
        for _ in threads:
            started.acquire()
        time.sleep(1.0)
        t0 = time.perf_counter()
        body = {"model": MODEL, "messages": [{"role": "user", "content": long_prompt}],
                "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}}
        prompt_tokens = 0
        for chunk in stream_chunks(url, "/v1/chat/completions", body):
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
        t1 = time.perf_counter()
        for t in threads:
            t.join()
    during = gaps(stamps, t0, t1)
    before = gaps(stamps, t0 - (t1 - t0), t0)
    for name, g in (("before", before), ("while admitted", during)):
        med, p99 = statistics.median(g), pct(g, 0.99)
        print(f"{name}: {len(g)} gaps, median {med * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
              f"p99/median {p99 / med:.2f}")
    print(f"the long prompt: {prompt_tokens} tokens, admitted in {(t1 - t0) * 1000:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
