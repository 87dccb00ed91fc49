"""Flash ev-softmax attention: exact ev-softmax (Eq. 7) attention in one pass over the keys.

ev-softmax keeps the keys whose score is at least the mean score over the valid keys, and that
mean is linear in the keys: ``mean_j (q . k_j) * scale = q . mean_j(k_j) * scale``. So each query's
threshold is known before any score is computed, from the key means (the mean of the valid keys,
or their prefix means under a causal mask), and the attention is softmax restricted to
``{j valid : s_ij >= threshold_i}``: FlashAttention-2's online softmax with one extra comparison.

* Forward (grid: query blocks x batch*heads): each program computes its queries' thresholds
  ``q . kmean * scale`` from the precomputed float32 key means, then streams key blocks with the
  online-softmax recurrence (running max, sum, output). A key block in which no score of the
  program's queries reaches its threshold is still computed (p = 0 there): a data-dependent skip
  miscompiled in 16 bits on an H200 (see the dK/dV kernel).
  Rows whose threshold rounding put above every valid score (the mean never exceeds the maximum
  in exact arithmetic; e.g. a single valid key) are redone with the threshold capped at their
  maximum valid score, as the dense ev-softmax caps it. Saves the log-sum-exp and the threshold
  per query (float32, in log2 units: scores are kept as ``s * log2(e)`` for ``exp2``).
* Backward (FlashAttention-2): ``delta = rowsum(dO * O)``; one kernel per key block accumulates
  ``dK, dV`` over the query blocks of every query head of its group (GQA without atomics), one
  kernel per query block accumulates ``dQ``; both recompute scores and support from ``q, k``, the
  saved threshold and log-sum-exp, and compute every block they visit (no data-dependent skip). The threshold carries no
  gradient (the support indicator is piecewise constant, Eq. 9).

Masks: ``key_lengths`` (B,) gives each batch element's number of valid keys (keys ``j >= len``
are not there; lengths are clamped to ``[0, S]``); ``key_mask`` (B, S) bool marks the keys that
are there (left padding, any pattern over keys; a key mask costs one byte load per key block, and
key lengths also shorten the loops); ``is_causal``: query ``i`` sees keys ``j <= i + causal_offset``
(0: top-left, as ``F.scaled_dot_product_attention``; ``S - L``: bottom-right, as FlashAttention
>= 2.1 and decoding with a cache), combined with ``key_lengths``. A query with no
valid key gives a zero output row and zero gradient. Layout ``(B, H, L, D)`` as SDPA; GQA when
``Hk`` divides ``Hq`` (query head ``h`` reads key/value head ``h // (Hq // Hk)``). Head dims up to
128 (not necessarily a power of two). float16/bfloat16 (float32 too, with IEEE float32 products),
float32 accumulation.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, autotune, check_tensor

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 128
# Block sizes under the interpreter (small, so that L <= 64 spans several blocks).
_INTERPRET_BLOCKS = dict(BLOCK_M=16, BLOCK_N=16)


def _configs(block_ms, block_ns):
    return lambda: [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm in block_ms for bn in block_ns for w in (4, 8) for s in (2, 3)
    ]


@triton.jit
def _scores(q, k, qk_scale, PRECISION: tl.constexpr):
    """``q k^T * scale * log2(e)`` in float32; the same product in every kernel, so the backward
    recomputes exactly the forward's support."""
    return tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale


@triton.jit
def _operand(x, like, UPCAST: tl.constexpr):
    """``x`` (P or dS, float32) as the second product's operand: in ``like``'s dtype, as the GPU's
    16-bit tensor-core product takes it. Under the interpreter's bfloat16 upcast (``like`` is float32
    there) it is rounded to bfloat16 and back, so the CPU tests see the GPU's rounding of P and dS."""
    if UPCAST:
        return x.to(tl.bfloat16).to(tl.float32)
    return x.to(like.dtype)


@triton.jit
def _key_ok(keymask, offs_n, klen, HAS_KEYMASK: tl.constexpr):
    """The keys of a block that are there: below the batch element's length and not masked out."""
    ok = offs_n < klen
    if HAS_KEYMASK:
        ok = ok & (tl.load(keymask + offs_n, mask=ok, other=0) != 0)
    return ok


@triton.jit
def _valid(offs_m, offs_n, key_ok, seq_q, coff, CAUSAL: tl.constexpr):
    valid = key_ok[None, :] & (offs_m[:, None] < seq_q)
    if CAUSAL:  # query i sees keys j <= i + coff (coff = 0: top-left; S - L: bottom-right)
        valid = valid & (offs_n[None, :] <= offs_m[:, None] + coff)
    return valid


@triton.jit
def _fwd_pass(acc, l_i, m_i, m_all, q, thr, only, k_base, v_base, keymask, stride_kn, stride_vn,
              offs_m, offs_d, klen, seq_q, hi, qk_scale, head_dim, coff,
              CAUSAL: tl.constexpr, HAS_KEYMASK: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
              PRECISION: tl.constexpr):
    """One pass over the key blocks ``[0, hi)``: the online softmax over the scores at or above
    ``thr`` of the rows with ``only`` set; also the rows' maximum valid score ``m_all``."""
    d_ok = offs_d[None, :] < head_dim
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_ok = (offs_n[:, None] < klen) & d_ok
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        valid = _valid(offs_m, offs_n, _key_ok(keymask, offs_n, klen, HAS_KEYMASK), seq_q, coff, CAUSAL)
        s = tl.where(valid, _scores(q, k, qk_scale, PRECISION), float("-inf"))
        m_all = tl.maximum(m_all, tl.max(s, 1))
        on = valid & (s >= thr[:, None]) & only[:, None]
        # Every visited block computes P V (no data-dependent skip: see the dK/dV kernel);
        # off-support entries have p = 0.
        s_on = tl.where(on, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_on, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s_on - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(_operand(p, v, UPCAST), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i, m_all


@autotune(_configs((64, 128), (32, 64, 128)), key=["seq_q", "seq_k", "BLOCK_D", "CAUSAL"])
@triton.jit
def _attn_fwd_kernel(
    Q, K, V, KMEAN, COUNTS, LENS, KEYMASK, OUT, LSE, THR,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om, stride_mb, stride_mh, stride_mr, stride_cb,
    n_heads, group, seq_q, seq_k, head_dim, qk_scale, coff,
    HAS_LENS: tl.constexpr, HAS_KEYMASK: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    hk = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < head_dim
    q_ok = (offs_m[:, None] < seq_q) & d_ok
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if HAS_LENS:
        klen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), seq_k)
    else:
        klen = seq_k
    # Threshold: q . (mean of the valid keys) * scale, in log2 units; the means and counts of the
    # valid keys are precomputed per batch element (prefix means and counts under a causal mask).
    if CAUSAL:  # query i reads the prefix row i + coff (no key where that is negative)
        row = tl.maximum(tl.minimum(offs_m + coff, seq_k - 1), 0)
        row_sees = offs_m + coff >= 0
        hi = tl.maximum(tl.minimum(klen, (pid_m + 1) * BLOCK_M + coff), 0)
    else:
        row = tl.zeros((BLOCK_M,), tl.int32)
        row_sees = offs_m >= 0
        hi = klen
    count = tl.load(COUNTS + b * stride_cb + row, mask=(offs_m < seq_q) & row_sees, other=0)
    kmean = tl.load(KMEAN + b * stride_mb + hk * stride_mh + row[:, None] * stride_mr + offs_d[None, :],
                    mask=q_ok, other=0.0)
    thr = tl.sum(q.to(tl.float32) * kmean, 1) * qk_scale

    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    keymask = KEYMASK + b * seq_k
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    m_all = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    everyone = offs_m >= 0
    acc, l_i, m_i, m_all = _fwd_pass(acc, l_i, m_i, m_all, q, thr, everyone, k_base, v_base, keymask, stride_kn,
                                     stride_vn, offs_m, offs_d, klen, seq_q, hi, qk_scale, head_dim, coff,
                                     CAUSAL, HAS_KEYMASK, BLOCK_N, UPCAST, PRECISION)
    stranded = (l_i == 0) & (count > 0) & (offs_m < seq_q)
    if tl.sum(stranded.to(tl.int32)) > 0:  # rounding put the mean above the max: cap it there
        thr = tl.where(stranded, m_all, thr)
        acc, l_i, m_i, m_all = _fwd_pass(acc, l_i, m_i, m_all, q, thr, stranded, k_base, v_base, keymask,
                                         stride_kn, stride_vn, offs_m, offs_d, klen, seq_q, hi, qk_scale, head_dim,
                                         coff, CAUSAL, HAS_KEYMASK, BLOCK_N, UPCAST, PRECISION)
    empty = l_i == 0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=q_ok)
    row_ok = offs_m < seq_q
    tl.store(LSE + pid_bh * seq_q + offs_m, lse, mask=row_ok)
    tl.store(THR + pid_bh * seq_q + offs_m, thr, mask=row_ok)


@autotune(_configs((32, 64), (64, 128)), key=["seq_q", "seq_k", "BLOCK_D", "CAUSAL"])
@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, THR, DELTA, LENS, KEYMASK, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    n_heads, n_kv_heads, group, seq_q, seq_k, head_dim, qk_scale, sm_scale, coff,
    HAS_LENS: tl.constexpr, HAS_KEYMASK: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < head_dim
    if HAS_LENS:
        klen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), seq_k)
    else:
        klen = seq_k
    kv_ok = (offs_n[:, None] < klen) & d_ok
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok,
                other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok,
                other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    if CAUSAL:
        lo = (tl.maximum(start_n - coff, 0) // BLOCK_M) * BLOCK_M  # queries i >= j - coff only
    else:
        lo = 0
    lo = tl.where(start_n < klen, lo, seq_q)  # keys that are not there: zero gradient, no loop
    key_ok = _key_ok(KEYMASK + b * seq_k, offs_n, klen, HAS_KEYMASK)
    for g in range(0, group):
        h = hk * group + g
        bh = b * n_heads + h
        for start_m in range(lo, seq_q, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < seq_q
            q_ok = row_ok[:, None] & d_ok
            q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                        mask=q_ok, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            thr = tl.load(THR + bh * seq_q + offs_m, mask=row_ok, other=float("inf"))
            s = _scores(q, k, qk_scale, PRECISION)
            on = _valid(offs_m, offs_n, key_ok, seq_q, coff, CAUSAL) & (s >= thr[:, None])
            # No data-dependent skip of the block (nor in the forward and dQ kernels): on an H200
            # (triton 3.6, sm_90) the products accumulated under such an ``if`` came out wrong in
            # float16/bfloat16 (results/gpu/h200-2026-11-28-window1: every 16-bit failure was dK, and
            # the kernels without the ``if`` passed those cases; window2: with the dK/dV kernel's ``if``
            # alone removed, 4 cases at head dims 96/128 still had a few dK entries off). Off-support
            # entries have p = 0, so computing every visited block is exact.
            lse = tl.load(LSE + bh * seq_q + offs_m, mask=row_ok, other=float("inf"))
            delta = tl.load(DELTA + bh * seq_q + offs_m, mask=row_ok, other=0.0)
            do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                         mask=q_ok, other=0.0)
            if UPCAST:
                do = do.to(tl.float32)
            p = tl.where(on, tl.exp2(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(_operand(p, do, UPCAST)), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(_operand(ds, q, UPCAST)), q, input_precision=PRECISION)
    out_ok = (offs_n[:, None] < seq_k) & d_ok
    tl.store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=out_ok)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=out_ok)


@autotune(_configs((64, 128), (32, 64)), key=["seq_q", "seq_k", "BLOCK_D", "CAUSAL"])
@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, THR, DELTA, LENS, KEYMASK, DQ,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom, stride_dqb, stride_dqh, stride_dqm,
    n_heads, group, seq_q, seq_k, head_dim, qk_scale, sm_scale, coff,
    HAS_LENS: tl.constexpr, HAS_KEYMASK: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    hk = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < head_dim
    row_ok = offs_m < seq_q
    q_ok = row_ok[:, None] & d_ok
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_ok, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :], mask=q_ok,
                 other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    thr = tl.load(THR + pid_bh * seq_q + offs_m, mask=row_ok, other=float("inf"))
    lse = tl.load(LSE + pid_bh * seq_q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * seq_q + offs_m, mask=row_ok, other=0.0)
    if HAS_LENS:
        klen = tl.minimum(tl.maximum(tl.load(LENS + b), 0), seq_k)
    else:
        klen = seq_k
    if CAUSAL:
        hi = tl.maximum(tl.minimum(klen, (pid_m + 1) * BLOCK_M + coff), 0)
    else:
        hi = klen
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_ok = (offs_n[:, None] < klen) & d_ok
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = _scores(q, k, qk_scale, PRECISION)
        on = _valid(offs_m, offs_n, _key_ok(KEYMASK + b * seq_k, offs_n, klen, HAS_KEYMASK), seq_q, coff, CAUSAL)
        on = on & (s >= thr[:, None])
        # No data-dependent skip (see the dK/dV kernel): off-support entries have p = 0.
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        p = tl.where(on, tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(_operand(ds, k, UPCAST), k, input_precision=PRECISION)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_ok)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
def _check(q: Tensor, k: Tensor, v: Tensor, key_lengths: Optional[Tensor], key_mask: Optional[Tensor]) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, length, head_dim), got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on one device")
    B, Hq, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"q, k and v must have one batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[-1] != D:
        raise ValueError(f"q and k must have the same head_dim, got {D} and {k.shape[-1]}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be between 1 and {MAX_HEAD_DIM}, got {D}")
    if Hq % k.shape[1]:
        raise ValueError(f"k has {k.shape[1]} heads, which does not divide q's {Hq} heads (GQA)")
    if key_lengths is not None:
        if not isinstance(key_lengths, Tensor) or key_lengths.dtype not in (torch.int32, torch.int64):
            raise TypeError("key_lengths must be an int32/int64 tensor of shape (batch,)")
        if key_lengths.shape != (B,):
            raise ValueError(f"key_lengths must have shape ({B},), got {tuple(key_lengths.shape)}")
        if key_lengths.device != q.device:
            raise ValueError(f"key_lengths is on {key_lengths.device} but q is on {q.device}")
    if key_mask is not None:
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            raise TypeError("key_mask must be a boolean tensor of shape (batch, S) (True = attend)")
        if key_mask.shape != (B, k.shape[2]):
            raise ValueError(f"key_mask must have shape ({B}, {k.shape[2]}), got {tuple(key_mask.shape)}")
        if key_mask.device != q.device:
            raise ValueError(f"key_mask is on {key_mask.device} but q is on {q.device}")


def key_means(k: Tensor, key_lengths: Optional[Tensor], key_mask: Optional[Tensor],
              is_causal: bool) -> Tuple[Tensor, Tensor]:
    """``(means, counts)`` behind the thresholds: float32 means of the valid keys (B, Hk, R, D) and
    their int32 counts (B, R). Under a causal mask prefix means and counts (R = S; query ``i``
    reads row ``min(i, S - 1)``), else over all valid keys (R = 1)."""
    B, _, S, _ = k.shape
    kf = k.float()
    if key_lengths is None and key_mask is None:
        if is_causal:
            counts = torch.arange(1, S + 1, device=k.device, dtype=torch.int32).expand(B, S)
            return kf.cumsum(2).div_(counts[0].view(S, 1).float()).contiguous(), counts.contiguous()
        return kf.mean(2, keepdim=True).contiguous(), torch.full((B, 1), S, device=k.device, dtype=torch.int32)
    valid = torch.ones(B, S, device=k.device, dtype=torch.bool)
    if key_lengths is not None:
        valid = valid & (torch.arange(S, device=k.device) < key_lengths.view(B, 1))
    if key_mask is not None:
        valid = valid & key_mask
    w = valid.to(torch.float32).view(B, 1, S, 1)
    if is_causal:
        sums, counts = (kf * w).cumsum(2), valid.to(torch.int32).cumsum(1)
    else:
        sums, counts = (kf * w).sum(2, keepdim=True), valid.to(torch.int32).sum(1, keepdim=True)
    means = sums.div_(counts.clamp_min(1).to(torch.float32).view(B, 1, -1, 1))
    return means.contiguous(), counts.to(torch.int32).contiguous()


def _flags(q: Tensor):
    upcast = INTERPRET and q.dtype == torch.bfloat16  # the interpreter has no bfloat16 tl.dot
    precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"
    return upcast, precision


def _launch(kernel, grid, args, **meta):
    if INTERPRET:
        meta.update(_INTERPRET_BLOCKS)
        kernel[grid(meta)](*args, **meta)
    else:
        kernel[grid](*args, **meta)


def _key_mask_bytes(key_mask: Optional[Tensor], unused: Tensor) -> Tensor:
    """The key mask as contiguous bytes, or any pointer (not read) without one."""
    return unused if key_mask is None else key_mask.contiguous().view(torch.uint8)


def _last_dim_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def flash_ev_softmax_attention_forward(
    q: Tensor, k: Tensor, v: Tensor, key_lengths: Optional[Tensor] = None, is_causal: bool = False,
    scale: Optional[float] = None, key_mask: Optional[Tensor] = None, causal_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse2, thr2)``: the attention output (q's shape and dtype), and per query the
    log-sum-exp and the threshold actually used, float32 (B, Hq, L) in log2 units (multiply by
    ``ln 2`` for natural units); the backward needs both exactly as saved."""
    _check(q, k, v, key_lengths, key_mask)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    B, Hq, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else float(scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, L), device=q.device, dtype=torch.float32)
    thr = torch.empty_like(lse)
    if q.numel() == 0:
        return out, lse, thr
    kmean, counts = key_means(k, key_lengths, key_mask, is_causal)
    upcast, precision = _flags(q)
    lens = key_lengths if key_lengths is not None else lse  # unused pointer when HAS_LENS is False
    keymask = _key_mask_bytes(key_mask, lse)
    args = (q, k, v, kmean, counts, lens, keymask, out, lse, thr,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
            kmean.stride(0), kmean.stride(1), kmean.stride(2), counts.stride(0),
            Hq, Hq // Hk, L, S, D, scale * LOG2E, int(causal_offset))
    grid = lambda meta: (triton.cdiv(L, meta["BLOCK_M"]), B * Hq)
    _launch(_attn_fwd_kernel, grid, args, HAS_LENS=key_lengths is not None, HAS_KEYMASK=key_mask is not None,
            CAUSAL=bool(is_causal),
            UPCAST=upcast, PRECISION=precision, BLOCK_D=max(16, triton.next_power_of_2(D)))
    return out, lse, thr


def flash_ev_softmax_attention_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse2: Tensor, thr2: Tensor,
    key_lengths: Optional[Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
    key_mask: Optional[Tensor] = None, causal_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` from the forward's ``out, lse2, thr2`` (same arguments as the forward)."""
    q, k, v, grad_out = (_last_dim_contiguous(t) for t in (q, k, v, grad_out.to(q.dtype)))
    B, Hq, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else float(scale)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = (grad_out.float() * out.float()).sum(-1).contiguous()
    upcast, precision = _flags(q)
    lens = key_lengths if key_lengths is not None else lse2
    keymask = _key_mask_bytes(key_mask, lse2)
    flags = dict(HAS_LENS=key_lengths is not None, HAS_KEYMASK=key_mask is not None, CAUSAL=bool(is_causal),
                 UPCAST=upcast, PRECISION=precision, BLOCK_D=max(16, triton.next_power_of_2(D)))
    common = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
              v.stride(0), v.stride(1), v.stride(2), grad_out.stride(0), grad_out.stride(1), grad_out.stride(2))
    _launch(_attn_bwd_dkdv_kernel, lambda meta: (triton.cdiv(S, meta["BLOCK_N"]), B * Hk),
            (q, k, v, grad_out, lse2, thr2, delta, lens, keymask, dk, dv, *common,
             dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
             Hq, Hk, Hq // Hk, L, S, D, scale * LOG2E, scale, int(causal_offset)), **flags)
    _launch(_attn_bwd_dq_kernel, lambda meta: (triton.cdiv(L, meta["BLOCK_M"]), B * Hq),
            (q, k, v, grad_out, lse2, thr2, delta, lens, keymask, dq, *common,
             dq.stride(0), dq.stride(1), dq.stride(2),
             Hq, Hq // Hk, L, S, D, scale * LOG2E, scale, int(causal_offset)), **flags)
    return dq, dk, dv
