"""Memory-efficient exact ev-softmax attention in PyTorch: blockwise over queries and keys, never L x S.

ev-softmax (ev-softmax paper, Eq. 7) keeps the keys whose score is at least the mean score over
the valid keys, and the mean is linear in the keys:

    mean_j (q . k_j) * scale = q . mean_j(k_j) * scale          (+ mean_j b_ij with a float bias)

so each query's threshold is known before any score is computed: the plain mean of the keys,
their prefix mean under a causal mask, the mean over valid keys under a key-padding mask, and
``(M @ K) / M.sum(-1)`` for a general boolean mask ``M`` (one blockwise pass). The attention is
then softmax restricted to ``{j valid : s_ij >= threshold_i}``, computed with FlashAttention's
online-softmax recurrence over key blocks (running max ``m``, sum ``l``, output ``o``), one query
block at a time. Backward (FlashAttention-2) recomputes each block's scores and support from the
saved ``q, k, v``, output and log-sum-exp; the threshold carries no gradient (the support
indicator is piecewise constant, Eq. 9). Extra memory: O(L) per head (output, log-sum-exp,
threshold) plus one block of scores.

Rounding: the threshold here is ``q . mean(k)``, the dense path's is ``mean(q . k)``; they agree
to rounding, so an entry within rounding of its row's mean can fall on different sides. Should
rounding put the threshold above every valid score of a row (e.g. a single valid key), that row
is redone with the threshold capped at its maximum valid score, as the dense ev-softmax caps it
(this check reads one boolean per query block on the host: the one host read of this module,
inside the registered op ``sparsenorm::ev_softmax_attention_blockwise``, so it breaks no graph).

The op and its autograd are in :mod:`sparsenorm.kernels.ops.evidential_attention`, the choice of
kernel in :mod:`sparsenorm.kernels.attention.dispatch`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

BLOCK_Q = 256
BLOCK_K = 512


def _rows_cols(t: Optional[Tensor], i0: int, i1: int, j0: int, j1: int) -> Optional[Tensor]:
    """Block ``[i0:i1, j0:j1]`` of a mask broadcastable to (..., L, S); size-1 dims stay as they are."""
    if t is None:
        return None
    if t.shape[-2] != 1:
        t = t[..., i0:i1, :]
    if t.shape[-1] != 1:
        t = t[..., j0:j1]
    return t


def _valid_block(keep: Optional[Tensor], causal: bool, i0: int, i1: int, j0: int, j1: int,
                 device, causal_offset: int = 0) -> Optional[Tensor]:
    valid = _rows_cols(keep, i0, i1, j0, j1)
    if causal and j1 - 1 > i0 + causal_offset:  # some key of the block lies after some query's last key
        rows = torch.arange(i0, i1, device=device).unsqueeze(-1) + causal_offset
        tri = torch.arange(j0, j1, device=device) <= rows
        valid = tri if valid is None else valid & tri
    return valid


def threshold(q: Tensor, k: Tensor, keep: Optional[Tensor], bias: Optional[Tensor], causal: bool,
              scale: float, block_k: int = BLOCK_K, causal_offset: int = 0) -> Tuple[Tensor, Tensor]:
    """``(threshold, count)``: each query's mean valid score ``(..., L, 1)`` and its number of valid keys.

    ``q`` (..., L, E), ``k`` (..., S, E); ``keep`` a boolean mask broadcastable to (..., L, S) or
    None; ``bias`` a finite float mask likewise; ``causal``: query ``i`` sees keys
    ``j <= i + causal_offset`` (0: SDPA's top-left ``is_causal``; ``S - L``: bottom-right).
    """
    L, S = q.shape[-2], k.shape[-2]
    dt = q.dtype
    rows_independent = keep is None or keep.shape[-2] == 1
    if bias is None and rows_independent:
        if keep is None:
            keys, ones = k, None
        else:  # key padding: zero the padded keys, count the valid ones
            w = keep.to(dt).transpose(-2, -1)  # (..., S, 1)
            keys, ones = k * w, w
        if causal:  # prefix sums; query i sees keys 0..min(i + offset, S-1) (none where i + offset < 0)
            last = torch.arange(L, device=q.device) + causal_offset
            idx = last.clamp(0, S - 1)
            ksum = keys.cumsum(-2)[..., idx, :]
            count = (torch.arange(1, S + 1, device=q.device, dtype=dt).unsqueeze(-1) if ones is None
                     else ones.cumsum(-2))[..., idx, :]
            if causal_offset < 0:
                count = count * (last >= 0).to(dt).unsqueeze(-1)
        else:
            ksum = keys.sum(-2, keepdim=True)
            count = (torch.full((1, 1), float(S), dtype=dt, device=q.device) if ones is None
                     else ones.sum(-2, keepdim=True))
        # q . (sum of the keys) / count: the division on the (..., L, 1) dot products, not on the keys
        thr = (q * ksum).sum(-1, keepdim=True) * scale / count.clamp_min(1)
        return thr, count.expand_as(thr)
    # General mask or bias: mask-weighted key sums (M @ K), counts and bias sums, block by block.
    ksum = count = bsum = None
    for j0 in range(0, S, block_k):
        j1 = min(j0 + block_k, S)
        valid = _valid_block(keep, causal, 0, L, j0, j1, q.device, causal_offset)
        w = torch.ones((1, j1 - j0), dtype=dt, device=q.device) if valid is None else valid.to(dt)
        w = w.expand(*w.shape[:-2], L, j1 - j0)
        part = w @ k[..., j0:j1, :]
        ksum = part if ksum is None else ksum + part
        c = w.sum(-1, keepdim=True)
        count = c if count is None else count + c
        if bias is not None:
            b = (_rows_cols(bias, 0, L, j0, j1) * w).sum(-1, keepdim=True)
            bsum = b if bsum is None else bsum + b
    thr = (q * ksum).sum(-1, keepdim=True) * scale / count.clamp_min(1)
    if bsum is not None:
        thr = thr + bsum / count.clamp_min(1)
    return thr, count


def score_block(q_blk: Tensor, k_blk: Tensor) -> Tensor:
    """``q_blk @ k_blk^T`` (``q_blk`` pre-scaled): every score of the forward, the row maxima and the
    backward comes from here, so all three round alike."""
    return torch.matmul(q_blk, k_blk.transpose(-2, -1))


def _support_scores(q_blk: Tensor, k_blk: Tensor, bias_blk: Optional[Tensor], valid: Optional[Tensor],
                    thr_blk: Tensor) -> Tensor:
    """The block's scores minus the threshold on the support, ``-inf`` off it (``q_blk`` is pre-scaled).

    Shifting each row by its threshold changes no softmax, and ``s - thr > -smallest_normal`` is
    ``s >= thr`` without a boolean temporary (as in ``sparsenorm.evidential._support_logits``).
    """
    c = score_block(q_blk, k_blk)
    if bias_blk is not None:
        c = c.add_(bias_blk) if torch.broadcast_shapes(c.shape, bias_blk.shape) == c.shape else c + bias_blk
    c.sub_(thr_blk)
    F.threshold_(c, -torch.finfo(c.dtype).smallest_normal, float("-inf"))
    if valid is not None:
        c.masked_fill_(~valid, float("-inf"))
    return c


def _forward_block(q_blk, k, v, keep, bias, causal, thr_blk, i0, i1, block_k, count_support, causal_offset=0):
    """Online softmax over the key blocks for one query block: ``(m, l, o, support count)``, with
    ``m`` the running maximum of ``s - thr`` over the support."""
    S = k.shape[-2]
    m = l = o = n_support = None
    for j0 in range(0, S, block_k):
        if causal and j0 > i1 - 1 + causal_offset:
            break
        j1 = min(j0 + block_k, S)
        valid = _valid_block(keep, causal, i0, i1, j0, j1, q_blk.device, causal_offset)
        c = _support_scores(q_blk, k[..., j0:j1, :], _rows_cols(bias, i0, i1, j0, j1), valid, thr_blk)
        if count_support:
            n = (c != float("-inf")).sum(-1, keepdim=True)
            n_support = n if n_support is None else n_support + n
        m_blk = c.amax(-1, keepdim=True)
        m_new = m_blk if m is None else torch.maximum(m, m_blk)
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
        p = c.sub_(m_safe).exp_()
        pv = torch.matmul(p, v[..., j0:j1, :])
        if m is None:
            l, o = p.sum(-1, keepdim=True), pv
        else:
            corr = torch.exp(m - m_safe)
            l = l.mul_(corr).add_(p.sum(-1, keepdim=True))
            o = o.mul_(corr).add_(pv)
        m = m_new
    if m is None:  # no key block is visible to this query block (bottom-right causal, L > S)
        shape = q_blk.shape[:-1] + (1,)
        m, l = q_blk.new_full(shape, float("-inf")), q_blk.new_zeros(shape)
        o = q_blk.new_zeros(q_blk.shape[:-1] + (v.shape[-1],))
        n_support = q_blk.new_zeros(shape, dtype=torch.long) if count_support else None
    return m, l, o, n_support


def _block_max(q_blk, k, v, keep, bias, causal, i0, i1, block_k, causal_offset=0):
    """Each row's maximum valid score (-inf if none), from the same block products as the passes."""
    S = k.shape[-2]
    m = None
    for j0 in range(0, S, block_k):
        if causal and j0 > i1 - 1 + causal_offset:
            break
        j1 = min(j0 + block_k, S)
        valid = _valid_block(keep, causal, i0, i1, j0, j1, q_blk.device, causal_offset)
        s = score_block(q_blk, k[..., j0:j1, :])
        bias_blk = _rows_cols(bias, i0, i1, j0, j1)
        if bias_blk is not None:
            s = s + bias_blk
        if valid is not None:
            s = s.masked_fill(~valid, float("-inf"))
        b = s.amax(-1, keepdim=True)
        m = b if m is None else torch.maximum(m, b)
    return m


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], bias: Optional[Tensor], causal: bool,
            scale: float, count_support: bool, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
            causal_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Tensor]:
    """``(out, lse, thr, support, count)`` of blockwise ev-softmax attention.

    ``q`` (..., L, E), ``k`` (..., S, E), ``v`` (..., S, Ev) with one batch shape (...); ``keep``
    boolean (True = attend) and ``bias`` (finite) broadcastable to (..., L, S); ``causal``: query
    ``i`` sees keys ``j <= i + causal_offset`` (0: SDPA's top-left mask). ``lse`` and ``thr``
    (..., L, 1) are what :func:`backward` needs (natural units, scores of ``q * scale``);
    ``support`` (..., L) counts the attended keys when ``count_support`` (else None); ``count``
    (..., L) the valid keys. Rows with no valid key: 0.
    """
    L = q.shape[-2]
    qs = q * scale  # scores are qs @ k^T, in the forward and in the backward alike
    thr, count = threshold(qs, k, keep, bias, causal, 1.0, block_k, causal_offset)
    outs, lses, supports = [], [], []
    for i0 in range(0, L, block_q):
        i1 = min(i0 + block_q, L)
        q_blk, thr_blk = qs[..., i0:i1, :], thr[..., i0:i1, :]
        args = (q_blk, k, v, keep, bias, causal)
        m, l, o, n = _forward_block(*args, thr_blk, i0, i1, block_k, count_support, causal_offset)
        stranded = (l == 0) & (count[..., i0:i1, :] > 0)  # rounding put the mean above the max
        if bool(stranded.any()):
            thr_blk = torch.where(stranded, _block_max(*args, i0, i1, block_k, causal_offset), thr_blk)
            thr[..., i0:i1, :] = thr_blk
            m, l, o, n = _forward_block(*args, thr_blk, i0, i1, block_k, count_support, causal_offset)
        empty = l == 0
        outs.append(torch.where(empty, 0.0, o / l.masked_fill(empty, 1.0)))
        # log-sum-exp of s - thr; +inf for rows with no key, so every recomputed weight is 0.
        lses.append(torch.where(empty, float("inf"), m + torch.log(l)))
        if count_support:
            supports.append(n)
    out = torch.cat(outs, -2)
    lse = torch.cat(lses, -2)
    count = count.expand_as(lse).squeeze(-1)
    support = torch.cat(supports, -2).squeeze(-1) if count_support else None
    return out, lse, thr, support, count


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, thr: Tensor,
             keep: Optional[Tensor], bias: Optional[Tensor], causal: bool, scale: float,
             block_q: int = BLOCK_Q, block_k: int = BLOCK_K, causal_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` (FlashAttention-2) from :func:`forward`'s ``out, lse, thr``; the threshold
    carries no gradient and ``bias`` none is computed for."""
    qs = q * scale
    L, S = qs.shape[-2], k.shape[-2]
    dq = torch.zeros_like(qs)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for i0 in range(0, L, block_q):
        i1 = min(i0 + block_q, L)
        q_blk, do_blk = qs[..., i0:i1, :], grad_out[..., i0:i1, :]
        delta = (do_blk * out[..., i0:i1, :]).sum(-1, keepdim=True)
        lse_blk, thr_blk = lse[..., i0:i1, :], thr[..., i0:i1, :]
        dq_blk = dq[..., i0:i1, :]
        for j0 in range(0, S, block_k):
            if causal and j0 > i1 - 1 + causal_offset:
                break
            j1 = min(j0 + block_k, S)
            k_blk, v_blk = k[..., j0:j1, :], v[..., j0:j1, :]
            valid = _valid_block(keep, causal, i0, i1, j0, j1, qs.device, causal_offset)
            p = _support_scores(q_blk, k_blk, _rows_cols(bias, i0, i1, j0, j1), valid, thr_blk)
            p = p.sub_(lse_blk).exp_()
            dv[..., j0:j1, :] += torch.matmul(p.transpose(-2, -1), do_blk)
            ds = torch.matmul(do_blk, v_blk.transpose(-2, -1)).sub_(delta).mul_(p)  # d(loss)/d(qs k^T)
            dq_blk += torch.matmul(ds, k_blk)
            dk[..., j0:j1, :] += torch.matmul(ds.transpose(-2, -1), q_blk)
    return dq.mul_(scale), dk, dv


def _off_support(s: Tensor, thr: Tensor) -> Tensor:
    """``s - thr`` on the support ``s >= thr``, ``-inf`` off it (one subtraction and one in-place
    threshold, as :func:`_support_scores`; softmax does not see the shift)."""
    c = s - thr
    return F.threshold_(c, -torch.finfo(c.dtype).smallest_normal, float("-inf"))


def few_queries(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor], causal: bool, causal_offset: int,
                scale: float, count_support: bool = False) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(out, support, valid)``: ev-softmax attention for a few queries over many keys (decoding
    with a key/value cache, a short chunk of prefill), differentiable through torch's autograd.

    ``q`` (B, Hq, L, E), ``k`` (B, Hk, S, E), ``v`` (B, Hk, S, Ev) with ``Hk`` dividing ``Hq``;
    ``key_mask`` (B, S) boolean (True = there) or None; ``causal``: query ``i`` sees keys
    ``j <= i + causal_offset``. The ``G = Hq / Hk`` query heads of a key/value head are stacked as
    ``G L`` rows against that head's keys, so grouped-query attention reads each key and value once
    and copies neither (the dense and blockwise paths repeat them per query head). One pass over
    the keys gives the scores ``s = (q scale) k^T``; the threshold is their mean over the valid keys
    (Eq. 7: ``mean_j s_ij = q_i . mean_j k_j scale``, from the same pass), capped at the row's
    largest valid score as the dense ev-softmax caps it; the weights are the softmax of the scores
    on ``{j valid : s_ij >= threshold}``, zero elsewhere, and ``out = P V``. ``support`` / ``valid``
    (B, Hq, L): the attended and the valid keys per query when ``count_support``. A query with no
    valid key gives zeros (and zero gradient). The support indicator carries no gradient (Eq. 9).

    On CPU the values off the support are multiplied by zero, not skipped: for a handful of query
    rows ``P V`` is a matrix-vector product at memory speed, and gathering the support's rows of
    ``V`` (about half of them, for ev-softmax's mean threshold) costs more than reading them all.
    """
    B, Hq, L, E = q.shape
    Hk, S = k.shape[1], k.shape[2]
    rows = (Hq // Hk) * L
    s = torch.matmul((q * scale).reshape(B, Hk, rows, E), k.transpose(-2, -1))  # (B, Hk, G L, S)
    valid = None if key_mask is None else key_mask.view(B, 1, 1, S)
    if causal and causal_offset < S - 1:  # some query does not see every key; row g L + i is query i
        last = torch.arange(L, device=q.device).repeat(Hq // Hk) + causal_offset
        tri = torch.arange(S, device=q.device) <= last.unsqueeze(-1)
        valid = tri if valid is None else valid & tri
    if valid is None:
        thr = torch.minimum(s.mean(-1, keepdim=True), s.amax(-1, keepdim=True))
        p = torch.softmax(_off_support(s, thr), -1)
        out, count, empty = torch.matmul(p, v), None, None
    else:
        # Few element-wise passes over the scores (each is a pass at memory speed here): the valid
        # scores' sum as a matrix-vector product, the keys that are not there pushed to the
        # dtype's lowest finite value by one broadcast add (finite, so that a row with no valid
        # key gives no NaN, only a row whose output is zeroed), one fill off the support.
        w = valid.to(s.dtype)
        count = w.sum(-1, keepdim=True)
        mean = torch.matmul(s, w.transpose(-2, -1)) / count.clamp_min(1) if w.shape[-2] == 1 else \
            (s * w).sum(-1, keepdim=True) / count.clamp_min(1)
        s = s + (w - 1).mul_(torch.finfo(s.dtype).max)  # + 0 where there, + finfo.min where not
        thr = torch.minimum(mean, s.amax(-1, keepdim=True))
        p = torch.softmax(_off_support(s, thr), -1)
        empty = count == 0  # no valid key: zeros
        out = torch.matmul(p, v).masked_fill(empty, 0.0)
    out = out.reshape(B, Hq, L, v.shape[-1])
    if not count_support:
        return out, None, None
    n_support = (p > 0).sum(-1) if empty is None else ((p > 0) & ~empty).sum(-1)
    n_valid = (torch.full((B, Hq, L), S, dtype=torch.long, device=q.device) if count is None
               else count.to(torch.long).expand(B, Hk, rows, 1).reshape(B, Hq, L))
    n_support = n_support.expand(B, Hk, rows).reshape(B, Hq, L)
    return out, n_support, n_valid
