"""Sparse attention: every sparsenorm normalizer in place of softmax in scaled dot-product attention.

* :func:`sparse_attention` -- ``F.scaled_dot_product_attention`` with ``normalizer=``,
  ``key_lengths=`` and ``backend=``.
* :class:`MultiheadAttention` -- a drop-in for ``torch.nn.MultiheadAttention`` with ``normalizer=``.
* :func:`record` -- attended keys per query (support size), per layer and head, from any model.
* :func:`ev_softmax_attention_blockwise` -- exact ev-softmax attention without the L x S matrix
  (the registered op of :mod:`sparsenorm.kernels.ops.evidential_attention`; chosen automatically).
* :func:`plan` -- which backend ``backend="auto"`` runs for given shapes, and why (no tensors, no GPU).
* :mod:`.masks` -- the "not there" rule for attention masks.
"""
from ..kernels.attention.dispatch import BACKENDS
from ..kernels.auto_plan import BLOCKWISE_MIN_SCORES, AttentionPlan
from ..kernels.ops.evidential_attention import ev_softmax_attention_blockwise
from .functional import sparse_attention
from .masks import split_mask
from .planning import plan
from .modules import MultiheadAttention
from .stats import AttentionStats, LayerStats, record

__all__ = [
    "sparse_attention", "MultiheadAttention", "record", "AttentionStats", "LayerStats",
    "ev_softmax_attention_blockwise", "split_mask", "BLOCKWISE_MIN_SCORES", "BACKENDS", "plan", "AttentionPlan",
]
