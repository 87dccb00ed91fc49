"""The fused C++ CPU kernel for ev-softmax (sparsenorm/kernels/cpu/evidential.cpp).

Oracle: the pure-PyTorch reference (sparsenorm/kernels/reference/evidential.py, itself tested
against the paper's formulas in test_evidential.py), run with ``sparsenorm.kernels.disabled()``,
and the float64 formula. Agreement standard, by the contract of tests/knife_edge.py: the NaN
pattern (NaN or +inf rows) is identical; an entry farther from its row's threshold than the
threshold's rounding bound (a sum of n terms: 4 (n + 4) u max|x|) gets the same decision in both
paths; each path's values equal the float64 formula on that path's own support to
16 ulp relative + 8 ulp · (1 + max|x|) absolute (both round ``x - threshold`` to the input's
precision before the exp). An entry within the bound (a tie with the mean, a mean of equal
entries) may be decided differently: the kernel sums the row mean in another order (in double).

The extension is compiled once per session (module fixture; about a minute the first time on a
busy 2-core machine, then cached on disk); without a compiler or ninja every test here SKIPS.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import sparsenorm
from sparsenorm import ev_softmax, ev_softmax_train, log_ev_softmax_train, kernels
from sparsenorm.kernels import cpu as cpu_kernels

from knife_edge import assert_ev_softmax_by_contract

NEG_INF = float("-inf")

# (label, function(x, dim), is_log)
FUNCS = [
    ("ev_softmax", lambda x, d: ev_softmax(x, d), False),
    ("ev_softmax_train", lambda x, d: ev_softmax_train(x, d), False),
    ("ev_softmax_train(eps=0.5)", lambda x, d: ev_softmax_train(x, d, eps=0.5), False),
    ("ev_softmax_train(eps=0)", lambda x, d: ev_softmax_train(x, d, eps=0.0), False),
    ("log_ev_softmax_train", lambda x, d: log_ev_softmax_train(x, d), True),
    ("log_ev_softmax_train(eps=0)", lambda x, d: log_ev_softmax_train(x, d, eps=0.0), True),
]
FUNC_IDS = [f[0] for f in FUNCS]
DTYPES = [torch.float32, torch.float64]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    """Build (or load the cached) extension once; skip the module if it cannot be built."""
    saved = cpu_kernels._code_setting
    ext = cpu_kernels.EVIDENTIAL.load()
    if ext is None:
        pytest.skip(f"C++ CPU kernel could not be built: {cpu_kernels.EVIDENTIAL.error}")
    sparsenorm.use_cpu_kernels(True)
    yield ext
    cpu_kernels._code_setting = saved


def both_paths(fn, x, dim, **kw):
    """(pure-PyTorch output, kernel output) of fn(x, dim)."""
    with kernels.disabled():
        pure = fn(x, dim, **kw)
    fused = fn(x, dim, **kw)
    return pure, fused


def kernel_runs(x):
    """Whether the kernel (not the reference) would run on ``x`` (rows along the last dim)."""
    return cpu_kernels.EVIDENTIAL.kernel_for(x) is not None


# Eq. 10's eps of each function in FUNCS (None: Eq. 7)
EPS = {"ev_softmax": None, "ev_softmax_train": 1e-6, "ev_softmax_train(eps=0.5)": 0.5,
       "ev_softmax_train(eps=0)": 0.0, "log_ev_softmax_train": 1e-6, "log_ev_softmax_train(eps=0)": 0.0}


def assert_agree(pure, fused, x, is_log, label, dim=-1):
    """The kernel and the reference by the contract (tests/knife_edge.py): the NaN pattern (NaN or
    +inf rows) is structural and identical; an entry farther from its row's threshold than the
    rounding bound of the threshold gets the same decision in both, and each path's values equal
    the float64 oracle on its own support to 16 ulp relative + 8 ulp (1 + max|x|) absolute."""
    assert pure.shape == fused.shape and pure.dtype == fused.dtype
    assert torch.equal(torch.isnan(pure), torch.isnan(fused)), "NaN pattern differs"
    rows = lambda t: t.movedim(dim, -1).reshape(-1, t.shape[dim])  # noqa: E731
    x, pure, fused = rows(x), rows(pure), rows(fused)
    ok = ~torch.isnan(pure).any(-1)
    x, pure, fused = x[ok], pure[ok], fused[ok]
    eps = torch.finfo(x.dtype).eps
    finite_x = x[torch.isfinite(x) & (x > torch.finfo(x.dtype).min / 2)]
    scale = 1.0 + (float(finite_x.abs().max()) if finite_x.numel() else 0.0)
    assert_ev_softmax_by_contract({"reference": pure, "kernel": fused}, x, EPS[label], is_log,
                                  rtol=16 * eps, atol=8 * eps * scale)


def cases(dtype):
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, scale=3.0):
        return torch.randn(shape, generator=gen, dtype=dtype) * scale

    with_neg_inf = randn(6, 40)
    with_neg_inf[0, :5] = NEG_INF
    with_neg_inf[2, :] = NEG_INF  # a row with no valid entry
    with_nan = randn(4, 17)
    with_nan[1, 3] = float("nan")
    with_nan[3, 0] = float("inf")
    with_nan[0, :] = NEG_INF
    additive = randn(5, 33)
    additive[0, ::3] = torch.finfo(dtype).min  # Hugging Face's additive mask: not there
    additive[1, :] = torch.finfo(dtype).min
    additive[2, :7] = torch.finfo(dtype).min / 2
    additive[3, 5] = NEG_INF
    return [
        ("K=1", randn(6, 1), -1),
        ("small", randn(5, 13), -1),
        ("vector tail", randn(3, 37), -1),
        ("long rows", randn(2, 3001), -1),
        ("dim 0", randn(100, 3), 0),
        ("middle dim", randn(4, 37, 5), 1),
        ("3-D last", randn(2, 3, 50), -1),
        ("ties with the mean", torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0],
                                             [5.0, 5.0, 5.0], [-2.0, 2.0, 0.0]], dtype=dtype), -1),
        ("integer ties, long", torch.arange(64, dtype=dtype).remainder(7).view(4, 16), -1),
        ("all equal (rounded mean)", torch.full((5, 1000), 0.1, dtype=dtype), -1),
        ("all equal, short", torch.full((3, 7), 0.3, dtype=dtype), -1),
        ("-inf entries and an empty row", with_neg_inf, -1),
        ("-inf, dim 0", with_neg_inf.T.contiguous(), 0),
        ("NaN and +inf rows", with_nan, -1),
        ("additive finfo.min masks", additive, -1),
        ("large magnitudes", randn(8, 300, scale=1e4), -1),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("label,fn,is_log", FUNCS, ids=FUNC_IDS)
def test_kernel_matches_pure_path(label, fn, is_log, dtype):
    for case, x, dim in cases(dtype):
        pure, fused = both_paths(fn, x, dim)
        try:
            assert_agree(pure, fused, x, is_log, label, dim)
        except AssertionError as err:
            raise AssertionError(f"{label}, {case}: {err}") from None


def test_kernel_path_is_taken_when_enabled_only():
    x = torch.randn(4, 10)
    assert kernel_runs(x)
    with kernels.disabled():
        assert not kernel_runs(x)
        with kernels.disabled():  # nested
            assert not kernel_runs(x)
        assert not kernel_runs(x)
    assert kernel_runs(x)
    assert not kernel_runs(x.half())  # upcast happens before
    assert not kernel_runs(torch.randn(4, 0))  # K = 0: reference path
    sparsenorm.use_cpu_kernels(False)
    try:
        assert not kernel_runs(x)
    finally:
        sparsenorm.use_cpu_kernels(True)


def test_disabled_is_per_thread():
    import threading

    seen = []
    with kernels.disabled():
        t = threading.Thread(target=lambda: seen.append(kernel_runs(torch.randn(2, 3))))
        t.start()
        t.join()
    assert seen == [True]


def test_rounded_mean_row_is_capped_row_by_row():
    # In float64 the mean of (0.1⁻, 0.1, 0.1) rounds above its max: the threshold is capped at
    # the max in both paths, whatever the other rows hold, leaving the two max entries.
    row = torch.tensor([math.nextafter(0.1, 0.0), 0.1, 0.1], dtype=torch.float64)
    assert row.mean() > row.max()
    for x in (row[None], torch.stack([row, torch.tensor([NEG_INF, 1.0, 2.0], dtype=torch.float64)])):
        for label, fn, is_log in FUNCS:
            pure, fused = both_paths(fn, x, -1)
            assert_agree(pure, fused, x, is_log, label)
        pure, fused = both_paths(ev_softmax, x, -1)
        assert fused[0, 0] == 0 and fused[0, 1] == fused[0, 2] == 0.5


def finite_part(out):
    """log 0 = -inf outputs (masked entries, eps = 0) are constants; finite differences of them
    are NaN, so gradcheck sees them as 0 (their incoming gradient is dropped, as backward does)."""
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))


@pytest.mark.parametrize("label,fn,is_log", FUNCS, ids=FUNC_IDS)
def test_gradcheck_through_kernel(label, fn, is_log):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 5, generator=gen, dtype=torch.float64)
    x[0, 0, 1] = NEG_INF  # masked path: -inf entries get zero gradient
    assert kernel_runs(x)
    for dim in (-1, 1):
        inp = x.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda t: finite_part(fn(t, dim)), (inp,))


@pytest.mark.parametrize("label,fn,is_log", FUNCS, ids=FUNC_IDS)
def test_gradients_match_pure_path_and_empty_rows_get_zero(label, fn, is_log):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 33, generator=gen) * 3
    x[1] = NEG_INF
    x[3, :4] = NEG_INF
    grad_out = torch.randn(5, 33, generator=gen)
    grads = []
    for disable in (True, False):
        inp = x.clone().requires_grad_(True)
        if disable:
            with kernels.disabled():
                fn(inp, -1).backward(grad_out)
        else:
            fn(inp, -1).backward(grad_out)
        grads.append(inp.grad)
    assert torch.isfinite(grads[1]).all()
    assert torch.equal(grads[1][1], torch.zeros(33))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_half_input_uses_kernel_and_returns_half():
    x = torch.randn(4, 50, dtype=torch.float16)
    pure, fused = both_paths(ev_softmax, x, -1)
    assert fused.dtype == torch.float16
    torch.testing.assert_close(fused, pure)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 70)),
              elements=st.floats(-50, 50, width=32)))
@example(np.array([[1e-45, 0.0]], dtype=np.float32))  # a subnormal mean: rounding is absolute there (knife_edge)
def test_kernel_matches_pure_path_property(values):
    x = torch.from_numpy(values)
    for label, fn, is_log in FUNCS:
        pure, fused = both_paths(fn, x, -1)
        assert_agree(pure, fused, x, is_log, label)


def test_env_switch_and_code_setting(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_code_setting", None)
    monkeypatch.delenv("SPARSENORM_CPU_KERNELS", raising=False)
    assert cpu_kernels._policy() is None  # default: used where built, never built by a call
    monkeypatch.setenv("SPARSENORM_CPU_KERNELS", "0")
    assert not cpu_kernels.cpu_kernels_enabled()
    monkeypatch.setenv("SPARSENORM_CPU_KERNELS", "1")
    assert cpu_kernels._policy() is True
    sparsenorm.use_cpu_kernels(False)  # code wins over the environment
    assert not cpu_kernels.cpu_kernels_enabled()


def test_default_policy_loads_a_built_kernel_without_compiling(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_code_setting", None)
    monkeypatch.delenv("SPARSENORM_CPU_KERNELS", raising=False)
    fresh = cpu_kernels.Extension("evidential", "ev-softmax")
    assert fresh._import_built() is not None  # built by the fixture: found in the cache

    def no_compiling(*args, **kwargs):
        raise AssertionError("an ordinary call must not compile")

    monkeypatch.setattr(fresh, "build", no_compiling)
    assert fresh.get() is not None
    missing = cpu_kernels.Extension("evidential", "ev-softmax")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/nonexistent-sparsenorm-build-dir")
    monkeypatch.setattr(missing, "build", no_compiling)
    assert missing.get() is None  # not built: the reference path, nothing compiled


def test_a_kernel_built_meanwhile_is_not_picked_up_mid_process(monkeypatch):
    """Under the default policy the built library is looked for once: a kernel that another
    process finishes building later does not switch this process's path (and rounding) mid-run."""
    monkeypatch.setattr(cpu_kernels, "_code_setting", None)
    monkeypatch.delenv("SPARSENORM_CPU_KERNELS", raising=False)
    ext = cpu_kernels.Extension("evidential", "ev-softmax")
    looks = []
    monkeypatch.setattr(ext, "_import_built", lambda: looks.append(1))  # not built yet: None
    assert ext.get() is None
    monkeypatch.setattr(ext, "_import_built", lambda: looks.append(2) or object())  # now it is
    assert ext.get() is None and looks == [1]


def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_kernels.EVIDENTIAL, "module", None)
    monkeypatch.setattr(cpu_kernels.EVIDENTIAL, "error", None)
    monkeypatch.setattr(cpu_kernels.EVIDENTIAL, "source", tmp_path / "missing.cpp")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "build"))
    monkeypatch.setattr(cpu_kernels, "_code_setting", True)
    x = torch.randn(3, 8)
    with pytest.warns(RuntimeWarning, match="could not build the C\\+\\+ CPU kernel"):
        out = ev_softmax(x)
    assert "missing.cpp" in cpu_kernels.EVIDENTIAL.error
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        again = ev_softmax(x)
    with kernels.disabled():
        torch.testing.assert_close(out, ev_softmax(x), rtol=0, atol=0)
    torch.testing.assert_close(again, out, rtol=0, atol=0)
