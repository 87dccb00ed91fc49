"""``sparse_attention``: scaled dot-product attention with any sparsenorm normalizer in place of softmax.

This layer validates arguments, resolves the normalizer once, turns masks into ``(keep, bias,
key_lengths)`` (:mod:`.masks`) and calls :func:`sparsenorm.kernels.attention.dispatch.run_attention_kernel`,
which picks the kernel; it never looks at the device or at a normalizer's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .. import registry
from .._validation import check_attention_batch, check_floating, check_param, value_checks_enabled
from ..kernels.attention.call import AttentionCall
from ..kernels.attention.dispatch import BACKENDS, check_backend, run_attention_kernel
from . import stats
from .masks import split_mask

__all__ = ["sparse_attention", "resolve_normalizer", "ResolvedNormalizer", "sparse_attention_from_parts", "BACKENDS",
           "CAUSAL_ALIGNMENTS"]

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
"""Valid values of ``causal_alignment``: SDPA's ``is_causal`` (query ``i`` sees keys ``j <= i``) and
FlashAttention's (>= 2.1; the last query sees the last key: ``j <= i + S - L``)."""


@dataclass(frozen=True)
class ResolvedNormalizer:
    """A normalizer as attention uses it: ``fn(scores, dim=-1)``, and its registry entry (None for
    a callable), whose capabilities say which memory-efficient kernels apply."""

    fn: Callable[..., Tensor]
    entry: Optional[registry.Normalizer] = None

    @property
    def attention_threshold(self) -> Optional[str]:
        return None if self.entry is None else self.entry.attention_threshold

    @property
    def name(self) -> Optional[str]:
        """The registry name (None for a callable): the CUDA record is kept per name."""
        return None if self.entry is None else self.entry.name

    @property
    def alpha(self) -> Optional[float]:
        return None if self.entry is None else self.entry.alpha


def resolve_normalizer(normalizer: Union[str, Callable, ResolvedNormalizer], params: dict,
                       training: bool = False) -> ResolvedNormalizer:
    """The normalizer for a registry name or a callable, in the form of mode ``training``.

    A name gives the registry entry's evaluation form (``Normalizer.forward``) through
    :meth:`~sparsenorm.registry.Normalizer.for_mode`: ``posthoc_evidential`` is softmax in
    training and ev-softmax otherwise (Theorem 3.1 with the keys as the linear layer).
    ev-softmax's Jacobian (Eq. 9) trains it directly, so Eq. 10's eps is not used here.
    ``params`` rebind the entry's parameters (or are passed to a callable).
    """
    if isinstance(normalizer, ResolvedNormalizer):
        return normalizer
    if callable(normalizer):
        return ResolvedNormalizer(partial(normalizer, **params) if params else normalizer)
    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer must be a registry name or a callable, got {type(normalizer).__name__}")
    entry = registry.get(normalizer)
    form = entry.for_mode(training)
    if form is not entry and params:
        raise ValueError(f"normalizer {normalizer!r} takes no parameters, got {sorted(params)}")
    form = registry.get(form.name, **params) if params else form
    return ResolvedNormalizer(form.forward, form)


def _check_inputs(query: Tensor, key: Tensor, value: Tensor, dropout_p: float, scale) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_floating(t, name)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., length, features), "
                             f"got shape {tuple(t.shape)}")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"query and key must have the same last dimension, got {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length (dim -2), got {key.shape[-2]} and {value.shape[-2]}")
    check_attention_batch(query, key, value)
    if not (key.dtype == value.dtype == query.dtype):
        raise TypeError(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.dim() >= 3:
        for name, t in (("key", key), ("value", value)):
            hq, hk = query.shape[-3], t.shape[-3] if t.dim() >= 3 else 1
            if hk not in (hq, 1) and hq % hk:
                raise ValueError(f"{name} has {hk} heads (dim -3), which does not divide query's {hq} heads")
    check_param(dropout_p, "dropout_p", low=0.0, high=1.0, high_inclusive=False)
    if scale is not None:
        check_param(scale, "scale")


def broadcast_shapes(*shapes) -> Tuple[int, ...]:
    """``torch.broadcast_shapes`` of plain shapes in a few Python steps (torch's goes through its
    symbolic-shape reference, tens of microseconds a call: a share of a decoding step's attention);
    torch's itself under ``torch.compile``. Raises ``RuntimeError`` where they do not broadcast."""
    if torch.compiler.is_compiling():
        return tuple(torch.broadcast_shapes(*shapes))
    ndim = max(len(shape) for shape in shapes)
    out = [1] * ndim
    for shape in shapes:
        for i, d in enumerate(shape, ndim - len(shape)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    raise RuntimeError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[i] = d
    return tuple(out)


def _scores_shape(query: Tensor, key: Tensor) -> Tuple[int, ...]:
    """(..., Hq, L, S): the leading dims of query and key broadcast (GQA heads count as Hq)."""
    k_lead = key.shape[:-2]
    if query.dim() >= 3 and key.dim() >= 3 and k_lead[-1] != query.shape[-3]:
        k_lead = k_lead[:-1] + (query.shape[-3],)
    try:
        lead = broadcast_shapes(query.shape[:-2], k_lead)
    except RuntimeError:
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} have leading dims that do not "
                         "broadcast") from None
    return tuple(lead) + (query.shape[-2], key.shape[-2])


def _check_mask(m: Optional[Tensor], scores_shape: Tuple[int, ...], device: torch.device, name: str) -> None:
    if m is None:
        return
    try:
        ok = broadcast_shapes(m.shape, scores_shape) == tuple(scores_shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(m.shape)} does not broadcast to the attention scores' shape "
                         f"{tuple(scores_shape)}")
    if m.device != device:
        raise ValueError(f"{name} is on {m.device} but query is on {device}")


def check_lengths(lengths: Optional[Tensor], scores_shape: Tuple[int, ...], device: torch.device,
                  name: str = "key_lengths") -> None:
    """``key_lengths`` / ``query_lengths``: an integer tensor of shape (batch,), batch = the scores'
    first dim, on the query's device, values in ``[0, S]`` (``[0, L]`` for queries; values are
    read in eager mode on CPU only)."""
    if lengths is None:
        return
    if not isinstance(lengths, Tensor):
        raise TypeError(f"{name} must be an integer tensor of shape (batch,), got {type(lengths).__name__}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {lengths.dtype}")
    if len(scores_shape) < 3:
        raise ValueError(f"{name} needs a batch dimension: query of at least 3 dims (batch, ..., L, E)")
    if tuple(lengths.shape) != (scores_shape[0],):
        raise ValueError(f"{name} must have shape ({scores_shape[0]},) (one length per batch element), "
                         f"got {tuple(lengths.shape)}")
    if lengths.device != device:
        raise ValueError(f"{name} is on {lengths.device} but query is on {device}")
    bound = scores_shape[-1] if name == "key_lengths" else scores_shape[-2]
    if value_checks_enabled(lengths) and lengths.numel():
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > bound:
            what = "keys" if name == "key_lengths" else "queries"
            raise ValueError(f"{name} must lie in [0, {bound}] (the number of {what}), got values in [{lo}, {hi}]")


def sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    normalizer: Union[str, Callable] = "ev_softmax",
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    return_weights: bool = False,
    *,
    key_lengths: Optional[Tensor] = None,
    query_lengths: Optional[Tensor] = None,
    backend: str = "auto",
    stats_module: Optional[nn.Module] = None,
    causal_alignment: str = "top_left",
    **params,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Scaled dot-product attention ``normalizer(q k^T * scale + mask) v``.

    Shapes, broadcasting, ``scale`` and masks follow ``F.scaled_dot_product_attention``: ``query``
    (..., Hq, L, E), ``key`` (..., Hk, S, E), ``value`` (..., Hk, S, Ev) -> (..., Hq, L, Ev);
    leading dims broadcast; ``scale`` defaults to ``1/sqrt(E)``. Grouped-query attention: when
    ``Hk`` divides ``Hq``, key/value head ``h`` serves query heads ``h*Hq/Hk ... (h+1)*Hq/Hk - 1``
    (SDPA's ``enable_gqa``, here automatic).

    ``attn_mask`` (broadcastable to (..., L, S)): boolean, True = attend; or float, added to the
    scores, where ``-inf`` and values at or below ``finfo(dtype).min / 2`` mean "not there" (a NaN
    entry makes its row NaN, as in SDPA; eager CPU calls refuse it). ``key_lengths`` (batch,)
    integer, batch = the first dim of the scores: keys ``j >= key_lengths[b]`` are not there
    (padding without a boolean matrix; 0 <= length <= S). ``query_lengths`` (batch,) likewise for
    the queries: rows ``i >= query_lengths[b]`` of the output (and weights) are exactly zero, with
    zero gradient. ``is_causal``: query ``i`` sees keys
    ``j <= i`` (top-left, as SDPA); unlike SDPA it may be combined with ``attn_mask`` and
    ``key_lengths``. ``causal_alignment="bottom_right"`` aligns the last query with the last key
    instead (query ``i`` sees keys ``j <= i + S - L``, as FlashAttention >= 2.1 and
    ``torch.nn.attention.bias.causal_lower_right``): chunked prefill and decoding with a key/value
    cache, where the L queries are the last L positions of the S keys; every kernel takes it.
    Not-there keys get exactly zero weight for every normalizer and are left out of its threshold
    (ev-softmax's mean is over the valid keys only, so padding does not change a sequence's
    weights). A query with no valid key gives a zero output row and zero gradient.

    ``normalizer``: a name from :mod:`sparsenorm.registry` (its evaluation form,
    ``Normalizer.for_mode(False)``; ``**params`` rebind its parameters, e.g. ``alpha=1.3``,
    ``r=0.5``) or a callable ``fn(scores, dim=-1)`` (``**params`` passed to it). ``dropout_p``
    drops weights as SDPA does (always, when > 0).

    ``backend``: ``"auto"`` (default) takes a memory-efficient kernel of the normalizer's
    registry capability where one applies -- for ev-softmax (threshold known before the pass) the
    Triton flash kernel on CUDA (boolean key-padding masks and ``key_lengths`` only), else the
    exact blockwise kernel (O(L) extra memory) once ``L * S`` reaches
    :data:`sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES` -- and the dense path
    otherwise, which builds the L x S weights. ``"dense"``, ``"blockwise"``, ``"triton"``,
    ``"flex"`` ask for one (``ValueError`` where it has no kernel for the normalizer or does not
    apply; the memory-efficient ones return no weights, apply no dropout and do not
    differentiate a float mask). See :mod:`sparsenorm.kernels.attention.dispatch`.

    ``stats_module``: the module this call's attended-key counts are filed under while a
    :func:`sparsenorm.attention.record` block is open (default: ``"sparse_attention"``).

    Returns the output, or ``(output, weights)`` with ``return_weights`` (weights (..., Hq, L, S),
    after dropout, as ``nn.MultiheadAttention`` returns them).
    """
    _check_inputs(query, key, value, dropout_p, scale)
    check_backend(backend)
    resolved = resolve_normalizer(normalizer, params)
    keep, bias = split_mask(attn_mask)
    return sparse_attention_from_parts(resolved, query, key, value, keep, bias, key_lengths=key_lengths,
                                       query_lengths=query_lengths, is_causal=is_causal, dropout_p=dropout_p,
                                       scale=scale, return_weights=return_weights, backend=backend,
                                       stats_module=stats_module, causal_alignment=causal_alignment)


def sparse_attention_from_parts(
    normalizer: ResolvedNormalizer, query: Tensor, key: Tensor, value: Tensor, keep: Optional[Tensor],
    bias: Optional[Tensor], *, key_lengths: Optional[Tensor] = None, query_lengths: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0, scale: Optional[float] = None, return_weights: bool = False, backend: str = "auto",
    stats_module: Optional[nn.Module] = None, causal_alignment: str = "top_left",
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """:func:`sparse_attention` with a resolved normalizer and the mask already split into a
    boolean ``keep`` and a finite ``bias`` (:func:`sparsenorm.attention.masks.split_mask`);
    query/key/value already checked. The entry point of the modules and :mod:`sparsenorm.hf`."""
    scores_shape = _scores_shape(query, key)
    _check_mask(keep, scores_shape, query.device, "attn_mask")
    _check_mask(bias, scores_shape, query.device, "attn_mask")
    check_lengths(key_lengths, scores_shape, query.device, "key_lengths")
    check_lengths(query_lengths, scores_shape, query.device, "query_lengths")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {causal_alignment!r}")
    offset = scores_shape[-1] - scores_shape[-2] if causal_alignment == "bottom_right" else 0
    recording = stats.recording()
    call = AttentionCall(
        query, key, value, keep, bias, key_lengths, bool(is_causal),
        query.shape[-1] ** -0.5 if scale is None else float(scale), scores_shape,
        alpha=normalizer.alpha, count_support=recording, query_lengths=query_lengths, causal_offset=offset,
    )
    out, weights, support, valid = run_attention_kernel(normalizer.fn, normalizer.attention_threshold, call, dropout_p,
                                                        return_weights, backend, name=normalizer.name)
    if recording:
        stats.observe(support, valid, stats_module)
    out = out.to(query.dtype)
    return (out, weights.to(query.dtype)) if return_weights else out

