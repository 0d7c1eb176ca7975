"""Training throughput: tokens a second of the language models' training step, by attention kernel.

The model: the shipped language models' shape (2 attention-only layers of 12 heads of 16, d_model 192, a BPE of
2,048 tokens, qk_only positions). The step: forward, cross-entropy, backward and AdamW, on random tokens (the
data pipeline costs about 2 % of a step on text: measured with py-spy on a run at 512 positions). Each row
times ``--steps`` steps after two of warm-up and reports the median, for the kernel analysis uses (``einsum``:
the scores and the pattern formed) and the fused one training uses (``sdpa``: TrainConfig.attention_kernel),
and their ratio. The shapes: the earlier runs' 32 x 128, and batches of 2 to 8 at 512 positions, the context the
follow-up paper's in-context learning score needs. On CUDA (where present) the same rows run on the GPU.

    python benchmarks/bench_train.py [--steps 6] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from numeric_check.training.config import TrainConfig
from numeric_check.training.toy import build_model, fuse_attention

SHAPES = [(32, 128), (2, 512), (4, 512), (8, 512)]  # (batch, n_ctx)


def step_seconds(batch: int, n_ctx: int, kernel: str, steps: int, device: str) -> float:
    """The median seconds of one training step of the language models' shape at ``batch`` x ``n_ctx``."""
    config = TrainConfig(n_layers=2, n_heads=12, d_model=192, d_head=16, d_vocab=2048, n_ctx=n_ctx, batch_size=batch,
                         lr=3e-3, init_std=0.02, seg_min=8, seg_max=64, attention_kernel=kernel)
    model = build_model(config, device)
    fuse_attention(model, kernel == "sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    tokens = torch.randint(0, config.d_vocab, (batch, n_ctx + 1), generator=torch.Generator().manual_seed(0)).to(device)
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per row (default 6)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1, as the shipped runs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {args.threads} thread(s)"
        print(f"== {name}: tokens a second of a training step (median of {args.steps}), 2 layers x 12 heads, d_model 192")
        print(f"{'batch x n_ctx':>14} {'einsum tok/s':>13} {'sdpa tok/s':>11} {'sdpa / einsum':>14}")
        for batch, n_ctx in SHAPES:
            einsum, sdpa = (step_seconds(batch, n_ctx, k, args.steps, device) for k in ("einsum", "sdpa"))
            tokens = batch * n_ctx
            print(f"{f'{batch} x {n_ctx}':>14} {tokens / einsum:>13,.0f} {tokens / sdpa:>11,.0f} {einsum / sdpa:>13.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
