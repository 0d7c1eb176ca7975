#!/usr/bin/env bash
# How much repetition induction needs: the shipped two-layer language model's run (the King James Bible,
# 12 heads of 16, d_model 192, 5,000 batches of 32 x 128 tokens, lr 0.003, init 0.02) at copy shares 0, 0.1,
# 0.25 and 1, and a one-layer control at a share, each keeping 32 snapshots for 'tcircuits dynamics'.
# Each run is one CPU thread for about 50 minutes of wall time here (the records' seconds); two at a time on two cores:
#
#   make corpus
#   bash scripts/sweep.sh 2 0 & bash scripts/sweep.sh 2 0.25 & wait
#   bash scripts/sweep.sh 1 0 & bash scripts/sweep.sh 2 0.1 & wait
#   .venv/bin/tcircuits dynamics --checkpoint build/sweep/kjv_2l_share0.safetensors \
#       --control build/sweep/kjv_1l_share0.safetensors -o build/sweep/dynamics_share0
#
# Usage: scripts/sweep.sh LAYERS SHARE  -> build/sweep/kjv_{LAYERS}l_share{SHARE}.safetensors (and .history/)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:?layers: 1 or 2}
share=${2:?copy share: 0 .. 1}
mkdir -p build/sweep
exec .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt --layers "$layers" --heads 12 --d-model 192 \
    --d-head 16 --n-ctx 128 --seg-min 8 --seg-max 64 --batch-size 32 --steps 5000 --copy-share "$share" \
    --lr 0.003 --init-std 0.02 --threads 1 --save-dtype float16 --snapshots 32 --quiet \
    -o "build/sweep/kjv_${layers}l_share${share}.safetensors"
