#!/usr/bin/env python3
"""The planner against strata's own measurements on this machine.

Runs (or reads) `strata-bench scaling --json` and asks `strata plan --json` to predict every
configuration it measured: one process on 1 and 2 threads, two single-threaded ranks with
each strategy over shared memory and TCP, and the emulated-latency sweep. Prints one Markdown
table with the error of each prediction.

    S=~/.cache/strata-ci-target/release/strata
    python3 scripts/plan-vs-bench.py --strata $S [--bench scaling.json] [--model ID]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def plan(strata, model, *args):
    out = subprocess.run(
        [strata, "plan", "-m", model, "--json", "--prompt", "128", *args],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--bench", help="a saved `strata-bench scaling --json` (default: run it)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--bound", type=float, default=0.15)
    ap.add_argument("--save", help="write the bench scaling JSON it ran here (for --bench later)")
    a = ap.parse_args()
    if a.bench:
        bench = json.load(open(a.bench))
    else:
        out = subprocess.run([os.path.join(os.path.dirname(a.strata), "strata-bench"), "scaling", "-m", a.model, "-r", "5", "--json"],
                             check=True, capture_output=True, text=True)
        bench = json.loads(out.stdout)
        if a.save:
            open(a.save, "w").write(out.stdout)
    # This machine is measured once, so every prediction rests on the same figures: a node of
    # one thread and one of two, and the loopback links over shared memory and TCP.
    one = plan(a.strata, a.model, "--nodes", "2x", "this-machine", "--threads", "1",
               "--link", "loopback-shm")["cluster"]
    tcp = plan(a.strata, a.model, "--nodes", "2x", "this-machine", "--threads", "1",
               "--link", "loopback-tcp")["cluster"]["links"][0]
    two = plan(a.strata, a.model, "--nodes", "this-machine", "--threads", "2")["cluster"]
    shm = one["links"][0]
    # The two ranks are processes of this one machine: they share its memory bus, which with
    # both cores reading delivers what the two-thread node measured.
    for n in one["nodes"]:
        n["machine"] = "this-machine"
        n["machine_bandwidth"] = two["nodes"][0]["mem_bandwidth"]
    tmp = tempfile.mkdtemp()

    def cluster_file(nodes, links):
        path = os.path.join(tmp, "cluster-%d.json" % len(os.listdir(tmp)))
        json.dump({"nodes": nodes, "links": links}, open(path, "w"))
        return path

    rows = []
    for r in bench["rows"]:
        if r["plaintext"]:
            continue
        if r["ranks"] == 1:
            src = one if r["threads_per_rank"] == 1 else two
            args = ["--cluster", cluster_file(src["nodes"][:1], [])]
        else:
            strategy = "pipeline" if r["strategy"] == "pipeline" else r["strategy"].split("-")[0]
            combine = "reduce" if r["strategy"] == "tensor-reduce" else "gather"
            link = dict(shm if r["transport"] == "shm" else tcp)
            # The emulator adds its latency to the transport's own.
            link["latency"] += r["latency_us"] * 1e-6
            args = ["--cluster", cluster_file(one["nodes"], [link]),
                    "--strategy", strategy, "--combine", combine]
        p = plan(a.strata, a.model, *args)
        rows.append((r["config"], r["decode_tok_s"], p["decode_tok_s"],
                     r["prefill_tok_s"], p["estimate"]["prefill_tok_s"]))
    shutil.rmtree(tmp)
    print("| configuration | decode measured | predicted | error | prefill measured | predicted | error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    misses = []
    for name, dm, dp, pm, pp in rows:
        de, pe = dp / dm - 1, (pp / pm - 1) if pp else float("nan")
        print(f"| {name} | {dm:.1f} | {dp:.1f} | {de*100:+.0f} % | {pm:.1f} | "
              f"{pp or 0:.1f} | {pe*100:+.0f} % |")
        if abs(de) > a.bound:
            misses.append(f"{name}: decode {de*100:+.0f} %")
        if pp and abs(pe) > a.bound:
            misses.append(f"{name}: prefill {pe*100:+.0f} %")
    errs = [abs(dp / dm - 1) for _, dm, dp, _, _ in rows]
    print(f"\ndecode: median error {statistics.median(errs)*100:.0f} %, "
          f"{sum(e <= a.bound for e in errs)} of {len(errs)} within {a.bound*100:.0f} %")
    errs = [abs(pp / pm - 1) for _, _, _, pm, pp in rows if pp]
    if errs:
        print(f"prefill: median error {statistics.median(errs)*100:.0f} %, "
              f"{sum(e <= a.bound for e in errs)} of {len(errs)} within {a.bound*100:.0f} %")
    for m in misses:
        print("outside the bound:", m)


if __name__ == "__main__":
    sys.exit(main())
