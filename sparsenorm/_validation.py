"""The one entry path of every normalizer, and every argument check.

Every public function goes through :func:`run_on_rows`: check ``x`` -> normalize ``dim`` -> upcast
(float16/bfloat16 are computed in float32; an op whose kernel takes them does that inside) -> apply
the "not there" rule and ``mask`` -> call the
algorithm on rows along the LAST dimension -> move the dimension back and cast to the input dtype.
Bad input fails here with a message that names the argument, never deep inside a kernel.

"Not there" (the same rule everywhere in sparsenorm): an entry is not there when it is ``-inf``,
when ``mask`` is False there (True = keep), or when it is at or below ``finfo(dtype).min / 2``
(an additive mask such as Hugging Face's ``torch.finfo(dtype).min``), with ``dtype`` the input's
dtype. Such entries get exactly zero probability (log-probability ``-inf``) and a zero gradient,
and are left out of every statistic of the row (ev-softmax's mean, sparsehourglass's sum, the
r-softmax quantile). A row with no entry that is there gives zeros.

Value checks of tensor arguments (a NaN ``r``, an out-of-range class index) read the tensor on
the host; they run in eager mode on CPU only, so that no public function synchronises with an
accelerator or breaks ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Union

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)

Number = Union[float, int, Tensor]


# ---------------------------------------------------------------------------------------- "not there"
def not_there_level(dtype: torch.dtype) -> float:
    """Entries at or below this value (``finfo(dtype).min / 2``) are "not there"."""
    return torch.finfo(dtype).min / 2


def is_there(x: Tensor, source_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Boolean tensor, False where ``x`` is at or below ``finfo(source_dtype or x.dtype).min / 2``
    (``-inf`` included). NaN counts as there, so it reaches its row's output."""
    return ~(x <= not_there_level(source_dtype or x.dtype))


def compute_dtype(x: Tensor) -> torch.dtype:
    """float16 and bfloat16 are computed in float32 (then cast back); other dtypes as they are."""
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


def check_mask(mask: Tensor, x: Tensor, name: str = "mask") -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a boolean tensor (True = keep), got {got}")
    try:
        ok = torch.broadcast_shapes(mask.shape, x.shape) == x.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the input's shape {tuple(x.shape)}"
        )
    if mask.device != x.device:
        raise ValueError(f"{name} is on {mask.device} but the input is on {x.device}")


def mark_not_there(x: Tensor, mask: Optional[Tensor] = None, source_dtype: Optional[torch.dtype] = None,
                   name: str = "mask") -> Tensor:
    """``x`` (upcast to its compute dtype) with every entry that is not there set to ``-inf``.

    ``source_dtype`` is the dtype whose ``finfo.min / 2`` applies (default: ``x.dtype``). NaN
    stays NaN. Masked entries are filled (not multiplied), so their gradient is exactly 0.
    """
    source_dtype = source_dtype or x.dtype
    if mask is not None:
        check_mask(mask, x, name)
    z = x.to(compute_dtype(x))
    drop = ~is_there(z, source_dtype)
    if mask is not None:
        drop = drop | ~mask
    return z.masked_fill(drop, -math.inf)


# ---------------------------------------------------------------------------------------- checks
def check_floating(x: Tensor, name: str = "X") -> None:
    """Raise ``TypeError`` unless ``x`` is a floating-point tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def normalize_dim(x: Tensor, dim: int, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative index, raising ``IndexError`` naming ``dim`` if out of range."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"{name}={dim} is out of range for a tensor with {x.dim()} dimensions")
    return dim % ndim


def value_checks_enabled(t: Tensor) -> bool:
    """Whether checks that read tensor values on the host may run: eager mode, CPU tensors."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def check_param(
    value: Number,
    name: str,
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ``ValueError`` naming ``name`` if ``value`` (number or tensor) leaves the given range.

    NaN and infinite parameters are rejected too: a NaN ``t`` or ``r`` is a bug in the caller, not
    data, and no parameter has a usable infinite value (``t = inf``, ``q = inf`` or an infinite
    attention ``scale`` gave NaN, ``alpha = inf`` the uniform distribution instead of its limit).
    Tensor values are checked where :func:`value_checks_enabled` allows it.
    """
    if isinstance(value, Tensor):
        if not value.is_floating_point():
            value = value.to(torch.get_default_dtype())
        if value.numel() == 0 or not value_checks_enabled(value):
            return
        v = value.detach()
        # One reduction reads all it needs (each host read is a device synchronisation on a GPU): a NaN makes
        # both extremes NaN, and an infinity is one of them.
        vmin, vmax = (float(extreme) for extreme in torch.aminmax(v))
        if vmin != vmin or vmax != vmax:
            raise ValueError(f"{name} contains NaN")
        if math.isinf(vmin) or math.isinf(vmax):
            raise ValueError(f"{name} must be finite, got {float(v[torch.isinf(v)][0])}")
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
        if value != value:
            raise ValueError(f"{name} is NaN")
        if math.isinf(value):
            raise ValueError(f"{name} must be finite, got {value}")
        vmin = vmax = float(value)
    if low is not None and (vmin < low or (not low_inclusive and vmin == low)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"{name} must be {op} {low}, got {vmin}")
    if high is not None and (vmax > high or (not high_inclusive and vmax == high)):
        op = "<=" if high_inclusive else "<"
        raise ValueError(f"{name} must be {op} {high}, got {vmax}")


def check_eps(eps: float) -> None:
    """ev-softmax's ``eps``: a finite Python number >= 0."""
    if isinstance(eps, Tensor):
        raise TypeError("eps must be a Python number, not a tensor")
    check_param(eps, "eps", low=0.0)


def check_k(k: Optional[int]) -> None:
    """The entmax package's partial-sort hint: None or an int >= 1."""
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be a positive int or None, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1 (or None for a full sort), got {k}")


def check_n_iter(n_iter: int) -> None:
    if isinstance(n_iter, bool) or not isinstance(n_iter, int):
        raise TypeError(f"n_iter must be a positive int, got {type(n_iter).__name__}")
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")


# ---------------------------------------------------------------------------------------- attention
def check_attention_batch(query: Tensor, key: Tensor, value: Tensor) -> None:
    """``query`` (..., Hq, L, E), ``key`` (..., Hk, S, E), ``value`` (..., Hk, S, Ev): the batch
    dimensions (all but the last three) must broadcast, as in ``F.scaled_dot_product_attention``."""
    batch = [tuple(t.shape[:-3]) for t in (query, key, value)]
    try:
        torch.broadcast_shapes(*batch)
    except RuntimeError:
        raise ValueError(
            f"query, key and value batch dimensions (all but the last 3: heads, length, features) must "
            f"broadcast, got {batch[0]}, {batch[1]} and {batch[2]}"
        ) from None


def check_multihead_inputs(query: Tensor, key: Tensor, value: Tensor, *, embed_dim: int, kdim: int, vdim: int,
                           num_heads: int, batch_first: bool, key_padding_mask: Optional[Tensor],
                           attn_mask: Optional[Tensor]) -> None:
    """The shapes ``torch.nn.MultiheadAttention.forward`` accepts, checked before any projection:
    ``query`` (L, E) unbatched or (L, N, E) ((N, L, E) with ``batch_first``), ``key``/``value`` the
    same with length S and features ``kdim``/``vdim``, ``key_padding_mask`` (N, S) ((S,)
    unbatched), ``attn_mask`` (L, S) or (N * num_heads, L, S)."""
    for name, t, features in (("query", query, embed_dim), ("key", key, kdim), ("value", value, vdim)):
        check_floating(t, name)
        if t.dim() not in (2, 3):
            raise ValueError(f"{name} must be 2-D (unbatched) or 3-D (batched), got shape {tuple(t.shape)}")
        if t.dim() != query.dim():
            raise ValueError(f"query, key and value must all be batched or all unbatched, got shapes "
                             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        if t.shape[-1] != features:
            raise ValueError(f"{name} must have {features} features (last dim), got shape {tuple(t.shape)}")
    seq_axis = 1 if (batch_first and query.dim() == 3) else 0
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"key and value must have the same length and batch, got shapes {tuple(key.shape)} "
                         f"and {tuple(value.shape)}")
    if query.dim() == 3 and query.shape[1 - seq_axis] != key.shape[1 - seq_axis]:
        raise ValueError(f"query and key must have the same batch size, got shapes {tuple(query.shape)} and "
                         f"{tuple(key.shape)}")
    L, S = query.shape[seq_axis], key.shape[seq_axis]
    if key_padding_mask is not None:
        expected = (query.shape[1 - seq_axis], S) if query.dim() == 3 else (S,)
        if tuple(key_padding_mask.shape) != expected:
            raise ValueError(f"key_padding_mask must have shape {expected} (batch, key length), got "
                             f"{tuple(key_padding_mask.shape)}")
    if attn_mask is not None:
        batched = query.shape[1 - seq_axis] * num_heads if query.dim() == 3 else num_heads
        allowed = [(L, S), (batched, L, S)]
        if tuple(attn_mask.shape) not in allowed:
            raise ValueError(f"attn_mask must have shape {' or '.join(map(str, allowed))}, "
                             f"got {tuple(attn_mask.shape)}")


# ---------------------------------------------------------------------------------------- entry path
def row_param(value: Number, x: Tensor, dim: int, name: str) -> Union[float, Tensor]:
    """A per-row parameter of ``x`` (normalized over ``dim``) in the layout of ``x.movedim(dim, -1)``.

    Accepted: a number (returned as a float), a 0-d tensor, one value per row (``x``'s shape
    without ``dim``) or a tensor broadcastable to ``x`` with size 1 along ``dim``. Tensors come
    back with shape ``x.shape[:dim] + x.shape[dim+1:] + (1,)`` (expanded, differentiable).
    """
    if not isinstance(value, Tensor):
        return float(value)
    row_shape = tuple(x.shape[:dim]) + tuple(x.shape[dim + 1:])
    v = value
    if v.dim() > 0 and tuple(v.shape) == row_shape and v.dim() == x.dim() - 1:
        v = v.unsqueeze(dim)
    keep_shape = list(x.shape)
    keep_shape[dim] = 1
    try:
        if v.dim() > x.dim():
            raise RuntimeError
        v = v.reshape((1,) * (x.dim() - v.dim()) + tuple(v.shape)).expand(keep_shape)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(value.shape)} must be a number, a 0-d tensor, one value per row "
            f"(shape {row_shape}) or broadcastable to {tuple(keep_shape)} (size 1 along dim)"
        ) from None
    v = v if dim == x.dim() - 1 else v.movedim(dim, -1)
    return v.to(device=x.device, dtype=compute_dtype(x))


def per_row_tensor(rows: Tensor, value: Union[float, Tensor]) -> Tensor:
    """A per-row parameter from :func:`row_param` as a tensor of shape ``rows.shape[:-1] + (1,)``
    (a number filled in, a tensor expanded), the form the registered operators take."""
    if isinstance(value, Tensor):
        return value.expand(rows.shape[:-1] + (1,))
    return torch.full(rows.shape[:-1] + (1,), value, dtype=rows.dtype, device=rows.device)


def _treats_not_there(fn, params: Optional[Dict[str, Number]]) -> bool:
    """Whether op ``fn`` reads the entries at or below ``finfo.min / 2`` as not there itself (its
    ``treats_not_there``: a bool, or a function of the call's ``params``), so that the entry path
    need not mark them (a pass, a masked_fill and its backward)."""
    treats = getattr(fn, "treats_not_there", False)
    return bool(treats(params or {}) if callable(treats) else treats)


@torch._dynamo.assume_constant_result
def _takes_low_precision(fn, device_type: str, dtype: torch.dtype, row_len: int) -> bool:
    """Whether op ``fn`` takes 16-bit rows as they are here (it reads the kernel choice: constant for
    ``torch.compile``)."""
    takes = getattr(fn, "takes_low_precision", None)
    return bool(takes is not None and takes(device_type, dtype, row_len))


def run_on_rows(
    fn: Callable[..., Tensor],
    x: Tensor,
    dim: int,
    mask: Optional[Tensor] = None,
    *args,
    params: Optional[Dict[str, Number]] = None,
    name: str = "x",
    marks_not_there: Optional[bool] = None,
) -> Tensor:
    """The one entry path: ``fn(rows, *params.values(), *args)`` with the normalized dim last.

    ``fn`` receives a tensor of rows along its last dimension in the compute dtype, in which
    every entry that is not there is ``-inf`` -- unless the op treats the entries ``<= finfo.min / 2``
    itself (its ``treats_not_there``; ``marks_not_there`` overrides it): then only ``mask`` and the
    low-precision upcast are applied, which saves a pass -- and the per-row ``params`` (see
    :func:`row_param`). An op that takes float16/bfloat16 rows itself (its
    ``takes_low_precision(device_type, dtype, row_len)`` says so: ev-softmax's Triton kernel, which
    accumulates in float32 inside) gets them as they are, with ``mask`` applied and nothing else: no
    upcast, marking or cast-back pass (where it does not mark). Its output has the rows' shape; it
    is moved back and cast to ``x``'s dtype. A 0-d ``x`` is one row of one entry; an empty
    dimension gives an empty result.
    """
    check_floating(x, name)
    d = normalize_dim(x, dim)
    out_dtype = x.dtype
    if marks_not_there is None:  # the op says whether it treats the not-there entries itself
        marks_not_there = not _treats_not_there(fn, params)
    if mask is not None:
        check_mask(mask, x)
    scalar = x.dim() == 0
    if scalar:
        x = x.reshape(1)
        mask = None if mask is None else mask.reshape(1)
    if (not marks_not_there and x.dtype in _LOW_PRECISION
            and _takes_low_precision(fn, x.device.type, x.dtype, x.shape[d])):
        z = x if mask is None else x.masked_fill(~mask, -math.inf)  # 16-bit rows as they are (see below)
    elif marks_not_there or x.dtype in _LOW_PRECISION:
        z = mark_not_there(x, mask)
    elif mask is not None:
        z = x.masked_fill(~mask, -math.inf)
    else:
        z = x
    rows_params = [row_param(v, z, d, k) for k, v in (params or {}).items()]
    last = d == z.dim() - 1
    rows = z if last else z.movedim(d, -1)
    if rows.numel() == 0:  # nothing to normalize (as torch.softmax)
        out = rows.clone()
    else:
        out = fn(rows, *rows_params, *args)
    out = (out if last else out.movedim(-1, d)).to(out_dtype)
    return out.reshape(()) if scalar else out
