#!/usr/bin/env bash
# Longer runs of the structure-aware schema fuzzer (crates/api/src/schema_fuzz.rs) than CI's:
# ROUNDS rounds of CASES generated schemas each, every round with a fresh seed, printed so a
# failure can be replayed with STRATA_FUZZ_SEED=SEED.
#
#   scripts/fuzz-schemas.sh [ROUNDS] [CASES]     (default: 10 rounds of 2000 cases)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-10}"
cases="${2:-2000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-ci-target}"
cargo test -p strata-api --profile test-release --lib --no-run --quiet
for ((r = 1; r <= rounds; r++)); do
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    echo "round $r/$rounds: $cases cases, STRATA_FUZZ_SEED=$seed"
    STRATA_FUZZ_CASES="$cases" STRATA_FUZZ_SEED="$seed" \
        cargo test -p strata-api --profile test-release --lib --quiet schema_fuzz -- --nocapture
done
