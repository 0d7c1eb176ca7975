"""A tiny numpy transformer with frozen patterns and scales, to check expansions against.

It follows the architecture conventions of :mod:`derivations.paths` and
:mod:`derivations.qk` directly (one row per position), never through the algebra, and
binds every atom the expansions use, by the labels of the naming conventions.
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from derivations.architecture import Architecture, head_label
from derivations.paths import Source


class NumpyModel:
    """Random weights, patterns ``A`` (any matrices: frozen), scales ``N`` and MLP outputs."""

    def __init__(self, arch: Architecture, seed: int = 0, n_ctx: int = 4, d_model: int = 5, d_head: int = 3,
                 d_vocab: int = 6):
        rng = np.random.default_rng(seed)
        self.arch, self.n_ctx, self.d_head = arch, n_ctx, d_head
        self.dims = {"n_ctx": n_ctx, "d_model": d_model, "d_head": d_head, "d_vocab": d_vocab}
        r = lambda *shape: rng.normal(size=shape)  # noqa: E731
        diag = lambda: np.diag(rng.uniform(0.5, 2.0, size=n_ctx))  # noqa: E731
        b = {"W_E": r(d_model, d_vocab), "W_pos": r(d_model, n_ctx), "W_U": r(d_vocab, d_model),
             "b_U": r(d_vocab, 1), "N^{final}": diag()}
        for layer in range(arch.n_layers):
            b[f"N^{{L{layer}}}"] = diag()
            b[f"b_O^{{L{layer}}}"] = r(d_model, 1)
            b[f"mlp^{layer}"] = r(n_ctx, d_model)  # the MLP's recorded output, not an atom
        for layer, head in arch.heads():
            i = head_label(layer, head)
            for name in ("W_Q", "W_K", "W_V"):
                b[f"{name}^{{{i}}}"] = r(d_head, d_model)
            b[f"W_O^{{{i}}}"] = r(d_model, d_head)
            b[f"b_Q^{{{i}}}"], b[f"b_K^{{{i}}}"] = r(d_head, 1), r(d_head, 1)
            b[f"A^{{{i}}}"] = r(n_ctx, n_ctx)
            b[f"W_OV^{{{i}}}"] = b[f"W_O^{{{i}}}"] @ b[f"W_V^{{{i}}}"]
            b[f"W_QK^{{{i}}}"] = b[f"W_Q^{{{i}}}"].T @ b[f"W_K^{{{i}}}"]
        self.bindings = b
        self.tokens = np.eye(d_vocab)[rng.integers(0, d_vocab, size=n_ctx)]  # one-hot [pos, d_vocab]
        self.ones = np.ones((n_ctx, 1))

    # -- the forward pass, row convention -------------------------------------------
    def value_input(self, x: np.ndarray, layer: int) -> np.ndarray:
        return self.bindings[f"N^{{L{layer}}}"] @ x if self.arch.layer_norm else x

    def resid_pre(self, layer: int) -> np.ndarray:
        """The residual stream entering ``layer`` (``n_layers``: the end)."""
        b, arch = self.bindings, self.arch
        x = self.tokens @ b["W_E"].T
        if arch.positional == "standard":
            x = x + b["W_pos"].T
        for j in range(layer):
            v = self.value_input(x, j)
            x = x + sum(b[f"A^{{{head_label(j, h)}}}"] @ v @ b[f"W_OV^{{{head_label(j, h)}}}"].T
                        for h in range(arch.heads_per_layer[j]))
            if arch.biases:
                x = x + self.ones @ b[f"b_O^{{L{j}}}"].T
            if arch.mlp:
                x = x + b[f"mlp^{j}"]
        return x

    def logits(self) -> np.ndarray:
        b = self.bindings
        x = self.resid_pre(self.arch.n_layers)
        if self.arch.layer_norm:
            x = b["N^{final}"] @ x
        out = x @ b["W_U"].T
        return out + self.ones @ b["b_U"].T if self.arch.biases else out

    def scores(self, layer: int, head: int) -> np.ndarray:
        """``S[i, j]``: query position i against key position j, before the softmax."""
        b, arch, i = self.bindings, self.arch, head_label(layer, head)
        x = self.resid_pre(layer)
        qk_in = self.value_input(x, layer)
        if arch.positional == "qk_only":  # positions join after the layer norm (TransformerLens' shortformer)
            qk_in = qk_in + b["W_pos"].T
        q, k = qk_in @ b[f"W_Q^{{{i}}}"].T, qk_in @ b[f"W_K^{{{i}}}"].T
        if arch.biases:
            q, k = q + self.ones @ b[f"b_Q^{{{i}}}"].T, k + self.ones @ b[f"b_K^{{{i}}}"].T
        return q @ k.T / np.sqrt(self.d_head)

    # -- evaluating terms --------------------------------------------------------------
    def input(self, source: Source) -> np.ndarray:
        """The input ``X`` (one row per position) a source's terms act on."""
        if source.kind == "token":
            return self.tokens
        if source.kind == "position":
            return np.eye(self.n_ctx)
        if source.kind == "mlp":
            return self.bindings[f"mlp^{source.layer}"]
        return self.ones

    def word(self, word, size: int) -> np.ndarray:
        """The matrix of a word of atoms; ``Id`` as the ``size x size`` identity."""
        if not word:
            return np.eye(size)
        return reduce(np.matmul, [self.bindings[a.label].T if a.transposed else self.bindings[a.label] for a in word])

    def coeff(self, c) -> float:
        return float(c.subs({s: self.dims[s.name] for s in c.free_symbols}))
