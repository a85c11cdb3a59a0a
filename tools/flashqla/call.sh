#!/usr/bin/env bash
# On the GPU machine, from the checkout's root: `bash tools/flashqla/call.sh N` for N = 1, 2, 3, in
# three calls back to back on one warm machine, call N carrying stage/qla/cN (tools/flashqla/stage.sh).
# 1, 2: copy what they carried into /tmp/wh. 3: joins the tilelang wheel, checks the hashes,
# installs everything into /tmp/site, imports flash_qla, then writes the FlashQLA gdn_fwd cases
# into $OUT/gdn_fwd/ with $OUT/gen.log (a case that fails its check is kept, marked
# known_failure). Later calls on the same machine use it with PYTHONPATH=/tmp/site
# (`bash tools/flashqla/call.sh env` prints what to put before a command).
set -uo pipefail
part=${1:?usage: call.sh 1|2|3|env}
wh=/tmp/wh site=/tmp/site
if [ "$part" = env ]; then echo "export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"; exit 0; fi
mkdir -p "$wh"
cp -v stage/qla/c"$part"/* "$wh"/ || { echo "error: stage/qla/c$part did not travel (carry it)"; exit 2; }
[ "$part" = 3 ] || { ls -la "$wh"; exit 0; }
cd "$wh"
for p in *.part-aa; do
    base=${p%.part-aa}
    [ -e "$base.part-ab" ] || { echo "error: $base.part-ab missing"; exit 2; }
    cat "$base".part-a? > "$base" && rm -f "$base".part-a?
done
sha256sum -c SHA256SUMS || { echo "error: a wheel is missing or broken: the machine went cold between calls? redo calls 1-3"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" ./*.whl || exit 2
cd - >/dev/null
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, flash_qla, tilelang; print('flash_qla', flash_qla.__version__, 'tilelang', tilelang.__version__, torch.cuda.get_device_name(0))" || exit 2
out=${OUT:-/tmp/qla-out}
mkdir -p "$out"
timeout 500 python3 tools/gen_fixtures.py --out "$out" --ops gdn_fwd --cases "${QLA_CASES:-flashqla_*}" 2>&1 | tee "$out/gen.log"
rc=${PIPESTATUS[0]}
rm -f "$out/MANIFEST.json"   # rebuilt in the checkout (gen_fixtures.py --manifest-only)
ls -la "$out" "$out"/gdn_fwd
exit "$rc"
