#!/usr/bin/env bash
# The GPU check (`make gpu-check`): on a machine with CUDA and no network, in at most ~6 minutes,
#   1. install what the machine lacks from the wheels in wheels/gpu (filled beforehand, where there is
#      a network, by `make gpu-wheels`), and this project without its dependencies;
#   2. run bench_scale (orders 1 and 2; order 3 too with GPU_CHECK_ORDER3=1) and bench_verify on CUDA (first its
#      ATen operation counts beside run_with_cache, issue 55);
#   3. run the whole suite with CUDA visible (in parallel with pytest-xdist where it is installed),
#      printing each failure the moment it happens;
#   4. print one summary. The whole log is written to gpu-check.log (GPU_CHECK_LOG=FILE to change), and copied
#      into $OUT where the device machine gives one.
# With GPU_CHECK_TRAIN=1 the plain-text runs of issue 53 (scripts/gpu_plain.sh, GPU_PLAIN_S seconds, default 240)
# train on the card while the suite runs (after the benchmarks, which they would disturb), into $OUT/gpu-plain
# (build/gpu-plain without $OUT).
# It uses the Python it finds (PYTHON=... to choose) and never builds a virtual environment: the GPU
# machine's torch is the one to test.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${GPU_CHECK_LOG:-gpu-check.log}
SUITE_LIMIT=${GPU_CHECK_SUITE_S:-240}
exec > >(tee "$LOG") 2>&1
started=$(date +%s)
echo "== tcircuits GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" - <<'PYEOF' || { echo "GPU check: torch cannot be imported"; exit 2; }
import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {gpu} x {torch.cuda.device_count()}")
PYEOF
if [ -z "${GPU_CHECK_ALLOW_CPU:-}" ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "GPU check: no CUDA device is visible here; run it on a GPU machine (GPU_CHECK_ALLOW_CPU=1 runs it anyway)"
  exit 2
fi

echo "== 1. install (offline)"
if [ -d wheels/gpu ]; then
  for wheel in wheels/gpu/*.whl; do  # one at a time: a wheel for another Python is skipped, not fatal
    "$PY" -m pip install -q --no-index --no-deps "$wheel" >/dev/null 2>&1 || echo "skipped $(basename "$wheel")"
  done
else
  echo "no wheels/gpu folder: TransformerLens and latex2mathml tests will skip (fill it with: make gpu-wheels)"
fi
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3 \
  || { echo "GPU check: cannot install tcircuits itself (setuptools missing?)"; exit 2; }

echo "== 2. benchmarks on CUDA (first: issue 26's figures)"
# (a result row shares its line with the progress bar's carriage returns: split them, then drop the bar)
timeout 150 "$PY" benchmarks/bench_scale.py --device cuda --orders 1 2 --dtypes float32 float64 2>&1 | tr '\r' '\n' \
  | grep -v "terms:" | grep -v "^ *$" | tail -15
scale_rc=${PIPESTATUS[0]}
if [ -n "${GPU_CHECK_ORDER3:-}" ]; then  # order 3 of GPT-2 small: 1.67 M terms
  timeout "${GPU_CHECK_ORDER3_S:-120}" "$PY" benchmarks/bench_scale.py --device cuda --orders 3 --dtypes float32 2>&1 \
    | tr '\r' '\n' | grep -v "terms:" | grep -v "^ *$" | tail -6 || echo "order 3: exit $? (124: cut at its time limit)"
fi
timeout 120 "$PY" benchmarks/bench_verify.py --device cuda 2>&1 | grep -v -i "deprecat" | tail -24  # 0.: issue 55's operation counts first
verify_rc=${PIPESTATUS[0]}

train_pid=
if [ -n "${GPU_CHECK_TRAIN:-}" ]; then
  echo "== 2b. the plain-text runs (issue 53), on the card beside the suite: ${OUT:-build}/gpu-plain"
  bash scripts/gpu_plain.sh "${OUT:-build}/gpu-plain" > .gpu-plain.out 2>&1 &
  train_pid=$!
fi

echo "== 3. the suite with CUDA visible (limit ${SUITE_LIMIT} s; failures shown as they happen)"
workers=()  # pytest-xdist where the machine has it: the suite in parallel on its cores
"$PY" -c "import xdist" 2>/dev/null && workers=(-n "${GPU_CHECK_WORKERS:-8}")
TCIRCUITS_INSTAFAIL=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} timeout "$SUITE_LIMIT" \
  "$PY" -m pytest -q -p no:cacheprovider "${workers[@]}" -rf 2>&1 | tee .gpu-suite.out | tail -25
suite_rc=${PIPESTATUS[0]}
suite_line=$(grep -E "(passed|failed|error)" .gpu-suite.out | tail -1)

train_rc=
if [ -n "$train_pid" ]; then
  wait "$train_pid"; train_rc=$?
  echo "== 2b. the plain-text runs"; cat .gpu-plain.out; rm -f .gpu-plain.out
fi

echo "== summary"
echo "suite: ${suite_line:-no result} (exit ${suite_rc}$([ "$suite_rc" = 124 ] && echo ', cut at its time limit'))"
echo "bench_scale: exit ${scale_rc}; bench_verify: exit ${verify_rc}"
[ -n "$train_pid" ] && echo "plain-text runs: exit ${train_rc}"
echo "took $(( $(date +%s) - started )) s; the whole log: $LOG"
rm -f .gpu-suite.out
[ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && cp "$LOG" "$OUT/"
[ "$suite_rc" = 0 ] && [ "$scale_rc" = 0 ] && [ "$verify_rc" = 0 ]
