"""Which attention kernel runs: the dispatch table and its adapters.

Attention ops: ``sparsenorm::ev_softmax_attention_blockwise`` and ``..._flash``
(:mod:`.ops.evidential_attention`), ``sparsenorm::projection_attention``
(:mod:`.ops.projection_attention`: sparsemax / 1.5-entmax / alpha-entmax in O(L) extra memory by a
blockwise threshold search), ev-softmax on PyTorch's FlexAttention (:mod:`.flex`; not an
op of ours: FlexAttention is itself compilable), and the dense path (:mod:`.dense`).

Dispatch. The registry says what attention may do with a normalizer
(``Normalizer.attention_threshold``: ``"known"``, ``"searched"`` or None); :data:`KERNELS` maps
that capability to its memory-efficient kernels by backend name. A kernel is a function of one
:class:`~.call.AttentionCall` returning ``(out, support, valid)`` -- or None where it does
not apply to those inputs (the flash kernel: another device, a mask that varies over queries, ...).
Adding "this normalizer's attention op is X" is one line::

    register_attention_kernel("searched", "blockwise", my_kernel)

:func:`run_attention_kernel` runs the kernel: an explicit ``backend`` must apply (else
``ValueError``; an unproven CUDA device kernel warns once, :mod:`..cuda_proof`); ``"auto"`` runs what
:func:`..auto_plan.choose_attention` names for the call's shapes and masks -- on CUDA only device kernels
that passed the CUDA suite in a committed GPU run -- else :func:`~.dense.dense_attention`,
which builds the L x S weights and works for every normalizer, weights, dropout and float-mask
gradients included. The device is looked at here and in :mod:`..auto_plan`, never above.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validation import compute_dtype
from .. import cpu, cuda_proof
from . import flex as flex_attention
from .call import AttentionCall, AttentionKernel, kernel_mask, lengths_keep
from .dense import dense_attention
from ..auto_plan import DECODE_MAX_QUERIES, DEVICE_KERNELS, AttentionSpec, applies, choose_attention  # noqa: F401
from ..ops.evidential_attention import ev_softmax_attention_blockwise, ev_softmax_attention_flash_op
from ..ops.projection_attention import projection_attention_op
from ..reference.evidential_attention import few_queries

BACKENDS = ("auto", "dense", "blockwise", "triton", "flex", "sdpa", "decode")
"""Valid values of ``backend``: ``"auto"``, the dense path, and the memory-efficient kernel kinds
(``"sdpa"``: torch's fused ``scaled_dot_product_attention``, for softmax itself; ``"flex"``:
ev-softmax on FlexAttention; ``"triton"``: the flash ev-softmax kernel; ``"decode"``: a few queries
over many keys, as in decoding with a key/value cache)."""

CPU_BLOCKS_KNOWN = (64, 128)
"""Query and key tile of the blockwise ev-softmax C++ kernel (CPU): the fastest of the tiles timed
(one thread, L = S = 512, causal, 9 heads, E = 64, forward+backward:
``benchmarks/results/tuning_cpu.json#attention_tiles``); the pure-PyTorch reference keeps its larger
blocks (fewer Python steps)."""


def _cpp_known(call: AttentionCall) -> bool:
    """Whether the blockwise ev-softmax op runs its C++ kernel on this call's device."""
    return _cpp_known_on(call.q.device.type)


@torch._dynamo.assume_constant_result
def _cpp_known_on(device_type: str) -> bool:
    return device_type == "cpu" and cpu.EVIDENTIAL_ATTENTION.get() is not None


# ---------------------------------------------------------------------------------------------
# Tuning of the searched-threshold kernel
# ---------------------------------------------------------------------------------------------
BISECT_STEPS = 50
"""Bisection steps of a searched threshold with no closed form (alpha not 1.5 or 2):
``entmax_bisect``'s default, which the registry entry keeps (it binds no ``n_iter``)."""

BLOCK_Q_SEARCHED, BLOCK_K_SEARCHED = 256, 1024
"""Query and key block sizes of the searched-threshold kernel (its reference module's defaults);
the query block shrinks for long key sequences (:func:`searched_block_q`)."""

SEARCHED_SCORES_PER_BLOCK = 2 ** 20
"""At most this many scores per head in one query block (block_q x S; 4 MB in float32), down to
64 queries: a query block's kept scores and kept ``dO Vᵀ`` are swept by every pass, and past the
caches each sweep runs at memory speed (L = S = 8192, B·H = 8, one thread: 256 queries 2.27x /
2.30x SDPA's fused kernel for sparsemax / entmax15, 128 queries 1.99x / 2.02x, 64 queries
1.85x / 2.08x; medians of 3 interleaved rounds, docs/guide/attention.md)."""


def searched_block_q(keys: int) -> int:
    """The searched kernel's query block for ``keys`` keys (see :data:`SEARCHED_SCORES_PER_BLOCK`)."""
    block = BLOCK_Q_SEARCHED
    while block > 64 and block * keys > SEARCHED_SCORES_PER_BLOCK:
        block //= 2
    return block


# ---------------------------------------------------------------------------------------------
# Adapters: one AttentionCall -> one kernel's arguments (None where the kernel does not apply)
# ---------------------------------------------------------------------------------------------
def _ev_softmax_blockwise(call: AttentionCall):
    q, k, v, keep, bias = call.expanded_inputs()
    block_q, block_k = CPU_BLOCKS_KNOWN if _cpp_known(call) else (None, None)
    out, support, count = ev_softmax_attention_blockwise(q, k, v, keep, bias, call.is_causal, call.scale,
                                                         call.count_support, block_q, block_k,
                                                         causal_offset=call.causal_offset)
    return out, support, count


def _ev_softmax_decode(call: AttentionCall):
    """ev-softmax for a few queries (at most :data:`.DECODE_MAX_QUERIES`) over the keys, the
    grouped-query heads stacked against their key/value head (no copy of the keys or values; see
    :func:`.reference.evidential_attention.few_queries`): 4-D inputs with one batch size, no float
    mask, a mask that varies over keys only (padding), ``key_lengths``, causal at any alignment."""
    q, k, v = call.q, call.k, call.v
    if call.scores_shape[-2] > DECODE_MAX_QUERIES or call.bias is not None:
        return None
    if any(t.dim() != 4 for t in (q, k, v)) or not (q.shape[0] == k.shape[0] == v.shape[0]):
        return None
    key_mask = kernel_mask(call, "keys")
    if key_mask is NotImplemented:
        return None
    if call.key_lengths is not None:
        short = lengths_keep(call.key_lengths, call.scores_shape[-1], 2)
        key_mask = short if key_mask is None else key_mask & short
    cdt = compute_dtype(q)
    return few_queries(q.to(cdt), k.to(cdt), v.to(cdt), key_mask, call.is_causal, call.causal_offset, call.scale,
                       call.count_support)


def _ev_softmax_flash(call: AttentionCall):
    """The flash op where it applies: 4-D (B, H, L, E) inputs with one batch size, E <= 128, the
    value's head dim equal to the query's, a float32/float16/bfloat16 dtype, no float mask, no
    support counting, a mask that varies over keys only (padding); else None."""
    q, k, v = call.q, call.k, call.v
    if _applies("triton", *_spec_fields(call_spec(None, "known", call))) is not None:
        return None
    key_mask = kernel_mask(call, "keys")
    if key_mask is NotImplemented:
        return None
    out, _, _ = ev_softmax_attention_flash_op(q, k, v, call.key_lengths, key_mask, call.is_causal, call.scale,
                                              call.causal_offset)
    return out, None, None


def _batch_head_inputs(call: AttentionCall):
    """``(q, k, v, keep, key_lengths, unflatten)`` as (B, H, L, E) tensors for the kernels that take
    only that layout: 4-D inputs with one batch size go as they are (GQA and ``key_lengths`` kept,
    ``keep`` in the ``"batch_heads"`` form); any other broadcastable layout is expanded to one batch
    of single-head rows (``keep`` in the ``"flat_rows"`` form, L x S booleans) and ``unflatten``
    restores the caller's leading dims."""
    q, k, v = call.q, call.k, call.v
    if len(call.scores_shape) == 4 and all(t.dim() == 4 for t in (q, k, v)) and q.shape[0] == k.shape[0] == v.shape[0]:
        return q, k, v, kernel_mask(call, "batch_heads"), call.key_lengths, lambda out: out
    q, k, v, _, _ = call.expanded_inputs()
    batch, (L, S) = call.scores_shape[:-2], call.scores_shape[-2:]
    flat = (q.reshape(-1, 1, L, q.shape[-1]), k.reshape(-1, 1, S, k.shape[-1]), v.reshape(-1, 1, S, v.shape[-1]))
    return (*flat, kernel_mask(call, "flat_rows"), None, lambda out: out.reshape(*batch, L, out.shape[-1]))


def _searched_kind(alpha: Optional[float]) -> str:
    """The blockwise search for alpha-entmax: the exact closed forms at alpha = 2 (sparsemax) and
    1.5, bisection otherwise."""
    return {2.0: "sparsemax", 1.5: "entmax15"}.get(alpha, "entmax_bisect")


def _searched_blockwise(call: AttentionCall):
    """``sparsenorm::projection_attention`` (O(L) extra memory) for the normalizers whose threshold
    is searched; not for a float mask (the op takes none) or support counting (it returns no counts)."""
    if call.bias is not None or call.count_support:
        return None
    q, k, v, keep, key_lengths, unflatten = _batch_head_inputs(call)
    out, _, _ = projection_attention_op(q, k, v, keep, key_lengths, call.is_causal, call.scale,
                                        _searched_kind(call.alpha), searched_block_q(k.shape[-2]), BLOCK_K_SEARCHED,
                                        float(call.alpha if call.alpha is not None else 1.5), BISECT_STEPS,
                                        call.causal_offset)
    return unflatten(out), None, None


def _ev_softmax_flex(call: AttentionCall):
    """ev-softmax on FlexAttention (:mod:`.flex`) where this torch has it and,
    on CPU, only outside autograd (FlexAttention has no CPU backward); float masks (not
    differentiated), no counts."""
    if _applies("flex", *_spec_fields(call_spec(None, "known", call))) is not None:
        return None
    q, k, v, keep, key_lengths, unflatten = _batch_head_inputs(call)
    bias = call.bias
    if bias is not None:
        if q is call.q:  # 4-D inputs as given: the float mask stays in its broadcast form (no copy)
            bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        else:  # flattened to single-head rows: the mask follows them
            bias = bias.expand(call.scores_shape).reshape(q.shape[0], q.shape[1], *call.scores_shape[-2:])
    out = flex_attention.ev_softmax_flex_attention(q, k, v, keep, key_lengths, call.is_causal, call.scale,
                                                   call.causal_offset, bias=bias)
    return unflatten(out), None, None


def _softmax_sdpa(call: AttentionCall):
    """softmax attention by torch's fused ``F.scaled_dot_product_attention`` (its flash kernel on CPU
    and CUDA): 4-D inputs with one batch size (GQA by ``enable_gqa``), no float mask, no support
    counting. No mask is built for a causal mask SDPA's ``is_causal`` states (top-left, or one
    query); key padding and the causal mask otherwise go as one boolean mask. A query with no valid
    key attends to every key inside SDPA (so no NaN reaches the backward) and is given zeros here."""
    q, k, v = call.q, call.k, call.v
    if call.bias is not None or call.count_support or any(t.dim() != 4 for t in (q, k, v)):
        return None
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return None
    S = call.scores_shape[-1]
    cdt = compute_dtype(q)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    gqa = k.shape[1] != q.shape[1]
    sees_all = not call.is_causal or call.causal_offset >= S - 1  # every query sees every key
    if call.keep is None and call.key_lengths is None and (sees_all or call.causal_offset == 0):
        return F.scaled_dot_product_attention(q, k, v, is_causal=not sees_all, scale=call.scale,
                                              enable_gqa=gqa), None, None
    mask = kernel_mask(call, "dense")
    mask = mask.reshape((1,) * max(0, 2 - mask.dim()) + tuple(mask.shape))  # SDPA takes a mask of 2 dims or more
    empty = ~mask.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty, scale=call.scale, enable_gqa=gqa)
    return out.masked_fill(empty, 0.0), None, None


# ---------------------------------------------------------------------------------------------
# The table and the choice
# ---------------------------------------------------------------------------------------------
KERNELS: Dict[str, Dict[str, AttentionKernel]] = {
    "known": {"triton": _ev_softmax_flash, "blockwise": _ev_softmax_blockwise, "flex": _ev_softmax_flex,
              "decode": _ev_softmax_decode},
    "searched": {"blockwise": _searched_blockwise},
    "softmax": {"sdpa": _softmax_sdpa},
}
"""``KERNELS[attention_threshold][backend]``: the memory-efficient kernels by the registry's
capability (``Normalizer.attention_threshold``) and backend name (one of :data:`BACKENDS`)."""


def register_attention_kernel(attention_threshold: str, backend: str, kernel: AttentionKernel) -> None:
    """Make ``kernel`` the ``backend`` kernel of every normalizer whose registry entry has
    ``attention_threshold == threshold`` (replacing any before)."""
    if backend not in BACKENDS or backend in ("auto", "dense"):
        raise ValueError(f"backend must be one of {[b for b in BACKENDS if b not in ('auto', 'dense')]}, "
                         f"got {backend!r}")
    KERNELS.setdefault(attention_threshold, {})[backend] = kernel


def check_backend(backend: str) -> None:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def call_spec(name: Optional[str], attention_threshold: Optional[str], call: AttentionCall, dropout_p: float = 0.0,
              return_weights: bool = False) -> AttentionSpec:
    """The call's :class:`~.plan.AttentionSpec` (what the choice of kernel depends on)."""
    q, k, v = call.q, call.k, call.v
    if call.bias is not None:
        mask = "float"
    elif call.keep is None and call.key_lengths is None:
        mask = None
    elif call.keep is None:
        mask = "keys"
    else:  # kernel_mask's "keys" form exists: a mask that varies over keys (and batch) only
        shape = (1,) * (4 - call.keep.dim()) + tuple(call.keep.shape)
        mask = "keys" if len(shape) == 4 and shape[1] == 1 and shape[2] == 1 else "general"
    one_batch_4d = all(t.dim() == 4 for t in (q, k, v)) and q.shape[0] == k.shape[0] == v.shape[0]
    return AttentionSpec(
        name or "", attention_threshold, q.device.type, q.dtype, call.is_causal, call.scores_shape[-2],
        call.scores_shape[-1], q.shape[-1], v.shape[-1], mask, one_batch_4d,
        bias_requires_grad=call.bias is not None and call.bias.requires_grad, needs_weights=return_weights,
        dropout=dropout_p > 0.0, count_support=call.count_support,
        requires_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))


def _spec_fields(spec: AttentionSpec) -> tuple:
    return tuple(getattr(spec, f.name) for f in dataclasses.fields(spec))


# The plan reads the environment (kernels built, allowed, proven; triton importable): constant for
# torch.compile, which then traces only the chosen kernel.
@torch._dynamo.assume_constant_result
def _planned(*fields) -> str:
    return choose_attention(AttentionSpec(*fields)).backend


@torch._dynamo.assume_constant_result
def _applies(backend: str, *fields) -> Optional[str]:
    return applies(backend, AttentionSpec(*fields))


def run_attention_kernel(fn: Callable[..., Tensor], attention_threshold: Optional[str], call: AttentionCall,
                         dropout_p: float = 0.0, return_weights: bool = False, backend: str = "auto",
                         name: Optional[str] = None):
    """``(out, weights or None, support or None, valid or None)`` by the kernel ``backend`` names.

    ``fn`` is the normalizer's map of the scores (for the dense path), ``attention_threshold`` its
    registry capability (which memory-efficient kernels apply), ``name`` its registry name (the CUDA record
    is kept per name; None for a callable). The memory-efficient kernels return no
    weights, apply no dropout and do not differentiate a float mask: an explicit ``backend`` asked
    for with any of those, or that does not apply to the inputs, raises ``ValueError``. Query rows
    past ``call.query_lengths`` are zeroed here (output, weights; left out of the counts).
    """
    out, weights, support, valid = _run(fn, attention_threshold, call, dropout_p, return_weights, backend, name)
    rows = kernel_mask(call, "query_rows")
    if rows is not None:
        out = out.masked_fill(~rows.unsqueeze(-1), 0.0)
        weights = None if weights is None else weights.masked_fill(~rows.unsqueeze(-1), 0.0)
        valid = None if valid is None else valid * rows
    return out, weights, support, valid


def _run(fn, attention_threshold, call, dropout_p, return_weights, backend, name):
    check_backend(backend)
    kernels = KERNELS.get(attention_threshold, {}) if attention_threshold is not None else {}
    if backend == "dense":
        return dense_attention(fn, call, dropout_p)
    if backend == "auto":
        chosen = _planned(*_spec_fields(call_spec(name, attention_threshold, call, dropout_p, return_weights)))
        kernel = kernels.get(chosen) if chosen != "dense" else None
        result = None if kernel is None else kernel(call)
        if result is None:  # the dense path (planned, or an adapter's own limit the plan does not model)
            return dense_attention(fn, call, dropout_p)
        return (result[0], None, *result[1:])
    efficient = not return_weights and dropout_p == 0.0 and (call.bias is None or not call.bias.requires_grad)
    if not efficient:
        raise ValueError(f"backend={backend!r} returns no weights, applies no dropout and does not differentiate "
                         "a float mask; use backend='dense' (or 'auto') for those")
    kernel = kernels.get(backend)
    if kernel is None:
        raise ValueError(f"backend={backend!r} has no kernel for this normalizer (attention_threshold="
                         f"{attention_threshold!r}; its backends: {', '.join(['dense', *kernels])})")
    if call.scores_shape[-2] * call.scores_shape[-1] == 0:
        # No query or no key: the answer is an empty or all-zero output (a query with no key attends
        # to nothing), which the dense path gives exactly; the tiled kernels assume at least one tile.
        out, _, support, valid = dense_attention(fn, call, dropout_p)
        return out, None, support, valid
    result = kernel(call)
    if result is None:
        raise ValueError(f"backend={backend!r} does not apply to these inputs (device, dtype, shapes or mask form); "
                         "use backend='auto'")
    if call.q.device.type == "cuda" and backend in DEVICE_KERNELS and name:
        cuda_proof.warn_unproven("attention", name, call.q.dtype, backend)
    return (result[0], None, *result[1:])


__all__ = ["AttentionCall", "KERNELS", "BACKENDS", "register_attention_kernel", "run_attention_kernel", "call_spec",
           "dense_attention", "searched_block_q"]
