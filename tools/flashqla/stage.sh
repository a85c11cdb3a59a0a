#!/usr/bin/env bash
# Here (a machine with pip and the network), from the checkout's root: downloads FlashQLA 0.1.3 and
# the wheels it needs that the GPU machine lacks (Python 3.12, x86-64, manylinux), splits the
# 47 MiB tilelang wheel, and lays them out for three device calls of at most ~28 MiB carried each
# (the checkout, 34 MiB, travels too: 64 MiB a call):
#   stage/qla/c1: tilelang part aa (25 MiB)      stage/qla/c2: z3-solver (28 MiB)
#   stage/qla/c3: tilelang part ab, flash-qla, apache-tvm-ffi, torch-c-dlpack-ext, SHA256SUMS
# stage/ is git-ignored. Then: tools/flashqla/README.md.
set -euo pipefail
root=${1:-stage/qla}
dl=$root/whl
mkdir -p "$dl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dl" \
    flash-qla==0.1.3 tilelang==0.1.15 'apache-tvm-ffi<0.1.13' torch-c-dlpack-ext 'z3-solver<4.15.5'
rm -rf "$root/c1" "$root/c2" "$root/c3"
mkdir -p "$root/c1" "$root/c2" "$root/c3"
(cd "$dl" && sha256sum *.whl) > "$root/c3/SHA256SUMS"
tl=$(cd "$dl" && ls tilelang-*.whl)
split -b 25M "$dl/$tl" "$root/c1/$tl.part-"
mv "$root/c1/$tl.part-ab" "$root/c3/"
[ ! -e "$root/c1/$tl.part-ac" ] || { echo "tilelang wheel larger than expected" >&2; exit 1; }
cp "$dl"/z3_solver-*.whl "$root/c2/"
cp "$dl"/flash_qla-*.whl "$dl"/apache_tvm_ffi-*.whl "$dl"/torch_c_dlpack_ext-*.whl "$root/c3/"
du -sh "$root"/c1 "$root"/c2 "$root"/c3
