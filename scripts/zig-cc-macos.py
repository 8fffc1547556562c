#!/usr/bin/env python3
"""A C compiler for the apple-darwin targets on a machine without the macOS SDK.

scripts/check-macos.sh names this script as CC for aarch64-apple-darwin and x86_64-apple-darwin.
It runs `zig cc` (from the PyPI package ziglang, in the venv given by ZIG_PY), which ships the
macOS libc headers that ring's build script needs. The `cc` crate passes the target in clang's
spelling (`-arch arm64`, `--target=arm64-apple-macosx`); zig wants its own, so those flags are
dropped and ZIG_MACOS_TARGET (`aarch64-macos` or `x86_64-macos`) is passed instead.

Called through a link whose name ends in `-ar`, it is `zig ar` instead (the archiver for the same
objects), so the check needs no LLVM of the host's.
"""
import os
import sys


def main() -> None:
    py = os.environ.get("ZIG_PY")
    if py and os.path.basename(sys.argv[0]).endswith("-ar"):
        os.execv(py, [py, "-m", "ziglang", "ar"] + sys.argv[1:])
    target = os.environ.get("ZIG_MACOS_TARGET")
    if not py or not target:
        sys.exit("zig-cc-macos: set ZIG_PY (a python with ziglang) and ZIG_MACOS_TARGET")
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a == "-arch":
            skip = True
            continue
        if a.startswith("--target="):
            continue
        args.append(a)
    os.execv(py, [py, "-m", "ziglang", "cc", "-target", target] + args)


main()
