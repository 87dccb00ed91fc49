"""Comparing two computations that may round a knife-edge decision differently, by the contract.

A sparse mapping keeps an entry when its score clears a threshold (ev-softmax: the mean; sparsemax
and entmax: tau; r-softmax: a quantile). Two paths that compute the same mapping with different
roundings (a C++ or Triton kernel and the PyTorch reference, blockwise and dense, compiled and
eager) agree on every entry whose exact gap ``score - threshold`` is larger than the error of the
computed gap. An entry inside that band may go either way in either path, and for ev-softmax
(whose weight at the threshold is not zero) the values then differ by far more than rounding.
So two such paths are never compared to each other by equality; each is compared to the float64
oracle evaluated with that path's own support:

- an entry clear above the band (``gap > bound``) is kept by every path, one clear below
  (``gap < -bound``) by none (a row always keeps its maximum, whose exact gap is >= 0);
- each path's values equal ``oracle(scores, its support)`` to the caller's error model.

``bound`` is the caller's a-priori error bound on the computed gap (an error model, not what one
machine showed), as a scalar or broadcastable to ``scores``.

Supports that only a count exposes (attention's output is ``weights @ v``): give the path one-hot
values (``v = eye(S)``) and its output *is* its weights.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Union

import torch
from torch import Tensor

from sparsenorm._validation import not_there_level

Oracle = Callable[[Tensor, Tensor], Tensor]


def softmax_on(scores: Tensor, support: Tensor) -> Tensor:
    """Softmax restricted to ``support`` along the last dim, in float64 (ev-softmax's Eq. 7 given its support)."""
    s = scores.double().masked_fill(~support, float("-inf"))
    p = torch.softmax(s, -1)
    return torch.nan_to_num(p, nan=0.0)  # a row with an empty support is all zero


def sparsemax_on(scores: Tensor, support: Tensor) -> Tensor:
    """Sparsemax given its support S: ``p = [z - tau]_+`` with ``tau = (sum_S z - 1) / |S|`` (sparsemax paper,
    Eq. 4)."""
    z = scores.double()
    count = support.sum(-1, keepdim=True).clamp_min(1)
    tau = ((z * support).sum(-1, keepdim=True) - 1) / count
    return torch.where(support, z - tau, torch.zeros_like(z))


def band(scores: Tensor, threshold: Tensor, bound: Union[float, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """``(clear_in, clear_out, ambiguous)``: entries clear above, clear below and inside the rounding band."""
    gap = scores.double() - threshold.double()
    bound = torch.as_tensor(bound, dtype=torch.float64)
    clear_in, clear_out = gap > bound, gap < -bound
    return clear_in, clear_out, ~(clear_in | clear_out)


def assert_agree_by_contract(paths: Mapping[str, Tensor], scores: Tensor, threshold: Tensor,
                             bound: Union[float, Tensor], oracle: Oracle, *, rtol: float, atol: float,
                             valid: Union[Tensor, None] = None,
                             kept: Callable[[Tensor], Tensor] = lambda p: p > 0,
                             underflow: float = 0.0) -> Tensor:
    """Check every path in ``paths`` (name -> probabilities/weights, shaped like ``scores``) by the contract.

    ``scores`` and ``threshold`` are the exact (float64) scores and thresholds (the threshold
    broadcastable along the last dim); ``valid`` marks entries that are there at all (masked entries
    must get exactly zero); ``kept(output)`` reads a path's decisions from its output (default: the
    nonzero entries; a log-probability or a training form with a floor reads them otherwise). An
    entry whose oracle weight, were it kept, is at most ``underflow`` (the path's exp may flush it to
    zero) cannot show its decision and is not read. Returns the ambiguous-entry mask, so that a test meant to
    exercise the band can assert it is not empty.
    """
    clear_in, clear_out, ambiguous = band(scores, threshold, bound)
    if valid is not None:
        clear_in, clear_out, ambiguous = clear_in & valid, clear_out | ~valid, ambiguous & valid
    readable = oracle(scores, clear_in | ambiguous).abs() > underflow
    for name, probs in paths.items():
        assert probs.shape == scores.shape, f"{name}: shape {tuple(probs.shape)} != {tuple(scores.shape)}"
        support = kept(probs) | (clear_in & ~readable)
        dropped = clear_in & ~support
        assert not dropped.any(), (f"{name} drops {int(dropped.sum())} entries whose score is clear above the "
                                   f"threshold (by more than the rounding bound)")
        extra = clear_out & support
        assert not extra.any(), (f"{name} keeps {int(extra.sum())} entries clear below the threshold "
                                f"(or not there)")
        expected = oracle(scores, support)
        finite = torch.isfinite(expected)
        assert torch.equal(finite, torch.isfinite(probs)), f"{name}: -inf/NaN pattern differs from the oracle's"
        torch.testing.assert_close(probs.double()[finite], expected[finite], rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"{name} against the float64 oracle on its own "
                                                            f"support: {m}")
    return ambiguous


def assert_ev_softmax_by_contract(paths: Mapping[str, Tensor], x: Tensor, eps: Optional[float], is_log: bool, *,
                                  rtol: float, atol: float, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """ev-softmax (Eq. 7, ``eps`` None or 0) or its training form (Eq. 10; ``is_log``: its log) of
    the rows of ``x`` (last dim, no NaN/+inf row), computed by each of ``paths``, by the contract.

    The threshold is ``min(mean, max)`` over the entries that are there; a path computes the mean
    in ``x``'s dtype or better, so its error is at most a sum's, ``gamma_(n+4) max|x|``, doubled
    for the other path and for the perturbation mode's 2 ulp (tests/nudge.py). Under Eq. 10 a
    path's decisions are read from ``log p - x``: the row's top level on the support,
    ``log(eps / (1 + eps))`` below it off the support. ``out_dtype``: the paths' output dtype
    when it is narrower than ``x``'s (its exp flushes to zero sooner).
    """
    valid = ~(x <= not_there_level(x.dtype))
    count = valid.sum(-1, keepdim=True)
    xd = x.double()
    there = xd.masked_fill(~valid, 0.0)
    threshold = torch.minimum(there.sum(-1, keepdim=True) / count.clamp_min(1),
                              xd.masked_fill(~valid, -math.inf).amax(-1, keepdim=True))
    u = torch.finfo(x.dtype).eps / 2
    # Below the normal range rounding is absolute, not relative: each of the sum's and the division's
    # roundings may add up to half the subnormal spacing (hypothesis found rows of subnormals, e.g.
    # [1e-45, 0], whose float32 mean rounds to 0 while the exact mean is 7e-46).
    subnormal = torch.finfo(x.dtype).smallest_normal * torch.finfo(x.dtype).eps
    bound = 4 * (count + 4) * (u * there.abs().amax(-1, keepdim=True) + subnormal)
    shift = -math.inf if not eps else math.log(eps) - math.log1p(eps)

    def oracle(scores, support):
        z = torch.where(support, scores, scores + shift).masked_fill(~valid, -math.inf)
        out = torch.log_softmax(z, -1) if is_log else torch.softmax(z, -1)
        return out.masked_fill(count == 0, -math.inf if is_log else 0.0)

    def kept(out):
        logp = out.double() if is_log else out.double().log()
        if not eps:
            return logp > -math.inf
        level = logp - xd
        top = level.masked_fill(~torch.isfinite(level), -math.inf).amax(-1, keepdim=True)
        return level > top + shift / 2

    return assert_agree_by_contract(paths, xd.masked_fill(~valid, -math.inf), threshold, bound, oracle,
                                    rtol=rtol, atol=atol, valid=valid, kept=kept,
                                    underflow=0.0 if is_log else torch.finfo(out_dtype or x.dtype).tiny)
