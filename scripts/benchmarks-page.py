#!/usr/bin/env python3
"""Renders BENCHMARKS.md and the book's results chapter from docs/benchmarks/results/*.json.

Usage:
    python3 scripts/benchmarks-page.py           # write BENCHMARKS.md and docs/src/benchmark-results.md
    python3 scripts/benchmarks-page.py --check   # exit 1 if either differs from what it would write

A record is one benchmark result set, a JSON object:
    title, section, order    where it goes on the page (sections in SECTIONS order)
    date, commit, cpu        when, which build, which machine
    command                  the command that produced it (a string or a list of strings)
    baseline                 what it is compared with, measured in the same run
    tables                   [{"caption", "columns", "rows"}], optional
    notes                    Markdown paragraphs, optional
    plots                    [{"path", "alt"}], paths relative to docs/src, optional
    raw                      path of the raw output in the repository, optional
    output                   what the command printed with --json, optional

`scripts/bench-record.sh` writes records with date, commit, cpu, command and output; a record
without tables shows its output as a table when it is a list of flat objects (or an object
holding one under "rows"), else as JSON.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks" / "results"
PAGE = ROOT / "BENCHMARKS.md"
CHAPTER = ROOT / "docs" / "src" / "benchmark-results.md"

SECTIONS = [
    "The engine against llama.cpp",
    "Serving on one node",
    "Sharded execution on one machine",
    "Serving from a cluster",
    "The planner against measurements",
    "Model downloads",
    "Other results",
]

INTRO = """\
Every figure below is one record in `docs/benchmarks/results/`: its date, the commit of the
build measured (for records transcribed from earlier pages, the commit that recorded them), the
CPU, the command, and the baseline it is compared with, measured in the same run. A newer run of
the same benchmark replaces its record; nothing accumulates. How each benchmark works and how
to build llama.cpp's `llama-bench` for the comparisons is in the book's Benchmarks chapter
(`docs/src/benchmarks.md`).

To add or replace a record, run the benchmark through `scripts/bench-record.sh NAME --
COMMAND... --json`, then regenerate this page with `python3 scripts/benchmarks-page.py`.
The machines are small shared cloud VMs whose speed moves between runs: read ratios within one
run, not absolute figures across runs.
"""


def cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def numeric(v):
    s = str(v).lstrip("+-")
    return isinstance(v, (int, float)) or s[:1].isdigit() or s in ("", "-")


def table(columns, rows):
    right = [all(numeric(r[i]) for r in rows if i < len(r)) for i in range(len(columns))]
    out = ["| " + " | ".join(columns) + " |",
           "| " + " | ".join("---:" if n else "---" for n in right) + " |"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def generic(output):
    rows = output.get("rows") if isinstance(output, dict) else output
    if isinstance(rows, list) and rows and all(
        isinstance(r, dict) and all(not isinstance(v, (dict, list)) for v in r.values()) for r in rows
    ):
        cols = list(dict.fromkeys(k for r in rows for k in r))
        return table(cols, [[r.get(c) for c in cols] for r in rows])
    return "```json\n" + json.dumps(output, indent=2, sort_keys=True) + "\n```"


def render_record(name, r, images):
    out = [f"### {r.get('title', name)}", ""]
    cmds = r["command"] if isinstance(r["command"], list) else [r["command"]]
    out.append(f"- Record: `{name}`; date {r['date']}; commit `{r['commit']}`")
    out.append(f"- CPU: {r['cpu']}")
    if len(cmds) == 1:
        out.append(f"- Command: `{cmds[0]}`")
    else:
        out.append("- Commands:")
        out += [f"  - `{c}`" for c in cmds]
    out.append(f"- Baseline, measured in the same run: {r.get('baseline', 'none')}")
    if r.get("raw"):
        out.append(f"- Raw output: `{r['raw']}`")
    out.append("")
    tables = r.get("tables")
    if tables:
        for t in tables:
            if t.get("caption"):
                out += [t["caption"], ""]
            out += [table(t["columns"], t["rows"]), ""]
    elif "output" in r:
        out += [generic(r["output"]), ""]
    for n in r.get("notes", []):
        out += [n, ""]
    for p in r.get("plots", []):
        out += [f"![{p['alt']}]({images}{p['path']})", ""]
    return out


def render(title, images):
    records = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    for name, r in records.items():
        missing = [k for k in ("date", "commit", "cpu", "command") if k not in r]
        if missing:
            sys.exit(f"{name}.json: missing {', '.join(missing)}")
    out = [f"# {title}", "",
           "This page is generated by `python3 scripts/benchmarks-page.py` from the records in",
           "`docs/benchmarks/results/`; do not edit it by hand.", "", INTRO]
    for section in SECTIONS:
        names = sorted((n for n, r in records.items() if r.get("section", SECTIONS[-1]) == section),
                       key=lambda n: (records[n].get("order", 100), n))
        if not names:
            continue
        out += [f"## {section}", ""]
        for n in names:
            out += render_record(n, records[n], images)
    unknown = {r.get("section") for r in records.values()} - set(SECTIONS) - {None}
    if unknown:
        sys.exit(f"unknown sections: {sorted(unknown)} (known: {SECTIONS})")
    return "\n".join(out).rstrip("\n") + "\n"


def main():
    outputs = {PAGE: render("Benchmarks", "docs/src/"), CHAPTER: render("Benchmark results", "")}
    if sys.argv[1:] == ["--check"]:
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not what scripts/benchmarks-page.py writes; "
                  "run it and commit the result", file=sys.stderr)
        sys.exit(1 if stale else 0)
    if sys.argv[1:]:
        sys.exit(__doc__)
    for p, text in outputs.items():
        p.write_text(text)


if __name__ == "__main__":
    main()
