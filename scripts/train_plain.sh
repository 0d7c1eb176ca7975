#!/usr/bin/env bash
# The language models with nothing planted (issue 53): the King James Bible as it is (copy share 0), 2, 1 and
# 0 attention layers of 12 heads of 16, d_model 192, contexts of 512 tokens (the follow-up paper's in-context
# learning score reads tokens 50 and 500), batches of 2 sequences (Aoyama et al. 2025: induction heads emerge
# after about 10^5.7 · sqrt(batch · context) tokens, 16 M here, step ~15,700; the smallest batch is the
# cheapest way there), 24,000 steps (24.6 M tokens), lr 0.003 held after 100 steps of warm-up and brought down
# over the last 2,400 (10 %), 32 snapshots each for 'tcircuits dynamics'. One CPU thread each; the fused
# attention kernel (TrainConfig.attention_kernel 'sdpa'). Run on 2026-12-06 at commit 3090c6f, the 2- and
# 1-layer runs at once on this 2-core machine beside other work, then the 0-layer one:
#
#   make corpus            # or: xz -dc numeric_check/data/kjv.txt.xz > build/corpus/kjv.txt (the same SHA-256)
#   bash scripts/train_plain.sh 2 & bash scripts/train_plain.sh 1 & wait; bash scripts/train_plain.sh 0
#   .venv/bin/tcircuits dynamics --checkpoint build/plain/kjv_2l.safetensors \
#       --control build/plain/kjv_1l.safetensors -o build/plain/dynamics
#
# The 2-layer run (5,175 s of wall time, one thread, beside other work) wrote a checkpoint of content hash
# 798cef0c0197164eb578561f8cd7649a8e9ebc5e5a5d37711424c34bf9cc8046 (its record's checkpoint_sha256), held-out loss
# 3.060 on its own held-out batches; no induction head formed (docs/how-to/train-on-text.md). The 1-layer control
# was stopped at step 11,474 of 24,000 once the 2-layer run had shown none, and the 0-layer one never ran.
#
# The second try (2026-12-07, commit 508f037): the same settings on twice the text, the Bible and Jane Austen's six
# novels (scripts/austen_corpus.py; 2.2 M training tokens, read 11 times instead of 22), the 2-layer model alone:
#
#   .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt build/corpus/austen.txt --layers 2 --heads 12 \
#       --d-model 192 --d-head 16 --n-ctx 512 --seg-min 8 --seg-max 64 --batch-size 2 --steps 24000 --warmup-steps 100 \
#       --decay-steps 2400 --copy-share 0 --lr 0.003 --init-std 0.02 --threads 1 --save-dtype float16 --snapshots 32 \
#       -o build/plain2/ka_2l.safetensors
#
# 4,514 s of one thread (record: text_sha256 8f87f9ef…, trained_on cpu AMD EPYC); no induction head formed either
# (docs/how-to/train-on-text.md).
#
# The third try (2026-12-07, commit 22386d2): the Bible alone, a BPE of 512 tokens (1.65 M training tokens, read 16 times), the
# positional embedding started from sines and cosines (--pos-init sinusoidal: the two runs above never formed a
# previous-token head), 26,000 steps (26.6 M tokens); the 2- and 1-layer runs at once, then the 0-layer one:
#
#   for layers in 2 1 0; do .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt --layers $layers \
#       --heads 12 --d-model 192 --d-head 16 --n-ctx 512 --d-vocab 512 --seg-min 8 --seg-max 64 --batch-size 2 \
#       --steps 26000 --warmup-steps 100 --decay-steps 2600 --copy-share 0 --lr 0.003 --init-std 0.02 \
#       --pos-init sinusoidal --threads 1 --save-dtype float16 --snapshots 32 -o build/plain3/kjv_${layers}l_26k.safetensors; done
#
# (The same run stopped at 16,000 steps, --steps 16000 --decay-steps 1600, is identical to it up to step 14,400.)
#
# The fourth try (2026-12-07, commit 89ea4b2): the third's settings at batches of 8 (4,096 tokens a step; the law's
# onset 32 M tokens, step ~7,800), 11,000 steps (45 M tokens); here the 2- and 1-layer runs at once, the control at nice 19:
#
#   for layers in 2 1; do .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt --layers $layers \
#       --heads 12 --d-model 192 --d-head 16 --n-ctx 512 --d-vocab 512 --seg-min 8 --seg-max 64 --batch-size 8 \
#       --steps 11000 --warmup-steps 100 --decay-steps 1100 --copy-share 0 --lr 0.003 --init-std 0.02 \
#       --pos-init sinusoidal --threads 1 --save-dtype float16 --snapshots 32 -o build/plain4/kjv_${layers}l_b8.safetensors; done
#
# The fifth try (2026-12-07, commit d89de6c): the third's settings at a batch of 1 (the law's onset 11.3 M tokens,
# step ~22,000), lr 0.002, 80,000 steps (41 M tokens, 3.6 x the onset), the 2-layer model alone (5,167 s of one thread):
#
#   .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt --layers 2 --heads 12 --d-model 192 --d-head 16 \
#       --n-ctx 512 --d-vocab 512 --seg-min 8 --seg-max 64 --batch-size 1 --steps 80000 --warmup-steps 100 \
#       --decay-steps 8000 --copy-share 0 --lr 0.002 --init-std 0.02 --pos-init sinusoidal --threads 1 \
#       --save-dtype float16 --snapshots 32 -o build/plain5/kjv_2l_b1.safetensors
#
# The sixth try (2026-12-07, commit 514d499): the fifth's settings with a BPE of 2,048 tokens (whole words and names
# where 512 split them), 60,000 steps (30.7 M tokens, 2.7 x the onset), the 2-layer model alone (4,910 s of one thread; no induction head;
# checkpoint content hash 128dd6c56e9092860cf7425a1f1f023a457e15a6a77267d8eac9716e3e267f5d, text a54f69ed...):
#
#   .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt --layers 2 --heads 12 --d-model 192 --d-head 16 \
#       --n-ctx 512 --d-vocab 2048 --seg-min 8 --seg-max 64 --batch-size 1 --steps 60000 --warmup-steps 100 \
#       --decay-steps 6000 --copy-share 0 --lr 0.002 --init-std 0.02 --pos-init sinusoidal --threads 1 \
#       --save-dtype float16 --snapshots 32 -o build/plain6/kjv_2l_v2048.safetensors
#
# The seventh try (2026-12-07, commit 4b59871): the sixth's settings on the Bible and SymPy's source
# (scripts/code_corpus.py: code defines a name and uses it again a few hundred tokens on, and most names are
# rare across the corpus, so only the context predicts them), 30,000 steps (15.4 M tokens, 1.4 x the onset;
# 5,151 s of one thread; checkpoint content hash e088909c8d1856c5c006d1e7c9309731b14e617eff2da680848ee3687587419d,
# text a2c51620...; the circuit began to form after step 17,897: prefix matching 0.19 at the end, no claim held yet):
#
#   .venv/bin/python scripts/code_corpus.py build/corpus/sympy.txt
#   .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt build/corpus/sympy.txt --layers 2 --heads 12 \
#       --d-model 192 --d-head 16 --n-ctx 512 --d-vocab 2048 --seg-min 8 --seg-max 64 --batch-size 1 --steps 30000 \
#       --warmup-steps 100 --decay-steps 3000 --copy-share 0 --lr 0.002 --init-std 0.02 --pos-init sinusoidal \
#       --threads 1 --save-dtype float16 --snapshots 32 -o build/plain7/mix_2l.safetensors
#
# Usage: scripts/train_plain.sh LAYERS  -> build/plain/kjv_{LAYERS}l.safetensors (and its record, tokenizer,
# loss curve and .history/)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:?layers: 0, 1 or 2}
mkdir -p build/plain
exec .venv/bin/tcircuits train-toy --text-file build/corpus/kjv.txt --layers "$layers" --heads 12 --d-model 192 \
    --d-head 16 --n-ctx 512 --seg-min 8 --seg-max 64 --batch-size 2 --steps 24000 --warmup-steps 100 \
    --decay-steps 2400 --copy-share 0 --lr 0.003 --init-std 0.02 --threads 1 --save-dtype float16 --snapshots 32 \
    --quiet -o "build/plain/kjv_${layers}l.safetensors"
