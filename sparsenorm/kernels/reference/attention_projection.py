"""Memory-efficient exact sparsemax / 1.5-entmax attention: blockwise, never the L x S matrix.

Both maps give each query row ``p_j = [s_j - tau]_+`` (sparsemax) or ``p_j = [(s_j - tau) / 2]_+^2``
(1.5-entmax, in units of the scores ``s``; equal to the entmax package's ``[s/2 - tau']_+^2``),
with the row's threshold ``tau`` the root of ``f(tau) = sum_j p_j(tau) - 1``. Unlike ev-softmax's
mean, ``tau`` is not linear in the keys, so it is searched (AdaSplash, Goncalves et al. 2025, does
the same on GPU with bisection and Halley steps); here the search is the exact iteration of
:func:`sparsenorm.kernels.reference.projection.threshold_step`, whose only inputs are the row sums
``n = |{s > tau}|``, ``s1 = sum (s - tau)_+`` and ``s2 = sum (s - tau)_+^2``, and those can be
accumulated over key blocks. For each block of queries:

1. one pass over the key blocks for the row maximum ``m`` (the scores are shifted by it, as the
   dense projection shifts them, and ``tau - m`` starts at the lower bound -1, resp. -2);
2. passes over the key blocks accumulating ``(n, s1, s2)`` at the current ``tau``, each followed by
   one threshold step (sparsemax: Newton from below, ``tau <- (sum_{s > tau} s - 1) / n``, exact as
   soon as the set ``{s > tau}`` stops shrinking; 1.5-entmax: the smaller root of the current set's
   quadratic, alternating with Newton steps from above). The step that stops returns the closed
   form on the final support (sparsemax ``tau = (sum_S s - 1) / |S|``; 1.5-entmax the root of
   ``sum_S ((s - tau) / 2)^2 = 1``, Peters et al. 2019), so the weights equal the dense path's to
   rounding. Typical rows stop after 3-8 passes; rows still iterating after :data:`MAX_STEPS`
   passes (adversarial inputs) are solved by the sort-based solver on their score rows (one
   ``block_q x S`` block of memory, once);
3. one output pass ``O = P V`` over the key blocks.

Backward (closed form, both Jacobians are ``diag(w) - w w^T / sum(w)`` on the support, with
``w = 1`` for sparsemax and ``w = sqrt(p)`` for 1.5-entmax): per query block, one pass over the key
blocks for ``c = sum_j w_j dp_j / sum_j w_j`` with ``dp = dO V^T``, and one pass for
``dS = w * (dp - c)``, ``dQ = scale dS K``, ``dK = scale dS^T Q``, ``dV = P^T dO``, recomputing the
scores of each block from the saved row maximum and threshold (as FlashAttention recomputes).

Memory: besides the inputs and outputs, O(L) per head (row maximum and threshold), the gradients'
size in the backward, and one ``block_q x block_k`` block of scores (per batch and head) at a time.

Layout: ``q`` (B, Hq, L, D), ``k`` (B, Hk, S, D), ``v`` (B, Hk, S, Dv), with ``Hk`` dividing ``Hq``
(grouped-query attention: query head ``h`` reads key/value head ``h // (Hq // Hk)``). Masks: ``keep``
boolean broadcastable to (B, Hq, L, S) (True = attend), ``key_lengths`` (B,) integer (keys
``j >= key_lengths[b]`` are not there), ``causal`` (query ``i`` sees keys ``j <= i``, top-left as
``F.scaled_dot_product_attention``), all combined. Not-there keys get exactly zero weight; a query
with no key there gives a zero row and zero gradient.

Host reads: the threshold search reads one boolean per pass and query block (are all rows done?),
to stop early; every other step is sync-free.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

from ..._validation import compute_dtype
from .projection import entmax15_tau_sort, sparsemax_tau_sort, sqrt_nonneg, threshold_step

KINDS = ("sparsemax", "entmax15")
BLOCK_Q = 256
BLOCK_K = 1024
MAX_STEPS = 64
"""Threshold steps before the rows still iterating are solved by sorting their score rows."""

_NEG_INF = float("-inf")


class _Grouped:
    """The inputs viewed with the query heads grouped by key head: queries (B, Hk, G, L, D), keys and
    values (B, Hk, 1, S, .), the keep mask broadcastable to (B, Hk, G, L, S), lengths (B, 1, 1, 1, 1)."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], key_lengths: Optional[Tensor],
                 causal: bool, scale: float):
        hq, hk = q.shape[1], k.shape[1]
        self.groups = hq // hk
        self.q = q.unflatten(1, (hk, self.groups))
        self.k, self.v = k.unsqueeze(2), v.unsqueeze(2)
        self.keep = None if keep is None else _group_mask(keep, hq, hk)
        self.lengths = None if key_lengths is None else key_lengths.view(-1, 1, 1, 1, 1)
        self.causal, self.scale = causal, scale
        self.L, self.S = q.shape[2], k.shape[2]

    def query_blocks(self, block_q: int) -> Iterator[Tuple[int, int]]:
        for i0 in range(0, self.L, block_q):
            yield i0, min(i0 + block_q, self.L)

    def key_blocks(self, i0: int, i1: int, block_k: int) -> Iterator[Tuple[int, int]]:
        """The key blocks that some query in ``[i0, i1)`` may see (under causal, not those after it)."""
        for j0 in range(0, self.S, block_k):
            if self.causal and j0 > i1 - 1:
                return
            yield j0, min(j0 + block_k, self.S)

    def valid(self, i0: int, i1: int, j0: int, j1: int) -> Optional[Tensor]:
        """Boolean (…, i1 - i0, j1 - j0), True where the key is there for the query; None = all."""
        device = self.q.device
        valid = None
        if self.keep is not None:
            valid = self.keep
            if valid.shape[-2] != 1:
                valid = valid[..., i0:i1, :]
            if valid.shape[-1] != 1:
                valid = valid[..., j0:j1]
        if self.lengths is not None:
            short = torch.arange(j0, j1, device=device) < self.lengths
            valid = short if valid is None else valid & short
        if self.causal and j1 - 1 > i0:  # some key of the block lies after some query of the block
            tri = torch.arange(j0, j1, device=device) <= torch.arange(i0, i1, device=device).unsqueeze(-1)
            valid = tri if valid is None else valid & tri
        return valid

    def scores(self, q_blk: Tensor, i0: int, i1: int, j0: int, j1: int) -> Tensor:
        """``(q k^T) * scale`` of the block (rounded as the dense path rounds), ``-inf`` where not there."""
        s = torch.matmul(q_blk, self.k[..., j0:j1, :].transpose(-2, -1)).mul_(self.scale)
        valid = self.valid(i0, i1, j0, j1)
        if valid is not None:  # every mask part broadcasts to the block, so fill in place
            s.masked_fill_(~valid, _NEG_INF)
        return s


def _group_mask(keep: Tensor, hq: int, hk: int) -> Tensor:
    """``keep`` broadcastable to (B, Hq, L, S) as (B, Hk, G, L, S)-broadcastable."""
    keep = keep.reshape((1,) * (4 - keep.dim()) + keep.shape)
    if keep.shape[1] == hq and hq > 1:
        return keep.unflatten(1, (hk, hq // hk))
    return keep.unsqueeze(2)


def _weights(z: Tensor, tau: Tensor, kind: str) -> Tensor:
    """In place: ``z <- [z - tau]_+`` (sparsemax) or ``[(z - tau) / 2]_+^2`` (1.5-entmax)."""
    z.sub_(tau).clamp_min_(0)
    return z.mul_(0.5).square_() if kind == "entmax15" else z


def _block_weights(g: _Grouped, q_blk, shift, tau, i0, i1, j0, j1, kind) -> Tensor:
    return _weights(g.scores(q_blk, i0, i1, j0, j1).sub_(shift), tau, kind)


def _row_max(g: _Grouped, q_blk: Tensor, i0: int, i1: int, block_k: int) -> Tensor:
    """Each row's maximum score over the keys there (``-inf`` if none)."""
    m = torch.full((*q_blk.shape[:-1], 1), _NEG_INF, dtype=q_blk.dtype, device=q_blk.device)
    for j0, j1 in g.key_blocks(i0, i1, block_k):
        m = torch.maximum(m, g.scores(q_blk, i0, i1, j0, j1).amax(-1, keepdim=True))
    return m


def _search_threshold(g: _Grouped, q_blk: Tensor, shift: Tensor, empty: Tensor, i0: int, i1: int, kind: str,
                      block_k: int) -> Tensor:
    """Each row's exact threshold relative to ``shift`` (its maximum; 0 for the ``empty`` rows, those
    with no key there), by passes over the key blocks."""
    entmax = kind == "entmax15"
    tau = torch.full_like(shift, -2.0 if entmax else -1.0)  # lower bound: p_max <= 1
    prev_n = torch.full_like(shift, -1.0)
    was_root = torch.zeros(shift.shape, dtype=torch.bool, device=shift.device)
    finished = empty  # rows with no key there: every weight is 0 whatever tau is
    result = torch.zeros_like(shift)
    for _ in range(MAX_STEPS):
        s1 = s2 = n = None
        for j0, j1 in g.key_blocks(i0, i1, block_k):
            d = g.scores(q_blk, i0, i1, j0, j1).sub_(shift).sub_(tau).clamp_min_(0)
            parts = [d.sum(-1, keepdim=True), torch.linalg.vector_norm(d, dim=-1, keepdim=True).square_() if entmax
                     else None, d.sign_().sum(-1, keepdim=True)]
            if s1 is None:
                s1, s2, n = parts
            else:
                s1, n = s1 + parts[0], n + parts[2]
                s2 = s2 + parts[1] if entmax else None
        final, done, new_tau, was_root = threshold_step(kind, tau, s1, s2, n, prev_n, was_root)
        result = torch.where(done & ~finished, final, result)
        finished = finished | done
        if bool(finished.all()):
            return result
        tau, prev_n = new_tau, n
    # Rows still iterating (adversarial inputs): sort their rows, built from the key blocks once.
    z = torch.cat([g.scores(q_blk, i0, i1, j0, j1) for j0, j1 in g.key_blocks(i0, i1, block_k)], -1).sub_(shift)
    exact = entmax15_tau_sort(z * 0.5) * 2 if entmax else sparsemax_tau_sort(z)
    return torch.where(finished, result, exact)


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], key_lengths: Optional[Tensor], causal: bool,
            scale: float, kind: str, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, shift, tau)``: the attention output (B, Hq, L, Dv) in ``q``'s dtype and each row's
    maximum score and threshold relative to it (B, Hq, L), in the compute dtype, for the backward."""
    cdt = compute_dtype(q)
    g = _Grouped(q.to(cdt), k.to(cdt), v.to(cdt), keep, key_lengths, causal, scale)
    B, Hq, L, _ = q.shape
    out = q.new_zeros((B, Hq, L, v.shape[-1]), dtype=cdt).unflatten(1, g.q.shape[1:3])
    shift = q.new_zeros((B, Hq, L, 1), dtype=cdt).unflatten(1, g.q.shape[1:3])
    tau = torch.zeros_like(shift)
    for i0, i1 in g.query_blocks(block_q):
        q_blk = g.q[..., i0:i1, :]
        m = _row_max(g, q_blk, i0, i1, block_k)
        empty = m == _NEG_INF
        m_safe = m.masked_fill(empty, 0.0)
        t = _search_threshold(g, q_blk, m_safe, empty, i0, i1, kind, block_k)
        o = None
        for j0, j1 in g.key_blocks(i0, i1, block_k):
            pv = torch.matmul(_block_weights(g, q_blk, m_safe, t, i0, i1, j0, j1, kind), g.v[..., j0:j1, :])
            o = pv if o is None else o.add_(pv)
        out[..., i0:i1, :] = o
        shift[..., i0:i1, :] = m_safe
        tau[..., i0:i1, :] = t
    return out.flatten(1, 2).to(q.dtype), shift.flatten(1, 2).squeeze(-1), tau.flatten(1, 2).squeeze(-1)


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], key_lengths: Optional[Tensor],
             causal: bool, scale: float, kind: str, shift: Tensor, tau: Tensor, block_q: int = BLOCK_Q,
             block_k: int = BLOCK_K) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` from the forward's ``shift`` and ``tau`` (closed form, see the module notes)."""
    cdt = compute_dtype(q)
    g = _Grouped(q.to(cdt), k.to(cdt), v.to(cdt), keep, key_lengths, causal, scale)
    hk, groups = g.q.shape[1:3]
    do = grad_out.to(cdt).unflatten(1, (hk, groups))
    shift = shift.to(cdt).unflatten(1, (hk, groups)).unsqueeze(-1)
    tau = tau.to(cdt).unflatten(1, (hk, groups)).unsqueeze(-1)
    dq = torch.zeros_like(g.q)
    dk = torch.zeros_like(g.k.squeeze(2))
    dv = torch.zeros_like(g.v.squeeze(2))
    entmax = kind == "entmax15"
    for i0, i1 in g.query_blocks(block_q):
        q_blk, do_blk = g.q[..., i0:i1, :], do[..., i0:i1, :]
        m_blk, t_blk = shift[..., i0:i1, :], tau[..., i0:i1, :]

        def weights(j0, j1):
            return _block_weights(g, q_blk, m_blk, t_blk, i0, i1, j0, j1, kind)

        def jacobian_weights(p):  # w = 1{p > 0} resp. sqrt(p); in place for sparsemax
            return sqrt_nonneg(p) if entmax else p.sign_()

        def dp(j0, j1):  # d(loss)/d(weights) of the block
            return torch.matmul(do_blk, g.v[..., j0:j1, :].transpose(-2, -1))

        w_sum = wdp_sum = 0
        for j0, j1 in g.key_blocks(i0, i1, block_k):
            w = jacobian_weights(weights(j0, j1))
            w_sum = w_sum + w.sum(-1, keepdim=True)
            wdp_sum = wdp_sum + dp(j0, j1).mul_(w).sum(-1, keepdim=True)
        c = wdp_sum / torch.where(w_sum > 0, w_sum, torch.ones_like(w_sum))
        for j0, j1 in g.key_blocks(i0, i1, block_k):
            p = weights(j0, j1)
            dv[..., j0:j1, :] += torch.matmul(p.transpose(-2, -1), do_blk).sum(2)
            ds = dp(j0, j1).sub_(c).mul_(jacobian_weights(p))  # d(loss)/d(scores), zero off the support
            dq[..., i0:i1, :] += torch.matmul(ds, g.k[..., j0:j1, :])
            dk[..., j0:j1, :] += torch.matmul(ds.transpose(-2, -1), q_blk).sum(2)
    return (dq.mul_(scale).flatten(1, 2).to(q.dtype), dk.mul_(scale).to(k.dtype), dv.to(v.dtype))
