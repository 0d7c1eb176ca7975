#!/usr/bin/env bash
# A plain-text run on a lent GPU (issue 53), for `make gpu-check` with GPU_CHECK_TRAIN=1 or on its own:
# the two-layer model and its one-layer control, trained alike at the same time on the one card, on the
# King James Bible (numeric_check/data/kjv.txt.xz, the text `make corpus` makes) with nothing planted
# (copy share 0), the learning rate held to the end. Where the time runs out before the steps do, `timeout`
# stops a run (SIGTERM), which train-toy answers by keeping the run so far: the model of the step it reached,
# its record ("stopped") and its snapshots. The settings are the CPU runs' (scripts/train_plain.sh: a BPE of 512, sinusoidal positions
# held at lr 0.003) at GPU_PLAIN_BATCH sequences of 512 a step (default 64: the law's onset,
# 10^5.7 x sqrt(64 x 512) = 90 M tokens, is about step 2,750).
#
# Then, where the card ran, or here on the CPU from what came back:
#   tcircuits dynamics --checkpoint OUT/kjv_2l_gpu.safetensors --control OUT/kjv_1l_gpu.safetensors -o OUT/dyn
#
# Usage: scripts/gpu_plain.sh [OUT]   (default build/gpu-plain; GPU_PLAIN_S seconds a run, default 240;
#        GPU_PLAIN_STEPS the steps asked for, default 8,000: 262 M tokens, 2.9 x the onset)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-build/gpu-plain}
seconds=${GPU_PLAIN_S:-240}
batch=${GPU_PLAIN_BATCH:-64}
steps=${GPU_PLAIN_STEPS:-8000}
mkdir -p "$out" build/corpus
[ -s build/corpus/kjv.txt ] || xz -dc numeric_check/data/kjv.txt.xz > build/corpus/kjv.txt
sha256sum build/corpus/kjv.txt | tee "$out/text.sha256"
pids=()
for layers in 2 1; do
  # where the time runs out first, `timeout` stops the run and it keeps what it reached
  timeout "$seconds" "$PY" -m derivations.cli train-toy --text-file build/corpus/kjv.txt --layers "$layers" \
      --heads 12 --d-model 192 --d-head 16 --n-ctx 512 --d-vocab 512 --seg-min 8 --seg-max 64 --batch-size "$batch" \
      --steps "$steps" --warmup-steps 100 --decay-steps 0 --copy-share 0 --lr 0.003 --init-std 0.02 \
      --pos-init sinusoidal --device "${GPU_PLAIN_DEVICE:-cuda}" --save-dtype float16 --snapshots 32 --quiet --force \
      -o "$out/kjv_${layers}l_gpu.safetensors" > "$out/kjv_${layers}l_gpu.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid"; rc=$?; [ "$rc" = 0 ] || [ "$rc" = 124 ] || status=$rc; done
for layers in 2 1; do
  echo "-- ${layers} layer(s):"; tail -5 "$out/kjv_${layers}l_gpu.log"
done
"$PY" - "$out" <<'PYEOF'
import json, sys
from pathlib import Path
for record in sorted(Path(sys.argv[1]).glob("kjv_*l_gpu.json")):
    r = json.loads(record.read_text())
    c, stopped = r["train_config"], r.get("stopped") or {}
    steps = stopped.get("step", c["steps"])
    tokens = steps * c["batch_size"] * c["n_ctx"]
    print(f"{record.stem}: {steps:,} steps, {tokens / 1e6:.1f} M tokens in {r['seconds']:.0f} s "
          f"({tokens / r['seconds']:,.0f} tokens/s) on {r['trained_on']['name']}; held-out loss {r['final']['loss']:.3f}")
PYEOF
exit $status
