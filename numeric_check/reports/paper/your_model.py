"""The companion's language page on a model of one's own: which models it reads, and what it measures.

The companion's derivations and its checks on planted data need no model of yours; its language
page measures the paper's findings (:mod:`numeric_check.reports.paper.language`) on attention-only
models of zero, one or two layers, and can measure them on yours, on a text you give, instead of
the shipped ones. :func:`check_readable` refuses any other model in one line that says what can
still be built from it (the algebra, the verification); :func:`language_models` makes the page's
inputs from one model and a text: the model at its own layer count and, for a two-layer model, the
same model with its second layer removed (:func:`first_layer`) as induction's control — the same
learned first layer on the same text, which has what induction needs but cannot form it (no second
layer to match on the previous token's head).

>>> unreadable(3, mlp=False), unreadable(2, mlp=True), unreadable(2, mlp=False)
('3 layers', 'MLPs', None)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from numeric_check.circuits.importance import MAX_ELEMENTS, count_paths
from numeric_check.errors import InputFileError, UnsupportedModel
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.reports.paper.language import N_CTX, LanguageData

#: The most layers the companion's language page reads (the paper's zero-, one- and two-layer models).
MAX_LAYERS = 2


def unreadable(n_layers: int, mlp: bool) -> str | None:
    """Why the companion's language page cannot measure a model of ``n_layers`` layers, with or without
    ``mlp`` (``None``: it can)."""
    if mlp:
        return "MLPs"
    if n_layers > MAX_LAYERS:
        return f"{n_layers} layers"
    return None


def refusal(name: str, why: str, verify: str) -> str:
    """The one line that refuses ``name`` for ``why``, with what can still be built from it (``verify``: the
    ``tcircuits verify`` arguments that name the model).

    >>> print(refusal("gpt2 (Hugging Face)", "MLPs", "--hf gpt2"))  # doctest: +NORMALIZE_WHITESPACE
    gpt2 (Hugging Face) has MLPs: the companion measures the paper's findings on attention-only models of 0, 1 or 2
    layers; from this model you can still build the algebra (tcircuits derive, tcircuits expand) and the verification
    (tcircuits verify --hf gpt2)
    """
    return (f"{name} has {why}: the companion measures the paper's findings on attention-only models of 0, 1 or 2 "
            f"layers; from this model you can still build the algebra (tcircuits derive, tcircuits expand) and the "
            f"verification (tcircuits verify{' ' + verify if verify else ''})")


def check_readable(n_layers: int, mlp: bool, name: str, verify: str) -> None:
    """Refuse a model the language page cannot measure (:func:`unreadable`): one
    :class:`~numeric_check.errors.UnsupportedModel` line (:func:`refusal`)."""
    why = unreadable(n_layers, mlp)
    if why is not None:
        raise UnsupportedModel(refusal(name, why, verify))


def check_sizes(model: CircuitModel, name: str) -> None:
    """Refuse, before any work, a model whose language page cannot be measured: a context shorter than the page's
    windows of text, or (two layers) a term importance whose one sequence would hold more logits at once than
    :func:`~numeric_check.circuits.importance.logits_by_order` allows."""
    if model.cfg.n_ctx < N_CTX:
        raise UnsupportedModel(f"the companion measures on windows of {N_CTX} tokens of the text, and {name} reads at most "
                               f"{model.cfg.n_ctx}; give a model whose context holds {N_CTX} tokens")
    if model.arch.n_layers == 0 and model.cfg.d_vocab ** 2 > MAX_ELEMENTS:
        raise UnsupportedModel(f"the bigram table of {name} has {model.cfg.d_vocab ** 2:,} entries (a vocabulary of "
                               f"{model.cfg.d_vocab:,} squared), more than the {MAX_ELEMENTS:,} the companion holds")
    if model.arch.n_layers == 2:
        paths = count_paths(model.arch.heads_per_layer, 1)  # expanded to order 1, as language.importance does
        held = (paths + 1) * N_CTX * model.cfg.d_vocab  # one sequence: language.importance holds as many as fit
        if held > MAX_ELEMENTS:
            raise UnsupportedModel(f"term importance on {name} would hold {held:,} logits at once ({paths} paths × "
                                   f"{N_CTX} tokens × a vocabulary of {model.cfg.d_vocab:,}), more than the "
                                   f"{MAX_ELEMENTS:,} the companion holds; a smaller vocabulary or fewer heads fit")


def first_layer(model: CircuitModel) -> CircuitModel:
    """``model`` with every layer after its first removed: the same embedding, first layer, final norm and
    unembedding (the same tensors' values, its own copy), on the same device and in the same dtype.

    >>> import torch
    >>> from derivations.architecture import Architecture
    >>> m = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
    >>> one = first_layer(m)
    >>> one.arch.n_layers, bool(torch.equal(one.blocks[0].attn.W_Q, m.blocks[0].attn.W_Q))
    (1, True)
    """
    arch = model.arch
    per_layer = {k: v[:1] for k in ("n_kv_heads", "window") if isinstance(v := getattr(arch, k), tuple)}
    one = replace(model.cfg, arch=replace(arch, n_layers=1, n_heads=arch.heads_per_layer[:1], **per_layer))
    kept = CircuitModel(one, dtype=model.dtype, device=model.device)
    state = model.state_dict()
    kept.load_state_dict({k: state[k] for k in kept.state_dict()})
    return kept.eval()


@dataclass(frozen=True)
class LanguageModels:
    """What the language page measures when it is not the shipped models: ``models`` by number of layers (one
    model, yours), their training ``records``, the text ``data``, induction's ``control`` (a two-layer model's
    first layer alone, else ``None``), ``name``: the model in words, and ``checkpoint``: its file, where it is a
    tcircuits checkpoint (its training record and history sit beside it)."""

    models: dict[int, CircuitModel]
    records: dict[int, dict | None]
    data: LanguageData
    name: str
    control: CircuitModel | None = None
    checkpoint: str | None = None  # the tcircuits checkpoint, where it is one: its training history sits beside it

    def describe(self) -> str:
        """Which model and text the page measured, one sentence.

        >>> import torch
        >>> from derivations.architecture import Architecture
        >>> m = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
        >>> data = LanguageData(None, torch.arange(40), tuple("abcdefghij"), "notes.txt")
        >>> print(LanguageModels({1: m}, {1: None}, data, "m.safetensors").describe())  # doctest: +NORMALIZE_WHITESPACE
        m.safetensors (1 layer x 2 heads, no positional embedding, d_model 8, a vocabulary of 10 tokens), measured on
        notes.txt (40 tokens; the held-out part of its training text)
        """
        (model,) = self.models.values()
        kind = {"held-out": "the held-out part of its training text", "training": "its own training text"}.get(
            self.data.kind, "a text its training record does not name: trained on or not, unknown")
        return (f"{self.name} ({model.arch.describe()}, d_model {model.cfg.d_model}, a vocabulary of "
                f"{model.cfg.d_vocab:,} tokens), measured on {self.data.name} ({len(self.data.ids):,} tokens; {kind})")


def text_kind(text: str, record: dict | None) -> str:
    """What ``text`` is to a model whose training record is ``record``, from the SHA-256s it keeps: ``training``
    (the text it trained on), ``held-out`` (the part of it held out), else ``unknown`` (no record says).

    >>> from numeric_check.training.text import text_sha256
    >>> record = {"text": {"sha256": text_sha256("a\\nb\\n"), "heldout_sha256": text_sha256("b")}}
    >>> text_kind("a\\nb\\n", record), text_kind("b\\n", record), text_kind("c", record), text_kind("a", None)
    ('training', 'held-out', 'unknown', 'unknown')
    """
    from numeric_check.training.text import text_sha256

    recorded = (record or {}).get("text") if isinstance(record, dict) else None
    if not isinstance(recorded, dict):
        return "unknown"
    if text_sha256(text) == recorded.get("sha256"):
        return "training"
    if text_sha256(text.rstrip("\n")) == recorded.get("heldout_sha256"):
        return "held-out"
    return "unknown"


def text_data(tokenizer, text: str, name: str, d_vocab: int, kind: str = "unknown") -> LanguageData:
    """``text`` read by ``tokenizer`` (a Hugging Face ``tokenizers.Tokenizer``) for a model of ``d_vocab`` tokens:
    a text that gives an id outside the vocabulary, or too few tokens for one window, is one
    :class:`~numeric_check.errors.InputFileError` line naming it; ids the tokenizer has no string for show as ``<id>``."""
    data = LanguageData.from_text(tokenizer, text, name, kind)
    if len(data.ids) <= 2 * N_CTX:
        raise InputFileError(f"{name} is {len(data.ids):,} tokens; the companion measures on windows of {N_CTX} "
                             f"tokens and needs more than {2 * N_CTX:,}: give a longer text")
    if int(data.ids.max()) >= d_vocab:
        raise InputFileError(f"the tokenizer reads {name} as the id {int(data.ids.max())}, outside the model's "
                             f"vocabulary 0..{d_vocab - 1}: the tokenizer is not the model's")
    if len(data.strings) < d_vocab:
        data = replace(data, strings=data.strings + tuple(f"<{i}>" for i in range(len(data.strings), d_vocab)))
    return data


def language_models(model: CircuitModel, data: LanguageData, name: str, record: dict | None = None, *,
                    verify: str = "") -> LanguageModels:
    """The language page's inputs from one attention-only ``model`` of 0, 1 or 2 layers and a text (see the
    module's docstring); the model is refused in one line where the page cannot measure it (:func:`refusal`,
    ``verify`` naming it for ``tcircuits verify``)."""
    check_readable(model.arch.n_layers, model.arch.mlp, name, verify)
    check_sizes(model, name)
    n_layers = model.arch.n_layers
    control = first_layer(model) if n_layers == 2 else None
    return LanguageModels({n_layers: model}, {n_layers: record}, data, name, control)


#: Under the language page's tables when your model was measured (the shipped models' note says why theirs differ).
YOURS_DIFFERENT = ("The paper's numbers stand beside your model's; where they differ, look at how the two models differ "
                   "in width, vocabulary, data and training (tcircuits knows only the model and the text it was given).")


def yours_paragraph(described: str) -> str:
    """The language page's opening when it measured a model of one's own (``described``: :meth:`LanguageModels.describe`)."""
    return (f"This page measures the paper's findings on {described}, in place of the models trained here on the King "
            "James Bible, at the model's own layer count: a zero-layer model the bigram table, a one-layer model "
            "copying and the skip-trigram tables, a two-layer model term importance and induction. The controls are "
            "the same, except induction's: a two-layer model's control is the same model with its second layer removed "
            "(its learned first layer, on the same text), which has what induction needs but cannot form it. The later "
            "sections measure the same findings on the models trained here on planted data, as without your model.")
