"""The architecture options of today's decoders (issue 18): validated, described, refused by name
where they cannot combine, and their terms in the QK and logits expansions."""

from __future__ import annotations

import pytest

from derivations import Architecture
from derivations.errors import ArchitectureError
from derivations.qk import estimate_qk_terms, expand_qk


def test_qk_norm_is_described_and_validated():
    assert "q/k RMSNorm per head" in Architecture(1, 2, qk_norm="rms_norm").describe()
    assert "q/k layer norm over all heads" in Architecture(1, 2, qk_norm="layer_norm", qk_norm_scope="all").describe()
    with pytest.raises(ArchitectureError, match="unknown qk_norm 'l2'"):
        Architecture(1, 2, qk_norm="l2")
    with pytest.raises(ArchitectureError, match="qk_norm_scope='all' but qk_norm is None"):
        Architecture(1, 2, qk_norm_scope="all")


def test_qk_norm_puts_a_scale_on_each_side_and_a_layer_norm_adds_its_bias():
    arch = Architecture(2, 2, n_kv_heads=1, qk_norm="layer_norm")
    terms = list(expand_qk(arch, 1, 1))
    direct = terms[0].term.words
    assert [a.label for a in direct[0]] == ["N^{L1H1,q}"] and [a.label for a in direct[1]] == ["N^{L1KV0,k}"]
    labels = {t.query.source.label for t in terms} | {t.key.source.label for t in terms}
    assert {"b_Qn^L1H1", "b_Kn^L1H1"} <= labels
    # the norm's bias has no scale in front; each side gains one source
    bias_side = next(t for t in terms if t.key.source.kind == "key_norm_bias")
    assert bias_side.term.words[1] == ()
    assert estimate_qk_terms(arch, 1, 1) == (3 + 1) ** 2 == len(terms)
    over_all = expand_qk(Architecture(2, 2, qk_norm="rms_norm", qk_norm_scope="all"), 1, 0)
    assert [a.label for a in list(over_all)[0].term.words[0]] == ["N^{L1,q}"]


def test_norms_after_a_sublayer_are_scales_on_every_head_and_on_b_O():
    from derivations.paths import expand_logits

    arch = Architecture(2, 1, norm="rms_norm", sublayer_norm="post", biases=True)
    assert "norms after each sublayer (not before)" in arch.describe()
    assert not arch.pre_norm and arch.post_norm
    words = {t.label: [a.label for a in t.term.words[0]] for t in expand_logits(arch)}
    assert words["tok→L0H0→L1H0"] == ["N^{final}", "N^{L1,post}", "A^{L1H0}", "N^{L0,post}", "A^{L0H0}"]
    assert words["b_O^L0 (direct)"] == ["N^{final}", "N^{L0,post}"]
    both = Architecture(1, 1, norm="rms_norm", sublayer_norm="both")
    assert [a.label for a in list(expand_logits(both))[1].term.words[0]] == ["N^{final}", "N^{L0,post}", "A^{L0H0}", "N^{L0}"]


@pytest.mark.parametrize("options, message", [
    ({"sublayer_norm": "post"}, "norm is 'none'"),
    ({"sublayer_norm": "both", "norm": "layer_norm"}, "pass norm='rms_norm'"),
    ({"sublayer_norm": "post", "norm": "rms_norm", "mlp": True, "parallel": True}, "parallel"),
    ({"sublayer_norm": "sandwich"}, "unknown sublayer_norm 'sandwich'"),
])
def test_norms_after_a_sublayer_are_refused_by_name_where_they_cannot_combine(options, message):
    with pytest.raises(ArchitectureError, match=message):
        Architecture(1, 1, **options)
