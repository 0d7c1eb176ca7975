"""An independent check of ``tcircuits dynamics``: every snapshot of a run read with safetensors alone and run by
a float64 forward pass written here in NumPy (none of tcircuits' model code), its held-out loss by position and
its in-context learning score compared with ``dynamics.json``, and each head's prefix matching recomputed on the
repeated random tokens the page reports.

    python scripts/independent_dynamics.py CHECKPOINT DYNAMICS_JSON

Prints the largest differences; exits 1 when one is beyond 1e-9 (losses) — the attention-only models with
positions in Q and K (``qk_only``) that train-toy makes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def forward(weights: dict, tokens: np.ndarray, n_layers: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits ``[batch, pos, vocab]`` and each layer's patterns ``[batch, head, query, key]``, float64."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    n = tokens.shape[1]
    x = w["W_E"].T[tokens]  # [batch, pos, d_model]
    pos = w["W_pos"].T[:n]  # [pos, d_model]: added to the inputs of queries and keys only
    patterns = []
    for layer in range(n_layers):
        wq, wk, wv, wo = (w[f"blocks.{layer}.attn.W_{m}"] for m in "QKVO")
        q = np.einsum("bpd,hed->bhpe", x + pos, wq)
        k = np.einsum("bpd,hed->bhpe", x + pos, wk)
        v = np.einsum("bpd,hed->bhpe", x, wv)
        scores = np.einsum("bhqe,bhke->bhqk", q, k) / np.sqrt(wq.shape[1])
        scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
        scores -= scores.max(-1, keepdims=True)
        a = np.exp(scores)
        a /= a.sum(-1, keepdims=True)
        patterns.append(a)
        z = np.einsum("bhqk,bhke->bhqe", a, v)
        x = x + np.einsum("bhqe,hde->bqd", z, wo)
    return x @ w["W_U"].T, patterns


def position_loss(weights: dict, windows: np.ndarray, n_layers: int, chunk: int = 32) -> np.ndarray:
    total = np.zeros(windows.shape[1] - 1)
    for start in range(0, len(windows), chunk):
        part = windows[start:start + chunk]
        logits, _ = forward(weights, part[:, :-1], n_layers)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total -= np.take_along_axis(logp, part[:, 1:, None], -1)[..., 0].sum(0)
    return total / len(windows)


def prefix_matching(weights: dict, tokens: np.ndarray, starts: np.ndarray, seg_len: int, n_layers: int) -> np.ndarray:
    """``[layer, head]``: attention from a query in the second copy to the keys after earlier occurrences of its token,
    averaged over the sequences at each query position and then over positions (the dynamics page's definition)."""
    _, patterns = forward(weights, tokens, n_layers)
    n = tokens.shape[1]
    before = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    targets = (tokens[:, :, None] == before[:, None, :]) & (j >= 1) & (j <= i)  # [batch, query, key]
    pos = np.arange(n)
    second = (pos >= (starts + seg_len)[:, None]) & (pos < (starts + 2 * seg_len)[:, None])
    has = second & targets.any(-1)
    counts = has.sum(0)
    out = []
    for a in patterns:  # [batch, head, query, key]
        on = (a * targets[:, None]).sum(-1)  # [batch, head, query]
        mean = (on * has[:, None]).sum(0) / np.maximum(counts, 1)
        mean[:, counts == 0] = np.nan
        out.append(np.nanmean(mean, -1))
    return np.array(out)


def main(argv: list[str]) -> int:
    checkpoint, dynamics = Path(argv[0]), json.loads(Path(argv[1]).read_text())
    run = dynamics["run"]
    folder = checkpoint.with_suffix(".history")
    history = json.loads((folder / "history.json").read_text())
    shape = history["windows"]
    windows = np.fromfile(folder / "heldout-windows.u16", dtype="<u2").astype(np.int64).reshape(shape["count"], shape["tokens"])
    (a, b), (c, d) = run["icl_positions"]["early"], run["icl_positions"]["late"]
    from numeric_check.circuits.behaviour import repeat_sweep  # the random tokens only (data, not model code)

    n = min(run["n_ctx"], 128)
    seg_len = max(2, min(8, n // 4))
    tokens, starts = (x.numpy() for x in repeat_sweep(load_file(str(checkpoint))["W_U"].shape[0], n, seg_len, 32, 0,
                                                       tokens=run.get("random_tokens")))  # as dynamics drew them
    worst_loss = worst_icl = worst_prefix = 0.0
    for snap in run["snapshots"]:
        weights = load_file(str(folder / f"step-{snap['step']:06d}.safetensors"))
        loss = position_loss(weights, windows, run["n_layers"])
        icl = loss[c:d].mean() - loss[a:b].mean()
        worst_loss = max(worst_loss, float(np.abs(loss - np.array(snap["position_loss"])).max()))
        worst_icl = max(worst_icl, abs(icl - snap["icl_score"]))
        if run["n_layers"]:
            prefix = prefix_matching(weights, tokens, starts, seg_len, run["n_layers"])
            worst_prefix = max(worst_prefix, float(np.nanmax(np.abs(prefix - np.array(snap["prefix_matching"], dtype=float)))))
    print(f"{len(run['snapshots'])} snapshots, an independent float64 forward pass: held-out loss by position within "
          f"{worst_loss:.1e} nats of dynamics.json, the in-context learning score within {worst_icl:.1e}, every head's "
          f"prefix matching within {worst_prefix:.1e}")
    return 0 if max(worst_loss, worst_icl, worst_prefix) <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
