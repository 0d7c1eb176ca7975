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


def test_windows_caps_and_alibi_are_validated_and_described():
    arch = Architecture(3, 2, window=(4, None, 2), alibi=True, attn_softcap=50, logit_softcap=30.0)
    assert [arch.window_of(l) for l in range(3)] == [4, None, 2]
    assert "windows 4/global/2, ALiBi" in arch.describe() and "logits soft-capped at 30 (expanded before the cap)" in arch.describe()
    for options, message in [({"window": 0}, "window must be an int >= 1"), ({"window": (2,)}, "1 windows for 3 layers"),
                             ({"attn_softcap": 0}, "attn_softcap must be a finite number > 0"),
                             ({"logit_softcap": float("inf")}, "logit_softcap"), ({"alibi": 1}, "alibi must be True or False")]:
        with pytest.raises(ArchitectureError, match=message):
            Architecture(3, 2, **options)


def test_alibi_adds_one_term_and_windows_and_caps_none():
    plain = expand_qk(Architecture(2, 2), 1, 0)
    with_alibi = expand_qk(Architecture(2, 2, alibi=True), 1, 0)
    assert len(with_alibi) == len(list(with_alibi)) == len(plain) + 1
    alibi = [t for t in with_alibi if t.query.source.kind == "alibi"]
    assert len(alibi) == 1 and alibi[0].composition == "direct" and alibi[0].term.coeff == 1
    assert with_alibi.to_tensor_sum(query="token", key="token") == plain.to_tensor_sum()
    for options in ({"window": 2}, {"attn_softcap": 5.0, "logit_softcap": 3.0}):
        assert expand_qk(Architecture(2, 2, **options), 1, 0).to_tensor_sum() == plain.to_tensor_sum()


@pytest.mark.parametrize("name", ["qk-norm", "post-norm", "alibi", "soft-caps"])
def test_the_decoder_pages_verify(name):
    from derivations.catalogue import get

    assert get(name, heads=2).verify().ok
