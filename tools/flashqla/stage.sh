#!/usr/bin/env bash
# Here (a machine with pip and the network), from the checkout's root: downloads FlashQLA 0.1.3 and
# the wheels it needs that the GPU machine lacks (Python 3.12, x86-64, manylinux; about 82 MB),
# cuts every wheel into pieces of at most $QLA_CALL_MIB MiB (default 24) and packs the pieces
# into as few device calls as hold them, $QLA_CALL_MIB each (first fit, largest first), because
# the checkout (about 36 MiB) travels with every call and a call carries 64 MiB in all:
#   stage/qla/c1 ... stage/qla/cN, each with the pieces it carries, SHA256SUMS and CALLS (N).
# stage/ is git-ignored. Then: tools/flashqla/README.md.
set -euo pipefail
root=${1:-stage/qla}
per=${QLA_CALL_MIB:-24}
dl=$root/whl
mkdir -p "$dl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dl" \
    flash-qla==0.1.3 tilelang==0.1.15 'apache-tvm-ffi<0.1.13' torch-c-dlpack-ext 'z3-solver<4.15.5'
rm -rf "$root"/c[0-9]* "$root/pieces"
mkdir -p "$root/pieces"
for w in "$dl"/*.whl; do
    split -b "$((per * 1024 * 1024 - 65536))" -d -a 2 "$w" "$root/pieces/$(basename "$w").piece-"
done
# first fit, largest piece first, into calls of `per` MiB
python3 - "$root" "$per" <<'PY'
import os, shutil, sys
root, per = sys.argv[1], int(sys.argv[2]) * 1024 * 1024
pieces = sorted(((os.path.getsize(p), p) for p in
                 (os.path.join(root, "pieces", f) for f in os.listdir(os.path.join(root, "pieces")))),
                reverse=True)
calls = []  # [used bytes, [paths]]
for size, p in pieces:
    for c in calls:
        if c[0] + size <= per:
            c[0] += size; c[1].append(p); break
    else:
        calls.append([size, [p]])
for i, (used, paths) in enumerate(calls, 1):
    d = os.path.join(root, f"c{i}")
    os.makedirs(d)
    for p in paths:
        shutil.move(p, d)
    print(f"{d}: {len(paths)} pieces, {used / 2**20:.1f} MiB")
for i in range(1, len(calls) + 1):
    with open(os.path.join(root, f"c{i}", "CALLS"), "w") as f:
        f.write(f"{len(calls)}\n")
PY
(cd "$dl" && sha256sum ./*.whl) > "$root/SHA256SUMS"
for c in "$root"/c[0-9]*; do cp "$root/SHA256SUMS" "$c/"; done
rmdir "$root/pieces"
echo "then: bash tools/flashqla/call.sh K for K = 1 .. $(cat "$root/c1/CALLS"), each carrying stage/qla/cK"
