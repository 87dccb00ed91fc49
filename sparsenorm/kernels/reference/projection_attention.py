"""Memory-efficient sparsemax / 1.5-entmax / alpha-entmax attention: blockwise, never the L x S matrix.

Both maps give each query row ``p_j = [s_j - tau]_+`` (sparsemax) or ``p_j = [(s_j - tau) / 2]_+^2``
(1.5-entmax, in units of the scores ``s``; equal to the entmax package's ``[s/2 - tau']_+^2``),
with the row's threshold ``tau`` the root of ``f(tau) = sum_j p_j(tau) - 1``. Unlike ev-softmax's
mean, ``tau`` is not linear in the keys, so it is searched (AdaSplash, Goncalves et al. 2025, does
the same on GPU with bisection and Halley steps); here the search is the exact iteration of
:func:`sparsenorm.kernels.reference.projection.threshold_step`, whose only inputs are the row sums
``n = |{s > tau}|``, ``s1 = sum (s - tau)_+`` and ``s2 = sum (s - tau)_+^2``, and those can be
accumulated over key blocks. For each block of queries:

1. one pass over the key blocks for the row maximum ``m`` (the scores are shifted by it, as the
   dense projection shifts them, and ``tau - m`` starts at the lower bound -1, resp. -2); for
   sparsemax the same pass keeps each row's :data:`SPARSEMAX_START_TOP` (K) largest scores and
   ``tau`` starts at ``max_{k <= K} (sum of the k largest - 1) / k`` (each term a lower bound, the
   threshold being their maximum over all ``k``; exact when the support has at most K keys, and
   then the first step, told that ``k``, confirms it);
2. passes over the key blocks accumulating ``(n, s1, s2)`` at the current ``tau``, each followed by
   one threshold step (sparsemax: Newton from below, ``tau <- (sum_{s > tau} s - 1) / n``, exact as
   soon as the set ``{s > tau}`` stops shrinking; 1.5-entmax: the smaller root of the current set's
   quadratic, alternating with Newton steps from above). The step that stops returns the closed
   form on the final support (sparsemax ``tau = (sum_S s - 1) / |S|``; 1.5-entmax the root of
   ``sum_S ((s - tau) / 2)^2 = 1``, Peters et al. 2019), so the weights equal the dense path's to
   rounding. On random Gaussian q, k (D = 64, L = S = 1024 and 4096) a query block of 256 stops
   after 7 steps for 1.5-entmax, about 2.2 for sparsemax (7 from -1): every row of the block must
   be done (``python -m benchmarks.attention_passes``); rows still iterating after :data:`MAX_STEPS`
   passes (adversarial inputs) are solved by the sort-based solver on their score rows (one
   ``block_q x S`` block of memory, once);
3. one output pass ``O = P V`` over the key blocks.

Each pass needs the block's scores: when they span at most :data:`CACHE_KEY_BLOCKS` key blocks they
are computed once (tile by tile, the products a recomputing pass makes) and kept for all passes of
the block, forward and backward, so a forward makes one ``Q K^T`` product per tile instead of
``k + 2`` (``k`` search steps, about 7 on random inputs); beyond, every pass recomputes them.

alpha-entmax (``kind='entmax_bisect'``, ``p = [(alpha - 1) (s - m) - tau]_+^(1 / (alpha - 1))``)
has no finite exact iteration; it reproduces ``sparsenorm.entmax_bisect`` instead: ``n_iter``
halvings of the same bracket ``[-1, -(1/S)^(alpha - 1)]`` (``S`` all keys, as the dense path counts
a row), one pass over the key blocks each, then the weights at the last midpoint divided by their
sum (accumulated in the output pass). Its backward uses ``w = p^(2 - alpha)``.

Backward (closed form, the Jacobians are ``diag(w) - w w^T / sum(w)`` on the support, with
``w = 1`` for sparsemax and ``w = sqrt(p)`` for 1.5-entmax): per query block, one pass over the key
blocks for ``c = sum_j w_j dp_j / sum_j w_j`` with ``dp = dO V^T``, and one pass for
``dS = w * (dp - c)``, ``dQ = scale dS K``, ``dK = scale dS^T Q``, ``dV = P^T dO``, recomputing the
scores of each block from the saved row maximum and threshold (as FlashAttention recomputes).

Memory: besides the inputs and outputs, O(L) per head (row maximum and threshold), the gradients'
size in the backward, and one ``block_q x block_k`` block of scores (per batch and head) at a time,
plus the kept scores of one query block (at most ``CACHE_KEY_BLOCKS`` such blocks).

Layout: ``q`` (B, Hq, L, D), ``k`` (B, Hk, S, D), ``v`` (B, Hk, S, Dv), with ``Hk`` dividing ``Hq``
(grouped-query attention: query head ``h`` reads key/value head ``h // (Hq // Hk)``). Masks: ``keep``
boolean broadcastable to (B, Hq, L, S) (True = attend), ``key_lengths`` (B,) integer (keys
``j >= key_lengths[b]`` are not there), ``causal`` (query ``i`` sees keys
``j <= i + causal_offset``; 0: top-left as ``F.scaled_dot_product_attention``, ``S - L``:
bottom-right), all combined. Not-there keys get exactly zero weight; a query with no key there
gives a zero row and zero gradient.

Host reads: the sparsemax / 1.5-entmax search reads one boolean per pass and query block (are all
rows done?), to stop early; every other step is sync-free.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Tuple

import torch
from torch import Tensor

from ..._validation import compute_dtype
from .projection import bisect, entmax15_tau_sort, sparsemax_tau_sort, threshold_step

KINDS = ("sparsemax", "entmax15", "entmax_bisect")
BLOCK_Q = 256
BLOCK_K = 1024
MAX_STEPS = 64
"""Threshold steps before the rows still iterating are solved by sorting their score rows."""
CACHE_KEY_BLOCKS = 8
"""A query block's scores are computed once and kept for all of its passes over the keys when they
span at most this many key blocks (the memory of that many ``block_q x block_k`` blocks instead of
one); beyond, every pass recomputes them (as FlashAttention recomputes). The scores, and so every
result, are the same to the bit either way; keeping them saves one ``Q K^T`` product per pass, most
of the search's time (see the CPU performance notes in docs/guide/attention.md)."""
SPARSEMAX_START_TOP = 8
"""sparsemax's search starts from ``max_{k <= K} tau_k``, ``tau_k = (sum of the row's k largest
scores - 1) / k``, with this ``K``: each ``tau_k`` is a lower bound of the threshold (which is the
maximum over all ``k``), and exact where the support has at most ``K`` keys (then one step confirms)."""

_NEG_INF = float("-inf")


class _Grouped:
    """The inputs viewed with the query heads grouped by key head: queries (B, Hk, G, L, D), keys and
    values (B, Hk, 1, S, .), the keep mask broadcastable to (B, Hk, G, L, S), lengths (B, 1, 1, 1, 1)."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], key_lengths: Optional[Tensor],
                 causal: bool, scale: float, causal_offset: int = 0):
        hq, hk = q.shape[1], k.shape[1]
        self.groups = hq // hk
        self.q = q.unflatten(1, (hk, self.groups))
        self.k, self.v = k.unsqueeze(2), v.unsqueeze(2)
        self.keep = None if keep is None else _group_mask(keep, hq, hk)
        self.lengths = None if key_lengths is None else key_lengths.view(-1, 1, 1, 1, 1)
        self.causal, self.scale, self.causal_offset = causal, scale, causal_offset
        self.L, self.S = q.shape[2], k.shape[2]

    def query_blocks(self, block_q: int) -> Iterator[Tuple[int, int]]:
        for i0 in range(0, self.L, block_q):
            yield i0, min(i0 + block_q, self.L)

    def key_blocks(self, i0: int, i1: int, block_k: int) -> Iterator[Tuple[int, int]]:
        """The key blocks that some query in ``[i0, i1)`` may see (under causal, not those after it)."""
        for j0 in range(0, self.S, block_k):
            if self.causal and j0 > i1 - 1 + self.causal_offset:
                return
            yield j0, min(j0 + block_k, self.S)

    def keeps_scores(self, i0: int, i1: int, block_k: int) -> bool:
        """Whether the scores of query block ``[i0, i1)`` are kept for all its passes (see :class:`_BlockScores`)."""
        return 0 < len(list(self.key_blocks(i0, i1, block_k))) <= CACHE_KEY_BLOCKS

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
        if self.causal and j1 - 1 > i0 + self.causal_offset:  # some key of the block lies after a query's last
            rows = torch.arange(i0, i1, device=device).unsqueeze(-1) + self.causal_offset
            tri = torch.arange(j0, j1, device=device) <= rows
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


class Mapping:
    """One of the maps ``p = [s - tau]_+`` (sparsemax), ``[(s - tau) / 2]_+^2`` (1.5-entmax) or
    ``[(alpha - 1) s - tau]_+^(1 / (alpha - 1))`` (alpha-entmax by bisection), as hooks used by one
    forward and one backward loop: the map itself, its Jacobian weights and the threshold search."""

    def __init__(self, kind: str, alpha: float = 1.5, n_iter: int = 50):
        self.kind, self.alpha, self.n_iter = kind, float(alpha), int(n_iter)
        self.bisect = kind == "entmax_bisect"

    @staticmethod
    def _gap(z: Tensor, tau: Tensor, in_place: bool) -> Tensor:
        """``[z - tau]_+``, in the memory of ``z`` with ``in_place`` (exactly rounded either way)."""
        return (z.sub_(tau) if in_place else z - tau).clamp_min_(0)

    def weights(self, z: Tensor, tau: Tensor, in_place: bool = False) -> Tensor:
        """The unnormalized weights at ``tau`` from ``z`` (scores minus the row maximum), in the
        memory of ``z`` with ``in_place`` (``z`` is then overwritten; else only read). alpha-entmax
        always gets a fresh tensor: torch may round its ``pow`` differently on a strided view (a kept
        block's tile) than on a fresh tensor."""
        if self.bisect:  # the order of operations of sparsenorm.entmax_bisect
            return (z * (self.alpha - 1)).sub_(tau).clamp_min_(0).pow_(1 / (self.alpha - 1))
        p = self._gap(z, tau, in_place)
        return p.mul_(0.5).square_() if self.kind == "entmax15" else p

    def jacobian_weights_at(self, z: Tensor, tau: Tensor, total: Optional[Tensor] = None,
                            in_place: bool = False) -> Tensor:
        """``w`` at ``tau`` from the scores ``z`` (in its memory with ``in_place``, as :meth:`weights`;
        ``total`` divides alpha-entmax's weights). 1.5-entmax's ``w = sqrt(p)`` is ``[(z - tau) / 2]_+``
        itself, so no square root is taken (``sqrt(x * x) == |x|`` in IEEE arithmetic, except where
        ``x * x`` underflows, where this is the more exact)."""
        if self.kind == "entmax15":
            return self._gap(z, tau, in_place).mul_(0.5)
        p = self.weights(z, tau, in_place)
        return self.jacobian_weights_(p if total is None else p.div_(total))

    def jacobian_weights_(self, p: Tensor) -> Tensor:
        """``w`` with the Jacobian ``diag(w) - w w^T / sum(w)`` on the support, from the weights
        ``p`` (possibly in place): ``1{p > 0}`` (sparsemax), resp. ``p^(2 - alpha)`` (alpha-entmax);
        1.5-entmax's ``sqrt(p)`` comes from the scores (:meth:`jacobian_weights_at`)."""
        if self.kind == "entmax15":
            raise AssertionError("1.5-entmax's Jacobian weights come from jacobian_weights_at")
        if self.bisect:
            return torch.where(p > 0, p.pow(2 - self.alpha), 0.0)
        return p.sign_()


class _BlockScores:
    """One query block's scores minus each row's maximum (``shift``), handed to the passes over the
    keys key block by key block: computed once and kept when the block sees at most
    :data:`CACHE_KEY_BLOCKS` key blocks, else recomputed on every pass. ``shift`` given (the
    backward's saved one) or found by a pass (rows with no key there: ``empty``, shift 0)."""

    def __init__(self, g: _Grouped, q_blk: Tensor, i0: int, i1: int, block_k: int, shift: Optional[Tensor] = None,
                 top: int = 1):
        """``top``: without ``shift``, also keep each row's ``top`` largest scores minus ``shift``
        (``self.top``, fewer where fewer keys; ``-inf`` for keys not there)."""
        self.g, self.q_blk, self.i0, self.i1 = g, q_blk, i0, i1
        self.spans = list(g.key_blocks(i0, i1, block_k))
        kept = None
        if g.keeps_scores(i0, i1, block_k):
            kept = q_blk.new_empty((*q_blk.shape[:-1], self.spans[-1][1]))
            for j0, j1 in self.spans:  # tile by tile, as the recomputing passes (the same products)
                kept[..., j0:j1] = g.scores(q_blk, i0, i1, j0, j1)
        if shift is None:
            largest = _row_top(g, q_blk, i0, i1, block_k, top) if kept is None else _top(kept, top)
            self.empty = largest[..., :1] == _NEG_INF
            shift = largest[..., :1].masked_fill(self.empty, 0.0)
            self.top = largest - shift
        self.shift = shift
        self.kept = None if kept is None else kept.sub_(shift)

    def blocks(self) -> Iterator[Tuple[int, int, Tensor]]:
        """``(j0, j1, z)``: the scores minus ``shift`` of keys ``[j0, j1)``; ``z`` is only to be read."""
        for j0, j1 in self.spans:
            if self.kept is None:
                yield j0, j1, self.g.scores(self.q_blk, self.i0, self.i1, j0, j1).sub_(self.shift)
            else:
                yield j0, j1, self.kept[..., j0:j1]


def _top(s: Tensor, top: int) -> Tensor:
    """The ``top`` largest entries of each row of ``s`` (all where fewer), largest first."""
    return s.amax(-1, keepdim=True) if top == 1 else s.topk(min(top, s.shape[-1]), -1).values


def _row_top(g: _Grouped, q_blk: Tensor, i0: int, i1: int, block_k: int, top: int) -> Tensor:
    """Each row's ``top`` largest scores over the keys there (``-inf`` for keys not there), by one pass."""
    largest = torch.full((*q_blk.shape[:-1], 1), _NEG_INF, dtype=q_blk.dtype, device=q_blk.device)
    for j0, j1 in g.key_blocks(i0, i1, block_k):
        tile = _top(g.scores(q_blk, i0, i1, j0, j1), top)
        largest = torch.maximum(largest, tile) if top == 1 else _top(torch.cat([largest, tile], -1), top)
    return largest


def _row_sum(mapping: Mapping, scores: _BlockScores, tau: Tensor) -> Tensor:
    """Each row's sum of (unnormalized) weights at ``tau``."""
    total = torch.zeros_like(scores.shift)
    for _, _, z in scores.blocks():
        total += mapping.weights(z, tau).sum(-1, keepdim=True)
    return total


def _bisect_threshold(g: _Grouped, mapping: Mapping, scores: _BlockScores) -> Tensor:
    """``sparsenorm.entmax_bisect``'s threshold: ``n_iter`` halvings of ``[-1, -(1/S)^(alpha - 1)]``
    (relative to the row maximum; ``S`` all keys, as the dense path counts them), the last midpoint."""
    shift = scores.shift
    tau_lo = torch.full_like(shift, -1.0)
    tau_hi = -torch.pow(1.0 / g.S, torch.full_like(shift, mapping.alpha) - 1)
    tau, _ = bisect(tau_lo, tau_hi - tau_lo, mapping.n_iter, lambda tau: (_row_sum(mapping, scores, tau), None))
    return tau


def _search_threshold(g: _Grouped, mapping: Mapping, scores: _BlockScores) -> Tensor:
    """Each row's exact threshold relative to its ``scores.shift`` (its maximum; 0 for the
    ``scores.empty`` rows, those with no key there), by passes over the key blocks."""
    if mapping.bisect:
        return _bisect_threshold(g, mapping, scores)
    kind, shift = mapping.kind, scores.shift
    entmax = kind == "entmax15"
    tau = torch.full_like(shift, -2.0 if entmax else -1.0)  # lower bound: p_max <= 1
    prev_n = torch.full_like(shift, -1.0)
    if not entmax:  # start from max_k tau_k (>= -1 = tau_1), with its k as the set the first step must keep
        ks = torch.arange(1, scores.top.shape[-1] + 1, dtype=shift.dtype, device=shift.device)
        best, k_best = ((scores.top.cumsum(-1) - 1) / ks).max(-1, keepdim=True)
        tau = torch.maximum(tau, best)  # -inf (empty rows) -> -1
        prev_n = (k_best + 1).to(shift.dtype)
    was_root = torch.zeros(shift.shape, dtype=torch.bool, device=shift.device)
    finished = scores.empty  # rows with no key there: every weight is 0 whatever tau is
    result = torch.zeros_like(shift)
    for _ in range(MAX_STEPS):
        s1 = s2 = n = 0
        for _, _, z in scores.blocks():
            d = (z - tau).clamp_min_(0)
            s1 = s1 + d.sum(-1, keepdim=True)
            if entmax:
                s2 = s2 + torch.linalg.vector_norm(d, dim=-1, keepdim=True).square_()
            n = n + d.sign_().sum(-1, keepdim=True)
        final, done, new_tau, was_root = threshold_step(kind, tau, s1, s2 if entmax else None, n, prev_n, was_root)
        result = torch.where(done & ~finished, final, result)
        finished = finished | done
        if bool(finished.all()):
            return result
        tau, prev_n = new_tau, n
    # Rows still iterating (adversarial inputs): sort their rows, built from the key blocks once.
    z = torch.cat([z for _, _, z in scores.blocks()], -1)
    exact = entmax15_tau_sort(z * 0.5) * 2 if entmax else sparsemax_tau_sort(z)
    return torch.where(finished, result, exact)


def forward(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], key_lengths: Optional[Tensor], causal: bool,
            scale: float, kind: str, block_q: int = BLOCK_Q, block_k: int = BLOCK_K, alpha: float = 1.5,
            n_iter: int = 50, kept_thresholds: Optional[Callable[[Tensor, str], Optional[Tensor]]] = None,
            causal_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, shift, tau)``: the attention output (B, Hq, L, Dv) in ``q``'s dtype and each row's
    maximum score and threshold relative to it (B, Hq, L), in the compute dtype, for the backward.
    ``alpha`` and ``n_iter`` are used by ``kind='entmax_bisect'`` only.

    ``kept_thresholds(z, kind)``: optional exact row solver for a query block whose scores are kept
    (``z``: the block's score rows minus their maxima, contiguous, (..., block_q, S')) returning
    each row's threshold relative to its max (..., block_q, 1), 0 for rows with no key there, or
    None to search here; a device kernel (the C++ row solver on CPU) solves the rows in cache, one
    row at a time, instead of a pass over the whole block per search step."""
    cdt = compute_dtype(q)
    mapping = Mapping(kind, alpha, n_iter)
    g = _Grouped(q.to(cdt), k.to(cdt), v.to(cdt), keep, key_lengths, causal, scale, causal_offset)
    B, Hq, L, _ = q.shape
    out = q.new_zeros((B, Hq, L, v.shape[-1]), dtype=cdt).unflatten(1, g.q.shape[1:3])
    shift = q.new_zeros((B, Hq, L, 1), dtype=cdt).unflatten(1, g.q.shape[1:3])
    tau = torch.zeros_like(shift)
    for i0, i1 in g.query_blocks(block_q):
        solve_kept = kept_thresholds is not None and not mapping.bisect and g.keeps_scores(i0, i1, block_k)
        scores = _BlockScores(g, g.q[..., i0:i1, :], i0, i1, block_k,
                              top=SPARSEMAX_START_TOP if kind == "sparsemax" and not solve_kept else 1)
        t = kept_thresholds(scores.kept, kind) if solve_kept else None
        if t is None:
            t = _search_threshold(g, mapping, scores)
        o = total = 0
        for j0, j1, z in scores.blocks():  # the last pass over z: the weights may take its memory
            p = mapping.weights(z, t, in_place=True)
            if mapping.bisect:  # sums to one only up to the bisection's resolution: normalize, as the dense path
                total = total + p.sum(-1, keepdim=True)
            o = o + torch.matmul(p, g.v[..., j0:j1, :])
        if mapping.bisect:
            o = o / torch.where(total > 0, total, torch.ones_like(total))
        out[..., i0:i1, :] = o
        shift[..., i0:i1, :] = scores.shift
        tau[..., i0:i1, :] = t
        scores = p = None  # the kept scores (and the last tile) go before the next block's are made
    return out.flatten(1, 2).to(q.dtype), shift.flatten(1, 2).squeeze(-1), tau.flatten(1, 2).squeeze(-1)


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], key_lengths: Optional[Tensor],
             causal: bool, scale: float, kind: str, shift: Tensor, tau: Tensor, block_q: int = BLOCK_Q,
             block_k: int = BLOCK_K, alpha: float = 1.5, n_iter: int = 50,
             causal_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` from the forward's ``shift`` and ``tau`` (closed form, see the module notes).

    For alpha-entmax the weights are the bisection's normalized by their sum (recomputed in the
    first pass); ``w = p^(2 - alpha)`` and ``c`` are then those of the normalized weights."""
    cdt = compute_dtype(q)
    mapping = Mapping(kind, alpha, n_iter)
    g = _Grouped(q.to(cdt), k.to(cdt), v.to(cdt), keep, key_lengths, causal, scale, causal_offset)
    hk, groups = g.q.shape[1:3]
    do = grad_out.to(cdt).unflatten(1, (hk, groups))
    shift = shift.to(cdt).unflatten(1, (hk, groups)).unsqueeze(-1)
    tau = tau.to(cdt).unflatten(1, (hk, groups)).unsqueeze(-1)
    dq = torch.zeros_like(g.q)
    dk = torch.zeros_like(g.k.squeeze(2))
    dv = torch.zeros_like(g.v.squeeze(2))
    for i0, i1 in g.query_blocks(block_q):
        q_blk, do_blk = g.q[..., i0:i1, :], do[..., i0:i1, :]
        m_blk, t_blk = shift[..., i0:i1, :], tau[..., i0:i1, :]
        scores = _BlockScores(g, q_blk, i0, i1, block_k, shift=m_blk)
        total = _row_sum(mapping, scores, t_blk) if mapping.bisect else None
        if total is not None:
            total = torch.where(total > 0, total, torch.ones_like(total))

        def dp(j0, j1):  # d(loss)/d(weights) of the block
            return torch.matmul(do_blk, g.v[..., j0:j1, :].transpose(-2, -1))

        # With the scores kept, dp is kept too (as much memory again): one product per tile fewer.
        kept_dp = [] if scores.kept is not None else None
        w_sum = wdp_sum = 0
        for j0, j1, z in scores.blocks():
            w = mapping.jacobian_weights_at(z, t_blk, total)
            w_sum = w_sum + w.sum(-1, keepdim=True)
            dp_tile = dp(j0, j1)
            if kept_dp is not None:
                kept_dp.append(dp_tile)
            # sum_j w_j dp_j as a product: no temporary tile (and dp_tile is kept unchanged)
            wdp_sum = wdp_sum + torch.matmul(dp_tile.unsqueeze(-2), w.unsqueeze(-1)).squeeze(-1)
        c = wdp_sum / torch.where(w_sum > 0, w_sum, torch.ones_like(w_sum))
        for tile, (j0, j1, z) in enumerate(scores.blocks()):  # the last pass over z: overwritten in place
            dp_tile = dp(j0, j1) if kept_dp is None else kept_dp[tile]
            if mapping.kind == "entmax15":  # w = [(z - tau) / 2]_+ first, then p = w^2 in its memory
                w = mapping.jacobian_weights_at(z, t_blk, in_place=True)
                ds = dp_tile.sub_(c).mul_(w)  # d(loss)/d(scores), 0 off the support
                p = w.square_()
            else:
                p = mapping.weights(z, t_blk, in_place=True)
                if total is not None:
                    p = p.div_(total)
            dv[..., j0:j1, :] += torch.matmul(p.transpose(-2, -1), do_blk).sum(2)
            if mapping.kind != "entmax15":
                ds = dp_tile.sub_(c).mul_(mapping.jacobian_weights_(p))
            dq[..., i0:i1, :] += torch.matmul(ds, g.k[..., j0:j1, :])
            dk[..., j0:j1, :] += torch.matmul(ds.transpose(-2, -1), q_blk).sum(2)
        scores = p = w = ds = dp_tile = kept_dp = None  # the kept scores and dp go before the next block's are made
    return (dq.mul_(scale).flatten(1, 2).to(q.dtype), dk.mul_(scale).to(k.dtype), dv.to(v.dtype))
