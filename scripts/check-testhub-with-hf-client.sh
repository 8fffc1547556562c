#!/usr/bin/env bash
# Checks that strata-testhub speaks the hub's protocol as the official huggingface_hub
# client expects it: downloads, snapshots, listings, pagination, and each error class.
# Usage: scripts/check-testhub-with-hf-client.sh [PYTHON]
# PYTHON must have huggingface_hub installed (default: python3).
set -euo pipefail
PY=${1:-python3}
cd "$(dirname "$0")/.."
cargo build -q -p strata-testhub
BIN=${CARGO_TARGET_DIR:-target}/debug/strata-testhub
WORK=$(mktemp -d)
trap 'kill $HUB 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/root/o/r/sub" "$WORK/root/o/gated" "$WORK/root/o/secret"
printf 'hello\n' > "$WORK/root/o/r/README.md"
head -c 3000000 /dev/urandom > "$WORK/root/o/r/m-Q4_K_M.gguf"
for i in 1 2 3; do head -c 200000 /dev/urandom > "$WORK/root/o/r/sub/m-Q8_0-0000$i-of-00003.gguf"; done
head -c 100000 /dev/urandom > "$WORK/root/o/gated/g.gguf"
head -c 100000 /dev/urandom > "$WORK/root/o/secret/s.gguf"
"$BIN" --root "$WORK/root" --page-size 2 --gated o/gated=good --private o/secret=good \
  > "$WORK/out" &
HUB=$!
for _ in $(seq 100); do grep -q endpoint "$WORK/out" 2>/dev/null && break; sleep 0.1; done
ENDPOINT=$(awk '/^endpoint/ {print $2}' "$WORK/out")
HF_ENDPOINT=$ENDPOINT HF_HUB_CACHE=$WORK/cache HF_HUB_DISABLE_TELEMETRY=1 \
  ROOT=$WORK/root timeout 300 "$PY" - <<'PY'
import hashlib, os, sys
import huggingface_hub as hh
from huggingface_hub import errors

root = os.environ["ROOT"]
ok = 0
def check(name, cond):
    global ok
    if not cond:
        sys.exit(f"FAIL {name}")
    ok += 1
    print(f"ok   {name}")

def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()

api = hh.HfApi()
info = api.model_info("o/r")
check("model_info lists the files", sorted(s.rfilename for s in info.siblings) == sorted(
    ["README.md", "m-Q4_K_M.gguf"] + [f"sub/m-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]))
files = api.list_repo_files("o/r")
check("list_repo_files follows the pages", len(files) == 5)
tree = list(api.list_repo_tree("o/r", recursive=True))
lfs = [t for t in tree if getattr(t, "lfs", None)]
check("the tree gives LFS SHA-256s", all(t.lfs.sha256 == sha(f"{root}/o/r/{t.path}") for t in lfs) and len(lfs) == 4)
p = hh.hf_hub_download("o/r", "m-Q4_K_M.gguf")
check("an LFS file downloads intact", sha(p) == sha(f"{root}/o/r/m-Q4_K_M.gguf"))
check("into the hub's cache layout", "/models--o--r/snapshots/" in p and os.path.islink(p))
p = hh.hf_hub_download("o/r", "README.md")
check("a plain file downloads intact", open(p).read() == "hello\n")
snap = hh.snapshot_download("o/r", allow_patterns=["sub/*Q8_0*"])
check("snapshot_download takes a split set", sorted(os.listdir(f"{snap}/sub")) == [f"m-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)])
p = hh.hf_hub_download("o/r", "m-Q4_K_M.gguf", revision=info.sha)
check("a commit is a revision", os.path.exists(p))
meta = hh.get_hf_file_metadata(hh.hf_hub_url("o/r", "m-Q4_K_M.gguf"))
check("metadata: size and etag", meta.size == 3000000 and meta.etag == sha(f"{root}/o/r/m-Q4_K_M.gguf") and meta.commit_hash == info.sha)
def raises(name, cls, f):
    try:
        f()
    except cls:
        check(name, True)
        return
    except Exception as e:
        sys.exit(f"FAIL {name}: {type(e).__name__}: {e}")
    sys.exit(f"FAIL {name}: no error")
raises("a missing repo", errors.RepositoryNotFoundError, lambda: hh.hf_hub_download("o/none", "x.gguf"))
raises("a missing revision", errors.RevisionNotFoundError, lambda: hh.hf_hub_download("o/r", "m-Q4_K_M.gguf", revision="v9"))
raises("a missing file", errors.EntryNotFoundError, lambda: hh.hf_hub_download("o/r", "nope.gguf"))
raises("a gated repo without a token", errors.GatedRepoError, lambda: hh.hf_hub_download("o/gated", "g.gguf", token=False))
raises("a private repo without a token", errors.RepositoryNotFoundError, lambda: hh.hf_hub_download("o/secret", "s.gguf", token=False))
p = hh.hf_hub_download("o/gated", "g.gguf", token="good")
check("a gated repo with its token", sha(p) == sha(f"{root}/o/gated/g.gguf"))
p = hh.hf_hub_download("o/secret", "s.gguf", token="good")
check("a private repo with its token", sha(p) == sha(f"{root}/o/secret/s.gguf"))
print(f"{ok} checks passed")
PY
