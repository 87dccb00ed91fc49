"""Attended keys per query (support size), collected from any model while a ``record()`` is open.

    with sparsenorm.attention.record(model) as stats:
        model(batch)
    stats.summary()   # per layer and head: queries, mean support, mean valid keys, histogram

Every attention call in sparsenorm (:func:`sparse_attention`, :class:`MultiheadAttention`, the
Hugging Face functions of :mod:`sparsenorm.hf`) reports the number of keys with nonzero weight for
each query, counted over valid (not masked) keys; query rows with no valid key are left out.
Only per-head counts and histograms are kept (on the CPU), never the weight tensors.
Layers are named by the module path inside ``model`` when one is given to :func:`record`, else
by the attention module's class and order of first appearance; plain functional calls are
``"sparse_attention"`` unless they pass ``stats_module=`` (the module to file them under).

The attention module is handed to :func:`observe` explicitly (no context variable), so the
attention path traces under ``torch.compile(fullgraph=True)``: outside a :func:`record` block
nothing is counted and the compiled graph has no trace of statistics. Counting itself is
host-side bookkeeping (a histogram on the CPU): inside a :func:`record` block a compiled model
counts through a graph break (``torch.compile`` without ``fullgraph``).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

import torch
from torch import Tensor, nn

_ACTIVE: List["AttentionStats"] = []


@dataclass
class LayerStats:
    """Counts for one attention layer, one entry per head."""

    queries: Tensor  # (H,) number of query rows with at least one valid key
    support_sum: Tensor  # (H,) total attended keys
    valid_sum: Tensor  # (H,) total valid keys
    histogram: Tensor  # (H, max support + 1): histogram[h, n] = queries of head h attending n keys

    @property
    def mean_support(self) -> Tensor:
        """Mean attended keys per query, per head."""
        return self.support_sum / self.queries.clamp_min(1)

    @property
    def mean_valid(self) -> Tensor:
        """Mean valid (unmasked) keys per query, per head."""
        return self.valid_sum / self.queries.clamp_min(1)

    def add(self, other: "LayerStats") -> None:
        if other.queries.shape != self.queries.shape:
            raise ValueError("the same layer was called with different numbers of heads")
        self.queries += other.queries
        self.support_sum += other.support_sum
        self.valid_sum += other.valid_sum
        width = max(self.histogram.shape[1], other.histogram.shape[1])
        self.histogram = _pad(self.histogram, width) + _pad(other.histogram, width)


def _pad(hist: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(hist, (0, width - hist.shape[1]))


@dataclass(eq=False)  # identity: nested blocks are told apart (field equality would compare tensors)
class AttentionStats:
    """What one :func:`record` collected: ``layers[name]`` is a :class:`LayerStats`."""

    layers: Dict[str, LayerStats] = field(default_factory=dict)
    _names: Dict[int, str] = field(default_factory=dict, repr=False)
    _ordinal: Dict[str, int] = field(default_factory=dict, repr=False)

    def name_of(self, module: Optional[nn.Module]) -> str:
        if module is None:
            return "sparse_attention"
        key = id(module)
        if key not in self._names:
            cls = type(module).__name__
            n = self._ordinal.get(cls, 0)
            self._ordinal[cls] = n + 1
            self._names[key] = f"{cls}#{n}"
        return self._names[key]

    def mean_support(self) -> float:
        """Mean attended keys per query over all layers and heads."""
        q = sum(float(s.queries.sum()) for s in self.layers.values())
        return sum(float(s.support_sum.sum()) for s in self.layers.values()) / max(q, 1.0)

    def summary(self) -> List[dict]:
        """One row per layer and head: queries, mean support, mean valid keys, support fraction."""
        rows = []
        for name, s in self.layers.items():
            for h in range(s.queries.shape[0]):
                q = max(int(s.queries[h]), 1)
                rows.append({
                    "layer": name, "head": h, "queries": int(s.queries[h]),
                    "mean_support": float(s.support_sum[h]) / q,
                    "mean_valid": float(s.valid_sum[h]) / q,
                    "support_fraction": float(s.support_sum[h]) / max(float(s.valid_sum[h]), 1.0),
                })
        return rows


@contextmanager
def record(model: Optional[nn.Module] = None) -> Iterator[AttentionStats]:
    """Collect attended-key statistics of every sparsenorm attention call inside the block.

    With ``model``, layers are named by their path in ``model.named_modules()``.
    """
    stats = AttentionStats()
    if model is not None:
        stats._names = {id(m): (name or type(m).__name__) for name, m in model.named_modules()}
    _ACTIVE.append(stats)
    try:
        yield stats
    finally:
        _ACTIVE.remove(stats)


def recording() -> bool:
    """Whether a :func:`record` block is open (attention calls then count their support)."""
    return bool(_ACTIVE)


@torch.compiler.disable
def observe(support: Tensor, valid: Tensor, module: Optional[nn.Module] = None) -> None:
    """Report support sizes ``(..., H, L)`` and valid-key counts of the same shape (integers) of
    one call of the attention module ``module`` (None: a plain functional call).

    Heads are dim -2 (a tensor ``(L,)`` counts as one head); rows with ``valid == 0`` are skipped.
    """
    if not _ACTIVE:
        return
    support = support.detach()
    valid = valid.detach().expand_as(support)
    if support.dim() == 1:
        support, valid = support.unsqueeze(0), valid.unsqueeze(0)
    heads = support.shape[-2]
    support = support.transpose(0, -2).reshape(heads, -1).to("cpu", torch.long)
    valid = valid.transpose(0, -2).reshape(heads, -1).to("cpu", torch.long)
    present = valid > 0
    support = support * present
    width = int(support.max()) + 1 if support.numel() else 1
    hist = torch.bincount((torch.arange(heads).unsqueeze(1) * width + support)[present], minlength=heads * width)
    layer = LayerStats(
        queries=present.sum(1), support_sum=support.sum(1), valid_sum=(valid * present).sum(1),
        histogram=hist.reshape(heads, width),
    )
    for stats in _ACTIVE:
        name = stats.name_of(module)
        if name in stats.layers:
            stats.layers[name].add(layer)
        else:
            stats.layers[name] = LayerStats(layer.queries.clone(), layer.support_sum.clone(),
                                            layer.valid_sum.clone(), layer.histogram.clone())
