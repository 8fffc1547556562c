#!/usr/bin/env python3
"""Speculative decoding benchmark: prompt-lookup drafts (`--speculate ngram`) against decoding
one token per step (`--speculate off`), measured side by side in interleaved rounds.

The workloads are made from files strata ships, so anyone can rebuild them:
  - edit: a 300-800-line source file of this repository in the prompt, asked back with one
    identifier renamed (SmolLM2, through its chat template, as an agent asks);
  - copy: the same kind of file given to Gemma 3 270M (a base model) and continued after a line
    that says the file follows again;
  - chat: a plain request with nothing to copy, where drafts should switch themselves off;
  - edit x8: eight editing requests sent together to `strata serve`, aggregate tokens per
    second over the whole exchange, timed the second time they are sent (their prompts then
    come from the prefix cache, so the exchange is mostly decoding).

For `strata run` it reports decode tokens per second (from `--stats-json`), medians over the
rounds, their ratio, the drafted tokens accepted, and whether the outputs were the same
(greedy). Standard library only.

    python3 scripts/bench-speculate.py --strata target/release/strata [--rounds 3] [--json]
"""
import argparse
import concurrent.futures
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from serve_process import serving

ROOT = Path(__file__).resolve().parent.parent
EDIT_FILE = ROOT / "crates/tokenizer/src/template.rs"
COPY_FILE = ROOT / "crates/engine/src/shard.rs"
CONCURRENT_FILES = sorted((ROOT / "crates/tokenizer/src").glob("*.rs"))
CHAT = "Write a short story about a dragon who learns to bake bread."


def edit_prompt(path):
    src = path.read_text()
    return (f"Here is `{path.name}`:\n```rust\n{src}```\nRename the function `render` to "
            "`render_prompt` and return the whole file with that change, nothing else.")


def copy_prompt(path):
    src = path.read_text()
    return f"// {path.name}\n{src}\n// {path.name} again, unchanged:\n"


def run(strata, speculate, model, prompt, n, raw):
    args = [strata, "run", "--model", model, "--speculate", speculate, "--max-tokens", str(n),
            "--ignore-eos", "--stats-json", "--threads", "2", "-"]
    if raw:
        args.insert(2, "--raw")
    p = subprocess.run(args, input=prompt, capture_output=True, text=True, check=True)
    stats = json.loads(p.stderr.strip().splitlines()[-1])
    return p.stdout, stats


def single(strata, name, model, prompt, n, raw, rounds):
    speeds = {"off": [], "ngram": []}
    outputs, spec = {}, None
    for _ in range(rounds):
        for mode in ("off", "ngram"):
            text, stats = run(strata, mode, model, prompt, n, raw)
            speeds[mode].append(stats["decode_tok_s"])
            outputs.setdefault(mode, text)
            if mode == "ngram":
                spec = stats.get("speculation")
    off, on = statistics.median(speeds["off"]), statistics.median(speeds["ngram"])
    return {
        "workload": name,
        "model": model,
        "prompt tokens": stats["prompt_tokens"],
        "tokens": n,
        "off tok/s": round(off, 1),
        "ngram tok/s": round(on, 1),
        "ratio": round(on / off, 2),
        "accepted / drafted": f"{spec['accepted']} / {spec['drafted']}" if spec else "-",
        "same output": "yes" if outputs["off"] == outputs["ngram"] else "NO",
    }


def together(strata, model, n, streams, rounds):
    bodies = [{"model": model, "max_tokens": n, "temperature": 0,
               "messages": [{"role": "user", "content": edit_prompt(CONCURRENT_FILES[i % len(CONCURRENT_FILES)])}]}
              for i in range(streams)]

    def ask(url, body):
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1800) as r:
            v = json.load(r)
        return v["choices"][0]["message"]["content"], v["usage"]["completion_tokens"]

    speeds = {"off": [], "ngram": []}
    outputs = {}
    for _ in range(rounds):
        for mode in ("off", "ngram"):
            with serving(strata, model, "--threads", "2", "--parallel", str(streams),
                         "--speculate", mode, "--quiet") as url:
                # Once untimed: the prompts are then restored from the prefix cache, and the
                # timed exchange is mostly decoding.
                with concurrent.futures.ThreadPoolExecutor(streams) as pool:
                    list(pool.map(lambda b: ask(url, b), bodies))
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(streams) as pool:
                    answers = list(pool.map(lambda b: ask(url, b), bodies))
                dt = time.perf_counter() - t0
            speeds[mode].append(sum(a[1] for a in answers) / dt)
            outputs.setdefault(mode, [a[0] for a in answers])
    off, on = statistics.median(speeds["off"]), statistics.median(speeds["ngram"])
    return {
        "workload": f"edit x{streams}, aggregate",
        "model": model,
        "prompt tokens": "-",
        "tokens": n * streams,
        "off tok/s": round(off, 1),
        "ngram tok/s": round(on, 1),
        "ratio": round(on / off, 2),
        "accepted / drafted": "-",
        "same output": "yes" if outputs["off"] == outputs["ngram"] else "NO",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", default=str(ROOT / "target/release/strata"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    smol, gemma = "smollm2-135m-instruct", "gemma3-270m"
    jobs = [
        lambda: single(a.strata, "edit", smol, edit_prompt(EDIT_FILE), a.tokens, False, a.rounds),
        lambda: single(a.strata, "copy", gemma, copy_prompt(COPY_FILE), a.tokens, True, a.rounds),
        lambda: single(a.strata, "chat", smol, CHAT, 200, False, a.rounds),
        lambda: together(a.strata, smol, a.tokens // 2, a.streams, a.rounds),
    ]
    rows = []
    for job in jobs:
        rows.append(job())
        print(rows[-1], file=sys.stderr)
    if a.json:
        print(json.dumps({"rows": rows}, indent=2))
    else:
        for r in rows:
            print(r)


if __name__ == "__main__":
    sys.exit(main())
