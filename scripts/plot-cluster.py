#!/usr/bin/env python3
"""Draws `strata-bench cluster --json` results.

Usage: python3 scripts/plot-cluster.py RESULT.json [MORE.json ...] OUT_DIR
Needs matplotlib. For each run writes OUT_DIR/cluster-<model>.png with two panels:
aggregate tok/s against concurrent clients for one node and every strategy and link (the
planner's predictions dashed), and inter-token latency p50/p99 at the largest level.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def name(row):
    if row["nodes"] == 1:
        return "1 node"
    return f"{row['nodes']} nodes, {row['strategy']}, {row['link']}"


def plot(run, out):
    rows = run["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for i, row in enumerate(rows):
        color = f"C{i % 10}"
        xs = [lv["clients"] for lv in row["levels"]]
        ax.plot(xs, [lv["aggregate_tok_s"] for lv in row["levels"]], "o-", color=color,
                label=name(row) + (" (planner's pick)" if row["planner_pick"] and row["nodes"] > 1 else ""))
        pred = [lv.get("predicted_aggregate_tok_s") for lv in row["levels"]]
        if all(p is not None for p in pred):
            ax.plot(xs, pred, "--", color=color, alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streaming clients")
    ax.set_ylabel("aggregate tok/s (dashed: planner's prediction)")
    ax.set_title("Aggregate decode through the API")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    labels, p50, p99 = [], [], []
    for row in rows:
        top = max(row["levels"], key=lambda lv: lv["clients"])
        labels.append(f"{name(row)}\n({top['clients']} clients)")
        p50.append(top["itl_p50_ms"])
        p99.append(top["itl_p99_ms"])
    ys = range(len(labels))
    bx.barh([y + 0.2 for y in ys], p50, height=0.4, label="p50")
    bx.barh([y - 0.2 for y in ys], p99, height=0.4, label="p99")
    bx.set_yticks(list(ys))
    bx.set_yticklabels(labels, fontsize=7)
    bx.set_xlabel("inter-token latency, ms")
    bx.set_title("Inter-token latency at the largest level")
    bx.legend()
    bx.grid(alpha=0.3, axis="x")
    fig.suptitle(f"strata-bench cluster: {os.path.basename(run['model'])}, {run['threads_per_node']} "
                 f"thread(s) per node, {run['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    out_dir = sys.argv[-1]
    os.makedirs(out_dir, exist_ok=True)
    for path in sys.argv[1:-1]:
        run = json.load(open(path))
        model = os.path.basename(run["model"]).replace(".gguf", "")
        out = os.path.join(out_dir, f"cluster-{model}.png")
        plot(run, out)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
