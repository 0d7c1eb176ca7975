"""Skip-trigram tables, as in the paper's one-layer analysis: ``source … destination → out``.

For one head and a source (key) token, the QK circuit ``W_Eᵀ W_QK W_E`` ranks the
destination (query) tokens that most want to attend to it, and the OV circuit
``W_U W_OV W_E`` ranks the out tokens whose logits it raises when attended to. Each is one
column of a ``d_vocab × d_vocab`` :class:`~numeric_check.circuits.factored.Factored` circuit,
computed by matrix–vector products; the circuits are never materialised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import torch

from tensoralg.display import md_table
from tensoralg.escape import escape_text

from numeric_check.circuits.ov_qk import ov_circuit, qk_circuit
from numeric_check.errors import AnalysisError


@dataclass(frozen=True)
class TokenScore:
    """A token id, its text (None without a vocabulary) and a score."""

    token: int
    text: str | None
    score: float

    def label(self) -> str:
        return token_label(self.token, self.text)


def token_label(token: int, text: str | None) -> str:
    """``"text" (id)`` (quoted, then escaped for Markdown: ``|``, HTML, emphasis) or ``#id`` without text."""
    if text is None:
        return f"#{token}"
    return escape_text(json.dumps(text, ensure_ascii=False), "markdown") + f" ({token})"  # no HTML, no table break


@dataclass(frozen=True)
class SkipTrigramTable:
    """The top destinations (QK) and outs (OV) of one head for one source token.

    ``destinations[i].score`` is the token–token term of the attention score
    ``(W_Eᵀ W_QK W_E)[dest, source] / scale`` (before softmax; positional terms excluded);
    ``outputs[i].score`` the direct logit effect ``(W_U W_OV W_E)[out, source]`` per unit of
    attention.
    """

    layer: int
    head: int
    source_token: int
    source_text: str | None
    destinations: tuple[TokenScore, ...]
    outputs: tuple[TokenScore, ...]

    def trigrams(self) -> list[tuple[str, str, str]]:
        """``(source, destination, out)`` labels, the i-th destination with the i-th out."""
        return [(token_label(self.source_token, self.source_text), d.label(), o.label()) for d, o in zip(self.destinations, self.outputs)]

    def _repr_markdown_(self) -> str:
        """What a notebook shows: :meth:`to_markdown`."""
        return self.to_markdown()

    def to_markdown(self) -> str:
        """A Markdown table: rank, destination (QK) and score, out (OV) and logit."""
        rows = [[str(rank), d.label(), f"{d.score:.3f}", o.label(), f"{o.score:.3f}"]
                for rank, (d, o) in enumerate(zip(self.destinations, self.outputs), start=1)]
        return "\n".join([
            f"**L{self.layer}H{self.head}**, source token {token_label(self.source_token, self.source_text)}",
            "",
            md_table(["rank", "destination (QK)", "score", "out (OV)", "logit"], rows, right=(0, 2, 4)),
        ]) + "\n"


def check_vocab(model, vocab: Sequence[str] | None) -> list[str] | None:
    """The vocabulary as a list, or an :class:`AnalysisError` if it is not ``d_vocab`` strings."""
    if vocab is None:
        return None
    if isinstance(vocab, str) or not isinstance(vocab, Sequence):
        raise AnalysisError(f"vocab must be a list of d_vocab={model.cfg.d_vocab} strings, got {type(vocab).__name__}")
    vocab = list(vocab)
    if len(vocab) != model.cfg.d_vocab:
        raise AnalysisError(f"vocab has {len(vocab)} entries but the model's d_vocab is {model.cfg.d_vocab}; give one string per token id")
    bad = next((i for i, t in enumerate(vocab) if not isinstance(t, str)), None)
    if bad is not None:
        raise AnalysisError(f"vocab entries must be strings; entry {bad} is {vocab[bad]!r}")
    return vocab


def _source_id(model, source_token: int | str, vocab: list[str] | None) -> int:
    if isinstance(source_token, str):
        if vocab is None:
            raise AnalysisError(f"source token {source_token!r} is text but no vocab was given; pass vocab= or a token id")
        if source_token not in vocab:
            raise AnalysisError(f"source token {source_token!r} is not in the vocabulary")
        return vocab.index(source_token)  # the first id with that text
    d_vocab = model.cfg.d_vocab
    if isinstance(source_token, bool) or not isinstance(source_token, int) or not 0 <= source_token < d_vocab:
        raise AnalysisError(f"source token {source_token!r} is not a token id in [0, {d_vocab})")
    return source_token


def skip_trigram_table(
    model, layer: int, head: int, source_token: int | str, k: int = 5, vocab: Sequence[str] | None = None
) -> SkipTrigramTable:
    """The ``k`` top destination tokens (QK) and out tokens (OV) of ``L{layer}H{head}`` for ``source_token``.

    ``source_token`` is an id, or a string of ``vocab`` (its first occurrence). ``vocab``,
    one string per token id, labels the table.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=6, n_ctx=4)
    >>> table = skip_trigram_table(model, 0, 1, "c", k=2, vocab=list("abcdef"))
    >>> table.source_token, len(table.destinations), len(table.outputs)
    (2, 2, 2)
    >>> print(table.to_markdown().splitlines()[0])
    **L0H1**, source token "c" (2)
    """
    vocab = check_vocab(model, vocab)
    source = _source_id(model, source_token, vocab)
    d_vocab = model.cfg.d_vocab
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_vocab:
        raise AnalysisError(f"k must be an int in 1..{d_vocab} (d_vocab), got {k!r}")
    with torch.no_grad():
        qk = qk_circuit(model, layer, head).topk_col(source, k)
        ov = ov_circuit(model, layer, head).topk_col(source, k)

    def scores(top, divide: float = 1.0) -> tuple[TokenScore, ...]:
        return tuple(
            TokenScore(int(t), vocab[int(t)] if vocab else None, float(v) / divide) for v, t in zip(top.values, top.indices)
        )

    return SkipTrigramTable(
        layer=layer,
        head=head,
        source_token=source,
        source_text=vocab[source] if vocab else None,
        destinations=scores(qk, model.cfg.scale),
        outputs=scores(ov),
    )
