#!/usr/bin/env bash
# The GPU suite, run on the device machine from the repository root (staged by gpu-suite.sh):
#
#   bash STAGE/run.sh STAGE [all|tests|verify|python|sanitizer|bench|tune|cp|cpbench|ptx|profile]...
#
# Writes into $OUT: summary.txt (the short table of everything), tests.log, verify.log, python.log,
# sanitizer.log, bench.txt, bench_gpu.json, bench_anchors.json, tune.txt. `tune` (not part of
# `all`) times the chunk and gate kernels under each tuning variant of $ATTN_TUNE_VARIANTS
# (`;`-separated; each a list of shell words VAR=VALUE, e.g.
# "ATTN_TILE_RP=16;ATTN_NVRTC_OPTS='-DATTN_TILE_CS=0 -DATTN_MIN_BLOCKS=4'";
# "-" is the default build), each run $ATTN_TUNE_PASSES times (default 1), a process per run.
# Narrowing (environment): ATTN_TESTS (test binaries, a glob over the names after test_; all),
# ATTN_SANITIZE (test names for compute-sanitizer; "scans gates decode fwd_h fwd_h_summaries fwd_h_split delta_fwd nsa nsa_attention"),
# ATTN_SANITIZE_SKIP (a test name substring to skip there, besides the long, 100-launch and
# determinism delta-rule tests and the NSA 2^31-element and 100-launch tests; long_lane), ATTN_TEST_THREADS / ATTN_TEST_TIMEOUT /
# ATTN_SANITIZE_TIMEOUT (2 threads, 420 s, 400 s), ATTN_BENCH_FILTER (bench_gpu --filter and the
# anchors' --filter; all), ATTN_ANCHORS_DECODE_ONLY=1 (only the decode anchors).
# `cp` (not in `all`): the context-parallel tests (test_cp) on every GPU of the machine, with
# ATTN_REQUIRE_GPUS set to the GPU count (tests for more ranks than GPUs are reported ignored),
# then `attn-conform verify --gpus N` on the fixtures for N = 2..GPU count.
# `cpbench` (not in `all`): bench_gpu's cp_* rows (bench_cp.json, cp.txt), then
# cp_anchors.py under torchrun on 1, 2, 4 GPUs (as many as the machine has; cp_anchors_rN.json);
# ATTN_CP_FILTER narrows both (a substring of the row names, default cp_).
# NCCL: cudarc opens `libnccl.so`; the Python package nvidia-nccl-cu13 ships only libnccl.so.2, so
# this script links it as /tmp/attn-nccl/libnccl.so and puts that folder on LD_LIBRARY_PATH.
# `ptx` (not in `all`): ptxas -v register and spill report of the modules in $ATTN_PTX_MODULES
# (default: the decode kernels).
# `profile` (not in `all`): Nsight Compute, per bench_gpu row of $ATTN_PROFILE_ROWS (default
# fwd_gdn_h32_8x8192,fwd_kda_h32_8x8192), on $ATTN_PROFILE_COUNT (4) launches of the kernels
# matching $ATTN_PROFILE_KERNELS (default: the delta-rule intra stages and fused kernels) after
# $ATTN_PROFILE_SKIP (6) of them: profile_ROW.ncu-rep and profile_ROW.txt (duration, memory and SM
# throughput, occupancy, registers, stall reasons), and profile_ROW.src.txt: each kernel's SASS
# source page summarised by ncu_source.py (stalls, opcode mix, hottest instructions, L2 sectors).
set -u -o pipefail
S=${1:?usage: run.sh STAGE_DIR [parts]}
shift
PARTS=${*:-all}
OUT=${OUT:-/tmp/attn-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_GPU=1
# NCCL for the context-parallel ops (cudarc looks for libnccl.so, the wheel has libnccl.so.2)
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$NCCL_LIB/libnccl.so.2" ] || NCCL_LIB=$(dirname "$(find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
if [ -f "$NCCL_LIB/libnccl.so.2" ]; then
  mkdir -p /tmp/attn-nccl && ln -sf "$NCCL_LIB/libnccl.so.2" /tmp/attn-nccl/libnccl.so
  export LD_LIBRARY_PATH=/tmp/attn-nccl:$LD_LIBRARY_PATH
fi
if [ -d "$S/fixtures" ]; then export ATTN_FIXTURES=$S/fixtures; else export ATTN_FIXTURES=$PWD/fixtures; fi
SUM=$OUT/summary.txt
want() { [[ " $PARTS " == *" all "* || " $PARTS " == *" $1 "* ]]; }
say() { echo "$*" | tee -a "$SUM"; }

say "== device: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader)"
say "== parts: $PARTS"

if want tests; then
  for t in "$S"/bin/test_${ATTN_TESTS:-*}; do
    start=$(date +%s)
    threads=${ATTN_TEST_THREADS:-2}
    # the context-parallel tests hold every GPU's communicators: one at a time
    [ "$(basename "$t")" = test_cp ] && threads=1
    timeout "${ATTN_TEST_TIMEOUT:-420}" "$t" --test-threads "$threads" >>"$OUT/tests.log" 2>&1
    rc=$?
    say "tests $(basename "$t"): exit $rc, $(( $(date +%s) - start )) s, $(grep -h '^test result' "$OUT/tests.log" | tail -1)"
  done
  grep -E "panicked|FAILED" "$OUT/tests.log" | head -20 | tee -a "$SUM"
fi

if want verify; then
  if [ -n "$(ls -A "$ATTN_FIXTURES" 2>/dev/null)" ]; then
    timeout 300 "$S/bin/attn-conform" verify --device all "$ATTN_FIXTURES" >"$OUT/verify.log" 2>&1
    say "verify --device all $ATTN_FIXTURES: exit $?, $(tail -1 "$OUT/verify.log")"
    timeout 300 "$S/bin/attn-conform" verify --device gpu "$ATTN_FIXTURES" >>"$OUT/verify.log" 2>&1
    say "verify --device gpu: exit $?, $(tail -1 "$OUT/verify.log")"
  else
    say "verify: no fixtures under $ATTN_FIXTURES"
  fi
fi

if want python; then
  # attn_conform (abi3 wheel built here) and pytest with its needs, beside the device's torch
  # Python (numpy and ml_dtypes are there);
  # its suite with ATTN_REQUIRE_GPU=1: the torch CUDA cases and the README's Triton example.
  if ls "$S"/pywhl/attn_conform-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/pysite "$S"/pywhl/*.whl >"$OUT/python.log" 2>&1
    PYTHONPATH=/tmp/pysite ATTN_CONFORM=$S/bin/attn-conform timeout 300 python3 -m pytest -rs -p no:cacheprovider \
      conformance/python/tests >>"$OUT/python.log" 2>&1
    say "pytest conformance/python/tests: exit $?, $(grep -E '[0-9]+ (passed|failed)' "$OUT/python.log" | tail -1)"
  else
    say "python: no attn_conform wheel under $S/pywhl"
  fi
fi

if want sanitizer; then
  # a reduced set of cases: the sanitizer slows kernels down by orders of magnitude
  export ATTN_TEST_CASES=4
  for tool in memcheck racecheck; do
    for t in ${ATTN_SANITIZE:-scans gates decode fwd_h fwd_h_summaries fwd_h_split delta_fwd nsa nsa_attention}; do
      timeout "${ATTN_SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool $tool --error-exitcode 3 "$S/bin/test_$t" --test-threads 1 \
        --skip "${ATTN_SANITIZE_SKIP:-long_lane}" --skip long_sequences --skip hundred_launches \
        --skip deterministic --skip past_2_31 --skip repeated_launches >>"$OUT/sanitizer.log" 2>&1
      rc=$?
      say "compute-sanitizer $tool test_$t: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
    done
  done
  unset ATTN_TEST_CASES
fi

if [[ " $PARTS " == *" tune "* ]]; then
  IFS=';' read -r -a variants <<<"${ATTN_TUNE_VARIANTS:--}"
  for pass in $(seq "${ATTN_TUNE_PASSES:-1}"); do
    for v in "${variants[@]}"; do
      [ "$v" = "-" ] && v=""
      echo "== variant [$v] pass $pass" >>"$OUT/tune.txt"
      eval "env $v timeout 120 \"\$S/bin/bench_gpu\"" --filter "${ATTN_TUNE_FILTER:-chunk_local,kda_gate}" >"$OUT/tune_one.txt" 2>&1
      cat "$OUT/tune_one.txt" >>"$OUT/tune.txt"
      grep -E "^(chunk|kda|decode|fwd_h|nsa)" "$OUT/tune_one.txt" | awk -v v="[$v] p$pass" '{printf "%-58s %-40s %8s ms %6s\n", v, $1, $2, $4}' | tee -a "$SUM"
    done
  done
fi

if [[ " $PARTS " == *" cp "* ]]; then
  NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  say "== cp: $NGPU GPU(s), NCCL from ${NCCL_LIB:-nowhere}"
  start=$(date +%s)
  ATTN_REQUIRE_GPUS=$NGPU timeout "${ATTN_TEST_TIMEOUT:-420}" "$S/bin/test_cp" --test-threads 1 >"$OUT/cp.log" 2>&1
  rc=$?
  say "tests test_cp (ATTN_REQUIRE_GPUS=$NGPU): exit $rc, $(( $(date +%s) - start )) s, $(grep -h '^test result' "$OUT/cp.log" | tail -1)"
  grep -E "panicked|FAILED|ignored" "$OUT/cp.log" | head -30 | tee -a "$SUM"
  for n in $(seq 2 "$NGPU"); do
    timeout 300 "$S/bin/attn-conform" verify --gpus "$n" "$ATTN_FIXTURES" >"$OUT/verify_gpus$n.log" 2>&1
    say "verify --gpus $n: exit $?, $(tail -1 "$OUT/verify_gpus$n.log")"
  done
fi

if [[ " $PARTS " == *" cpbench "* ]]; then
  NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  CF=${ATTN_CP_FILTER:-cp_}
  timeout 540 "$S/bin/bench_gpu" --filter "$CF" --json "$OUT/bench_cp.json" 2>&1 | grep -E "^(device|cp_)" | tee "$OUT/cp.txt"
  whl=$(ls "$S"/whl/fla_core-0.6.0-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$whl" && export PYTHONPATH=/tmp/site
  fi
  for n in 1 2 4; do
    [ "$n" -le "$NGPU" ] || { echo "cp anchors on $n GPUs: skipped ($NGPU GPU(s) here)" | tee -a "$OUT/cp.txt"; continue; }
    PYTHONUNBUFFERED=1 timeout 540 torchrun --standalone --nproc_per_node "$n" "$S/cp_anchors.py" --filter "$CF" \
      --ours "$OUT/bench_cp.json" --json "$OUT/cp_anchors_r$n.json" 2>&1 | grep -vE "^(W|I)[0-9]{4}" | tee -a "$OUT/cp.txt"
  done
  cat "$OUT/cp.txt" >>"$SUM"
fi

if [[ " $PARTS " == *" ptx "* ]]; then
  mkdir -p /tmp/ptx
  ATTN_PTX_DIR=/tmp/ptx "$S/bin/test_compile" >/dev/null 2>&1
  for m in ${ATTN_PTX_MODULES:-decode_attention kv_cache_update}; do
    /usr/local/cuda/bin/ptxas -arch=sm_90 -v /tmp/ptx/$m.ptx -o /tmp/ptx/$m.cubin 2>&1 |
      grep -E "Compiling entry|registers|spill" | paste - - - | sed -E 's/ptxas info *: //g' >"$OUT/ptx_$m.txt"
    say "ptxas $m: $(grep -c . "$OUT/ptx_$m.txt") kernels, $(grep -vc ' 0 bytes spill stores' "$OUT/ptx_$m.txt") with spills"
  done
fi

if [[ " $PARTS " == *" profile "* ]]; then
  K=${ATTN_PROFILE_KERNELS:-'regex:^(gdn_intra|kda_intra_mma|delta_fwd_gdn|delta_fwd_mma)'}
  rows=${ATTN_PROFILE_ROWS:-fwd_gdn_h32_8x8192,fwd_kda_h32_8x8192}
  for row in ${rows//,/ }; do
    timeout 300 ncu --clock-control none --kernel-name "$K" --launch-skip "${ATTN_PROFILE_SKIP:-6}" \
      --launch-count "${ATTN_PROFILE_COUNT:-4}" --set full -f -o "$OUT/profile_$row" \
      "$S/bin/bench_gpu" --iters 20 --filter "$row" >"$OUT/profile_$row.log" 2>&1
    say "ncu $row: exit $?"
    ncu --import "$OUT/profile_$row.ncu-rep" --page details --print-units base \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      >"$OUT/profile_$row.txt" 2>&1
    grep -E '^  [a-z_0-9]+|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Stall' \
      "$OUT/profile_$row.txt" | head -60 >>"$SUM"
    ncu --import "$OUT/profile_$row.ncu-rep" --page source --csv --print-source sass >/tmp/attn-src.csv 2>/dev/null &&
      python3 "$S/ncu_source.py" /tmp/attn-src.csv --top 25 >"$OUT/profile_$row.src.txt" 2>&1
    say "source page $row: $(grep -c 'SASS instructions' "$OUT/profile_$row.src.txt" 2>/dev/null || echo 0) kernels summarised"
  done
fi

if want bench; then
  BF=${ATTN_BENCH_FILTER:-}
  timeout 300 "$S/bin/bench_gpu" --json "$OUT/bench_gpu.json" ${BF:+--filter "$BF"} 2>&1 | tee "$OUT/bench.txt"
  whl=$(ls "$S"/whl/fla_core-0.6.0-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$whl" && export PYTHONPATH=/tmp/site
  fi
  PYTHONUNBUFFERED=1 timeout 400 python3 "$S/bench_anchors.py" --json "$OUT/bench_anchors.json" --ours "$OUT/bench_gpu.json" \
    ${BF:+--filter "$BF"} ${ATTN_ANCHORS_DECODE_ONLY:+--decode-only} 2>&1 | tee -a "$OUT/bench.txt"
  # the whole delta-rule forward rows against FLA (and FlashQLA where installed in /tmp/site)
  PYTHONUNBUFFERED=1 timeout 600 python3 "$S/forward_anchors.py" --json "$OUT/forward_anchors.json" --ours "$OUT/bench_gpu.json" \
    ${BF:+--filter "$BF"} 2>&1 | tee "$OUT/forward.txt"
  sed -n '/^decode (bytes/,/^$/p;/^ours on/,$p' "$OUT/bench.txt" >>"$SUM"
  cat "$OUT/forward.txt" >>"$SUM"
fi
echo "== summary"; cat "$SUM"
