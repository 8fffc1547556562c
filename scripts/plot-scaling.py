#!/usr/bin/env python3
"""Draws the plots of BENCHMARKS.md from `strata-bench scaling --json` output.

Usage: python3 scripts/plot-scaling.py [--prefix NAME] [--relative] RESULT.json [MORE.json ...] OUT_DIR
Each JSON file is one run (e.g. SmolLM2 and a synthetic 1B model); needs matplotlib.
`--prefix` names the PNGs (default `scaling`); `--relative` plots decode speed relative to one
process with one thread (to compare models of different speeds, e.g. a mixture of experts and a
dense model of the same active size). Expert-parallel rows are drawn like tensor-parallel ones.
Prints a markdown table per run and writes OUT_DIR/scaling-configs.png (decode and prefill tok/s per configuration, relative to one
process with one thread) and OUT_DIR/scaling-latency.png (tensor vs pipeline decode speed as the
emulated link latency grows).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(path, run):
    name = os.path.basename(run["model"]).replace(".gguf", "")
    return name


def table(run):
    rows = run["rows"]
    base = rows[0]
    print(f"### {os.path.basename(run['model'])}: pp{run['pp']} / tg{run['tg']}, "
          f"median of {run['repetitions']}\n")
    print("| configuration | prefill tok/s | decode tok/s | decode vs 1x1 | prefill vs 1x1 "
          "| rank 0 wait us/token | wait share |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows + run.get("llama_cpp", []):
        wait = r.get("comm_us_per_token")
        share = r.get("comm_share")
        print(f"| {r['config']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} "
              f"| {r['decode_tok_s'] / base['decode_tok_s']:.2f}x "
              f"| {r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x "
              f"| {'-' if wait is None else f'{wait:.0f}'} "
              f"| {'-' if share is None else f'{100 * share:.1f} %'} |")
    print("\n```json\n" + json.dumps(run["summary"], indent=2) + "\n```\n")


def main():
    args = sys.argv[1:]
    prefix, relative = "scaling", False
    while args and args[0].startswith("--"):
        if args[0] == "--prefix" and len(args) > 1:
            prefix, args = args[1], args[2:]
        elif args[0] == "--relative":
            relative, args = True, args[1:]
        else:
            sys.exit(__doc__)
    if len(args) < 2:
        sys.exit(__doc__)
    runs = [(p, json.load(open(p))) for p in args[:-1]]
    out = args[-1]
    os.makedirs(out, exist_ok=True)
    for _, run in runs:
        table(run)

    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 4.5), squeeze=False)
    for ax, (p, run) in zip(axes[0], runs):
        rows = [r for r in run["rows"] if r["latency_us"] == 0]
        base = rows[0]
        names = [r["config"].replace(", +0 us", "") for r in rows]
        names += [r["config"] for r in run.get("llama_cpp", [])]
        dec = [r["decode_tok_s"] / base["decode_tok_s"] for r in rows]
        dec += [r["decode_tok_s"] / base["decode_tok_s"] for r in run.get("llama_cpp", [])]
        pre = [r["prefill_tok_s"] / base["prefill_tok_s"] for r in rows]
        pre += [r["prefill_tok_s"] / base["prefill_tok_s"] for r in run.get("llama_cpp", [])]
        y = range(len(names))
        ax.barh([i + 0.2 for i in y], dec, height=0.4, label="decode")
        ax.barh([i - 0.2 for i in y], pre, height=0.4, label="prefill")
        ax.set_yticks(list(y), names, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("speed relative to 1 process x 1 thread")
        ax.set_title(label(p, run), fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{prefix}-configs.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p, run in runs:
        base = run["rows"][0]["decode_tok_s"] if relative else 1.0
        styles = (("tensor", "-o"), ("tensor-reduce", "-^"), ("expert", "-D"), ("pipeline", "--s"))
        for strategy, style in styles:
            pts = sorted(
                (r["latency_us"], r["decode_tok_s"] / base)
                for r in run["rows"]
                if r["strategy"] == strategy and r["transport"] == "shm"
            )
            if not pts:
                continue
            xs = [max(x, 1.0) for x, _ in pts]
            ax.plot(xs, [v for _, v in pts], style, label=f"{label(p, run)}, {strategy}")
    ax.set_xscale("log")
    ax.set_xlabel("emulated one-way link latency, us (0 drawn at 1)")
    if relative:
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("decode, 2 ranks x 1 thread, relative to 1 process x 1 thread")
    else:
        ax.set_ylabel("decode tok/s, 2 ranks x 1 thread")
    ax.set_title("Splitting a model as links slow down")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{prefix}-latency.png"), dpi=110)


if __name__ == "__main__":
    main()
