"""Fused linear + single-label loss without the N x V logits: the chunked algorithms, pure PyTorch.

The loss of logits ``z = h W^T + b`` (``h`` (N, d) hidden states, ``W`` (V, d), ``b`` (V,)) against
class indices ``y``, computed over chunks of tokens x chunks of vocabulary, so that at most one
``token_chunk x vocab_chunk`` block of logits exists at a time. Per kind (``kinds`` below):

* ``softmax``: cross-entropy ``lse(z) - z_y``, with the running max / sum of a streamed
  log-sum-exp (the algorithm of Cut Cross-Entropy, Wijmans et al. 2025).
* ``ev_softmax``: the NLL of Eq. 10 of the ev-softmax paper, ``-log p_y`` with
  ``p_i ∝ (1{z_i >= t} + eps) e^{z_i}``. The threshold is ``t = min(mean_v z, max_v z)`` and the
  mean logit is ``h . mean_v(W) + mean_v(b)`` over the vocabulary entries that are there: known
  before the vocabulary is streamed. So one pass gives the normaliser
  ``Z = sum_on e^z + eps/(1 + eps) sum_off e^z`` (the two masses of Eq. 10, each a running
  log-sum-exp; the ``max`` only matters when rounding puts the mean above every logit, where the
  entries at the maximum are the support, counted on the way), and the loss
  ``log Z - z_y - log w_y``. Gradient w.r.t. ``z``: ``p - e_y`` (Eq. 12's form at eps > 0).
* ``sparsemax``, ``entmax15``, ``entmax_bisect`` (alpha-entmax, ``alpha > 1``): the Fenchel-Young
  loss ``L = H_alpha(p) + <p, z> - z_y`` (``H_alpha`` the Tsallis entropy, ``H(e_y) = 0``),
  gradient ``p - e_y``, with ``p = [(alpha - 1)(z - t)]_+^{1/(alpha - 1)}`` for the exact row
  threshold ``t`` (in units of ``z``). The threshold comes from a candidate search: each vocabulary
  chunk gives its ``k`` largest logits (``topk``); the candidates of all chunks are projected
  together (the row-wise kernel, ``project_rows``), and ``t`` is read off the largest candidate
  (``t = z_max - p_max^{alpha - 1} / (alpha - 1)``). The result is exact when no logit left out
  can be in the support, i.e. when the ``k``-th largest logit of every truncated chunk is ``<= t``
  (a logit ``<= t`` has ``p = 0``); the tokens where that check fails are redone on their whole
  rows. The gradient ``p - e_y`` is exactly sparse: the products ``G W`` and ``G^T h`` touch only
  the support's rows of ``W`` (and of ``h``) -- no logits are recomputed for them.

When one chunk spans the whole vocabulary (``vocab_chunk >= V``) each token chunk's logits are one
block: the row-wise kernels run on it directly (no candidate search), and softmax/ev-softmax turn
the block into its gradient in place (no recomputation).

Gradients in the forward. With ``with_grads`` the forward also returns the gradients of
``sum_r row_weight_r loss_r`` w.r.t. ``h``, ``W`` and ``b``, from the logits it already has (as
Liger-Kernel's fused linear cross-entropy does): a loss that is the last operation is then
differentiated with no second pass over the vocabulary. :func:`backward` is the other route: the
gradients for arbitrary per-token weights (reduction ``'none'``) from the saved per-token
statistics, recomputing the logits.

"Not there" vocabulary entries (``vocab_mask == False``, or a bias at or below
``finfo(dtype).min / 2``, ``-inf`` included) are ``-inf`` logits: probability 0, left out of the
mean, zero gradient. A target that is not there gives an infinite loss (as the materialised
losses). Rows whose target is ``ignore_index`` give 0 and no gradient.

Label smoothing and a soft cap (``Opts``). With ``label_smoothing = s`` the target is the
distribution ``q = (1 - s) e_y + s u``, ``u`` uniform over the vocabulary entries that are there
(``torch.nn.functional.cross_entropy``'s ``label_smoothing`` when every entry is there): every kind
here has a loss of a class distribution (cross-entropy, Eq. 10's NLL, Fenchel-Young), whose
gradient is ``p - q``. Its extra terms need each row's mean logit ``zbar`` (ev-softmax's threshold)
and, for ev-softmax, the number of entries on the support; for the Fenchel-Young losses the
constant ``H_alpha(q)``. With ``softcap = c > 0`` the logits are ``c tanh(z / c)`` (Gemma 2's cap),
applied to each block as it is computed; the gradient w.r.t. the raw logits is multiplied by
``1 - (z_capped / c)^2``. The mean of capped logits is not ``h . mean(W)``: it is summed from each
whole-row block, or by a pre-pass over the vocabulary when the vocabulary is streamed.

Host reads: the sparse kinds read support sizes on the host (``nonzero``) to build the sparse
gradient and to decide the fallback -- the search is exact only with them. Softmax and ev-softmax
are sync-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from ..._validation import not_there_level
from .entmax_terms import p_of as _p_of, threshold_from as _threshold_from, tsallis_terms as _tsallis_terms
from .evidential import off_support_shift

KINDS = ("softmax", "ev_softmax", "sparsemax", "entmax15", "entmax_bisect")
SPARSE_ALPHA = {"sparsemax": 2.0, "entmax15": 1.5}
"""The entmax ``alpha`` of the sparse kinds with a fixed one (``entmax_bisect`` takes it as ``param``)."""

ProjectRows = Callable[[Tensor], Tensor]

_NEG_INF = float("-inf")
CHUNK_BYTES = 32 << 20
"""Default size of one block of logits (float32: 8M entries; 170 tokens of a 49k vocabulary). Larger
blocks make the products faster (16 MiB cost 1.2x, 8 MiB 1.5x the time of 32 MiB, one thread) and
the peak memory larger."""
MIN_TOKENS = 32
"""With fewer tokens than this per whole-vocabulary block, the vocabulary is streamed in chunks."""
ROW_TOKENS = 128
"""Whole-vocabulary blocks hold at least this many tokens (at most the hidden size), more bytes than
:data:`CHUNK_BYTES` where the vocabulary is large: every block re-reads all of ``W`` in its three
products, and 65-token blocks of a 128k vocabulary made fused ev-softmax 1.22x the materialised
softmax cross-entropy's time against 1.13x with 128 and 1.12x with 170 (2 CPU cores,
``benchmarks/README.md``). A block
of ``T <= d`` tokens is no larger than ``W``'s gradient (V x d), which the loss returns anyway."""
DEFAULT_K = 128
"""Candidates per vocabulary chunk in the threshold search of the sparse kinds."""
DENSE_FRACTION = 1 / 32
"""A support wider than this fraction of a whole-row block: its gradient by dense products."""


@dataclass(frozen=True)
class Plan:
    token_chunk: int
    vocab_chunk: int
    k: int


@dataclass(frozen=True)
class Opts:
    """Label smoothing ``s`` in [0, 1] and the soft cap ``c`` (0: none) of the logits."""
    label_smoothing: float = 0.0
    softcap: float = 0.0


NO_OPTS = Opts()


def make_plan(n_tokens: int, n_vocab: int, token_chunk: int = 0, vocab_chunk: int = 0, k: int = 0,
              chunk_bytes: int = CHUNK_BYTES, itemsize: int = 4, n_hidden: int = 0) -> Plan:
    """Chunk sizes: given ones (> 0) are kept; 0 picks blocks of about ``chunk_bytes`` -- whole
    vocabulary rows when at least :data:`MIN_TOKENS` of them fit, else vocabulary chunks. A block of
    whole rows holds at least ``min(ROW_TOKENS, n_hidden)`` tokens (:data:`ROW_TOKENS`; ``n_hidden``
    0, unknown: no such floor), which keeps whole rows for any vocabulary when ``n_hidden >= MIN_TOKENS``."""
    entries = max(1, chunk_bytes // itemsize)
    row_floor = min(ROW_TOKENS, n_hidden) if n_hidden > 0 else 0
    row_tokens = max(entries // max(n_vocab, 1), row_floor)
    if vocab_chunk <= 0:
        vocab_chunk = n_vocab if row_tokens >= MIN_TOKENS else max(1024, entries // 256)
    vocab_chunk = max(1, min(vocab_chunk, max(n_vocab, 1)))
    if token_chunk <= 0:
        token_chunk = row_tokens if vocab_chunk >= n_vocab else max(1, entries // vocab_chunk)
    token_chunk = max(1, min(token_chunk, max(n_tokens, 1)))
    return Plan(token_chunk, vocab_chunk, k if k > 0 else DEFAULT_K)


def kind_alpha(kind: str, param: float) -> float:
    return SPARSE_ALPHA.get(kind, param)


def vocab_there(weight: Tensor, bias: Optional[Tensor], vocab_mask: Optional[Tensor]) -> Optional[Tensor]:
    """(V,) bool, False where a vocabulary entry is not there; None when every entry is."""
    there = None
    if vocab_mask is not None:
        there = vocab_mask.to(torch.bool)
    if bias is not None:
        b_there = ~(bias <= not_there_level(bias.dtype))
        there = b_there if there is None else there & b_there
    return there


def mean_logit(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], there: Optional[Tensor]) -> Tensor:
    """``h . mean_v(W) + mean_v(b)`` over the entries that are there (ev-softmax's threshold before
    its clamp to the row max): (N,)."""
    if there is None:
        w_mean = weight.mean(0)
        b_mean = bias.mean() if bias is not None else None
    else:
        on = there.to(weight.dtype)
        count = on.sum().clamp_min(1)
        w_mean = (on @ weight) / count  # a product, not a V x d masked copy
        b_mean = torch.where(there, bias, torch.zeros_like(bias)).sum() / count if bias is not None else None
    t = hidden @ w_mean
    return t + b_mean if b_mean is not None else t


def chunk_logits(h: Tensor, weight: Tensor, bias: Optional[Tensor], there: Optional[Tensor], v0: int,
                 v1: int, softcap: float = 0.0, sums: Optional[Tensor] = None) -> Tensor:
    """The logits block ``h W[v0:v1]^T + b[v0:v1]`` (capped to ``softcap * tanh(z / softcap)`` when
    ``softcap > 0``), not-there columns ``-inf``. ``sums`` (rows,): the capped logits' sum over the
    columns that are there is added to it (only with ``softcap``: without, the mean is
    :func:`mean_logit`)."""
    w = weight[v0:v1]
    z = torch.addmm(bias[v0:v1], h, w.t()) if bias is not None else h @ w.t()
    if softcap:
        z.div_(softcap).tanh_().mul_(softcap)  # a -inf bias (not there) gives -softcap: masked below
        if sums is not None:
            sums.add_(z.sum(1) if there is None else z @ there[v0:v1].to(z.dtype))
    if there is not None:
        z.masked_fill_(~there[v0:v1], _NEG_INF)
    return z


def cap_slope(z: Tensor, softcap: float) -> Tensor:
    """``d(c tanh(u / c))/du = 1 - (z / c)^2`` from the capped logits ``z``; 0 where ``z = -inf`` (not there)."""
    return (z / softcap).square_().neg_().add_(1).clamp_min_(0)


def capped(z: Tensor, softcap: float) -> Tensor:
    """``softcap * tanh(z / softcap)`` (``z`` unchanged without a cap), out of place."""
    return z if not softcap else torch.tanh(z / softcap) * softcap


def n_there(weight: Tensor, there: Optional[Tensor]) -> Tensor:
    """The number of vocabulary entries that are there, a 0-dim tensor (no host read), at least 1."""
    if there is None:
        return weight.new_full((), float(weight.shape[0]))
    return there.sum().to(weight.dtype).clamp_min(1)


def capped_mean_logit(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], there: Optional[Tensor],
                      softcap: float, plan: "Plan", count: Tensor) -> Tensor:
    """The mean capped logit of every token over the entries that are there, by a pass over the
    vocabulary (the streamed plan's pre-pass): (N,)."""
    out = hidden.new_zeros(hidden.shape[0])
    for t0, t1 in _spans(hidden.shape[0], plan.token_chunk):
        for v0, v1 in _spans(weight.shape[0], plan.vocab_chunk):
            chunk_logits(hidden[t0:t1], weight, bias, there, v0, v1, softcap, out[t0:t1])
    return out / count


def smoothed_entropy(alpha: float, smoothing: float, count: Tensor) -> Tensor:
    """Tsallis ``H_alpha(q)`` of ``q = (1 - s) e_y + s / n`` over ``n = count`` entries (a 0-dim tensor,
    computed in float64): the constant of the smoothed Fenchel-Young loss."""
    n = count.double()
    s = smoothing
    powsum = (1 - s + s / n) ** alpha + (n - 1) * (s / n) ** alpha
    return (1 - powsum) / (alpha * (alpha - 1))


def _spans(n: int, step: int) -> List[Tuple[int, int]]:
    return [(i, min(i + step, n)) for i in range(0, n, step)]


class _Grads:
    """Accumulators of the gradients w.r.t. ``h``, ``W``, ``b`` (None where not wanted)."""

    def __init__(self, hidden: Tensor, weight: Tensor, bias: Optional[Tensor], wanted: bool):
        self.h = torch.zeros_like(hidden) if wanted else None
        self.w = torch.zeros_like(weight) if wanted else None
        self.b = torch.zeros_like(bias) if wanted and bias is not None else None

    def dense(self, g: Tensor, h: Tensor, weight: Tensor, t0: int, t1: int, v0: int, v1: int) -> None:
        """Add a dense block ``G = dL/dz`` (tokens t0:t1 x vocabulary v0:v1)."""
        self.h[t0:t1].addmm_(g, weight[v0:v1])
        self.w[v0:v1].addmm_(g.t(), h)
        if self.b is not None:
            self.b[v0:v1].add_(g.sum(0))

    def sparse(self, rows: Tensor, cols: Tensor, vals: Tensor, h: Tensor, weight: Tensor, t0: int,
               piece: int) -> None:
        """Add ``G`` given by its nonzero entries (``rows`` local to the token chunk starting at
        ``t0``, ``cols`` global), in pieces of ``piece`` entries: only those rows of ``W`` and ``h``."""
        for s0, s1 in _spans(rows.numel(), max(1, piece)):
            r, c, v = rows[s0:s1], cols[s0:s1], vals[s0:s1].unsqueeze(1)
            self.h[t0:].index_add_(0, r, weight.index_select(0, c) * v)
            self.w.index_add_(0, c, h.index_select(0, r) * v)
            if self.b is not None:
                self.b.index_add_(0, c, vals[s0:s1])

    def target(self, y: Tensor, w: Tensor, h: Tensor, weight: Tensor, t0: int, t1: int) -> None:
        """Add the ``-e_y`` part of ``G = p - e_y`` with row weights ``w`` (0 on ignored rows)."""
        self.h[t0:t1].sub_(weight.index_select(0, y) * w.unsqueeze(1))
        self.w.index_add_(0, y, h * (-w).unsqueeze(1))
        if self.b is not None:
            self.b.index_add_(0, y, -w)

    def uniform(self, c: Tensor, on: Optional[Tensor], h: Tensor, weight: Tensor, t0: int, t1: int) -> None:
        """Add ``G = -c_r 1{v there}`` (label smoothing's uniform part, no cap): rank one, no logits."""
        w_sum = weight.sum(0) if on is None else on @ weight
        self.h[t0:t1].sub_(c.unsqueeze(1) * w_sum.unsqueeze(0))
        ones = on if on is not None else weight.new_ones(weight.shape[0])
        self.w.addr_(ones, c @ h, alpha=-1)
        if self.b is not None:
            self.b.sub_(ones * c.sum())

    def out(self) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        return self.h, self.w, self.b


# ----------------------------------------------------------------------------- softmax / ev-softmax
def _shift_off_(z: Tensor, thr: Tensor, shift: float) -> Tensor:
    """In place: Eq. 10's log-weights, ``z + log(eps/(1+eps))`` where ``z < thr`` (off the support).
    (The comparison is written as 0/1 in ``z``'s dtype: adding a boolean tensor costs a promoting copy.)"""
    return z.add_(torch.lt(z, thr.unsqueeze(1), out=torch.empty_like(z)), alpha=shift)


def _finite_or_zero(m: Tensor) -> Tensor:
    return torch.where(m == _NEG_INF, torch.zeros_like(m), m)


def dense_block_(z: Tensor, thr: Optional[Tensor], y: Tensor, w: Tensor, wy: Tensor, ev: bool, shift: float,
                 grad: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """A whole-row block of logits ``z`` (rows, V) -> ``(loss, log Z, t)`` per row, softmax or
    (``ev``) Eq. 10 with the threshold ``t = min(thr, max)``; with ``grad``, ``z`` becomes in place
    the gradient ``w_r (p - e_y)`` of the weighted losses (``wy_r`` = ``w_r``, or 0 where the target is
    ignored or not there). One exp per entry. (``BlockRows``: the Triton kernel does the same on CUDA.)"""
    m = z.amax(1)
    t = None
    if ev:
        t = torch.minimum(thr, m)  # the max entry is on the support: m is also Eq. 10's max
        _shift_off_(z, t, shift)
    zy = z.gather(1, y.unsqueeze(1)).squeeze(1)  # Eq. 10's log-weight of the target included
    m_safe = _finite_or_zero(m)
    e = z.sub_(m_safe.unsqueeze(1)).exp_()
    total = e.sum(1)
    lse = m_safe + torch.log(total)
    if grad:
        e.mul_((w / total).unsqueeze(1))
        e.scatter_add_(1, y.unsqueeze(1), -wy.unsqueeze(1))
    return lse - zy, lse, lse if t is None else t


BlockRows = Callable[[Tensor, Optional[Tensor], Tensor, Tensor, Tensor, bool, float, bool],
                     Tuple[Tensor, Tensor, Tensor]]


def _smoothing_terms(opts: Opts, count: Tensor, there: Optional[Tensor]):
    """``(s, s / n, on)``: label smoothing, its mass per entry that is there, and ``on`` (V,) float (None: all)."""
    on = None if there is None else there.to(count.dtype)
    return opts.label_smoothing, opts.label_smoothing / count, on


def _softmax_family_chunk(hidden, weight, bias, there, y, ok, w, kind, eps, zbar, plan, t0, t1, grads,
                          loss_rows, stats, block_rows=None, opts: Opts = NO_OPTS, count=None,
                          fill_mean: bool = False) -> None:
    """Loss (and gradients) of tokens t0:t1 for softmax / ev-softmax. ``zbar`` (N,): each row's mean
    (capped) logit over the entries that are there, when ev-softmax or label smoothing needs it
    (``fill_mean``: summed here from the whole-row block, then divided by ``count``)."""
    h = hidden[t0:t1]
    yc, okc = y[t0:t1], ok[t0:t1]
    n_vocab = weight.shape[0]
    ev = kind == "ev_softmax"
    shift = off_support_shift(eps) if ev else 0.0
    cap, smooth = opts.softcap, opts.label_smoothing
    if plan.vocab_chunk >= n_vocab:  # one block: stats, loss and gradient from it, in place
        z = chunk_logits(h, weight, bias, there, 0, n_vocab, cap, zbar[t0:t1] if fill_mean else None)
        if fill_mean:
            zbar[t0:t1].div_(count)
        zb = None if zbar is None else zbar[t0:t1]
        wc = w[t0:t1]
        wy = torch.where(okc if there is None else okc & there.index_select(0, yc), wc, torch.zeros_like(wc))
        want = grads.h is not None
        slope = cap_slope(z, cap) if cap and want else None
        n_on = None
        if smooth and ev:  # entries on the support (Eq. 10's weight 1) before the block is overwritten
            t_row = torch.minimum(zb, z.amax(1))
            n_on = torch.ge(z, t_row.unsqueeze(1)).sum(1).to(z.dtype)
        loss, lse, t = (block_rows or dense_block_)(z, zb if ev else None, yc, wc, wy * (1 - smooth), ev, shift,
                                                    want)
        if smooth:
            s, s_n, on = _smoothing_terms(opts, count, there)
            mean_w = zb if n_on is None else zb + shift * (count - n_on) / count  # mean log-weight + logit
            loss = (1 - s) * loss + s * (lse - mean_w)
            if want:
                c = wc * s_n
                if on is None:
                    z.sub_(c.unsqueeze(1))
                else:
                    z.addr_(c, on, alpha=-1)
        if slope is not None:
            z.mul_(slope)
        loss_rows[t0:t1] = loss
        stats[t0:t1, 0], stats[t0:t1, 1] = lse, t
        if want:
            grads.dense(z, h, weight, t0, t1, 0, n_vocab)
        return
    # Streamed: running max m, masses s_on, s_off relative to m, count of entries at m (ev-softmax).
    n = t1 - t0
    m = h.new_full((n,), _NEG_INF)
    s_on = h.new_zeros(n)
    s_off = h.new_zeros(n)
    c_max = h.new_zeros(n)
    n_on = h.new_zeros(n)
    zy = h.new_full((n,), _NEG_INF)
    thr = zbar[t0:t1] if ev else None
    for v0, v1 in _spans(n_vocab, plan.vocab_chunk):
        z = chunk_logits(h, weight, bias, there, v0, v1, cap)
        in_chunk = (yc >= v0) & (yc < v1)
        zy = torch.where(in_chunk, z.gather(1, (yc - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)).squeeze(1), zy)
        cm = z.amax(1)
        new_m = torch.maximum(m, cm)
        safe = _finite_or_zero(new_m)
        scale = torch.exp(m - safe)
        e = (z - safe.unsqueeze(1)).exp_()
        if ev:
            on = z >= thr.unsqueeze(1)
            if smooth:
                n_on = n_on + on.sum(1).to(z.dtype)
            e_on = torch.where(on, e, torch.zeros_like(e)).sum(1)
            s_on = s_on * scale + e_on
            s_off = s_off * scale + (e.sum(1) - e_on)
            c_max = torch.where(cm > m, (z == cm.unsqueeze(1)).sum(1).to(z.dtype),
                                torch.where(cm == m, c_max + (z == cm.unsqueeze(1)).sum(1).to(z.dtype), c_max))
        else:
            s_on = s_on * scale + e.sum(1)
        m = new_m
    safe_m = _finite_or_zero(m)
    mean_w = None if zbar is None else zbar[t0:t1]
    if ev:
        r = math.exp(shift)  # eps / (1 + eps)
        none_on = m < thr  # rounding put the mean above every logit: the entries at the max are the support
        s_on2 = torch.where(none_on, c_max, s_on)
        s_off2 = torch.where(none_on, (s_off - c_max).clamp_min(0), s_off)
        lse = safe_m + torch.log(s_on2 + r * s_off2)
        t = torch.minimum(thr, m)
        zy = torch.where(zy >= t, zy, zy + shift)
        if smooth:
            n_on = torch.where(none_on, c_max, n_on)
            mean_w = mean_w + shift * (count - n_on) / count
    else:
        lse = safe_m + torch.log(s_on)
        t = lse
    loss = lse - zy
    if smooth:
        loss = (1 - smooth) * loss + smooth * (lse - mean_w)
    loss_rows[t0:t1] = loss
    stats[t0:t1, 0], stats[t0:t1, 1] = lse, t
    if grads.h is not None:
        _softmax_family_grads(hidden, weight, bias, there, y, ok, w, kind, eps, stats, plan, t0, t1, grads, opts,
                              count)


def _sub_target_(g: Tensor, y: Tensor, ok: Tensor, w: Tensor, there: Optional[Tensor], v0: int = 0) -> None:
    """``g[r, y_r - v0] -= w_r`` for the rows whose target lies in this block and is there."""
    width = g.shape[1]
    inside = ok & (y >= v0) & (y < v0 + width)
    if there is not None:
        inside = inside & there.index_select(0, y)
    col = (y - v0).clamp(0, width - 1).unsqueeze(1)
    g.scatter_add_(1, col, torch.where(inside, -w, torch.zeros_like(w)).unsqueeze(1))


def _sub_uniform_(g: Tensor, c: Tensor, on: Optional[Tensor], v0: int) -> None:
    """``g[r, v] -= c_r`` on the block's entries that are there (label smoothing's uniform part)."""
    if on is None:
        g.sub_(c.unsqueeze(1))
    else:
        g.addr_(c, on[v0:v0 + g.shape[1]], alpha=-1)


def _softmax_family_grads(hidden, weight, bias, there, y, ok, w, kind, eps, stats, plan, t0, t1, grads,
                          opts: Opts = NO_OPTS, count=None) -> None:
    """Gradient pass over the vocabulary for tokens t0:t1 from their ``(log Z, t)``: ``p - q``."""
    h = hidden[t0:t1]
    lse, t = stats[t0:t1, 0], stats[t0:t1, 1]
    shift = off_support_shift(eps) if kind == "ev_softmax" else 0.0
    cap, smooth = opts.softcap, opts.label_smoothing
    wc = w[t0:t1]
    if smooth:
        _, s_n, on = _smoothing_terms(opts, count, there)
    for v0, v1 in _spans(weight.shape[0], plan.vocab_chunk):
        z = chunk_logits(h, weight, bias, there, v0, v1, cap)
        slope = cap_slope(z, cap) if cap else None
        if kind == "ev_softmax":
            _shift_off_(z, t, shift)
        g = z.sub_(lse.unsqueeze(1)).exp_().mul_(wc.unsqueeze(1))
        _sub_target_(g, y[t0:t1], ok[t0:t1], wc * (1 - smooth), there, v0)
        if smooth:
            _sub_uniform_(g, wc * s_n, on, v0)
        if slope is not None:
            g.mul_(slope)
        grads.dense(g, h, weight, t0, t1, v0, v1)


# ----------------------------------------------------------------------------- sparsemax / entmax
def _support_of_block(z: Tensor, project_rows: ProjectRows) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Whole-row block: ``(rows, cols, p, z)`` of the support entries, by the row-wise kernel."""
    p = project_rows(z)
    rows, cols = (p > 0).nonzero(as_tuple=True)
    return rows, cols, p[rows, cols], z[rows, cols]


def _search_support(h, weight, bias, there, plan, alpha, project_rows,
                    cap: float = 0.0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The support of the tokens ``h`` by the candidate search over vocabulary chunks (module
    docstring), with the uncertified tokens redone on whole rows: ``(rows, cols, p, z)``."""
    n_vocab = weight.shape[0]
    n = h.shape[0]
    vals, idx = [], []
    bound = h.new_full((n,), _NEG_INF)  # max over truncated chunks of their k-th largest logit
    for v0, v1 in _spans(n_vocab, plan.vocab_chunk):
        z = chunk_logits(h, weight, bias, there, v0, v1, cap)
        k = min(plan.k, v1 - v0)
        top = torch.topk(z, k, dim=1, sorted=False)
        vals.append(top.values)
        idx.append(top.indices + v0)
        if k < v1 - v0:
            bound = torch.maximum(bound, top.values.amin(1))
    cand = torch.cat(vals, 1)
    cand_idx = torch.cat(idx, 1)
    p = project_rows(cand)
    p_max, arg = p.max(1)
    z_max = cand.gather(1, arg.unsqueeze(1)).squeeze(1)
    t = _threshold_from(p_max, z_max, alpha)
    certified = bound <= t
    on = (p > 0) & certified.unsqueeze(1)
    rows, slot = on.nonzero(as_tuple=True)
    parts = [(rows, cand_idx[rows, slot], p[rows, slot], cand[rows, slot])]
    redo = (~certified).nonzero().squeeze(1)
    if redo.numel():  # whole rows for the tokens whose support may hold a logit left out
        step = max(1, (plan.token_chunk * plan.vocab_chunk) // max(n_vocab, 1))
        for s0, s1 in _spans(redo.numel(), step):
            sel = redo[s0:s1]
            z = torch.cat([chunk_logits(h.index_select(0, sel), weight, bias, there, v0, v1, cap)
                           for v0, v1 in _spans(n_vocab, plan.vocab_chunk)], 1)
            r, c, pv, zv = _support_of_block(z, project_rows)
            parts.append((sel[r], c, pv, zv))
    return tuple(torch.cat(list(col)) for col in zip(*parts))  # type: ignore[return-value]


def _sparse_chunk(hidden, weight, bias, there, y, ok, w, alpha, plan, t0, t1, grads, loss_rows, stats,
                  project_rows, opts: Opts = NO_OPTS, zbar=None, count=None, fill_mean: bool = False) -> None:
    """Loss (and gradients) of tokens t0:t1 for the Fenchel-Young losses of the sparse kinds."""
    h = hidden[t0:t1]
    yc, okc = y[t0:t1], ok[t0:t1]
    n_vocab = weight.shape[0]
    n = t1 - t0
    cap, smooth = opts.softcap, opts.label_smoothing
    dense_p = None
    slope = None
    if plan.vocab_chunk >= n_vocab:
        z = chunk_logits(h, weight, bias, there, 0, n_vocab, cap, zbar[t0:t1] if fill_mean else None)
        if fill_mean:
            zbar[t0:t1].div_(count)
        dense_p = project_rows(z)
        rows, cols = (dense_p > 0).nonzero(as_tuple=True)
        pv, zv = dense_p[rows, cols], z[rows, cols]
        zy = z.gather(1, yc.unsqueeze(1)).squeeze(1)
        dense_grad = grads.h is not None and (rows.numel() > DENSE_FRACTION * dense_p.numel() or (smooth and cap))
        if dense_grad and cap:
            slope = cap_slope(z, cap)
        del z  # the block is not needed any more: free it before the gradient's gathers
        if not dense_grad:
            dense_p = None  # (kept only for a wide support's dense products, or a capped smoothed gradient)
    else:
        rows, cols, pv, zv = _search_support(h, weight, bias, there, plan, alpha, project_rows, cap)
        zy = (h * weight.index_select(0, yc)).sum(1)
        if bias is not None:
            zy = zy + bias.index_select(0, yc)
        zy = capped(zy, cap)
        if there is not None:
            zy = torch.where(there.index_select(0, yc), zy, torch.full_like(zy, _NEG_INF))
    # Per row: the max logit m (on the support), sum p (z - m) and sum p^alpha over the support.
    m = h.new_full((n,), _NEG_INF).scatter_reduce_(0, rows, zv, "amax")
    inner = h.new_zeros(n).index_add_(0, rows, pv * (zv - m.index_select(0, rows)))
    powsum = h.new_zeros(n).index_add_(0, rows, _tsallis_terms(pv, alpha))
    p_max = h.new_zeros(n).scatter_reduce_(0, rows, pv, "amax")
    entropy = (1 - powsum) / (alpha * (alpha - 1))
    if smooth:  # H(p) + <p - q, z> - H(q), q = (1 - s) e_y + s u
        zb = zbar[t0:t1]
        loss = entropy + inner - (1 - smooth) * (zy - m) - smooth * (zb - m) \
            - smoothed_entropy(alpha, smooth, count).to(h.dtype)
    else:
        loss = entropy + inner - (zy - m)
    loss_rows[t0:t1] = loss.clamp_min(0)
    stats[t0:t1, 0] = _threshold_from(p_max, m, alpha)
    stats[t0:t1, 1] = m
    if grads.h is None:
        return
    wc = w[t0:t1]
    y_there = okc if there is None else okc & there.index_select(0, yc)
    wy = torch.where(y_there, wc, torch.zeros_like(wc)) * (1 - smooth)
    if dense_p is not None:
        g = dense_p.mul_(wc.unsqueeze(1))  # a wide support: dense products are cheaper
        _sub_target_(g, yc, okc, wc * (1 - smooth), there)
        if smooth:
            _, s_n, on = _smoothing_terms(opts, count, there)
            _sub_uniform_(g, wc * s_n, on, 0)
        if slope is not None:
            g.mul_(slope)
        grads.dense(g, h, weight, t0, t1, 0, n_vocab)
        return
    vals = pv * wc.index_select(0, rows)
    if cap:
        vals = vals * cap_slope(zv, cap)
        wy = wy * cap_slope(zy, cap)
    grads.sparse(rows, cols, vals, h, weight, t0, _piece(plan, weight))
    grads.target(yc, wy, h, weight, t0, t1)
    if smooth:
        _smoothing_grads(hidden, weight, bias, there, wc, opts, count, plan, t0, t1, grads)


def _smoothing_grads(hidden, weight, bias, there, wc, opts: Opts, count, plan, t0, t1, grads) -> None:
    """Label smoothing's uniform part ``-s/n`` of ``G`` for tokens t0:t1 (row weights ``wc``): rank one
    without a cap; with one, times each entry's slope, block by block (the logits recomputed)."""
    _, s_n, on = _smoothing_terms(opts, count, there)
    c = wc * s_n
    if not opts.softcap:
        grads.uniform(c, on, hidden[t0:t1], weight, t0, t1)
        return
    h = hidden[t0:t1]
    for v0, v1 in _spans(weight.shape[0], plan.vocab_chunk):
        g = cap_slope(chunk_logits(h, weight, bias, there, v0, v1, opts.softcap), opts.softcap)
        g.mul_(-c.unsqueeze(1))
        grads.dense(g, h, weight, t0, t1, v0, v1)


def _piece(plan: Plan, weight: Tensor) -> int:
    """Support entries per gather, so that a gathered block of rows is no bigger than a logits block."""
    return max(1, (plan.token_chunk * plan.vocab_chunk) // max(1, weight.shape[1]))


def _sparse_grads_recomputed(hidden, weight, bias, there, y, ok, w, alpha, stats, plan, t0, t1, grads,
                             opts: Opts = NO_OPTS, count=None) -> None:
    """Gradient of tokens t0:t1 from their saved threshold: the support is ``{z > t}`` of the
    recomputed logits, ``p = [(alpha - 1)(z - t)]_+^{1/(alpha - 1)}``."""
    h = hidden[t0:t1]
    t = stats[t0:t1, 0]
    wc = w[t0:t1]
    cap, smooth = opts.softcap, opts.label_smoothing
    for v0, v1 in _spans(weight.shape[0], plan.vocab_chunk):
        z = chunk_logits(h, weight, bias, there, v0, v1, cap)
        rows, cols = (z > t.unsqueeze(1)).nonzero(as_tuple=True)
        zv = z[rows, cols]
        vals = _p_of(zv - t.index_select(0, rows), alpha) * wc.index_select(0, rows)
        if cap:
            vals = vals * cap_slope(zv, cap)
        grads.sparse(rows, cols + v0, vals, h, weight, t0, _piece(plan, weight))
    yc, okc = y[t0:t1], ok[t0:t1]
    y_there = okc if there is None else okc & there.index_select(0, yc)
    wy = torch.where(y_there, wc, torch.zeros_like(wc)) * (1 - smooth)
    if cap:
        zy = (h * weight.index_select(0, yc)).sum(1)
        if bias is not None:
            zy = zy + bias.index_select(0, yc)
        wy = wy * cap_slope(capped(zy, cap), cap)
    grads.target(yc, wy, h, weight, t0, t1)
    if smooth:
        _smoothing_grads(hidden, weight, bias, there, wc, opts, count, plan, t0, t1, grads)


# ----------------------------------------------------------------------------- entry points
def forward(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor, vocab_mask: Optional[Tensor],
            kind: str, param: float, ignore_index: int, row_weight: Optional[Tensor], with_grads: bool,
            plan: Plan, project_rows: Optional[ProjectRows] = None, block_rows: Optional[BlockRows] = None,
            opts: Opts = NO_OPTS):
    """``(loss, grad_h, grad_W, grad_b, stats)``.

    ``loss``: per-token losses (N,) (0 on ignored rows) when ``row_weight`` is None, else the
    scalar ``sum_r row_weight_r loss_r``. With ``with_grads`` (needs ``row_weight``), the gradients
    of that scalar w.r.t. ``hidden``, ``weight`` and ``bias`` (None where not computed). ``stats``
    (N, 2): per token ``(log Z, t)`` (softmax, ev-softmax) or ``(t, max logit)`` (sparse kinds),
    what :func:`backward` needs. ``param``: ev-softmax's eps, entmax_bisect's alpha.
    ``project_rows``: the row-wise map of the sparse kinds (the registered op, so that the kernel
    of the device runs); ``block_rows``: softmax/ev-softmax's whole-row block step (default
    :func:`dense_block_`; the Triton kernel on CUDA). ``opts``: label smoothing and soft cap.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    n = hidden.shape[0]
    there = vocab_there(weight, bias, vocab_mask)
    ok = target != ignore_index
    y = target.masked_fill(~ok, 0)
    w = ok.to(hidden.dtype) if row_weight is None else row_weight.to(hidden.dtype) * ok
    grads = _Grads(hidden, weight, bias, with_grads)
    loss_rows = hidden.new_zeros(n)
    stats = hidden.new_zeros(n, 2)
    count = n_there(weight, there)
    zbar, fill_mean = None, False
    if kind == "ev_softmax" or opts.label_smoothing:
        if not opts.softcap:
            zbar = mean_logit(hidden, weight, bias, there)
        elif plan.vocab_chunk < weight.shape[0]:
            zbar = capped_mean_logit(hidden, weight, bias, there, opts.softcap, plan, count)
        else:
            zbar, fill_mean = hidden.new_zeros(n), True
    for t0, t1 in _spans(n, plan.token_chunk):
        if kind in ("softmax", "ev_softmax"):
            _softmax_family_chunk(hidden, weight, bias, there, y, ok, w, kind, param, zbar, plan, t0, t1,
                                  grads, loss_rows, stats, block_rows, opts, count, fill_mean)
        else:
            _sparse_chunk(hidden, weight, bias, there, y, ok, w, kind_alpha(kind, param), plan, t0, t1, grads,
                          loss_rows, stats, project_rows, opts, zbar, count, fill_mean)
    loss_rows = loss_rows.masked_fill(~ok, 0.0)
    if row_weight is None:
        return (loss_rows, *grads.out(), stats)
    weighted = torch.where(w != 0, loss_rows * w, torch.zeros_like(loss_rows))
    return (weighted.sum(), *grads.out(), stats)


def backward(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor, vocab_mask: Optional[Tensor],
             stats: Tensor, grad_rows: Tensor, kind: str, param: float, ignore_index: int,
             plan: Plan, opts: Opts = NO_OPTS) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Gradients of ``sum_r grad_rows_r loss_r`` w.r.t. ``hidden``, ``weight``, ``bias`` from the
    forward's ``stats``, recomputing the logits block by block."""
    there = vocab_there(weight, bias, vocab_mask)
    count = n_there(weight, there)
    ok = target != ignore_index
    y = target.masked_fill(~ok, 0)
    w = grad_rows.to(hidden.dtype).expand(hidden.shape[0]) * ok
    grads = _Grads(hidden, weight, bias, True)
    for t0, t1 in _spans(hidden.shape[0], plan.token_chunk):
        if kind in ("softmax", "ev_softmax"):
            _softmax_family_grads(hidden, weight, bias, there, y, ok, w, kind, param, stats, plan, t0, t1, grads,
                                  opts, count)
        else:
            _sparse_grads_recomputed(hidden, weight, bias, there, y, ok, w, kind_alpha(kind, param), stats, plan,
                                     t0, t1, grads, opts, count)
    return grads.out()
