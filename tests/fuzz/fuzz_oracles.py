"""float64 oracles of every registry normalizer on one row, with the error model of the fuzz suite.

Each oracle takes the entries of a row that are there (a 1-D float64 tensor, the input's values
exactly), the normalizer's parameters and the form (``forward``/``train``/``log``) and returns an
:class:`Expected`: the candidate outputs (more than one only where rounding decides a
discontinuous support, i.e. ev-softmax's mean), which entries lie within rounding of a support
threshold (``near``: there the support rule is not asserted), and the scale ``S`` of the error model.

Error model (:func:`value_tolerance`): a computed probability differs from the float64 value by at
most ``C (n + 2) eps_c S + eps_out``, where ``eps_c`` is the machine epsilon of the compute dtype
(float32 for float16/bfloat16), ``n`` the row length (every quantity is at most an n-term sum or
a normalization by one), ``C = 8`` a handful of such operations, ``eps_out`` the rounding of the
result to the output dtype and ``S`` the conditioning of the map:

* softmax-like maps (softmax, ev-softmax on a fixed support): ``S = 1`` (``p_i |x_i - max|`` is
  at most ``1/e``, so the rounding of ``x - max`` costs at most an ulp of 1);
* Euclidean/Tsallis projections (sparsemax, 1.5-entmax, sparsehourglass): ``S = max(1, |z|)``,
  the threshold is found from sums of ``z`` itself;
* alpha-entmax by bisection: that, times ``max(1, 1 / |alpha - 1|)``, the exponent of the map;
* weighted softmax (t-/r-softmax, ``w = relu(x - tau)``): ``1 + max(1, |x|) / w_eff``, a
  perturbation ``dw`` of every weight moves ``p`` by at most ``2 dw / w_eff`` with ``w_eff`` the
  ``exp``-weighted mean weight over the support (large where every weight is near 0).

The oracles are the ``entmax`` package (sparsemax, 1.5-entmax, alpha-entmax) and the papers'
formulas (ev-softmax Eqs. 7 and 10, r-softmax Eqs. 1 and 3, sparsehourglass's scale).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List

import entmax
import torch
from torch import Tensor

C_OPS = 8


@dataclass
class Expected:
    candidates: List[Tensor]
    scale: float
    near: Tensor = None  # bool, entries within rounding of a support threshold
    sparse_forms: bool = True  # whether exact zeros off the support are asserted
    grad_scale: float = 1.0
    """Bound on the Jacobian's entries (up to the row's ``C (n + 1)``): where even that times the
    cotangent overflows the dtype, the exact gradient may not be representable, so its
    finiteness is not asserted."""


def value_tolerance(n: int, compute_dtype: torch.dtype, out_dtype: torch.dtype, scale: float) -> float:
    return C_OPS * (n + 2) * torch.finfo(compute_dtype).eps * scale + torch.finfo(out_dtype).eps


def rounding_band(row: Tensor, compute_dtype: torch.dtype) -> float:
    """How far a threshold computed from sums of the row may be from its float64 value."""
    n = row.numel()
    return C_OPS * (n + 2) * torch.finfo(compute_dtype).eps * max(1.0, row.abs().max().item())


def _softmax(row: Tensor, params, form: str, cdt) -> Expected:
    return Expected([torch.softmax(row, -1)], 1.0, torch.zeros_like(row, dtype=torch.bool), sparse_forms=False)


def _ev_softmax(row: Tensor, params, form: str, cdt) -> Expected:
    """Eq. 7 (``forward``), Eq. 10 (``train``, ``log``): ``p ∝ (1{x >= mean} + eps) exp(x)``.

    The support ``{x >= min(mean, max)}`` changes discontinuously with the mean, which the
    library computes in the compute dtype: every threshold within rounding of the mean is a
    candidate (each gives the upper set of the row above it)."""
    eps = 0.0 if form == "forward" else float(params["eps"])
    mean, top = row.mean().item(), row.max().item()
    band = rounding_band(row, cdt)
    thresholds = {min(t, top) for t in [mean - band, mean + band] + row[(row - mean).abs() <= band].tolist()}
    e = torch.exp(row - top)
    candidates = []
    for t in sorted(thresholds):
        weight = (row >= t).double() + eps
        candidates.append(weight * e / (weight * e).sum())
    return Expected(candidates, 1.0, torch.zeros_like(row, dtype=torch.bool), sparse_forms=eps == 0.0)


def _projection(fn: Callable[[Tensor], Tensor], z: Tensor, map_of_tau, cdt) -> Expected:
    """``p = fn(z)``; ``map_of_tau`` gives each entry's distance to the threshold from ``p``."""
    p = fn(z.unsqueeze(0)).squeeze(0)
    distance = map_of_tau(z, p)
    near = distance.abs() <= rounding_band(z, cdt)
    return Expected([p], max(1.0, z.abs().max().item()), near)


def _sparsemax_distance(z, p):
    on = p > 0
    tau = (z[on] - p[on]).mean()
    return z - tau


def _sparsemax(row, params, form, cdt) -> Expected:
    return _projection(lambda z: entmax.sparsemax(z, -1), row, _sparsemax_distance, cdt)


def _entmax15(row, params, form, cdt) -> Expected:
    def distance(z, p):
        on = p > 0
        tau = (z[on] / 2 - p[on].sqrt()).mean()
        return z / 2 - tau

    return _projection(lambda z: entmax.entmax15(z, -1), row, distance, cdt)


def _entmax_bisect(row, params, form, cdt) -> Expected:
    alpha = float(params["alpha"])
    if alpha == 1.0:  # documented: exactly softmax
        return _softmax(row, params, form, cdt)

    def distance(z, p):
        on = p > 0
        if alpha < 1:  # dense map: no support threshold
            return torch.full_like(z, float("inf"))
        tau = ((alpha - 1) * z[on] - p[on] ** (alpha - 1)).mean()
        return (alpha - 1) * z - tau

    # float64 oracle with many more bisection steps than the library's 50
    expected = _projection(lambda z: entmax.entmax_bisect(z, alpha, -1, n_iter=200), row, distance, cdt)
    expected.scale *= max(1.0, 1.0 / abs(alpha - 1))
    expected.sparse_forms = alpha > 1
    return expected


def _sparsehourglass(row, params, form, cdt) -> Expected:
    q = float(params["q"])
    k = row.numel()
    alpha = (1 + q * k) / (row.sum().abs().item() + q * k)
    expected = _projection(lambda z: entmax.sparsemax(z, -1), alpha * row, _sparsemax_distance, cdt)
    # d(alpha z)/dz = alpha (I + z sign(sum z)^T / (|sum z| + qK)) up to sign
    expected.grad_scale = alpha * (1.0 + row.abs().max().item() / (row.sum().abs().item() + q * k))
    return expected


def _weighted_softmax(row: Tensor, tau: float, cdt) -> Expected:
    """``p ∝ relu(x - tau) exp(x)``; every weight 0 gives the uniform distribution over the arg-max."""
    top = row.max().item()
    w = (row - tau).clamp_min(0)
    e = torch.exp(row - top)
    if (w == 0).all():
        ties = (row == top).double()
        p, w_eff = ties / ties.sum(), 0.0
    else:
        p = w * e / (w * e).sum()
        w_eff = ((w * e).sum() / e[w > 0].sum()).item()
    dw = C_OPS * torch.finfo(cdt).eps * max(1.0, row.abs().max().item())
    near = (row - tau).abs() <= dw
    scale = 1.0 + (max(1.0, row.abs().max().item()) / w_eff if w_eff > 0 else float("inf"))
    # dp/dx has the terms e_j = p_j / w_j <= 1 / w_eff (and 0 on a dead row)
    return Expected([p], scale, near, grad_scale=1.0 + (1.0 / w_eff if w_eff > 0 else 0.0))


def _t_softmax(row, params, form, cdt) -> Expected:
    return _weighted_softmax(row, row.max().item() - float(params["t"]), cdt)


def _r_softmax(row, params, form, cdt) -> Expected:
    """Eq. 3: ``tau`` the linearly interpolated ``quantile(x, r)`` (``torch.quantile``'s default)."""
    return _weighted_softmax(row, torch.quantile(row, float(params["r"])).item(), cdt)


ORACLES: Dict[str, Callable[..., Expected]] = {
    "softmax": _softmax,
    "posthoc_evidential": _softmax,  # its registry forms are softmax (sparsified from the linear layer)
    "ev_softmax": _ev_softmax,
    "sparsemax": _sparsemax,
    "entmax15": _entmax15,
    "entmax_bisect": _entmax_bisect,
    "t_softmax": _t_softmax,
    "r_softmax": _r_softmax,
    "sparsehourglass": _sparsehourglass,
}
