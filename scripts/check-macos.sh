#!/usr/bin/env bash
# Checks that the workspace builds for macOS: `cargo clippy -D warnings` (which type-checks as
# `cargo check` does) of every crate and target (tests, benches, examples) for
# aarch64-apple-darwin and x86_64-apple-darwin, from this Linux machine.
#
# Why zig: ring (under rustls and quinn) compiles C in its build script, and that C includes the
# macOS libc headers, which only the macOS SDK has. zig (the PyPI package ziglang) bundles those
# headers and can compile for macOS from Linux, so scripts/zig-cc-macos.py runs `zig cc` as the C
# compiler of the apple targets. Nothing is ever linked: `cargo check` and `cargo clippy` stop at
# metadata, so the missing macOS linker and system libraries do not matter.
#
# The venv with ziglang is cached under ${XDG_CACHE_HOME:-$HOME/.cache}/strata-zig; the target
# directory is CARGO_TARGET_DIR (default: target/ in the repo, as for any cargo command).
# CHECK_ONLY=1 runs cargo check instead of clippy.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${XDG_CACHE_HOME:-$HOME/.cache}/strata-zig"
if ! "$venv/bin/python" -m ziglang version > /dev/null 2>&1; then
    echo "check-macos: installing ziglang into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check ziglang
fi

targets=(aarch64-apple-darwin x86_64-apple-darwin)
installed=$(rustup target list --installed)
for t in "${targets[@]}"; do
    if ! grep -qx "$t" <<< "$installed"; then
        echo "check-macos: rustup target add $t"
        rustup target add "$t"
    fi
done

export ZIG_PY="$venv/bin/python"
cc="$PWD/scripts/zig-cc-macos.py"
# The same script is `zig ar` when called by a name ending in -ar (see the script).
ar="$venv/bin/zig-macos-ar"
ln -sf "$cc" "$ar"
for t in "${targets[@]}"; do
    arch=${t%%-*}
    env_t=${t//-/_}
    # zig names the targets aarch64-macos and x86_64-macos; cc-rs reads CC_<target>, AR_<target>.
    export ZIG_MACOS_TARGET="$arch-macos"
    export "CC_$env_t=$cc"
    export "AR_$env_t=$ar"
    # clippy compiles everything `cargo check` does (its own artifacts, so running both would
    # build every dependency twice); CHECK_ONLY=1 runs the plain check instead.
    if [ -n "${CHECK_ONLY:-}" ]; then
        echo "== cargo check --target $t"
        cargo check --workspace --all-targets --target "$t"
    else
        echo "== cargo clippy --target $t"
        cargo clippy --workspace --all-targets --target "$t" -- -D warnings
    fi
done
echo "check-macos: ok"
