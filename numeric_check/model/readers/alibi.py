"""BLOOM and MPT: attention with ALiBi position biases, which the algebra does not express yet.

Both are registered so that a model of either is refused for what it uses — ALiBi, named in
one place (:mod:`~numeric_check.model.readers.pending`) — rather than as an unknown family; their
weights are not read until ALiBi lands (one more position-only term of each head's scores).
"""

from __future__ import annotations

from typing import Any

from numeric_check.model.build import SourceWeights, unsupported
from numeric_check.model.readers import pending
from numeric_check.model.readers.common import Family


def read_bloom(model: Any) -> SourceWeights:
    pending.refuse("the BLOOM model", ("alibi", "every BLOOM layer"))
    raise AssertionError("unreachable")  # pragma: no cover


def read_mpt(model: Any) -> SourceWeights:
    if model.config.attn_config.alibi:
        pending.refuse("the MPT model", ("alibi", "attn_config.alibi=True"))
    raise unsupported("attention without ALiBi (attn_config.alibi=False): tcircuits reads MPT only as far as its "
                      "ALiBi", "the MPT model")


_BLOOM = frozenset({"hidden_size", "n_layer", "n_head", "layer_norm_epsilon", "apply_residual_connection_post_layernorm",
                    "pretraining_tp", "slow_but_exact"})
_MPT = frozenset({"d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "attn_config", "layer_norm_epsilon",
                  "learned_pos_emb", "no_bias", "norm_type", "emb_pdrop", "logit_scale", "embedding_fraction", "init_device"})

FAMILIES = (
    Family("BLOOM", ("BloomForCausalLM",), read_bloom, _BLOOM, converts=False),
    Family("MPT", ("MptForCausalLM",), read_mpt, _MPT, converts=False),
)
