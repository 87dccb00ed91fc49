"""float32 accuracy of ev-softmax (issue 8 item 3, issue 25 item 1), against an a-priori error model.

Oracle: the same function evaluated in float64 on the same float32 inputs. Every path computes a
probability as ``y_i = exp(t_i) / S`` with ``t_i = z_i - max`` and ``S = sum_j exp(t_j)`` in the
input's precision (the reference path through ``torch.softmax``, the C++ kernel in
``kernels/cpu/evidential.cpp``, at every SIMD level). With ``u`` the unit roundoff (``2**-24`` for
float32, ``2**-53`` for float64) the rounding operations and their worst-case relative errors are:

1. the exp argument: ``t_i`` is rounded once (``x_i - max``); in the training form an off-support
   entry is also shifted, ``z_i = x_i + shift``, with ``shift`` itself rounded to the input's
   precision. An absolute error ``d`` in ``t_i`` is a relative error ``d`` in ``exp(t_i)``, so this
   costs ``u * c_i`` with ``c_i`` the sum of the magnitudes of the rounded values
   (``|t_i|``, and ``|shift| + |x_i + shift|`` for shifted entries);
2. exp: at most ``EXP_ULPS = 1`` ulp, i.e. ``2u`` relative. AVX2/AVX512 builds (ours and
   ``torch.softmax``) call Sleef's ``expf*_u10``/``expd*_u10`` (documented bound 1.0 ulp); the
   DEFAULT level maps ``std::exp`` (glibc: < 1 ulp). No path uses ATen's faster ``exp_u20``;
   if one did, its bound would go here;
3. the sum: positive terms, so its relative error is at most ``m * u`` where ``m`` is the longest
   chain of additions any term goes through: ``ceil(K / W)`` per SIMD lane, then at most ``W - 1``
   across the ``W`` lanes and ``W - 1`` scalar tail terms, ``m <= ceil(K / W) + 2W`` (``W`` lanes:
   float32 16 at AVX512, 8 at AVX2 and DEFAULT, whose ``Vectorized`` is 32 bytes); the sum also
   carries the terms' own errors, ``sum_j y_j (c_j + 2 EXP_ULPS) u``;
4. the normalisation: ``1 / S`` then a product (two roundings; a true division is one): ``2u``.

First order in ``u``, per entry: ``|y_hat_i - y_i| <= y_i * u * (c_i + 2 EXP_ULPS + m + 2 +
sum_j y_j (c_j + 2 EXP_ULPS))``. Second-order terms are below 0.1% of that (every factor is
< 1e-3), covered by a factor 1.001. The float64 oracle obeys the same model with ``u = 2**-53``,
and the two bounds add. Below float32's normal range (``2**-126``) relative bounds do not hold
(gradual underflow of ``exp`` and of the product): there an absolute error of ``2**-126`` is
allowed. This is the whole tolerance; nothing in it comes from an error observed on a machine.
"""
from __future__ import annotations

import math

import pytest
import torch

from sparsenorm import ev_softmax, ev_softmax_train, kernels
from sparsenorm.kernels import cpu
from sparsenorm.kernels.reference.evidential import off_support_shift

SCALES = [1.0, 10.0, 100.0, 1e3, 1e4]
EXP_ULPS = 1  # Sleef u10 / glibc exp: at most one ulp (point 2 above)
SECOND_ORDER = 1.001
EPS_TRAIN = 0.1


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def simd_lanes(dtype: torch.dtype) -> int:
    """Lanes of ATen's ``Vectorized<dtype>`` at the level this process dispatches to (64-byte
    registers at AVX512, 32 bytes at AVX2 and DEFAULT)."""
    register_bytes = 64 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 32
    return register_bytes * 8 // torch.finfo(dtype).bits


def softmax_error_bound(exact: torch.Tensor, arg_rounding: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-entry bound on ``|computed - exact|`` for ``exp(t_i) / sum_j exp(t_j)`` over the last dim,
    computed in ``dtype`` (the model in this module's docstring).

    ``exact``: float64 probabilities; ``arg_rounding``: ``c_i``, the summed magnitudes of the values
    rounded while forming entry i's exp argument (point 1).
    """
    u = unit_roundoff(dtype)
    k = exact.shape[-1]
    lanes = simd_lanes(dtype)
    additions = math.ceil(k / lanes) + 2 * lanes
    per_term = (arg_rounding + 2 * EXP_ULPS) * u  # points 1 and 2
    carried = (exact * per_term).sum(-1, keepdim=True)  # point 3: the terms' errors, carried by S
    relative = per_term + carried + additions * u + 2 * u  # points 3 and 4
    return SECOND_ORDER * exact * relative


def assert_within_error_model(got: torch.Tensor, exact: torch.Tensor, arg_rounding: torch.Tensor) -> None:
    """``got`` (float32) agrees with the float64 oracle ``exact`` within the model: the float32
    bound plus the oracle's own float64 bound, and ``2**-126`` absolute below the normal range."""
    assert got.dtype == torch.float32 and exact.dtype == torch.float64
    bound = (softmax_error_bound(exact, arg_rounding, torch.float32)
             + softmax_error_bound(exact, arg_rounding, torch.float64)
             + torch.finfo(torch.float32).tiny)
    err = (got.double() - exact).abs()
    worst = (err / bound).argmax()
    assert (err <= bound).all(), (
        f"error {err.flatten()[worst].item():.3e} > bound {bound.flatten()[worst].item():.3e} at an entry "
        f"of probability {exact.flatten()[worst].item():.3e} (level {torch.backends.cpu.get_cpu_capability()})")


def inputs(scale, seed=0):
    """Short rows (where centering at the mean cost accuracy most) and long ones."""
    rows = []
    for k, n in ((4, 2000), (10, 2000), (1000, 100)):
        gen = torch.Generator().manual_seed(seed + k)
        x = (torch.randn(n, k, generator=gen, dtype=torch.float64) * scale).float()
        # keep rows whose entries are clear of the mean, so float32 and float64 agree on the support
        x64 = x.double()
        gap = (x64 - x64.mean(-1, keepdim=True)).abs().amin(-1)
        rows.append(x[gap > 1e-4 * scale])
    return rows


def run_path(path, fn, x):
    """``fn(x)`` on the reference path or the C++ kernel of this process's SIMD level."""
    if path == "reference":
        with kernels.disabled():
            return fn(x)
    if cpu.EVIDENTIAL.kernel_for(x) is None:
        pytest.skip(f"the C++ kernel is not built at this SIMD level ({cpu.EVIDENTIAL.error or 'not built'}; "
                    "`sparsenorm build-kernels`)")
    return fn(x)


def support_of(x):
    return x.double() >= x.double().mean(-1, keepdim=True)


PATHS = ["kernel", "reference"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scale", SCALES)
def test_ev_softmax_float32_within_error_model(scale, path):
    for x in inputs(scale):
        assert x.shape[0] > 50
        got = run_path(path, ev_softmax, x)
        exact = ev_softmax(x.double())
        support = support_of(x)
        assert not ((got > 0) & ~support).any()  # (on the support, float32 may underflow to 0)
        t = x.double() - x.double().amax(-1, keepdim=True)
        assert_within_error_model(got, exact, t.abs())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scale", SCALES)
def test_ev_softmax_train_float32_within_error_model(scale, path):
    shift = off_support_shift(EPS_TRAIN)
    for x in inputs(scale, seed=1):
        got = run_path(path, lambda v: ev_softmax_train(v, eps=EPS_TRAIN), x)
        exact = ev_softmax_train(x.double(), eps=EPS_TRAIN)
        x64 = x.double()
        z = torch.where(support_of(x), x64, x64 + shift)
        t = z - x64.amax(-1, keepdim=True)
        shifted_terms = torch.where(support_of(x), torch.zeros_like(z), abs(shift) + z.abs())
        assert_within_error_model(got, exact, t.abs() + shifted_terms)


@pytest.mark.parametrize("scale", SCALES)
def test_the_model_holds_for_torch_softmax(scale):
    """The model is not specific to our code: ``torch.softmax`` (an independent implementation of
    the same three steps) satisfies it on the same inputs."""
    for x in inputs(scale, seed=2):
        exact = torch.softmax(x.double(), -1)
        t = x.double() - x.double().amax(-1, keepdim=True)
        assert_within_error_model(torch.softmax(x, -1), exact, t.abs())


def test_the_check_can_fail():
    """One rounding more than the model allows (the exp evaluated in bfloat16) is caught."""
    x = inputs(1.0, seed=3)[2]
    exact = torch.softmax(x.double(), -1)
    t = x - x.amax(-1, keepdim=True)
    coarse = t.bfloat16().float().exp()
    with pytest.raises(AssertionError, match="bound"):
        assert_within_error_model(coarse / coarse.sum(-1, keepdim=True), exact, t.double().abs())
