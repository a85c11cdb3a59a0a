#!/usr/bin/env bash
# On the GPU machine, from the checkout's root: `bash tools/flashqla/call.sh K` for K = 1 .. N (N in
# stage/qla/c1/CALLS, from tools/flashqla/stage.sh), in N calls back to back on one warm machine,
# call K carrying stage/qla/cK. Each call copies its wheel pieces into /tmp/wh; the call that
# completes the set joins the pieces, checks the hashes, installs everything into /tmp/site,
# imports flash_qla, then writes the FlashQLA gdn_fwd cases into $OUT/gdn_fwd/ with $OUT/gen.log
# (a case that fails its check is kept, marked known_failure). Later calls on the same machine
# use it with PYTHONPATH=/tmp/site (`bash tools/flashqla/call.sh env` prints what to put before a
# command). QLA_NO_CASES=1 stops after the import.
set -uo pipefail
part=${1:?usage: call.sh K|env}
wh=${QLA_WH:-/tmp/wh} site=${QLA_SITE:-/tmp/site}
if [ "$part" = env ]; then echo "export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"; exit 0; fi
mkdir -p "$wh"
cp stage/qla/c"$part"/* "$wh"/ || { echo "error: stage/qla/c$part did not travel (carry it)"; exit 2; }
touch "$wh/.got-$part"
n=$(cat "$wh/CALLS")
got=$(ls "$wh"/.got-* 2>/dev/null | wc -l)
[ "$got" -ge "$n" ] || { echo "call $part of $n: $got carried so far"; ls -la "$wh"; exit 0; }
cd "$wh"
for w in $(ls ./*.piece-* | sed 's/\.piece-[0-9]*$//' | sort -u); do
    cat "$w".piece-* > "$w" && rm -f "$w".piece-*
done
sha256sum -c SHA256SUMS || { echo "error: a wheel is missing or broken: the machine went cold between calls? redo them all"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" ./*.whl || exit 2
cd - >/dev/null
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, flash_qla, tilelang; print('flash_qla', flash_qla.__version__, 'tilelang', tilelang.__version__, torch.cuda.get_device_name(0))" || exit 2
[ -z "${QLA_NO_CASES:-}" ] || exit 0
out=${OUT:-/tmp/qla-out}
mkdir -p "$out"
timeout 500 python3 tools/gen_fixtures.py --out "$out" --ops gdn_fwd --cases "${QLA_CASES:-flashqla_*}" 2>&1 | tee "$out/gen.log"
rc=${PIPESTATUS[0]}
rm -f "$out/MANIFEST.json"   # rebuilt in the checkout (gen_fixtures.py --manifest-only)
ls -la "$out" "$out"/gdn_fwd
exit "$rc"
