#!/usr/bin/env python3
"""Prefix cache benchmark: agent-sized prompts (a long fixed prefix, as an agent's system prompt
and tools, and a short varying tail) against `strata serve`, with the cache on and off.

Starts the servers itself (the strata binary given by --strata). Reports:
  - time to first token (streamed, greedy) of the first request and of the later ones, with the
    cache on, and the ratio of the first to the median of the later ones;
  - whether every answer is the same with the cache on and off (greedy);
  - N concurrent clients sharing the prefix: their median time to first token, the bytes the
    prefix cache holds (one copy of the prefix), the peaks while they run of the keys and
    values the running sequences read in shared blocks (each block once), would read as private
    copies, and computed themselves (`/metrics`), and the server's resident memory.
Standard library only.

    python3 scripts/bench-prefix-cache.py --strata target/release/strata \\
        [--model gemma3-270m] [--prefix-tokens 12000] [--requests 4] [--clients 8] [--json out.json]
"""
import argparse
import concurrent.futures
import json
import random
import statistics
import threading
import time
import urllib.request

from serve_process import serving_process as serving, stream_chunks

WORDS = ("file function test build module error branch commit review patch lint type value "
         "index cache thread queue socket buffer parser token schema option config path").split()


def prefix_text(tokens):
    """Text of about `tokens` tokens, varied enough not to be one repeated phrase."""
    rng = random.Random(7)
    lines, n = [], 0
    while n < tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(8))
        lines.append(f"Rule {len(lines)}: when you see a {words}, handle it carefully and report it.")
        n += 26
    return "You are a coding agent working in a repository.\n" + "\n".join(lines) + "\n"


def tail_text(i, tokens):
    """About `tokens` tokens (these words take about three each)."""
    rng = random.Random(100 + i)
    return f"\nTask {i}: " + " ".join(rng.choice(WORDS) for _ in range(tokens // 3)) + "\nAnswer:"


def ask(url, model, prompt, max_tokens):
    """Streams one greedy completion: (time to first token, text, usage)."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, parts, usage = None, [], None
    for chunk in stream_chunks(url, "/v1/completions", body, timeout=1800):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for ch in chunk.get("choices", []):
            if first is None:
                first = time.perf_counter()
            parts.append(ch.get("text", ""))
    return (first or time.perf_counter()) - t0, "".join(parts), usage


def metrics(url):
    """Every unlabelled sample of `/metrics`, by name."""
    out = {}
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()[:2]
                out[name] = float(value)
    return out


class Peaks(threading.Thread):
    """Samples the server's KV metrics and resident memory until stopped; keeps the peaks."""
    NAMES = ("strata_kv_shared_bytes", "strata_kv_shared_read_bytes", "strata_kv_own_bytes")

    def __init__(self, url, pid):
        super().__init__(daemon=True)
        self.url, self.pid, self.done = url, pid, threading.Event()
        self.peak = {n: 0.0 for n in self.NAMES}
        self.peak["rss"] = 0.0

    def run(self):
        while not self.done.wait(0.2):
            try:
                m = metrics(self.url)
            except OSError:
                continue
            for n in self.NAMES:
                self.peak[n] = max(self.peak[n], m.get(n, 0.0))
            self.peak["rss"] = max(self.peak["rss"], rss_bytes(self.pid) or 0)


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--prefix-tokens", type=int, default=12000)
    ap.add_argument("--tail-tokens", type=int, default=200)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    ctx = str(int(1.25 * (a.prefix_tokens + a.tail_tokens)) + a.max_tokens + 512)
    prefix = prefix_text(a.prefix_tokens)
    prompts = [prefix + tail_text(i, a.tail_tokens) for i in range(a.requests)]
    common = ["--ctx-size", ctx, "--parallel", str(a.clients)]

    with serving(a.strata, a.model, *common) as (url, pid):
        on = [ask(url, a.model, p, a.max_tokens) for p in prompts]
        shared = [prefix + tail_text(1000 + i, a.tail_tokens) for i in range(a.clients)]
        rss_before = rss_bytes(pid)
        peaks = Peaks(url, pid)
        peaks.start()
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(a.clients) as ex:
            together = list(ex.map(lambda p: ask(url, a.model, p, a.max_tokens), shared))
        wall = time.perf_counter() - t0
        peaks.done.set()
        peaks.join()
        cache_bytes = metrics(url).get("strata_prefix_cache_bytes")
        rss_after = rss_bytes(pid)
    with serving(a.strata, a.model, *common, "--cache-mem", "0") as (url, _):
        off = [ask(url, a.model, p, a.max_tokens) for p in prompts]

    ttft = [r[0] for r in on]
    later = statistics.median(ttft[1:]) if len(ttft) > 1 else float("nan")
    same = [x[1] == y[1] for x, y in zip(on, off)]
    prompt_tokens = on[0][2]["prompt_tokens"]
    report = {
        "model": a.model,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": [r[2].get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in on],
        "ttft_cache_on_s": ttft,
        "ttft_cache_off_s": [r[0] for r in off],
        "first_over_later": ttft[0] / later,
        "same_output_on_and_off": all(same),
        "concurrent_clients": a.clients,
        "concurrent_ttft_median_s": statistics.median(r[0] for r in together),
        "concurrent_cached_tokens": [r[2].get("prompt_tokens_details", {}).get("cached_tokens", 0)
                                     for r in together],
        "concurrent_wall_s": wall,
        "prefix_cache_bytes": cache_bytes,
        "rss_before_concurrent_bytes": rss_before,
        "rss_after_concurrent_bytes": rss_after,
        "rss_peak_concurrent_bytes": peaks.peak["rss"],
        "kv_shared_bytes_peak": peaks.peak["strata_kv_shared_bytes"],
        "kv_shared_read_bytes_peak": peaks.peak["strata_kv_shared_read_bytes"],
        "kv_own_bytes_peak": peaks.peak["strata_kv_own_bytes"],
    }
    print(f"model {a.model}, prompts of {prompt_tokens} tokens ({a.prefix_tokens} shared), greedy")
    print("request  cached  TTFT cache on  TTFT cache off  same output")
    for i, (x, y) in enumerate(zip(on, off)):
        cached = report["cached_tokens"][i]
        print(f"{i + 1:>7}  {cached:>6}  {x[0]:>12.2f}s  {y[0]:>13.2f}s  {'yes' if same[i] else 'NO'}")
    print(f"first / later (median): {report['first_over_later']:.1f}x")
    print(f"{a.clients} concurrent clients: TTFT median {report['concurrent_ttft_median_s']:.2f}s, "
          f"wall {wall:.1f}s, prefix cache {cache_bytes / 2**20:.0f} MiB, "
          f"server RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB "
          f"(peak {peaks.peak['rss'] / 2**20:.0f})")
    mib = lambda k: report[k] / 2**20
    print(f"while they ran (peaks): shared prefix blocks held {mib('kv_shared_bytes_peak'):.0f} MiB, "
          f"as private copies {mib('kv_shared_read_bytes_peak'):.0f} MiB, "
          f"own positions {mib('kv_own_bytes_peak'):.0f} MiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
