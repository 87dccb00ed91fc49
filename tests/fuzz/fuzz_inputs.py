"""Hypothesis settings and input strategies shared by the fuzz suite (issue 25, item 3).

Budgets: the profile ``fuzz`` (default suite: 25 examples per test, derandomized, so CI is
reproducible) or ``fuzz-slow`` (``make test-slow`` sets ``SPARSENORM_FUZZ_PROFILE=fuzz-slow``: a large,
randomized budget that explores new inputs on every run; a failure prints the seed to replay).

Inputs (:func:`scores`): shapes with 0-size and 1-wide dimensions, any ``dim`` (negative too),
contiguous, transposed, sliced (strided) and expanded (stride-0) layouts, float16/bfloat16/
float32/float64, magnitudes up to 1e4, subnormals, NaN/+inf/-inf and ``finfo.min`` entries, and
every mask form: none, boolean (broadcast, all-masked rows included), ``-inf`` filled in the
input, and an additive float mask of ``finfo(dtype).min`` added to the input.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("fuzz", max_examples=25, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_HEALTH)
settings.register_profile("fuzz-slow", max_examples=400, deadline=None, derandomize=False, database=None,
                          print_blob=True, suppress_health_check=_HEALTH)
PROFILE = os.environ.get("SPARSENORM_FUZZ_PROFILE", "fuzz")
FUZZ = settings(settings.get_profile(PROFILE))
"""Decorator giving a fuzz test the selected budget."""

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")
MASK_FORMS = ("none", "bool", "-inf", "additive")
SPECIALS = ("none", "subnormal", "nan", "+inf", "-inf", "finfo.min")


@dataclass
class Scores:
    """One fuzz input: ``x`` (any layout; ``base`` is the leaf to differentiate) and its ``mask``."""

    x: torch.Tensor
    base: torch.Tensor
    dim: int
    mask: Optional[torch.Tensor]
    layout: str
    mask_form: str

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return (f"Scores(dtype={self.x.dtype}, shape={tuple(self.x.shape)}, dim={self.dim}, layout={self.layout}, "
                f"mask_form={self.mask_form},\n  x={self.x.double().tolist()},\n  "
                f"mask={None if self.mask is None else self.mask.tolist()})")


def special_values(kind: str, dtype: torch.dtype) -> list:
    finfo = torch.finfo(dtype)
    return {
        "none": [],
        "subnormal": [finfo.smallest_normal * finfo.eps, -finfo.smallest_normal * finfo.eps, finfo.tiny, 0.0],
        "nan": [math.nan],
        "+inf": [math.inf],
        "-inf": [-math.inf],
        "finfo.min": [finfo.min, finfo.min / 2],
    }[kind]


@st.composite
def values(draw, shape, dtype) -> torch.Tensor:
    """A float64 tensor of ``shape`` (cast to ``dtype``): finite values up to a drawn magnitude,
    plus, in some examples, one kind of special value."""
    n = math.prod(shape)
    magnitude = draw(st.sampled_from([1.0, 100.0, 1e4]))
    finite = st.floats(-magnitude, magnitude, allow_nan=False, allow_infinity=False)
    special = special_values(draw(st.sampled_from(SPECIALS)), dtype)
    element = st.one_of(finite, st.sampled_from(special)) if special else finite
    flat = draw(st.lists(element, min_size=n, max_size=n))
    return torch.tensor(flat, dtype=torch.float64).reshape(shape).to(dtype)


@st.composite
def scores(draw, dtypes=DTYPES, max_dims: int = 3, max_size: int = 6, mask_forms=MASK_FORMS) -> Scores:
    dtype = draw(st.sampled_from(dtypes))
    ndim = draw(st.integers(1, max_dims))
    shape = tuple(draw(st.lists(st.integers(0, max_size), min_size=ndim, max_size=ndim)))
    dim = draw(st.integers(-ndim, ndim - 1))
    layout = draw(st.sampled_from(LAYOUTS))
    if layout == "transposed" and ndim >= 2:
        base = draw(values(shape[::-1], dtype))
        x_of = lambda b: b.permute(*reversed(range(ndim)))  # noqa: E731
    elif layout == "sliced":
        base = draw(values(shape[:-1] + (2 * shape[-1],), dtype))
        x_of = lambda b: b[..., ::2]  # noqa: E731
    elif layout == "expanded":
        axis = draw(st.integers(0, ndim - 1))
        base = draw(values(shape[:axis] + (1,) + shape[axis + 1:], dtype))
        x_of = lambda b: b.expand(shape)  # noqa: E731
    else:
        layout = "contiguous"
        base = draw(values(shape, dtype))
        x_of = lambda b: b  # noqa: E731
    base.requires_grad_(True)
    x = x_of(base)
    assert tuple(x.shape) == shape
    mask_form = draw(st.sampled_from(mask_forms))
    mask = None
    if mask_form != "none":
        # a mask broadcast along some dims; with drop-probability 1 every row is masked
        mask_shape = tuple(s if draw(st.booleans()) else 1 for s in shape)
        keep = draw(st.lists(st.booleans(), min_size=math.prod(mask_shape), max_size=math.prod(mask_shape)))
        keep = torch.tensor(keep, dtype=torch.bool).reshape(mask_shape)
        if mask_form == "bool":
            mask = keep
        elif mask_form == "-inf":
            x = x.masked_fill(~keep, -math.inf)
        else:  # additive, as Hugging Face builds it
            x = x + torch.zeros(mask_shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    return Scores(x, base, dim, mask, layout, mask_form)
