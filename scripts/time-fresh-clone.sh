#!/usr/bin/env bash
# Times README's two set-up commands as a new user meets them: a fresh clone of this repository,
# an empty target directory and an empty model store (the default model is fetched again).
# Cargo's crate downloads (~/.cargo/registry) and pip's cache are reused: those are network
# time, not build time.
#
# Usage: scripts/time-fresh-clone.sh [--keep]
#   --keep   leave the work directory (clone, target, store, build timing reports) in place
#
# Prints one line per command with its wall time, and where cargo's --timings reports are
# (HTML: the crates that took longest to build, and what waited on them).
set -euo pipefail

keep=false
[[ "${1:-}" == "--keep" ]] && keep=true

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d -t strata-fresh-XXXXXX)
$keep || trap 'rm -rf "$work"' EXIT

git clone --quiet "$repo" "$work/strata"
export CARGO_TARGET_DIR="$work/target"
export STRATA_HOME="$work/strata-home"
export CARGO_TERM_COLOR=never
cd "$work/strata"

log() { printf '%s\n' "$*" | tee -a "$work/times.txt"; }
log "fresh clone of $(git rev-parse --short HEAD) in $work ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"

start=$(date +%s)
cargo run --release --timings -p strata -- run "Explain in one sentence what a CPU does." \
    > "$work/run.out" 2> "$work/run.err"
mid=$(date +%s)
log "README quick start (cargo run --release ... run): $((mid - start)) s ($(grep -m1 Finished "$work/run.err" | sed 's/^ *//')), answered: $(head -c 100 "$work/run.out" | tr '\n' ' ')"
mkdir -p "$work/timings" && cp "$CARGO_TARGET_DIR"/cargo-timings/cargo-timing.html "$work/timings/release.html"

cargo test --timings --workspace --profile test-release > "$work/test.out" 2> "$work/test.err"
end=$(date +%s)
summary=$(grep -E '^test result:' "$work/test.out" | awk '{p+=$4; f+=$6; i+=$8} END {print p" passed, "f" failed, "i" ignored"}')
log "README test command (cargo test --workspace --profile test-release): $((end - mid)) s ($(grep -m1 Finished "$work/test.err" | sed 's/^ *//')), $summary"
cp "$CARGO_TARGET_DIR"/cargo-timings/cargo-timing.html "$work/timings/test.html"
# The costliest compilation units of each build, from cargo's report.
for which in release test; do
    log "slowest units ($which build):"
    python3 - "$work/timings/$which.html" <<'PY' | tee -a "$work/times.txt"
import json, re, sys
html = open(sys.argv[1]).read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);", html, re.S).group(1))
for u in sorted(units, key=lambda u: -u["duration"])[:8]:
    print(f'  {u["duration"]:7.1f} s  {u["name"]} {u.get("version", "")} {u.get("target", "")}')
PY
done
log "build timing reports: $work/timings/{release,test}.html$($keep || echo ' (removed on exit: pass --keep)')"
