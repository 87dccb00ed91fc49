"""Fuzzing every registry normalizer, in every form, against float64 oracles (issue 25, item 3).

Driven by :mod:`sparsenorm.registry` (every name, its evaluation/training/log forms, its parameters
drawn at random). Inputs: :mod:`fuzz_inputs` (shapes, dims, layouts, dtypes, magnitudes, special
values, every mask form). Per row along ``dim``, with "there" the library's rule (not ``-inf``,
not ``<= finfo.min / 2``, ``mask`` True):

* a row with NaN (or ``+inf``) there is that row's business only; it must show NaN when NaN is
  there, and is otherwise not checked;
* every other row: no NaN; entries not there are exactly 0 (log form: ``-inf``); a row with
  nothing there is all 0; else the result is within the error model (:mod:`fuzz_oracles`) of the
  float64 oracle, hence sums to 1; and the support rule holds exactly: an entry the oracle gives
  0, farther than rounding from the threshold, is exactly 0;
* gradients (random cotangent) are finite on those rows, and 0 on entries not there and on rows
  with nothing there;
* the kernel path equals the reference path (``sparsenorm.kernels.disabled()``), values and
  gradients, within twice the error model (each is within it of the oracle).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz_inputs import FUZZ, scores
from fuzz_oracles import C_OPS, ORACLES, value_tolerance
from sparsenorm import kernels, registry
from sparsenorm._validation import compute_dtype, not_there_level

PARAMETERS = {
    "alpha": st.one_of(st.sampled_from([1.0, 1.5, 2.0]), st.floats(0.2, 3.0)),
    "eps": st.one_of(st.just(1e-6), st.floats(0.0, 1.0)),
    "r": st.floats(0.0, 1.0),
    "t": st.floats(1e-3, 1e3),
    "q": st.floats(1e-3, 1e3),
}
"""How to draw each registry parameter (every parameter any normalizer has must be here)."""


def forms(entry):
    out = {"forward": entry.forward}
    if entry.train_forward is not entry.forward:
        out["train"] = entry.train_forward
    if entry.log_prob is not None:
        out["log"] = entry.log_prob
    return out


CASES = [(name, form) for name in registry.names() for form in forms(registry.get(name))]


def test_every_registry_normalizer_has_an_oracle_and_parameter_strategies():
    for name in registry.names():
        assert name in ORACLES, f"add a float64 oracle for {name!r} to fuzz_oracles.ORACLES"
        for param in registry.get(name).params:
            assert param in PARAMETERS, f"add a strategy for {name}'s parameter {param!r}"


def there(x, mask):
    keep = ~(x.double() <= not_there_level(x.dtype))  # NaN counts as there
    return keep if mask is None else keep & mask.expand(x.shape)


def rows_of(t, dim):
    moved = t.movedim(dim, -1)
    return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])


def max_abs(t):
    return t.abs().max().item() if t.numel() else 0.0


def call(fn, s, g):
    """Output and input gradient (``None`` for an empty input) of ``fn`` on ``s``."""
    out = fn(s.x, dim=s.dim, mask=s.mask)
    if out.numel() == 0:
        return out.detach(), None
    finite_g = torch.where(torch.isfinite(out), g, torch.zeros_like(g))
    (grad,) = torch.autograd.grad(out, s.x, finite_g)
    return out.detach(), grad


class RowChecker:
    """The per-row expectations of one input (oracle, tolerance, which rows are checked)."""

    def __init__(self, name, form, params, s, g):
        self.is_log = form == "log"
        self.dtype, self.g_max = s.x.dtype, max_abs(g.double())
        x, keep = s.x.detach(), there(s.x.detach(), s.mask)
        n = x.shape[s.dim]
        self.dim = s.dim
        self.x_rows, self.keep_rows = rows_of(x.double(), s.dim), rows_of(keep, s.dim)
        cdt = compute_dtype(x)
        self.rows = []
        for x_row, k_row in zip(self.x_rows, self.keep_rows):
            bad = bool((torch.isnan(x_row) & k_row).any() or (torch.isposinf(x_row) & k_row).any())
            if bad or not k_row.any():
                self.rows.append((bad, None, 0.0))
                continue
            expected = ORACLES[name](x_row[k_row], params, form, cdt)
            tol = value_tolerance(n, cdt, x.dtype, expected.scale)
            self.rows.append((bad, expected, tol))

    def check_values(self, out, label=""):
        for i, (out_row, x_row, k_row, (bad, expected, tol)) in enumerate(
                zip(rows_of(out.double(), self.dim), self.x_rows, self.keep_rows, self.rows)):
            where = f"{label} row {i}: x={x_row.tolist()} keep={k_row.tolist()} out={out_row.tolist()}"
            if bad:
                if (torch.isnan(x_row) & k_row).any():
                    assert torch.isnan(out_row).any(), "a row with NaN must show it; " + where
                continue
            assert not torch.isnan(out_row).any(), "NaN in a row without NaN; " + where
            p = out_row.exp() if self.is_log else out_row
            assert (p[~k_row] == 0).all(), "entries not there must get exactly 0; " + where
            if expected is None:
                continue  # nothing there: all zero, checked above
            got = p[k_row]
            errors = [max_abs(got - c) for c in expected.candidates]
            best = min(range(len(errors)), key=errors.__getitem__)
            assert errors[best] <= tol, f"error {errors[best]:.3g} > tolerance {tol:.3g}; " + where
            if expected.sparse_forms:
                outside = (expected.candidates[best] == 0) & ~expected.near
                assert (got[outside] == 0).all(), "support rule: an entry off the support is not 0; " + where

    def representable(self, expected, n):
        """Whether the row's exact gradient is surely finite in the dtype (see ``Expected.grad_scale``)."""
        return expected is None or C_OPS * (n + 1) * self.g_max * expected.grad_scale < torch.finfo(self.dtype).max

    def check_gradient(self, grad, label=""):
        if grad is None:
            return
        for i, (g_row, k_row, (bad, expected, tol)) in enumerate(
                zip(rows_of(grad.double(), self.dim), self.keep_rows, self.rows)):
            if bad:
                continue
            where = f"{label} row {i}: keep={k_row.tolist()} grad={g_row.tolist()}"
            assert torch.isfinite(g_row).all() or not self.representable(expected, len(k_row)), (
                "gradient not finite; " + where)
            assert (g_row[~k_row] == 0).all(), "gradient of an entry not there must be 0; " + where

    def assert_paths_agree(self, out_k, out_r, grad_k, grad_r, g, kind):
        g_max = max_abs(g.double())
        for i, (ok, orf, (bad, expected, tol)) in enumerate(
                zip(rows_of(out_k.double(), self.dim), rows_of(out_r.double(), self.dim), self.rows)):
            if bad:
                assert torch.isnan(ok).any() == torch.isnan(orf).any(), f"row {i}: NaN on one path only"
                continue
            if expected is not None and len(expected.candidates) > 1:
                continue  # each path picks its own rounding of the threshold, both checked against the oracle
            pk, pr = (ok.exp(), orf.exp()) if self.is_log else (ok, orf)
            assert max_abs(pk - pr) <= 2 * tol, f"row {i}: kernel {pk.tolist()} != reference {pr.tolist()}"
        if grad_k is None:
            return
        n = out_k.shape[self.dim]
        for i, (gk, gr, (bad, expected, tol)) in enumerate(
                zip(rows_of(grad_k.double(), self.dim), rows_of(grad_r.double(), self.dim), self.rows)):
            if bad or (expected is not None and len(expected.candidates) > 1) or not self.representable(expected, n):
                continue
            # The backward is a function of the output: Lipschitz (softmax, sparsemax) or, through
            # sqrt(p) (1.5-entmax), Hölder-1/2 in it.
            dp = 2 * tol if kind != "entmax15" else math.sqrt(2 * tol)
            bound = 2 * (n + 1) * g_max * dp
            assert max_abs(gk - gr) <= bound, f"row {i}: kernel grad {gk.tolist()} != reference {gr.tolist()}"


@pytest.mark.parametrize("name,form", CASES, ids=[f"{n}-{f}" for n, f in CASES])
@FUZZ
@given(s=scores(), data=st.data())
def test_normalizer_on_fuzzed_input(name, form, s, data):
    entry = registry.get(name)
    params = {p: data.draw(PARAMETERS[p], label=p) for p in entry.params}
    fn = forms(registry.get(name, **params) if params else entry)[form]
    g = torch.randn(s.x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(s.x.dtype)

    out, grad = call(fn, s, g)
    assert out.shape == s.x.shape and out.dtype == s.x.dtype
    checker = RowChecker(name, form, params, s, g)
    checker.check_values(out)
    checker.check_gradient(grad)

    if entry.cpu_kernel:
        with kernels.disabled():
            out_r, grad_r = call(fn, s, g)
        checker.check_values(out_r, "reference path")
        checker.check_gradient(grad_r, "reference path")
        checker.assert_paths_agree(out, out_r, grad, grad_r, g, name)
