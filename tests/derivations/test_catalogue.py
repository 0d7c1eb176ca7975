"""The catalogue: every entry verifies numerically, compiles with pdflatex, and agrees with
the path expansions of :mod:`derivations.paths` and :mod:`derivations.qk`."""

import re

import numpy as np
import pytest

from tensoralg import InvalidOrder, TensorSum, Term, atom, to_numpy

from derivations import catalogue
from derivations.architecture import Architecture
from derivations.numeric import Numeric, RandomBindings, instantiate
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms, UnknownDerivation
from derivations.paths import expand_logits
from derivations.qk import expand_qk
from tests.conftest import needs_pdflatex


VARIANTS = [(name, {}) for name in catalogue.names()] + [
    ("path-expansion", dict(layers=3, heads=2, concrete=True)),
    ("path-expansion", dict(layers=2, heads=(1, 3), concrete=True, max_order=1)),
    ("path-expansion", dict(layers=2, heads=2, positional="standard", layer_norm=True, biases=True, mlp=True)),
    ("path-expansion", dict(layers=0, heads=1)),
    ("one-layer", dict(heads=3, concrete=True)),
    ("two-layer-logits", dict(heads=3, concrete=True, layer_norm=True)),
    ("two-layer-qk", dict(heads=3, concrete=True)),
    ("two-layer-qk", dict(positional="qk_only", layer_norm=True)),
    ("two-layer-qk", dict(positional="standard", max_order=1)),
    ("qk-expansion", dict(layers=3, heads=2, positional="qk_only", layer_norm=True, concrete=True)),
    ("qk-expansion", dict(layers=3, layer=0, head=1)),
    ("virtual-weights", dict(layers=3, heads=2, concrete=True)),
    ("virtual-weights", dict(layers=1, heads=3)),
    ("multi-head", dict(heads=6)),
    ("bias-folding", dict(heads=4)),
]
IDS = [f"{name}{'-' + '-'.join(f'{k}={v}' for k, v in p.items()) if p else ''}" for name, p in VARIANTS]


def test_the_catalogue_lists_every_equation_of_the_issue():
    expected = {"zero-layer", "multi-head", "attention-head", "one-layer", "two-layer-logits", "two-layer-qk",
                "virtual-weights", "subspace-deletion", "layer-norm-folding", "bias-folding",
                "tensor-product-readings", "path-expansion", "qk-expansion", "eigenvalue-copying",
                "composition-scores", "induction-mechanism", "marginal-loss"}
    assert expected <= set(catalogue.names())
    for name, description in catalogue.descriptions().items():
        assert description and "\n" not in description and len(description) < 120, name


@pytest.mark.parametrize("name, params", VARIANTS, ids=IDS)
def test_every_line_of_every_entry_equals_its_first_numerically(name, params):
    d = catalogue.get(name, **params)
    for seed in (0, 1):
        report = d.verify(seed=seed)
        assert report.ok, (name, params, report.worst)
    assert all(len(c.steps) >= 1 for c in d.chains)


def test_rules_are_produced_by_the_algebra_not_typed():
    rules = {s.rule.key for name in catalogue.names() for s in catalogue.get(name).steps}
    assert {"distributivity", "mixed-product", "associativity", "fold", "unfold", "substitution", "orthonormality",
            "stochastic", "bilinear", "block", "transpose", "regroup"} <= rules


@needs_pdflatex
@pytest.mark.parametrize("name, params", VARIANTS, ids=IDS)
def test_every_entry_compiles_with_pdflatex_without_bad_overflow(name, params):
    from derivations.commands import compile_latex

    pdf, log = compile_latex(catalogue.get(name, **params).to_latex())
    assert pdf.startswith(b"%PDF")
    overfull = [float(x) for x in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert max(overfull, default=0) < 20, overfull


def test_markdown_and_text_are_sane_for_every_entry():
    for name in catalogue.names():
        d = catalogue.get(name)
        md, text = d.to_markdown(), d.to_text()
        assert md.startswith("# ") and md.count("$$") % 2 == 0 and md.count("$$") >= 2
        assert text.startswith(d.title) and "\\" not in text.replace("\\\\", ""), name
        for line in text.splitlines():
            if line.startswith(" ") and not line.lstrip().startswith("["):
                assert len(line) <= 110, (name, line)


# -- agreement with the path expansions ----------------------------------------------------


ARCHS = [Architecture(1, 3), Architecture(2, 2), Architecture(3, (1, 2, 2)),
         Architecture(2, 2, positional="standard", layer_norm=True, biases=True, mlp=True)]


@pytest.mark.parametrize("arch", ARCHS, ids=str)
@pytest.mark.parametrize("max_order", [None, 1])
def test_concrete_logits_equal_expand_logits_source_by_source(arch, max_order):
    d = catalogue.get("path-expansion", layers=arch.n_layers, heads=arch.n_heads, positional=arch.positional,
                      layer_norm=arch.layer_norm, biases=arch.biases, mlp=arch.mlp, concrete=True,
                      max_order=max_order)
    expansion = expand_logits(arch, max_order)
    assert len(d.chains) == len(expansion.sources)
    for chain, source in zip(d.chains, expansion.sources):
        assert chain.last.expand() == expansion.to_tensor_sum(source), source.label


def test_term_counts_are_one_plus_heads_to_the_layers():
    for layers, heads in [(1, 4), (2, 3), (3, 2)]:
        d = catalogue.get("path-expansion", layers=layers, heads=heads, concrete=True)
        assert len(d.chains[0].last) == (1 + heads) ** layers
        truncated = catalogue.get("path-expansion", layers=layers, heads=heads, concrete=True, max_order=1)
        assert len(truncated.chains[0].last) == 1 + layers * heads


@pytest.mark.parametrize("params", [dict(), dict(positional="qk_only", layer_norm=True), dict(max_order=1),
                                    dict(positional="standard")], ids=str)
def test_concrete_qk_equals_expand_qk_with_the_same_composition_tags(params):
    d = catalogue.get("two-layer-qk", heads=2, concrete=True, **params)
    arch = Architecture(2, 2, positional=params.get("positional", "none"), layer_norm=params.get("layer_norm", False))
    sums = expand_qk(arch, 1, 0, params.get("max_order")).to_tensor_sums()
    chains = d.chains[1:]
    assert {c.last for c in chains} == set(sums.values())
    token_tags = {t.composition for t in expand_qk(arch, 1, 0, params.get("max_order"))
                  if t.query.source.kind == t.key.source.kind == "token"}
    labels = {"direct": "direct", "Q": "Q-composition", "K": "K-composition", "QK": "QK-composition"}
    token_chain = next(c for c in chains if c.last == sums[("token", "token")])
    assert [label for label, _ in token_chain.steps[-1].groups] == [labels[t] for t in labels if t in token_tags]


def rename(expr: TensorSum, mapping) -> TensorSum:
    return TensorSum({tuple(tuple(a.with_index(mapping(a.index)) for a in w) for w in t.words): t.coeff for t in expr},
                     n_slots=expr.n_slots)


def concrete_index(index: str) -> str:
    m = re.fullmatch(r"[hqk](\d+)=(\d+)", index)
    return f"L{m[1]}H{m[2]}" if m else ("L1H0" if index == "h" else index)


@pytest.mark.parametrize("name, extra", [("two-layer-logits", {}), ("path-expansion", dict(layers=3)),
                                         ("two-layer-qk", {})])
def test_the_sigma_form_instantiated_is_the_concrete_form(name, extra):
    symbolic = catalogue.get(name, heads=2, **extra)
    concrete = catalogue.get(name, heads=2, concrete=True, **extra)
    for s_chain, c_chain in zip(symbolic.chains, concrete.chains):
        full = instantiate(s_chain.last, s_chain.sums, 2).expand()
        assert rename(full, concrete_index) == c_chain.last.expand()


def test_qk_terms_act_as_the_bilinear_form_of_the_model():
    """S = (x W_Qᵀ)(x W_Kᵀ)ᵀ/√d from a forward pass equals Σ c·P X M Xᵀ Qᵀ over the derived terms."""
    d = catalogue.get("two-layer-qk", heads=2, concrete=True)
    final = d.chains[-1].last
    bindings = RandomBindings(Numeric(), np.random.default_rng(3))
    n, vocab, dh = 4, 6, bindings.dims["d_head"]
    X = np.eye(vocab)[[1, 4, 1, 2]]  # one-hot tokens, one row per position
    value = lambda name, i="": bindings.bind(atom(name, i))
    x = X @ value("W_E").T
    x = x + sum(value("A", f"L0H{h}") @ x @ value("W_OV", f"L0H{h}").T for h in range(2))
    q, k = x @ value("W_Q", "L1H0").T, x @ value("W_K", "L1H0").T
    direct = q @ k.T / np.sqrt(dh)
    value("W_QK", "L1H0")  # bound from its definition, W_Qᵀ W_K
    derived = np.zeros((n, n))
    for t in final:
        P, Q, M = (to_numpy(TensorSum([Term(1, (w,))]), bindings.values, slot_sizes={0: n}) for w in t.words)
        derived += bindings.number(t.coeff).real * P @ X @ M @ X.T @ Q.T
    np.testing.assert_allclose(derived, direct, atol=1e-12)


def test_specific_entries_say_what_the_paper_says():
    assert str(catalogue.get("zero-layer").chains[0].last) == "Id ⊗ W_U W_E"
    heads = catalogue.get("multi-head", heads=3).chains[0].last
    assert str(heads) == "Id ⊗ W_O^{0} r^{0} + Id ⊗ W_O^{1} r^{1} + Id ⊗ W_O^{2} r^{2}"
    head, scores = catalogue.get("attention-head").chains
    assert str(head.last) == "A^{h} ⊗ W_OV^{h}" and str(scores.last) == "x W_QK^{h} xᵀ"
    one = catalogue.get("one-layer")
    assert str(one.chains[1].last) == "1/sqrt(d_head)·Id ⊗ Id ⊗ W_Eᵀ W_QK^{h} W_E"
    assert str(one.chains[2].first) == "W_U W_OV^{h} W_E"
    virtual = str(catalogue.get("two-layer-logits").chains[0].last)
    assert "A^{h1} A^{h0} ⊗ W_U W_OV^{h1} W_OV^{h0} W_E" in virtual
    qk = dict(catalogue.get("two-layer-qk").chains[-1].steps[-1].groups)
    assert list(qk) == ["direct", "Q-composition", "K-composition", "QK-composition"]
    assert str(qk["K-composition"]) == "1/sqrt(d_head)·Id ⊗ A^{k0} ⊗ W_Eᵀ W_QK^{h} W_OV^{k0} W_E"
    assert catalogue.get("subspace-deletion").chains[1].last.is_zero
    after = catalogue.get("subspace-deletion").chains[0].last
    assert len(after) == 2 and after.coeff(None, None) == 1 and sorted(map(str, after.as_dict().values())) == ["-1", "1"]
    assert str(catalogue.get("layer-norm-folding").chains[0].last) == "A^{h} N ⊗ W_OV'^{h}"
    assert str(catalogue.get("layer-norm-folding").chains[1].last) == "1 ⊗ W_OV^{h} b_LN"
    assert str(catalogue.get("bias-folding").chains[0].last) == "1 ⊗ b_O'"
    assert len(catalogue.get("virtual-weights", layers=2, heads=3, concrete=True).chains[0].last) == 16
    assert all(str(c.last) == "A^{h} ⊗ W" for c in catalogue.get("tensor-product-readings").chains)


# -- bad requests -------------------------------------------------------------------------------


def test_unknown_names_list_the_known_ones_and_suggest_close_matches():
    with pytest.raises(UnknownDerivation, match="did you mean 'two-layer-qk'") as info:
        catalogue.get("two-layer-qq")
    assert "zero-layer" in str(info.value)
    with pytest.raises(UnknownDerivation, match="Known: zero-layer"):
        catalogue.get("nothing-like-it")


@pytest.mark.parametrize("name, params, error, message", [
    ("zero-layer", dict(heads=2), DerivationError, "does not take heads; it takes: no parameters"),
    ("path-expansion", dict(layers=-1), ArchitectureError, "n_layers must be >= 0"),
    ("path-expansion", dict(heads=0), ArchitectureError, "at least one head"),
    ("path-expansion", dict(positional="rotary"), ArchitectureError, "expected one of 'none', 'standard'"),
    ("path-expansion", dict(concrete="yes"), DerivationError, "concrete must be True or False"),
    ("path-expansion", dict(max_order=3), InvalidOrder, r"in 0\.\.2 \(the deepest term of the logits of a 2-layer model "),
    ("path-expansion", dict(max_order=-1), InvalidOrder, r"max_order must be None \(every term\) or an integer in 0\.\.2"),
    ("multi-head", dict(heads=0), DerivationError, "heads must be an integer >= 1"),
    ("two-layer-qk", dict(max_order=3), InvalidOrder, r"the deepest term of the scores of a head with 1 layer before it"),
    ("qk-expansion", dict(layer=2), ArchitectureError, "layer 2 does not exist"),
    ("qk-expansion", dict(head=5), ArchitectureError, "head 5 does not exist"),
    ("qk-expansion", dict(layers=0), DerivationError, "no attention scores"),
    ("virtual-weights", dict(layers=0), DerivationError, "layers must be an integer >= 1"),
])
def test_bad_parameters_raise_clear_errors(name, params, error, message):
    with pytest.raises(error, match=message):
        catalogue.get(name, **params)


def test_oversize_requests_are_refused_with_a_max_order_that_fits():
    with pytest.raises(TooManyTerms, match=r"max_order=1 \(--max-order 1: 145 terms\)"):
        catalogue.get("path-expansion", layers=12, heads=12, concrete=True)
    assert len(catalogue.get("path-expansion", layers=12, heads=12, concrete=True, max_order=1).chains[0].last) == 145
    with pytest.raises(TooManyTerms, match="max_order=2"):
        catalogue.get("qk-expansion", layers=5, heads=12, concrete=True)
    with pytest.raises(TooManyTerms, match=r"8,192 terms.*max_order=6 \(--max-order 6: 4,096 terms\)"):
        catalogue.get("path-expansion", layers=13, heads=1)
    assert len(catalogue.get("path-expansion", layers=3, heads=12, concrete=True).chains[0].last) == 2197


@pytest.mark.parametrize("name, primed", [("layer-norm-folding", "W_{OV'}"), ("bias-folding", "b_{O'}")])
def test_a_folded_name_is_printed_one_way_in_its_definition_and_its_lines(name, primed):
    """Issue 19: the definition read ``W_{OV}'`` (W'_OV) and the lines ``W_{OV'}``."""
    latex = catalogue.get(name).to_latex()
    assert latex.count(primed) >= 2  # the definition and the line it folds into
    assert "_{OV}'" not in latex and "_{O}'" not in latex


def test_the_stream_x_holds_one_row_per_position_on_every_page():
    """Issue 19: one page said ``(A ⊗ W)·x = A x Wᵀ`` (rows) and ``P xᵀ M x Qᵀ`` (columns); the
    attention head's scores were ``xᵀ W_QK x``. x has one meaning: one row per position."""
    from derivations.cli import DESCRIPTION

    for name in catalogue.names():
        text = " ".join(catalogue.get(name).to_text().split())
        assert "column per position" not in text, name
        for columns in ("xᵀ M x", "xᵀ W_QK", "xᵀ W_Q^{h}ᵀ"):
            assert columns not in text, (name, columns)
    assert "A x Wᵀ" in " ".join(catalogue.get("qk-expansion").to_text().split())
    assert "P x M xᵀ Qᵀ" in " ".join(catalogue.get("qk-expansion").to_text().split())
    assert "column per position" not in DESCRIPTION


def test_S_means_the_scores_in_every_entry_and_notebook():
    """Issue 19: rotary called its quarter-turn blocks S^f and notebook 03 the shift matrix S,
    while every page says "one meaning of S everywhere: the scores"."""
    import json
    from pathlib import Path

    for name in catalogue.names():
        d = catalogue.get(name)
        atoms = {a.name for chain in d.chains for step in chain.steps for t in step.expr.expand()
                 for w in t.words for a in w}
        assert "S" not in atoms, name
        assert not re.search(r"\bS\^\{?f", d.to_text()), name
    assert "J^{f}" in catalogue.get("rotary").to_latex()
    for path in sorted(Path(__file__).resolve().parents[2].glob("tutorials/*.ipynb")):
        source = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        assert not re.search(r"^\s*S\s*=", source, re.M) and "matrix $S$" not in source, path.name


def test_formulae_side_by_side_in_prose_share_one_dollar_pair():
    """``$W_{OV}^{h}$$ := $$W_O W_V$`` read as display maths (``$$``) in TeX and Pandoc."""
    for name in catalogue.names():
        d = catalogue.get(name)
        for text in (d.to_markdown(), d.to_latex()):
            glued = [line for line in text.splitlines() if "$$" in line and line.strip() != "$$"]
            assert not glued, (name, glued[:2])
