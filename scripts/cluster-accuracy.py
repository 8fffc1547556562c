#!/usr/bin/env python3
"""The planner against `strata-bench cluster`, over several runs of it.

One `bench cluster` run compares every figure with the prediction its nodes' probes gave, but
on a shared VM the same configuration measures 15-25 % apart in runs minutes apart (two busy
cores are at times much slower than one busy core twice over), so one run cannot tell the
planner's error from the machine's. This runs the bench several times (or reads saved runs),
and for every figure prints the median of the measurements beside the median of the
predictions, the error between the medians, how far the measurements themselves spread
(largest over smallest), and each run's own error.

    S=~/.cache/strata-ci-target/release/strata
    python3 scripts/cluster-accuracy.py --strata $S [--runs 3] [--links tb5-rdma,tb-tcp]
    python3 scripts/cluster-accuracy.py --read run1.json run2.json ...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def figures(doc):
    """(key, measured, predicted) for every figure of one `bench cluster --json`."""
    out = []
    for r in doc["rows"]:
        name = f"{r['nodes']} {r['strategy']} {r['link']}"
        if r.get("predicted_prefill_tok_s"):
            out.append(((name, "-", "prefill"), r["prefill_tok_s"], r["predicted_prefill_tok_s"]))
        for lv in r["levels"]:
            for fig, m, p in [("aggregate", "aggregate_tok_s", "predicted_aggregate_tok_s"),
                              ("all live", "steady_tok_s", "predicted_steady_tok_s"),
                              ("per stream", "per_stream_tok_s", "predicted_per_stream_tok_s")]:
                if lv.get(m) and lv.get(p):
                    out.append(((name, lv["clients"], fig), lv[m], lv[p]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", help="the strata binary (to run the bench)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--links", default="tb5-rdma,tb-tcp")
    ap.add_argument("--strategies", default="tensor,pipeline")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--save-dir", help="keep each run's JSON here")
    ap.add_argument("--read", nargs="+", help="saved `bench cluster --json` files instead")
    ap.add_argument("--bound", type=float, default=0.15)
    a = ap.parse_args()
    docs = []
    if a.read:
        docs = [json.load(open(p)) for p in a.read]
    else:
        if not a.strata:
            ap.error("--strata or --read is needed")
        out_dir = a.save_dir or "."
        os.makedirs(out_dir, exist_ok=True)
        for i in range(a.runs):
            path = os.path.join(out_dir, f"cluster-run-{i + 1}.json")
            print(f"run {i + 1} of {a.runs} -> {path}", file=sys.stderr)
            subprocess.run([os.path.join(os.path.dirname(a.strata), "strata-bench"), "cluster", "-m", a.model, "--links", a.links,
                            "--strategies", a.strategies, "--no-llama", "--json", path],
                           check=True, stdout=subprocess.DEVNULL)
            docs.append(json.load(open(path)))
    runs = [dict(((k, (m, p)) for k, m, p in figures(d))) for d in docs]
    keys = [k for k, _, _ in figures(docs[0]) if all(k in r for r in runs)]
    print(f"{len(docs)} runs of `strata-bench cluster` ({docs[0].get('cpu', '?')}); "
          "tok/s, measured median [lowest-highest], predicted median, error of the medians, "
          "each run's error")
    print()
    print("| configuration | clients | figure | measured | spread | predicted | error | "
          "each run |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    med_err, run_errs, spreads = [], [], []
    for k in keys:
        ms = [r[k][0] for r in runs]
        ps = [r[k][1] for r in runs]
        m, p = statistics.median(ms), statistics.median(ps)
        err = p / m - 1
        spread = max(ms) / min(ms) - 1
        each = [r[k][1] / r[k][0] - 1 for r in runs]
        med_err.append(err)
        run_errs.extend(each)
        spreads.append(spread)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {m:.1f} [{min(ms):.1f}-{max(ms):.1f}] | "
              f"{spread * 100:.0f} % | {p:.1f} | {err * 100:+.0f} % | "
              + ", ".join(f"{e * 100:+.0f} %" for e in each) + " |")
    b = a.bound

    def within(es):
        return sum(abs(e) <= b for e in es)
    print()
    print(f"medians: {within(med_err)} of {len(med_err)} figures within ±{b * 100:.0f} %, "
          f"median |error| {statistics.median([abs(e) for e in med_err]) * 100:.0f} %")
    print(f"single runs: {within(run_errs)} of {len(run_errs)} within ±{b * 100:.0f} %")
    print(f"the measurements' own spread over the runs: median {statistics.median(spreads) * 100:.0f} %, "
          f"{sum(s > 2 * b for s in spreads)} of {len(spreads)} figures spread more than "
          f"{2 * b * 100:.0f} % (no single prediction is within ±{b * 100:.0f} % of every run there)")
    for k, e in zip(keys, med_err):
        if abs(e) > b:
            print(f"outside the bound: {k[0]}, {k[1]} client(s), {k[2]}: {e * 100:+.0f} %")


if __name__ == "__main__":
    sys.exit(main())
