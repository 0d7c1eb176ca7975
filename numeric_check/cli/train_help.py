"""The help texts of ``tcircuits train-toy`` (kept apart from its parser and its run)."""

from numeric_check.training.config import BLOCK_LINES, HELDOUT_EVERY

TRAIN_DESCRIPTION = f"""\
Train a small attention-only transformer, the paper's kind of model, with zero, one or
two layers, and save it as a safetensors checkpoint (plus a JSON record beside it: the
training configuration, the data's hash, the device, the time and the final losses).

On your text (--text-file FILE..., or --text): a byte-level BPE of --d-vocab tokens is
trained on it and saved beside the checkpoint; every {HELDOUT_EVERY}th block of {BLOCK_LINES} lines is held
out, and every evaluation measures there; windows of --n-ctx tokens are cut at random
offsets. Nothing is planted unless --copy-share asks for it, and the record says what
was. --snapshots keeps checkpoints along the way for 'tcircuits dynamics'. A run stopped
by Ctrl-C (or SIGTERM) once training has begun ends at the end of its step and keeps the
model, its record and its snapshots.

Without text, the data is planted for induction heads to learn:

Every sequence holds segments that recur anywhere in the context: up to
MAX_REPEATS copies per sequence, each of SEG_MIN..SEG_MAX tokens (log-uniform, so short
repeats are common), each copying a source that ends a varying distance before it
(log-uniform, so sources and copies sit late in the context as often as early). On a
copy each token (after the first) can be predicted by finding the previous occurrence of
the current token and copying the token that followed it: a previous-token head in
layer 0 composed (K-composition) with an induction head in layer 1. So:
  --layers 2   learns induction heads: the loss on the repeated part drops far below
               log(vocab) (the "phase change"), at every position of the context;
  --layers 1   cannot: it can only copy tokens seen before, so its loss on repeats
               stays far above (a control); it learns the planted skip-trigrams;
  --layers 0   is the direct path only: it learns the bigram table.
Between and inside the repeats the tokens follow a bigram table (each token has
--bigram-successors likely successors, followed with probability --bigram-follow) and
hold planted skip-trigrams (--skip-trigrams sources A, each with two destination/out
pairs: A earlier, then B, makes C next), all drawn from --seed; 0 and 0 give tokens
uniformly at random.

The defaults are a recipe measured on a shared 2-core CPU (one thread; the 2-layer
model takes about 15 minutes of CPU time): vocab 128, context 64, up to 8 repeats of
3-32 tokens per sequence, placed left to right in half of the sequences and right to
left in the other half, d_model 128, 4 heads of 32, qk_only positions, no layer norm,
weights N(0, 0.1^2), AdamW lr 1e-3 (reached over 100 steps, held, then brought down
linearly to 0 over the last 4,500), batch 64, 14,000 steps: the loss on a repeat of
4 tokens stays under 1 nat at every offset. With one repeat of 16-32
tokens per sequence, the previous-token head learnt only the first half of the
context: no later query ever needed it there.
"""

TRAIN_EPILOG = """\
examples:
  # a first try, under a minute of CPU time: 20 steps on a short text, vocabulary and batch fitted to it
  tcircuits train-toy --text-file /usr/share/common-licenses/GPL-3 --steps 20 --out gpl.safetensors
  tcircuits train-toy --layers 2 --out induction_2l.safetensors
  tcircuits train-toy --layers 1 --steps 4000 --seed 1 --out control_1l.safetensors
  tcircuits analyze --checkpoint induction_2l.safetensors --out report/
"""
