"""What ``auto`` will run, and why: the one place the choice of kernel is made, from shapes alone.

:func:`plan_rows` (``sparsenorm.kernels.plan``) answers for the row-wise functions,
:func:`choose_attention` (behind ``sparsenorm.attention.plan``) for attention; neither needs a
tensor or a GPU. The kernels follow
these answers: the row-wise ops ask :func:`row_backend` (the same function on a tensor's
properties), and ``sparse_attention(..., backend="auto")`` runs :func:`choose_attention` on the call's
shapes and masks (:func:`~sparsenorm.kernels.attention.dispatch.call_spec`), then exactly the
backend it names.

Rules. On CUDA a device kernel (Triton, FlexAttention, SDPA) is chosen only where the committed
record (:mod:`.cuda_proof`) shows it passed the CUDA suite on a GPU; the pure-PyTorch paths
(reference, dense, blockwise, decode) need no record. On CPU the C++ kernels run where built and
allowed; the blockwise attention from a number of scores on (below it the dense path is as fast).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch

from . import cpu, cuda_proof
from .policy import kernels_disabled, triton_launchers
from .tiles import TRITON_TILE_COLS

# --------------------------------------------------------------------------------------- row-wise
TRITON_ROW_FAMILIES = tuple(TRITON_TILE_COLS)
"""The row-wise families with a Triton kernel (CUDA)."""

CPP_ROW_FAMILIES = {"ev_softmax": cpu.EVIDENTIAL, "sparsemax": cpu.PROJECTION, "entmax15": cpu.PROJECTION,
                    "sparsehourglass": cpu.PROJECTION, "r_softmax": cpu.RSOFTMAX, "t_softmax": cpu.RSOFTMAX}
"""The row-wise families with a C++ kernel (CPU), and its extension."""

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class RowPlan:
    """Which kernel a row-wise function runs: ``backend`` is ``"triton"``, ``"cpp"`` or
    ``"reference"`` (pure PyTorch), ``reason`` says why, ``proof`` cites the GPU run behind a CUDA kernel."""

    name: str
    device: str
    dtype: torch.dtype
    row_len: int
    backend: str
    reason: str
    proof: Optional[str] = None


def _device_type(device) -> str:
    return torch.device(device).type if not isinstance(device, str) or ":" in device else device


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def plan_rows(name: str, *, device="cpu", dtype=torch.float32, row_len: int = 1) -> RowPlan:
    """Which kernel ``sparsenorm.<name>`` runs on rows of ``row_len`` entries of ``dtype`` on ``device``.

    ``name`` is a registry name; the families with a fused kernel are :data:`TRITON_ROW_FAMILIES`
    (CUDA) and :data:`CPP_ROW_FAMILIES` (CPU), every other name runs its reference path. Example::

        >>> sparsenorm.kernels.plan("ev_softmax", device="cuda", dtype=torch.bfloat16, row_len=4096)
        RowPlan(name='ev_softmax', device='cuda', ..., backend='triton', reason='...', proof='results/gpu/...')
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a normalizer's registry name, got {name!r}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be a floating dtype ({', '.join(map(str, FLOAT_DTYPES))}), got {dtype}")
    if isinstance(row_len, bool) or not isinstance(row_len, int) or row_len < 0:
        raise ValueError(f"row_len must be a non-negative int, got {row_len!r}")
    kind = _device_type(device)
    backend, reason, proof = row_choice(name, kind, dtype, row_len)
    return RowPlan(name, kind, dtype, row_len, backend, reason, proof)


def row_choice(name: str, kind: str, dtype, row_len: int) -> Tuple[str, str, Optional[str]]:
    """``(backend, reason, proof)`` of :func:`plan_rows` for a device type (the ops call this)."""
    if kernels_disabled():
        return "reference", "inside kernels.disabled()", None
    if row_len == 0:
        return "reference", "an empty row", None
    if kind == "cuda" or (kind == "cpu" and _interpreting() and name in TRITON_ROW_FAMILIES
                          and dtype != torch.float64):
        if name not in TRITON_ROW_FAMILIES:
            return "reference", f"{name} has no Triton kernel (those with one: {', '.join(TRITON_ROW_FAMILIES)})", None
        if dtype == torch.float64:
            return "reference", "the Triton kernels take float32/float16/bfloat16", None
        if triton_launchers() is None:
            return "reference", "triton is not installed (pip install 'sparsenorm[gpu]') or kernels are disabled", None
        if kind == "cpu":
            return "triton", "Triton's interpreter (TRITON_INTERPRET=1)", None
        regime = "long_rows" if row_len > TRITON_TILE_COLS[name] else "rows"  # tile or split kernels
        proof = cuda_proof.proven(regime, name, dtype, "triton")
        if proof is None and not cuda_proof.trusted():
            which = "split" if regime == "long_rows" else "tile"
            return ("reference", f"no committed GPU run proves the Triton {name} {which} kernel (rows of "
                    f"{'more than' if regime == 'long_rows' else 'at most'} {TRITON_TILE_COLS[name]} entries) in "
                    f"{str(dtype)[6:]}", None)
        return "triton", "passed the CUDA suite" if proof else "unproven, allowed by cuda_proof.trusting()", proof
    if kind == "cpu":
        ext = CPP_ROW_FAMILIES.get(name)
        if ext is None:
            return "reference", f"{name} has no C++ kernel", None
        if dtype not in (torch.float32, torch.float64):
            return "reference", "the C++ kernels take float32/float64 (16-bit input is computed in float32)", None
        if ext.get() is None:
            return "reference", "the C++ kernels are not built or not allowed (sparsenorm build-kernels)", None
        return "cpp", "the C++ kernel is built", None
    return "reference", f"no fused kernel on {kind}", None


def row_backend(name: str, x: torch.Tensor) -> str:
    """The backend :func:`plan_rows` names for rows ``x`` (what the row-wise ops' CUDA kernels run)."""
    if x.dim() == 0:
        return "reference"
    return row_choice(name, x.device.type, x.dtype, x.shape[-1])[0]



def flex_available() -> bool:
    """Whether this torch has FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5)."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None

# -------------------------------------------------------------------------------------- attention
MASK_KINDS = (None, "keys", "general", "float")
"""``mask`` of ``sparsenorm.attention.plan``: None; ``"keys"`` -- a key-padding mask or key lengths (varies
over keys only); ``"general"`` -- a boolean mask that varies over queries or heads; ``"float"`` -- an
additive float mask."""

BLOCKWISE_MIN_SCORES = 1 << 20
"""``auto`` takes a blockwise kernel once ``L * S`` reaches this (below it the dense path is as fast
and its memory is small)."""

KNOWN_BLOCKWISE_MIN_SCORES = 1 << 14
"""... and the blockwise ev-softmax kernel from this many scores on where its C++ kernel runs (CPU):
the length from which the blockwise C++ kernel is faster than the dense path (one thread, 9 query /
3 key-value heads, E = 64, causal, L = S = 64 ... 512, forward+backward:
``benchmarks/results/tuning_cpu.json#attention_known_min_scores``)."""

DECODE_MAX_QUERIES = 16
"""The most queries the ``"decode"`` kernel takes (decoding: 1 per sequence; speculative or
chunked steps: a few)."""

FLASH_MAX_HEAD_DIM = 128

DEVICE_KERNELS = ("sdpa", "flex", "triton")
"""The backends that need a committed GPU record before ``auto`` runs them on CUDA."""

AUTO_ORDER = {
    "cpu": {"softmax": ("sdpa",), "known": ("triton", "decode", "blockwise"), "searched": ("blockwise",)},
    # Decoding (few queries over a growing cache) stays on the decode path on CUDA: FlexAttention
    # compiles per shape, so a cache that grows by one key per step would recompile at every step.
    "cuda": {"softmax": ("sdpa",), "known": ("decode", "flex", "blockwise"), "searched": ("blockwise",)},
}
"""The memory-efficient backends ``auto`` tries, in order, per device and threshold kind, before
the dense path."""


@dataclass(frozen=True)
class AttentionSpec:
    """What the choice of attention kernel depends on (no tensors)."""

    normalizer: str
    attention_threshold: Optional[str]
    device: str
    dtype: torch.dtype
    causal: bool
    q_len: int
    k_len: int
    head_dim: int
    value_dim: int
    mask: Optional[str] = None
    one_batch_4d: bool = True
    bias_requires_grad: bool = False
    needs_weights: bool = False
    dropout: bool = False
    count_support: bool = False
    requires_grad: bool = False


@dataclass(frozen=True)
class AttentionPlan:
    """``backend`` is what ``sparse_attention(..., backend="auto")`` runs; ``reason`` why; ``proof``
    the committed GPU run behind a CUDA device kernel; ``rejected`` each backend tried before it, with why not."""

    backend: str
    reason: str
    proof: Optional[str] = None
    rejected: Tuple[Tuple[str, str], ...] = field(default_factory=tuple)


def applies(backend: str, spec: AttentionSpec) -> Optional[str]:
    """None where ``backend`` can run ``spec``, else why not (capability and shape limits)."""
    if spec.needs_weights or spec.dropout or spec.bias_requires_grad:
        return "the memory-efficient kernels return no weights, apply no dropout, do not differentiate a float mask"
    if backend == "sdpa":
        if spec.attention_threshold != "softmax":
            return "SDPA computes softmax only"
        if spec.mask == "float" or spec.count_support or not spec.one_batch_4d:
            return "SDPA here takes 4-D inputs of one batch size, no float mask, no support counts"
        return None
    if backend == "triton":
        if spec.attention_threshold != "known":
            return "the flash kernel computes ev-softmax only"
        if spec.device != "cuda" and not (spec.device == "cpu" and _interpreting()):
            return f"Triton does not run on {spec.device}"
        if triton_launchers() is None:
            return "triton is not installed or kernels are disabled"
        if spec.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return "the flash kernel takes float32/float16/bfloat16"
        if spec.mask in ("general", "float") or spec.count_support or not spec.one_batch_4d:
            return "the flash kernel takes 4-D inputs of one batch size, a key-padding mask only, no counts"
        if spec.head_dim > FLASH_MAX_HEAD_DIM or spec.value_dim != spec.head_dim:
            return f"the flash kernel takes head dims up to {FLASH_MAX_HEAD_DIM}, equal for values"
        return None
    if backend == "flex":
        if spec.attention_threshold != "known":
            return "the Flex path computes ev-softmax only"
        if not flex_available():
            return f"torch {torch.__version__} has no FlexAttention"
        if spec.count_support:
            return "the Flex path returns no support counts"
        if spec.device == "cpu" and spec.requires_grad:
            return "FlexAttention has no backward on CPU"
        return None
    if backend == "decode":
        if spec.attention_threshold != "known":
            return "the decode path computes ev-softmax only"
        if spec.q_len > DECODE_MAX_QUERIES:
            return f"more than {DECODE_MAX_QUERIES} queries"
        if spec.mask in ("general", "float") or not spec.one_batch_4d:
            return "the decode path takes 4-D inputs of one batch size and a key-padding mask only"
        return None
    if backend == "blockwise":
        if spec.attention_threshold not in ("known", "searched"):
            return "no blockwise kernel for this normalizer"
        if spec.attention_threshold == "searched" and (spec.mask == "float" or spec.count_support):
            return "the searched-threshold kernel takes no float mask and returns no counts"
        least = BLOCKWISE_MIN_SCORES
        if spec.attention_threshold == "known" and spec.device == "cpu" and cpu.EVIDENTIAL_ATTENTION.get() is not None:
            least = min(least, KNOWN_BLOCKWISE_MIN_SCORES)
        if spec.q_len * spec.k_len < least:
            return f"fewer than {least} scores (the dense path is as fast there)"
        return None
    return f"unknown backend {backend!r}"


def choose_attention(spec: AttentionSpec) -> AttentionPlan:
    """The plan ``auto`` follows for ``spec`` (``sparsenorm.attention.plan`` is its public form)."""
    rejected = []
    if spec.q_len * spec.k_len == 0:
        return AttentionPlan("dense", "no query or no key: the answer is empty or zeros")
    order = AUTO_ORDER.get(spec.device, {}).get(spec.attention_threshold or "", ())
    for backend in order:
        why = applies(backend, spec)
        proof = None
        if why is None and spec.device == "cuda" and backend in DEVICE_KERNELS:
            proof = cuda_proof.proven("attention", spec.normalizer, spec.dtype, backend)
            if proof is None and not cuda_proof.trusted():
                why = f"no committed GPU run proves it for {spec.normalizer} in {str(spec.dtype)[6:]}"
        if why is None:
            reason = {"sdpa": "torch's fused softmax attention", "flex": "FlexAttention with the threshold folded in",
                      "triton": "the flash ev-softmax kernel", "decode": "few queries over many keys",
                      "blockwise": "O(L) memory, threshold per query block"}[backend]
            return AttentionPlan(backend, reason + (" (passed the CUDA suite)" if proof else ""), proof,
                                 tuple(rejected))
        rejected.append((backend, why))
    return AttentionPlan("dense", "the L x S weights: every normalizer, mask, weights and dropout", None,
                         tuple(rejected))


__all__ = ["RowPlan", "plan_rows", "row_backend", "row_choice", "AttentionSpec", "AttentionPlan", "choose_attention",
           "applies", "AUTO_ORDER", "MASK_KINDS", "BLOCKWISE_MIN_SCORES", "KNOWN_BLOCKWISE_MIN_SCORES",
           "DECODE_MAX_QUERIES", "DEVICE_KERNELS", "TRITON_ROW_FAMILIES", "CPP_ROW_FAMILIES", "flex_available"]
