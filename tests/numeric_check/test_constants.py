"""What verification keeps from a model's unembedding between calls (issue 17): kept while W_U and
b_U are unchanged, made again when they change, never kept above its size cap, and never a reason
for a different verdict or figure."""

from __future__ import annotations

import torch

import numeric_check.verification.constants as constants
from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.constants import UnembedConstants
from numeric_check.verification.verify import verify_logits

TOKENS = torch.tensor([[1, 2, 3, 1, 2], [4, 5, 6, 7, 0]])


def model():
    return CircuitModel.random(Architecture(2, 2, biases=True), d_model=8, d_head=4, d_vocab=12, n_ctx=6, seed=0,
                               dtype=torch.float64, device="cpu")


def counted(monkeypatch, cls) -> list:
    """The names of the constants ``cls`` (or a subclass) makes from now on, in order."""
    made, real = [], cls.get
    monkeypatch.setattr(cls, "get", lambda self, name, make: real(self, name, lambda: made.append(name) or make()))
    return made


def test_a_second_verification_reuses_the_unembedding_constants_and_reports_the_same(monkeypatch):
    m = model()
    made = counted(monkeypatch, UnembedConstants)
    first = verify_logits(m, TOKENS, exact_errors=False)
    n_first = len(made)
    second = verify_logits(m, TOKENS, exact_errors=False)
    assert n_first > 0 and len(made) == n_first  # nothing made again
    assert [t.norm for t in first.terms] == [t.norm for t in second.terms]
    assert first.scale == second.scale and first.passed and second.passed
    with torch.no_grad():
        m.W_U.mul_(2)  # written in place: a new version, made again
    third = verify_logits(m, TOKENS, exact_errors=False)
    assert len(made) == 2 * n_first and third.passed
    fresh = model()  # another model object with the same doubled W_U: nothing kept for it
    with torch.no_grad():
        fresh.W_U.mul_(2)
    alone = verify_logits(fresh, TOKENS, exact_errors=False)
    assert third.scale == alone.scale != first.scale
    assert [t.norm for t in third.terms] == [t.norm for t in alone.terms]


def test_another_dtype_or_a_new_W_U_is_another_entry():
    W = torch.randn(5, 3)
    a = UnembedConstants(W, None, torch.float64, "cpu").get("x", lambda: torch.ones(1))
    b = UnembedConstants(W, None, torch.float32, "cpu").get("x", lambda: torch.zeros(1))
    assert float(a) == 1 and float(b) == 0
    assert float(UnembedConstants(torch.randn(5, 3), None, torch.float32, "cpu").get("x", lambda: torch.full((1,), 7.0))) == 7


def test_constants_above_the_cap_are_not_kept(monkeypatch):
    monkeypatch.setattr(constants, "KEEP_BYTES", 16)
    W, made = torch.randn(5, 3), []
    for _ in range(2):
        UnembedConstants(W, None, torch.float64, "cpu").get("big", lambda: made.append(1) or torch.zeros(100))
    assert len(made) == 2


def test_an_entry_goes_with_its_W_U():
    W = torch.randn(5, 3)
    UnembedConstants(W, None, torch.float64, "cpu").get("x", lambda: torch.zeros(1))
    key = id(W)
    assert key in constants._STORE
    del W
    assert key not in constants._STORE


def test_what_the_weights_give_is_kept_and_made_again_when_any_weight_changes(monkeypatch):
    """Each layer's kernels and head maps (ModelConstants) are made once for a model, again after any of its
    weights is written in place, and a verification reports what a fresh model's first one does."""
    from numeric_check.verification.constants import ModelConstants

    def attn_model():
        return CircuitModel.random(Architecture(2, 8, layer_norm=True), d_model=64, d_head=4, d_vocab=12, n_ctx=6,
                                   seed=0, dtype=torch.float64, device="cpu")  # (the grouped engine's size: its kernels)

    m, made = attn_model(), counted(monkeypatch, ModelConstants)
    first = verify_logits(m, TOKENS, exact_errors=False)
    n_first = len(made)
    second = verify_logits(m, TOKENS, exact_errors=False)
    assert ("kernels", 1) in made and ("head map", 1) in made and len(made) == n_first  # nothing made again
    assert [(t.norm, t.error_bound) for t in first.terms] == [(t.norm, t.error_bound) for t in second.terms]
    with torch.no_grad():
        m.blocks[1].attn.W_O.mul_(2)  # not W_U: only the whole model's stamp sees it
    third = verify_logits(m, TOKENS, exact_errors=False)
    assert len(made) == 2 * n_first and third.passed
    fresh = attn_model()
    with torch.no_grad():
        fresh.blocks[1].attn.W_O.mul_(2)
    alone = verify_logits(fresh, TOKENS, exact_errors=False)
    assert [(t.norm, t.error_bound) for t in third.terms] == [(t.norm, t.error_bound) for t in alone.terms]
    assert [t.norm for t in third.terms] != [t.norm for t in first.terms]
