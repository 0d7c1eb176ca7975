"""The options of today's models in the algebra: RMSNorm, grouped-query attention, parallel
blocks and rotary. Each checked against a numpy forward pass with frozen patterns and
scales (written directly, never through the algebra), and each bad combination refused
with what was wrong."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import atom
from tensoralg.expr import TensorSum
from tensoralg.rotary import expand_rotary, is_rotary, rotary_atom, rotary_bindings, rotary_dims, rotary_scores

from derivations.architecture import Architecture, head_label
from derivations.errors import ArchitectureError, TooManyTerms
from derivations.paths import (
    Source,
    estimate_mlp_input_terms,
    expand_logits,
    expand_mlp_input,
    head_factors,
    mlp_input_terms,
    unfold_heads,
    weight_factors,
)
from derivations.qk import expand_qk
from tests.conftest import PROPERTY
from tests.derivations.numpy_model import NumpyModel
from tests.tensoralg.test_rotary import hf_rotary


@st.composite
def variants(draw, max_layers: int = 2):
    """``(arch, layer, head, d_head)``: a small architecture with any of the new options."""
    n_layers = draw(st.integers(1, max_layers))
    groups = draw(st.lists(st.sampled_from([1, 2]), min_size=n_layers, max_size=n_layers))
    per_group = draw(st.lists(st.sampled_from([1, 2]), min_size=n_layers, max_size=n_layers))
    heads = tuple(g * p for g, p in zip(groups, per_group))
    mlp = draw(st.booleans())
    d_head = draw(st.sampled_from([4, 6]))
    rotary = draw(st.none() | st.sampled_from([f for f in (1 / 3, 1 / 2, 2 / 3, 1.0)
                                                if _even(d_head, f)]))
    arch = Architecture(
        n_layers, heads, positional=draw(st.sampled_from(["none", "standard", "qk_only"])),
        norm=draw(st.sampled_from(["none", "layer_norm", "rms_norm"])), biases=draw(st.booleans()), mlp=mlp,
        n_kv_heads=tuple(groups), parallel=mlp and draw(st.booleans()), rotary=rotary,
        rotary_style=draw(st.sampled_from(["neox", "gptj"])),
    )
    layer = draw(st.integers(0, n_layers - 1))
    return arch, layer, draw(st.integers(0, heads[layer] - 1)), d_head


def _even(d_head: int, fraction: float) -> bool:
    rot = int(d_head * fraction)
    return rot >= 2 and rot % 2 == 0


class VariantModel(NumpyModel):
    """:class:`NumpyModel` with shared key/value heads, the MLP reading its stream (sequential
    or parallel, behind its own norm scale) and rotary queries and keys (Hugging Face's
    convention, from :func:`tests.tensoralg.test_rotary.hf_rotary`)."""

    def __init__(self, arch: Architecture, seed: int = 0, d_head: int = 4, n_ctx: int = 4):
        super().__init__(arch, seed, n_ctx=n_ctx, d_head=d_head)
        b, rng = self.bindings, np.random.default_rng(seed + 1)
        for layer, head in arch.heads():
            i, g = head_label(layer, head), arch.kv_label(layer, head)
            if g != i:  # the group's factors, named once; W_QK and W_OV read them
                for name, shape in (("W_K", (d_head, 5)), ("W_V", (d_head, 5)), ("b_K", (d_head, 1))):
                    b.setdefault(f"{name}^{{{g}}}", rng.normal(size=shape))
                    b.pop(f"{name}^{{{i}}}", None)
            b[f"W_OV^{{{i}}}"] = b[f"W_O^{{{i}}}"] @ b[f"W_V^{{{g}}}"]
            b[f"W_QK^{{{i}}}"] = b[f"W_Q^{{{i}}}"].T @ b[f"W_K^{{{g}}}"]
        for layer in range(arch.n_layers):
            b[f"N^{{L{layer}mlp}}"] = np.diag(rng.uniform(0.5, 2.0, size=n_ctx))
        self.rot = None if arch.rotary is None else rotary_dims(d_head, arch.rotary)
        if self.rot:
            b.update(rotary_bindings(np.arange(n_ctx), d_head, self.rot, arch.rotary_style))

    def value_input(self, x, layer):
        return self.bindings[f"N^{{L{layer}}}"] @ x if self.arch.normalised else x

    def attention_out(self, x, layer):
        b = self.bindings
        v = self.value_input(x, layer)
        out = sum(b[f"A^{{{head_label(layer, h)}}}"] @ v @ b[f"W_OV^{{{head_label(layer, h)}}}"].T
                  for h in range(self.arch.heads_per_layer[layer]))
        return out + self.ones @ b[f"b_O^{{L{layer}}}"].T if self.arch.biases else out

    def mlp_input(self, layer):
        x = self.resid_pre(layer)
        if not self.arch.parallel:
            x = x + self.attention_out(x, layer)
        scale = f"N^{{L{layer}}}" if self.arch.parallel else f"N^{{L{layer}mlp}}"
        return self.bindings[scale] @ x if self.arch.normalised else x

    def logits(self):
        b = self.bindings
        x = self.resid_pre(self.arch.n_layers)
        if self.arch.normalised:
            x = b["N^{final}"] @ x
        out = x @ b["W_U"].T
        return out + self.ones @ b["b_U"].T if self.arch.biases else out

    def scores(self, layer, head):
        b, arch, i, g = self.bindings, self.arch, head_label(layer, head), self.arch.kv_label(layer, head)
        qk_in = self.value_input(self.resid_pre(layer), layer)
        if arch.positional == "qk_only":
            qk_in = qk_in + b["W_pos"].T
        q, k = qk_in @ b[f"W_Q^{{{i}}}"].T, qk_in @ b[f"W_K^{{{g}}}"].T
        if arch.biases:
            q, k = q + self.ones @ b[f"b_Q^{{{i}}}"].T, k + self.ones @ b[f"b_K^{{{g}}}"].T
        if self.rot:
            positions = np.arange(self.n_ctx)
            q, k = hf_rotary(q, positions, self.rot, arch.rotary_style), hf_rotary(k, positions, self.rot, arch.rotary_style)
        return q @ k.T / np.sqrt(self.d_head)

    def score_term(self, t) -> np.ndarray:
        """One QK term's scores; a rotary term evaluated factored (rotate, then multiply)."""
        P, Q, M = t.term.words
        Xq, Xk = self.input(t.query.source), self.input(t.key.source)
        at = [n for n, a in enumerate(M) if is_rotary(a)]
        if not at:
            return self.coeff(t.term.coeff) * self.word(P, self.n_ctx) @ Xq @ self.word(M, 0) @ Xk.T @ self.word(Q, self.n_ctx).T
        left, right = M[: at[0]], M[at[0] + 1:]
        q = self.word(P, self.n_ctx) @ Xq @ self.word(left, 0)
        k = self.word(Q, self.n_ctx) @ Xk @ self.word(right, 0).T
        return self.coeff(t.term.coeff) * rotary_scores(q, k, self.rot, self.arch.rotary_style)


# -- the forward pass, term by term --------------------------------------------------------


@PROPERTY
@given(variants(), st.integers(0, 2**16))
def test_logits_are_the_sum_of_their_paths(case, seed):
    arch, _, _, d_head = case
    model = VariantModel(arch, seed, d_head)
    total = sum(model.coeff(t.term.coeff) * model.word(t.term.words[0], model.n_ctx) @ model.input(t.source)
                @ model.word(t.term.words[1], 0).T for t in expand_logits(arch))
    np.testing.assert_allclose(total, model.logits(), rtol=1e-9, atol=1e-9)


@PROPERTY
@given(variants(), st.integers(0, 2**16))
def test_scores_are_the_sum_of_their_terms(case, seed):
    arch, layer, head, d_head = case
    model = VariantModel(arch, seed, d_head)
    expansion = expand_qk(arch, layer, head)
    total = sum(model.score_term(t) for t in expansion)
    np.testing.assert_allclose(total, model.scores(layer, head), rtol=1e-9, atol=1e-9)


@PROPERTY
@given(variants().filter(lambda c: c[0].mlp), st.integers(0, 2**16))
def test_mlp_input_is_the_sum_of_its_paths(case, seed):
    arch, layer, _, d_head = case
    model = VariantModel(arch, seed, d_head)
    terms = expand_mlp_input(arch, layer)
    assert len(terms) == estimate_mlp_input_terms(arch, layer)
    total = sum(model.word(t.term.words[0], model.n_ctx) @ model.input(t.source) @ model.word(t.term.words[1], 5).T
                for t in terms)  # an MLP source's residual word may be Id (d_model = 5)
    np.testing.assert_allclose(total, model.mlp_input(layer), rtol=1e-9, atol=1e-9)
    own_heads = [t for t in terms if any(l == layer for l, _ in t.heads)]
    assert bool(own_heads) == (not arch.parallel)


# -- rotary: one operator per head ---------------------------------------------------------


@PROPERTY
@given(variants().filter(lambda c: c[0].rotary is not None), st.integers(0, 2**16))
def test_rotary_terms_hold_one_operator_and_write_out_to_the_same_scores(case, seed):
    arch, layer, head, d_head = case
    model = VariantModel(arch, seed, d_head)
    plain = expand_qk(replace(arch, rotary=None), layer, head)
    expansion = expand_qk(arch, layer, head)
    assert len(expansion) == len(plain)  # no d_head-fold blow-up of the terms
    R = [a for t in expansion for a in t.term.words[2] if is_rotary(a)]
    assert len(R) == len(expansion) and {a.index for a in R} == {head_label(layer, head)}
    assert not any(a.name == "W_QK" for t in expansion for a in t.term.words[2])
    # written out through R's diagonal factors and blocks, the same numbers
    rot = rotary_dims(d_head, arch.rotary)
    for t in list(expansion)[:6]:
        written = expand_rotary(TensorSum([t.term]), rot // 2, rot < d_head)
        assert len(written) == 4 * (rot // 2) + (rot < d_head)
        Xq, Xk = model.input(t.query.source), model.input(t.key.source)
        value = sum(model.coeff(w.coeff) * model.word(w.words[0], model.n_ctx) @ Xq @ model.word(w.words[2], 0) @ Xk.T
                    @ model.word(w.words[1], model.n_ctx).T for w in written)
        np.testing.assert_allclose(value, model.score_term(t), rtol=1e-9, atol=1e-9)


def test_rotary_leaves_the_logits_expansion_alone():
    arch = Architecture(2, 2, norm="rms_norm", mlp=True, rotary=0.5)
    assert list(expand_logits(arch)) == list(expand_logits(replace(arch, rotary=None)))


def test_a_rotary_term_with_biases_rotates_the_biases_too():
    arch = Architecture(1, 2, biases=True, rotary=1.0, n_kv_heads=1)
    words = {t.label: t.term.words[2] for t in expand_qk(arch, 0, 1)}
    R, K = rotary_atom("L0H1"), atom("W_K", "L0KV0")
    assert [repr(a) for a in words["q: b_Q^L0H1 (direct) | k: tok (direct)"]] == ["b_Q^{L0H1}ᵀ", "R^{L0H1}", "W_K^{L0KV0}", "W_E"]
    assert words["q: b_Q^L0H1 (direct) | k: b_K^L0H1 (direct)"][1:] == (R, atom("b_K", "L0KV0"))
    assert K in words["q: tok (direct) | k: tok (direct)"]


# -- norms, groups, parallel blocks ----------------------------------------------------------


def test_rms_norm_expands_as_layer_norm_does():
    """Both are a frozen per-position scale ``N`` in the algebra; they differ in the weights."""
    ln, rms = Architecture(2, 2, norm="layer_norm", mlp=True), Architecture(2, 2, norm="rms_norm", mlp=True)
    assert ln == Architecture(2, 2, layer_norm=True, mlp=True) and ln != rms
    assert list(expand_logits(ln)) == list(expand_logits(rms))
    assert list(expand_qk(ln, 1, 0)) == list(expand_qk(rms, 1, 0))
    assert rms.normalised and not rms.layer_norm and "RMSNorm" in rms.describe()


@PROPERTY
@given(variants())
def test_shared_factors_are_named_once(case):
    arch = case[0]
    factors = weight_factors(arch)
    assert len(factors) == len(set(factors)) == sum(2 * h + 2 * g for h, g in zip(arch.heads_per_layer, arch.kv_heads_per_layer))
    unfolded = unfold_heads(expand_logits(arch, max_order=1).to_tensor_sum("tok"), arch)
    values = {a.base for t in unfolded for w in t.words for a in w if a.name == "W_V"}
    assert values == {a for a in factors if a.name == "W_V"}
    for layer, head in arch.heads():  # Hugging Face's repeat_kv: query head h reads key/value head h // n_rep
        n_rep = arch.heads_per_layer[layer] // arch.kv_heads_per_layer[layer]
        kv = np.repeat(np.arange(arch.kv_heads_per_layer[layer]), n_rep)
        assert arch.kv_head(layer, head) == kv[head]
        assert head_factors(arch, layer, head)["W_QK"][1] in factors


def test_parallel_blocks_change_the_mlp_input_not_the_logits():
    sequential = Architecture(3, 2, mlp=True, biases=True)
    parallel = replace(sequential, parallel=True)
    assert list(expand_logits(sequential)) == list(expand_logits(parallel))
    # the parallel MLP of layer 1 reads the stream entering layer 1: tok (1 + 2), b_O^L0 (1), mlp^L0 (1)
    assert [estimate_mlp_input_terms(parallel, l) for l in range(3)] == [1, 5, 17]
    # the sequential one reads it after its own heads and b_O^L1: tok 9, b_O^L0 3, mlp^L0 3, b_O^L1 1
    assert [estimate_mlp_input_terms(sequential, l) for l in range(3)] == [4, 16, 52]
    labels = [t.label for t in mlp_input_terms(parallel, 1)]
    assert labels == ["tok (direct)", "tok→L0H0", "tok→L0H1", "b_O^L0 (direct)", "mlp^L0 (direct)"]
    assert Source("mlp", 1) not in {t.source for t in mlp_input_terms(sequential, 1)}


def test_the_mlp_input_is_refused_when_too_large_or_absent():
    with pytest.raises(TooManyTerms, match=r"has 399 terms, more than limit=50; pass max_order=1 \(keeps 39 terms\)"):
        expand_mlp_input(Architecture(3, 6, mlp=True), 2, limit=50)
    with pytest.raises(ArchitectureError, match="the model has no MLPs, so layer 0 has no MLP input; pass mlp=True"):
        expand_mlp_input(Architecture(1, 1), 0)
    with pytest.raises(ArchitectureError, match="layer 3 does not exist"):
        expand_mlp_input(Architecture(1, 1, mlp=True), 3)


def test_describe_names_every_option():
    arch = Architecture(2, (4, 8), n_kv_heads=(2, 4), norm="rms_norm", mlp=True, parallel=True, rotary=0.25,
                        rotary_style="gptj")
    assert arch.describe() == ("2 layers x heads 4/8, no positional embedding, RMSNorm, MLPs, key/value heads 2/4, "
                               "parallel attention and MLP, rotary on 25% of the head dimensions (gptj pairing)")
    assert arch.kv_label(1, 7) == "L1KV3" and Architecture(1, 2).kv_label(0, 1) == "L0H1"


@pytest.mark.parametrize("options, message", [
    ({"norm": "batch_norm"}, "unknown norm 'batch_norm'; expected one of 'none', 'layer_norm', 'rms_norm'"),
    ({"norm": "rms_norm", "layer_norm": True}, "layer_norm=True contradicts norm='rms_norm'"),
    ({"n_kv_heads": 3}, "layer 0 has 4 query heads and 3 key/value heads; grouped-query attention needs the query "
                        "heads to split evenly"),
    ({"n_kv_heads": 0}, "layer 0 must have at least one key/value head"),
    ({"n_kv_heads": (2,)}, "n_kv_heads gives 1 counts for 2 layers"),
    ({"n_kv_heads": True}, "n_kv_heads must be an int or one int per layer, got True"),
    ({"parallel": True}, "parallel=True means attention and MLP read the same stream, but the model has no MLPs"),
    ({"parallel": 1, "mlp": True}, "parallel must be True or False, got 1"),
    ({"rotary": 0}, r"rotary is the fraction of the head dimensions rotated by position, a number in \(0, 1\]"),
    ({"rotary": 1.5}, r"a number in \(0, 1\] \(or None for no rotary\), got 1.5"),
    ({"rotary": True}, "got True"),
    ({"rotary": 0.5, "rotary_style": "llama"}, "unknown rotary_style 'llama'; expected one of 'neox', 'gptj'"),
])
def test_bad_combinations_say_what_was_wrong(options, message):
    with pytest.raises(ArchitectureError, match=message):
        Architecture(2, 4, **options)
