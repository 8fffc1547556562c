#!/usr/bin/env bash
# Runs a benchmark command that prints JSON on standard output (its --json flag) and records
# the result as docs/benchmarks/results/NAME.json, with the date, the commit, the CPU and the
# command, for scripts/benchmarks-page.py to render into BENCHMARKS.md.
#
#   scripts/bench-record.sh NAME -- COMMAND...
#   scripts/bench-record.sh engine-smollm2 -- cargo run --release -p strata-bench -- engine -r 5 --json
#
# Fields the command cannot know (title, section, baseline, notes) may be added to the record
# by hand afterwards; a newer run of the same NAME replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 3 ] || [ "$2" != "--" ]; then
    echo "usage: $0 NAME -- COMMAND..." >&2
    exit 2
fi
name=$1
shift 2
case $name in
    *[!a-z0-9-]* | "") echo "$0: NAME takes lower-case letters, digits and '-' (got '$name')" >&2; exit 2 ;;
esac

out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" > "$out"

cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*:[[:space:]]*//')
cores=$(grep -c '^processor' /proc/cpuinfo)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
simd=scalar
for f in sse4_2 avx2 avx512f; do
    case " $flags " in *" $f "*) simd=$f ;; esac
done
case $simd in avx512f) simd=AVX-512 ;; avx2) simd=AVX2 ;; sse4_2) simd=SSE4.2 ;; esac

mkdir -p docs/benchmarks/results
command=$(printf '%q ' "$@")
python3 - "$name" "$out" "$cores-core $cpu, $simd" "$(git rev-parse --short HEAD)" "${command% }" <<'PY'
import datetime, json, sys
name, out, cpu, commit, command = sys.argv[1:]
with open(out) as f:
    text = f.read()
try:
    output = json.loads(text)
except json.JSONDecodeError as e:
    sys.exit(f"bench-record: the command did not print JSON ({e}); give it --json")
path = f"docs/benchmarks/results/{name}.json"
try:
    with open(path) as f:
        record = json.load(f)
except FileNotFoundError:
    record = {"title": name}
record.update({
    "date": datetime.date.today().isoformat(),
    "commit": commit,
    "cpu": cpu,
    "command": command,
    "output": output,
})
record.pop("tables", None)
with open(path, "w") as f:
    f.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
print(f"bench-record: wrote {path}; now run python3 scripts/benchmarks-page.py")
PY
