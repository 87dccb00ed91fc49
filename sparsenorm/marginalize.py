"""Exact expectation over a sparse support: ``E_{z~p}[f(x, z)] = Σ_z p(z|x) f(x, z)``, evaluating ``f``
only where ``p(z|x) != 0``.

This is what a sparse normalizer buys a latent-variable model (ev-softmax paper, Sec. 4.2, Table 2;
Correia et al. 2020): the expectation over a discrete latent is computed exactly, and the expensive
function (a decoder, a whole ELBO) runs once per (example, class) pair in the support instead of
once per pair in ``batch × classes``. :func:`marginalize` packs every such pair of the batch into
*one* call of ``fn`` (or a few, with ``max_batch``), so an example whose support is one class costs
one row, whatever the other examples of the batch do. (The authors' released code, sisl/EvSoftmax
``mnist_ssvae``, loops over classes and skips a class only when the *whole batch* gives it zero
mass, so it evaluates ``batch × (classes used by any example)`` rows.)

Which form of a normalizer to pair with it: the one whose zeros you want to skip, i.e. the
*evaluation* form (``registry.get(name).forward``; post-hoc evidential through
``probs_from_linear``). For ev-softmax that is Eq. 7 (exact zeros; its gradient is softmax's
restricted to the support, Eq. 9), while the labelled/classification term keeps its own training
loss (the NLL of Eq. 10, whose gradient tends to Eq. 12). A full-support form (softmax, Eq. 10)
works too, but evaluates every pair.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import torch
from torch import Tensor

from ._validation import check_floating, normalize_dim

__all__ = ["marginalize", "MarginalStats"]


@dataclass(frozen=True)
class MarginalStats:
    """What one :func:`marginalize` call evaluated."""

    rows: int
    """Rows of ``fn`` evaluated: the number of nonzero probabilities (the paper's "decoder calls", summed)."""
    calls: int
    """Invocations of ``fn``: 1, or ``ceil(rows / max_batch)`` with chunking."""
    support_size: Tensor
    """Nonzero probabilities per example, int64 of the batch shape (``probs``' shape without ``dim``)."""

    @property
    def examples(self) -> int:
        return self.support_size.numel()

    @property
    def rows_per_example(self) -> float:
        """``rows / examples`` (0.0 for an empty batch)."""
        return self.rows / self.examples if self.examples else 0.0


def marginalize(
    probs: Tensor,
    fn: Callable[[Tensor, Tensor], Tensor],
    *,
    dim: int = -1,
    return_stats: bool = False,
    max_batch: Optional[int] = None,
) -> Union[Tensor, Tuple[Tensor, MarginalStats]]:
    r"""``Σ_z probs[x, z] · fn(x, z)`` for every example ``x``, calling ``fn`` only where ``probs != 0``.

    .. math:: \mathbb{E}_{z \sim p(\cdot|x)}[f(x, z)] = \sum_{z:\, p(z|x) \neq 0} p(z|x)\, f(x, z)

    The (example, class) pairs with a nonzero probability are gathered, ``fn(example_index,
    class_index)`` is called **once** on the packed batch of all of them (int64 index tensors of
    equal length ``rows``; chunks of at most ``max_batch`` rows when it is given), and its rows
    are weighted by their probabilities and summed back per example.

    Args:
        probs: floating tensor of probabilities with the classes on ``dim`` (any other dims are
            the batch). Exactly-zero entries are skipped; every other entry is used as is, so
            the result equals the dense sum ``(probs * f).sum(dim)`` (negative or NaN entries
            included: a NaN probability gives NaN for its example, as the dense sum would).
        fn: ``fn(example_index, class_index) -> Tensor`` of shape ``(rows,)`` or ``(rows, ...)``.
            ``example_index`` indexes the batch flattened in row-major order (for a 2-D
            ``(N, K)`` batch with ``dim=-1`` it is the row); unflatten it with
            ``torch.unravel_index`` for more batch dims. Gradients flow through ``fn``.
        dim: the class dimension of ``probs``.
        return_stats: also return a :class:`MarginalStats` (rows evaluated, calls, support sizes).
        max_batch: evaluate at most this many rows per call of ``fn`` (for memory); None = all at once.

    Returns:
        The expectation, of shape ``batch_shape + fn's trailing shape`` and dtype
        ``torch.result_type`` of ``probs`` and ``fn``'s output; with ``return_stats``, the pair
        ``(expectation, stats)``.

    Gradients: to ``probs`` at its nonzero entries (``fn(x, z)``) and through ``fn`` (weighted by
    ``p``), exactly as the dense sum. At a zero entry the gradient is 0, not ``fn(x, z)`` (that
    row was never evaluated); through any normalizer whose zeros are locally constant (sparsemax,
    entmax, ev-softmax's Eq. 7, r-softmax, post-hoc evidential: the Jacobian row of an entry
    that stays 0 is 0) the gradient to the *logits* is therefore exactly the dense sum's.

    Edge cases: an example whose probabilities are all 0 (an empty or fully masked row) gets 0.
    If no entry of the whole batch is nonzero, ``fn`` is still called once with empty index
    tensors, to learn its output's trailing shape and dtype (``stats.rows == 0``).

    Host synchronisation: packing needs the number of nonzero entries on the host (one
    ``nonzero``), which is inherent to evaluating ``fn`` on a data-dependent number of rows; it
    is the one sync of this function. Summation uses ``index_add`` (on CUDA its float sums are
    not bitwise deterministic).
    """
    check_floating(probs, "probs")
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(example_index, class_index), got {type(fn).__name__}")
    if probs.dim() == 0:
        raise ValueError("probs must have at least one dimension (the classes on `dim`), got a 0-d tensor")
    dim = normalize_dim(probs, dim)
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ValueError(f"max_batch must be a positive int or None, got {max_batch!r}")

    rows_of = probs.movedim(dim, -1)
    batch_shape = rows_of.shape[:-1]
    flat = rows_of.reshape(math.prod(batch_shape), rows_of.shape[-1])  # -1 is ambiguous when K = 0
    support = flat != 0
    example_index, class_index = support.nonzero(as_tuple=True)  # the one host sync
    rows = example_index.numel()

    values = _evaluate(fn, example_index, class_index, max_batch)
    weights = flat[example_index, class_index]
    weights = weights.reshape((rows,) + (1,) * (values.dim() - 1))
    dtype = torch.result_type(weights, values)
    contributions = weights.to(dtype) * values.to(dtype)
    out = contributions.new_zeros((flat.shape[0],) + values.shape[1:])
    out = out.index_add(0, example_index, contributions)
    out = out.reshape(batch_shape + values.shape[1:])
    if not return_stats:
        return out
    calls = 1 if max_batch is None or rows == 0 else -(-rows // max_batch)
    stats = MarginalStats(rows=rows, calls=calls, support_size=support.sum(-1).reshape(batch_shape))
    return out, stats


def _evaluate(fn, example_index: Tensor, class_index: Tensor, max_batch: Optional[int]) -> Tensor:
    rows = example_index.numel()
    step = rows if max_batch is None or rows == 0 else max_batch
    starts = range(0, rows, step) if rows else [0]
    chunks: List[Tensor] = []
    for start in starts:
        ex, cls = example_index[start:start + step], class_index[start:start + step]
        value = fn(ex, cls)
        if not isinstance(value, Tensor):
            raise TypeError(f"fn must return a torch.Tensor, got {type(value).__name__}")
        if value.dim() == 0 or value.shape[0] != ex.numel():
            raise ValueError(
                f"fn must return one row per (example, class) pair: shape ({ex.numel()},) or ({ex.numel()}, ...), "
                f"got {tuple(value.shape)}"
            )
        if not (value.is_floating_point() or value.is_complex()):
            raise TypeError(f"fn must return a floating-point tensor, got dtype {value.dtype}")
        if value.device != example_index.device:
            raise ValueError(f"fn returned a tensor on {value.device}, but probs is on {example_index.device}")
        chunks.append(value)
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)
