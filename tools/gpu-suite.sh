#!/usr/bin/env bash
# Builds the GPU suite on this (GPU-less) machine and stages it for the device machine.
#
#   tools/gpu-suite.sh [DEST] [REPO_ROOT]
#
# DEST (default $ATTN_GPU_STAGE or REPO_ROOT/stage/gpu) must lie inside REPO_ROOT (default: the
# checkout holding this script), the checkout the device tool sends, in a git-ignored folder
# (`stage/` is ignored): it is then named in
# the run's `carry`. Staged: the release test binaries of attn-gpu (bin/test_*), bench_gpu and
# attn-conform (bin/), the fixtures (when this checkout has any), tools/bench_anchors.py and
# tools/decode_anchors.py, tools/nsa_anchors.py, the
# device-side script tools/gpu-run.sh (as run.sh), the fla-core 0.6.0 wheel (whl/), and the
# attn_conform wheel with pytest's (pywhl/, for the `python` part).
# Prints the one `run` call (command + carry) that runs the whole GPU suite there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPO=${2:-$ROOT}
DEST=${1:-${ATTN_GPU_STAGE:-$REPO/stage/gpu}}
case "$DEST" in "$REPO"/*) ;; *) echo "error: $DEST is not inside $REPO" >&2; exit 2 ;; esac
REL=${DEST#"$REPO"/}
cd "$ROOT"

rm -rf "$DEST/bin" "$DEST/fixtures" "$DEST/fixturegen"
mkdir -p "$DEST/bin" "$DEST/whl"

echo "building release test binaries of attn-gpu ..." >&2
cargo test --release -p attn-gpu --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" "$DEST/bin/test_$name"; done
echo "building bench_gpu and attn-conform ..." >&2
cargo build --release -p attn-tools --bin bench_gpu -p attn-conformance --bin attn-conform 2>&1 | tail -1 >&2
cp "${CARGO_TARGET_DIR:-target}/release/bench_gpu" "${CARGO_TARGET_DIR:-target}/release/attn-conform" "$DEST/bin/"
# The fixtures travel with the sent checkout; a copy is staged only when this checkout's differ
# (a worktree with new cases), since the tree and the carry share one 64 MiB limit.
if [ -d fixtures ] && [ -n "$(ls -A fixtures 2>/dev/null)" ] && ! diff -rq fixtures "$REPO/fixtures" >/dev/null 2>&1; then
  cp -r fixtures "$DEST/fixtures"
fi
echo "building the attn_conform wheel (abi3) and fetching pytest ..." >&2
rm -rf "$DEST/pywhl"
python3 -m pip wheel -q --no-deps ./conformance/python -w "$DEST/pywhl" >&2
python3 -m pip download -q --only-binary=:all: pytest -d "$DEST/pywhl" >&2  # and its needs
cp tools/bench_anchors.py tools/decode_anchors.py tools/nsa_anchors.py tools/forward_anchors.py tools/cp_anchors.py tools/ncu_source.py "$DEST/"
# forward_anchors.py --export-qla-case writes its case with the fixture generator
cp -r tools/fixturegen "$DEST/fixturegen"
rm -rf "$DEST/fixturegen/__pycache__"
cp tools/gpu-run.sh "$DEST/run.sh"
if ! ls "$DEST"/whl/fla_core-0.6.0-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps fla-core==0.6.0 -d "$DEST/whl"
fi
strip "$DEST"/bin/* 2>/dev/null || true
size=$(du -sm "$DEST" | cut -f1)
echo "staged $DEST ($size MiB; the carry limit is 64 MiB with the tree):" >&2
ls "$DEST/bin" >&2
echo
echo "run command: bash $REL/run.sh $REL all"
echo "carry: [\"$REL\"]"
echo "(parts: 'tests', 'verify', 'python', 'sanitizer', 'bench' instead of 'all', 'cp' (multi-GPU context parallelism: tests, verify --gpus) and 'cpbench' (its benchmark rows and anchors), not in 'all'; outputs land in \$OUT)"
