#!/usr/bin/env python3
"""Serving speed of a 2-node cluster through the OpenAI API, against one node.

Starts two `strata node` processes on loopback (`--threads 1` each: one node is one core, as
`strata bench scaling` compares 1x1 with 2x1), loads the model with each strategy asked for,
and drives `/v1/chat/completions` with 1, 4 and 16 concurrent streaming clients; then the same
against `strata serve --threads 1` (one node). Reports aggregate and per-stream tok/s and the
median time to first token. Several binaries may be given to compare builds side by side.

    python3 scripts/bench-cluster-api.py --strata target/release/strata [--strata OTHER]
        [--strategies tensor,pipeline] [--levels 1,4,16] [--tokens 64] [--load-parallel 16]
        [--json out.json]
"""
import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from serve_process import serving, stream_chunks

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain how a steam engine works, step by step.",
    "Describe a journey across the mountains in winter.",
    "Write a detailed recipe for bread, with every step.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TEMPERATURE = 0.7


def one(url, i, tokens):
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": tokens, "temperature": TEMPERATURE, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, n = None, 0
    for chunk in stream_chunks(url, "/v1/chat/completions", body):
        if chunk.get("usage"):
            n = chunk["usage"]["completion_tokens"]
        if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            first = time.perf_counter()
    end = time.perf_counter()
    return n, (first or end) - t0, end - (first or t0)


def level(url, clients, tokens, rounds=2):
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        t0 = time.perf_counter()
        res = list(ex.map(lambda i: [one(url, i * rounds + r, tokens) for r in range(rounds)],
                          range(clients)))
        wall = time.perf_counter() - t0
    flat = [x for r in res for x in r]
    total = sum(n for n, _, _ in flat)
    per = [max(n - 1, 0) / d for n, _, d in flat if d > 0]
    return {"clients": clients, "aggregate_tok_s": total / wall,
            "per_stream_tok_s": statistics.median(per) if per else 0.0,
            "ttft_s": statistics.median(t for _, t, _ in flat)}


def wait_http(url, path="/health", timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        try:
            urllib.request.urlopen(url + path, timeout=2).read()
            return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def cluster(strata, strategy, levels, tokens, parallel=None):
    tmp = tempfile.mkdtemp(prefix="strata-bench-cluster-")
    key = os.path.join(tmp, "cluster.key")
    subprocess.run([strata, "keygen", "--out", key], check=True, capture_output=True)
    control = [free_port(), free_port()]
    api = [free_port(), free_port()]
    procs = []
    try:
        for i in range(2):
            cmd = [strata, "node", "--name", f"n{i}", "--no-multicast", "--threads", "1",
                   "--api-addr", f"127.0.0.1:{api[i]}", "--control-addr", f"127.0.0.1:{control[i]}",
                   "--advertise-addr", "127.0.0.1", "--state-dir", os.path.join(tmp, f"s{i}"),
                   "--cluster-key-file", key]
            if i == 1:
                cmd += ["--peer", f"127.0.0.1:{control[0]}"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(tmp, f"n{i}.log"), "w")))
        url = f"http://127.0.0.1:{api[0]}"
        wait_http(url)
        end = time.time() + 60
        while time.time() < end:
            out = subprocess.run([strata, "status", "--node", url, "--json"], capture_output=True,
                                 text=True)
            if out.returncode == 0 and len(json.loads(out.stdout).get("members", [])) >= 2:
                break
            time.sleep(0.5)
        # A node that joined a moment ago may not have published its measurements yet.
        for attempt in range(10):
            extra = ["--parallel", str(parallel)] if parallel else []
            out = subprocess.run([strata, "load", MODEL, "--strategy", strategy, "--node", url,
                                  "--json", *extra], capture_output=True, text=True, timeout=300)
            if out.returncode == 0:
                break
            time.sleep(2)
        else:
            raise RuntimeError(f"strata load failed: {out.stderr.strip()}")
        one(url, 0, 8)
        return [level(url, c, tokens) for c in levels]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def single(strata, levels, tokens):
    with serving(strata, MODEL, "--threads", "1", "--parallel", str(max(levels))) as url:
        one(url, 0, 8)
        return [level(url, c, tokens) for c in levels]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", action="append", required=True)
    ap.add_argument("--strategies", default="tensor,pipeline")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--load-parallel", type=int,
                    help="sequence slots of the cluster's instance (`strata load --parallel`)")
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="0 samples greedily (a sharded instance then moves one logit per rank)")
    ap.add_argument("--configs", default="1 node,cluster",
                    help="which of `1 node` and `cluster` to run")
    ap.add_argument("--json")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    global TEMPERATURE
    TEMPERATURE = a.temperature
    results = []
    for strata in a.strata:
        rows = {}
        if "1 node" in a.configs:
            rows["1 node"] = single(strata, levels, a.tokens)
        for s in a.strategies.split(",") if "cluster" in a.configs else []:
            rows[f"2 nodes, {s}"] = cluster(strata, s, levels, a.tokens, a.load_parallel)
        results.append({"strata": strata, "rows": rows})
    print("| build | configuration | clients | aggregate tok/s | per stream tok/s | TTFT s | vs 1 node |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        base = {x["clients"]: x["aggregate_tok_s"] for x in r["rows"].get("1 node", [])}
        for name, lv in r["rows"].items():
            for x in lv:
                print(f"| {r['strata']} | {name} | {x['clients']} | {x['aggregate_tok_s']:.1f} | "
                      f"{x['per_stream_tok_s']:.1f} | {x['ttft_s']:.2f} | "
                      + (f"{x['aggregate_tok_s'] / base[x['clients']]:.2f}x |"
                         if x["clients"] in base else "- |"))
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
