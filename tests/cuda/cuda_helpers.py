"""Inputs and error bounds shared by the CUDA suite.

Error model: every comparison is against a float64 oracle (or the reference path) on the SAME
inputs (already rounded to the tested dtype), so the only differences are the kernel's roundings.
Each bound is ``ulp(dtype) * |ref|`` (the output's own rounding, <= half an ulp, counted as one)
plus ``ulp(float32) * n_ops * scale``, where ``n_ops`` counts the float32 operations an entry's
error can accumulate through (a tree reduction of N terms: log2 N; a chunked one: N / CHUNK more)
and ``scale`` is the magnitude those operations run on (computed by the test from |inputs|).
No bound was tuned to what a machine showed.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch

ULP32 = torch.finfo(torch.float32).eps
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GRID = 64  # inputs on a 1/64 grid inside (-4, 4): exact in float32, float16 and bfloat16
FULL_CONFIGS: Dict[object, list] = {}
"""Each pinned autotuner's full configuration list (filled by conftest)."""


def ulp(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def rounding(dtype: torch.dtype, magnitude) -> object:
    """The error of rounding a value of this magnitude into ``dtype``: one ulp relative, or the
    subnormal spacing (``smallest_normal * eps``) for values below the normal range."""
    info = torch.finfo(dtype)
    return info.eps * magnitude + info.smallest_normal * info.eps


def reduction_ops(n: int, chunk: Optional[int] = None) -> float:
    """Float32 roundings an entry's result can collect through a reduction over ``n`` terms."""
    ops = math.ceil(math.log2(max(n, 2)))
    if chunk is not None and n > chunk:
        ops += math.ceil(n / chunk)
    return ops


def autotuners(module) -> list:
    """The ``triton.runtime.Autotuner`` objects among ``module``'s kernels."""
    from triton.runtime.autotuner import Autotuner

    return [obj for obj in vars(module).values() if isinstance(obj, Autotuner)]


def grid_rows(n_rows: int, n_cols: int, seed: int) -> torch.Tensor:
    """float64 rows on the 1/64 grid in (-4, 4). Every dtype holds them exactly, and float32 sums
    up to 65,536 of them exactly (fewer than 2^24 grid steps), so a kernel's ``mean = sum / count``
    is the correctly rounded quotient: exactly an entry's value where the mean equals it (a tie),
    else off by less than the distance 1 / (64 count) to the nearest entry. So the ``x >= mean``
    support is the float64 one, and ev-softmax's discontinuity cannot make a spurious difference."""
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(n_rows, n_cols, generator=g, dtype=torch.float64) * 1.5 * GRID).round().clamp(-255, 255)
    return k / GRID


def assert_within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """``|got - want| <= bound`` entrywise (float64), NaN exactly where ``want`` is NaN, infinities equal."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    bound = torch.as_tensor(bound, dtype=torch.float64).cpu().expand(want.shape)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    assert torch.equal(nan_got, nan_want), f"{what}: NaN at {int((nan_got ^ nan_want).sum())} wrong places"
    inf = torch.isinf(want) | torch.isinf(got)
    assert torch.equal(got[inf], want[inf]), f"{what}: infinities differ"
    fine = ~(nan_want | inf)
    err = (got - want).abs()[fine]
    allowed = bound[fine]
    if err.numel() and not (err <= allowed).all():
        worst = (err / allowed.clamp_min(1e-300)).argmax()
        raise AssertionError(f"{what}: {int((err > allowed).sum())} of {err.numel()} entries off; worst "
                             f"|error| {err[worst].item():.3g} > bound {allowed[worst].item():.3g}")
