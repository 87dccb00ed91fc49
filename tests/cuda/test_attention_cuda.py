"""Flash ev-softmax attention (Triton) on the GPU against a float64 oracle: values and the three
gradients, with key lengths (a zero length too), boolean key masks, causal masks, GQA, head dims
16 to 128 (powers of two and not), L and S from 1 to 16,384, float32/float16/bfloat16; every
autotuning configuration; and ``sparse_attention``'s CUDA route against its reference path.

Exact supports: ``q`` and ``k`` lie on a 1/8 grid in [-2, 2], so every score ``q . k`` is a sum of
products that are multiples of 1/64 below 2^15 in size, which float32 (and the tensor cores'
float32 accumulation) computes exactly. The kernel then decides ``fl32(s * qk_scale) >= thr`` with
the threshold it returns, and the oracle makes that same float32 decision from the exact score:
the support is identical, and what is left to bound is smooth rounding (``cuda_helpers``).
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import pytest
import torch

import sparsenorm
from cuda_helpers import FULL_CONFIGS, ULP32, assert_within, rounding, ulp

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

LOG2E = 1.4426950408889634
QK_GRID = 8


def grid_normal(shape, gen, std=0.7, limit=2.0) -> torch.Tensor:
    """float64 normal draws rounded to the 1/8 grid, clamped to [-limit, limit]."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * std * QK_GRID).round().clamp(
        -limit * QK_GRID, limit * QK_GRID) / QK_GRID


def valid_keys(B, L, S, key_lengths, key_mask, causal, device, causal_offset=0) -> torch.Tensor:
    """(B, 1, L, S) bool: the keys each query may see."""
    keep = torch.ones(B, 1, L, S, dtype=torch.bool, device=device)
    if key_lengths is not None:
        keep &= torch.arange(S, device=device) < key_lengths.clamp(0, S).view(B, 1, 1, 1)
    if key_mask is not None:
        keep &= key_mask.view(B, 1, 1, S)
    if causal:
        keep &= torch.arange(S, device=device) <= torch.arange(L, device=device).view(L, 1) + causal_offset
    return keep


class Oracle:
    """float64 ev-softmax attention on a given support, its gradients, and their error bounds."""

    def __init__(self, q, k, v, support, scale, dtype):
        group = q.shape[1] // k.shape[1]
        self.group, self.scale, self.dtype = group, scale, dtype
        self.q, self.k, self.v = q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = (self.q @ self.k.transpose(-1, -2)) * scale
        self.empty = ~support.any(-1, keepdim=True)
        self.p = torch.softmax(s.masked_fill(~support, float("-inf")).masked_fill(self.empty, 0.0), -1)
        self.p = self.p.masked_fill(~support, 0.0).masked_fill(self.empty, 0.0)
        self.out = self.p @ self.v
        L, S, D = q.shape[2], k.shape[2], q.shape[3]
        # Matrix products are rounded to the dtype's precision once per operand (P, dS: two for the
        # 16-bit dtypes; float32 runs IEEE float32 products); a float32 sum over the S keys (L*group
        # queries) adds at most S (L*group) roundings in any order; exp2 of |arguments| < 16 adds 16.
        self.u_mm = ULP32 if dtype == torch.float32 else ulp(dtype)
        self.e_weight = 2 * self.u_mm + (16 + S) * ULP32
        self.key_ops = (16 + S) * ULP32
        self.query_ops = (16 + L * group) * ULP32
        self.dot_ops = (D + 4) * ULP32
        self.out_bound = rounding(dtype, self.out.abs()) + self.e_weight * (self.p @ self.v.abs())

    def _fold(self, t):
        """Sum the query heads of each key/value head (GQA)."""
        B, H, S, D = t.shape
        return t.view(B, H // self.group, self.group, S, D).sum(2)

    def grads(self, do):
        p, v, q, k = self.p, self.v, self.q, self.k
        dv = self._fold(p.transpose(-1, -2) @ do)
        dp = do @ v.transpose(-1, -2)
        delta = (do * self.out).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq = ds @ k * self.scale
        dk = self._fold(ds.transpose(-1, -2) @ q * self.scale)
        # Bounds: |dS| terms' magnitude, its error (weights, delta from the rounded output, dP's dot).
        m_ds = p * (do.abs() @ v.abs().transpose(-1, -2) + (do * self.out).abs().sum(-1, keepdim=True))
        err_ds = ((self.e_weight + 2 * self.u_mm + self.dot_ops) * m_ds
                  + p * (do.abs() * self.out_bound).sum(-1, keepdim=True))
        bounds = dict(
            dq=rounding(self.dtype, dq.abs()) + self.scale * (err_ds @ k.abs() + self.key_ops * (m_ds @ k.abs())),
            dk=rounding(self.dtype, dk.abs()) + self.scale * self._fold(
                err_ds.transpose(-1, -2) @ q.abs() + self.query_ops * (m_ds.transpose(-1, -2) @ q.abs())),
            dv=rounding(self.dtype, dv.abs()) + self._fold(
                (self.e_weight + self.query_ops) * (p.transpose(-1, -2) @ do.abs())),
        )
        return dict(dq=dq, dk=dk, dv=dv), bounds


def run_case(device, launchers, dtype, B=1, Hq=2, Hk=1, L=40, S=40, D=32, causal=False, key_lengths=None,
             key_mask=None, scale=None, seed=0, causal_offset=0):
    """Run the forward and backward launchers and check them against the oracle; returns the output."""
    from sparsenorm.kernels.triton import attention as attn

    gen = torch.Generator().manual_seed(seed)
    q64, k64 = grid_normal((B, Hq, L, D), gen), grid_normal((B, Hk, S, D), gen)
    v64 = torch.randn(B, Hk, S, D, generator=gen, dtype=torch.float64)
    do64 = torch.randn(B, Hq, L, D, generator=gen, dtype=torch.float64)
    q, k, v, do = (t.to(dtype).to(device) for t in (q64, k64, v64, do64))
    lens = None if key_lengths is None else torch.tensor(key_lengths, device=device)
    kmask = None if key_mask is None else key_mask.to(device)
    out, lse2, thr2 = attn.flash_ev_softmax_attention_forward(q, k, v, lens, causal, scale, kmask, causal_offset)
    dq, dk, dv = attn.flash_ev_softmax_attention_backward(do, q, k, v, out, lse2, thr2, lens, causal, scale, kmask,
                                                          causal_offset)

    sm_scale = D ** -0.5 if scale is None else scale
    qk_scale = torch.tensor(sm_scale * LOG2E, dtype=torch.float32)  # as the launcher passes it
    q64, k64, v64, do64 = (t.to(dtype).double().to(device) for t in (q, k, v, do))
    group = Hq // Hk
    exact = q64 @ k64.repeat_interleave(group, 1).transpose(-1, -2)  # exact in float32 too (grid)
    valid = valid_keys(B, L, S, lens, kmask, causal, device, causal_offset)
    support = valid & ((exact.float() * qk_scale.to(device)) >= thr2.unsqueeze(-1))
    oracle = Oracle(q64, k64, v64, support, sm_scale, dtype)
    assert out.dtype == dtype and out.shape == (B, Hq, L, D)
    what = f"{dtype} B={B} Hq={Hq} Hk={Hk} L={L} S={S} D={D} causal={causal} lens={key_lengths} " \
           f"keymask={key_mask is not None} causal_offset={causal_offset}"
    assert_within(out, oracle.out, oracle.out_bound, "output " + what)
    # Every row with a valid key keeps at least its maximum score (ev-softmax's mean <= max).
    has_valid = valid.any(-1).expand(B, Hq, L)
    assert torch.equal(support.any(-1), has_valid), "a query with valid keys got an empty support " + what
    lse = torch.logsumexp((exact * sm_scale).masked_fill(~support, float("-inf")), -1)
    assert_within(torch.where(has_valid, lse2.double() * math.log(2), lse2.double()),
                  torch.where(has_valid, lse, torch.full_like(lse, float("inf"))),
                  (16 + S) * ULP32 * (1 + lse.abs().nan_to_num(posinf=0.0)), "log-sum-exp " + what)
    want, bounds = oracle.grads(do64)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert got.dtype == dtype
        assert_within(got, want[name], bounds[name], f"{name} " + what)
    return out


CASES = [
    # (dtype, shape, causal, key lengths, key mask pattern)
    (torch.float16, dict(L=1, S=1, D=16), False, None, None),
    (torch.bfloat16, dict(L=1, S=300, D=64), False, [123], None),
    (torch.float32, dict(B=2, Hq=4, Hk=2, L=37, S=53, D=40), True, [53, 0], None),  # zero length: zeros
    (torch.bfloat16, dict(Hq=8, Hk=2, L=128, S=128, D=128), True, None, None),
    (torch.float16, dict(B=2, L=1000, S=1000, D=80), False, [1000, 700], "left"),
    (torch.bfloat16, dict(Hq=4, Hk=1, L=2048, S=2048, D=64), True, None, None),
    (torch.float16, dict(Hq=2, Hk=1, L=16, S=4096, D=32), False, None, "random"),
    (torch.float16, dict(B=2, Hq=4, Hk=2, L=300, S=200, D=96), True, [200, 150], None),  # L > S
    (torch.bfloat16, dict(Hq=1, Hk=1, L=16384, S=16384, D=128), True, None, None),
    (torch.float16, dict(Hq=2, Hk=2, L=4096, S=16384, D=64), False, [16000], "left"),
]
CPU_MAX_LENGTH = 64  # the interpreter's limit for these tests

BOTTOM_RIGHT = [
    # bottom-right causal (causal_offset = S - L): cached decoding, chunked prefill, L > S
    (torch.float16, dict(B=2, L=1, S=57, D=32), [57, 50], "left"),
    (torch.bfloat16, dict(B=2, Hq=4, Hk=2, L=24, S=60, D=64), None, "left"),
    (torch.float32, dict(L=40, S=25, D=16), None, None),
    (torch.bfloat16, dict(B=2, Hq=8, Hk=2, L=200, S=3000, D=64), [3000, 2500], "left"),
    (torch.float16, dict(B=4, Hq=9, Hk=3, L=1, S=4096, D=64), None, "left"),
]


def key_mask_for(pattern: Optional[str], B: int, S: int, seed: int) -> Optional[torch.Tensor]:
    if pattern is None:
        return None
    if pattern == "left":  # left padding, as in batched generation
        return torch.arange(S) >= torch.tensor([(7 * b) % max(S, 1) for b in range(B)]).view(B, 1)
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(B, S, generator=gen) < 0.7


@pytest.mark.parametrize("dtype,shape,lens,pattern", BOTTOM_RIGHT,
                         ids=[f"{str(c[0])[6:]}-L{c[1]['L']}-S{c[1]['S']}" for c in BOTTOM_RIGHT])
def test_flash_attention_bottom_right_causal(device, launchers, dtype, shape, lens, pattern):
    if device == "cpu" and max(shape["L"], shape["S"]) > CPU_MAX_LENGTH:
        pytest.skip("long sequences run on the GPU only")
    B, L, S = shape.get("B", 1), shape["L"], shape["S"]
    out = run_case(device, launchers, dtype, causal=True, key_lengths=lens, causal_offset=S - L,
                   key_mask=key_mask_for(pattern, B, S, seed=2), **shape)
    if L > S:  # the first L - S queries see no key
        assert (out[:, :, :L - S] == 0).all()


@pytest.mark.parametrize("dtype,shape,causal,lens,pattern", CASES,
                         ids=[f"{str(c[0])[6:]}-L{c[1]['L']}-S{c[1]['S']}-D{c[1]['D']}-{'causal' if c[2] else 'full'}"
                              for c in CASES])
def test_flash_attention_against_float64(device, launchers, dtype, shape, causal, lens, pattern):
    if device == "cpu" and max(shape["L"], shape["S"]) > CPU_MAX_LENGTH:
        pytest.skip("long sequences run on the GPU only")
    B = shape.get("B", 1)
    out = run_case(device, launchers, dtype, causal=causal, key_lengths=lens,
                   key_mask=key_mask_for(pattern, B, shape["S"], seed=1), **shape)
    if lens is not None and 0 in lens:
        assert (out[lens.index(0)] == 0).all()


@pytest.mark.parametrize("D", [16, 24, 32, 64, 96, 128])
def test_head_dims(device, launchers, D):
    run_case(device, launchers, torch.bfloat16, Hq=2, Hk=2, L=64, S=48, D=D, causal=D % 32 == 0,
             key_lengths=[40], seed=D)


def test_small_shapes_on_cpu_as_well(device, launchers):
    """Short cases of every mask form (the ones the CPU interpreter shake-out can run too)."""
    run_case(device, launchers, torch.float32, B=2, Hq=2, Hk=1, L=20, S=30, D=16, causal=True, key_lengths=[30, 9])
    run_case(device, launchers, torch.float16, B=2, Hq=4, Hk=2, L=33, S=17, D=24, causal=False,
             key_mask=key_mask_for("random", 2, 17, 3), scale=0.3)
    run_case(device, launchers, torch.bfloat16, B=1, Hq=3, Hk=1, L=1, S=5, D=32, causal=True)


def test_every_autotune_configuration(device, launchers):
    """Each kernel's every autotuning configuration (block sizes, warps, stages) in turn."""
    if device == "cpu":
        pytest.skip("no autotuning under the interpreter")
    from sparsenorm.kernels.triton import attention

    tuners = [t for t in FULL_CONFIGS if any(t is obj for obj in vars(attention).values())]
    assert tuners, "the conftest did not pin the attention autotuners"
    pinned = {t: t.configs for t in tuners}
    try:
        for i in range(max(len(FULL_CONFIGS[t]) for t in tuners)):
            for t in tuners:
                t.configs = [FULL_CONFIGS[t][i % len(FULL_CONFIGS[t])]]
                t.cache.clear()
            run_case(device, launchers, torch.float16, B=2, Hq=4, Hk=2, L=200, S=264, D=64, causal=i % 2 == 1,
                     key_lengths=[264, 131], seed=i)
    finally:
        for t in tuners:
            t.configs = pinned[t]
            t.cache.clear()


def test_full_autotuning_on_one_shape(device, launchers):
    """The autotuner itself (benchmarking every configuration) once, as users run it."""
    if device == "cpu":
        pytest.skip("no autotuning under the interpreter")
    from sparsenorm.kernels.triton import attention

    tuners = [t for t in FULL_CONFIGS if any(t is obj for obj in vars(attention).values())]
    pinned = {t: t.configs for t in tuners}
    try:
        for t in tuners:
            t.configs = FULL_CONFIGS[t]
            t.cache.clear()
        run_case(device, launchers, torch.bfloat16, Hq=4, Hk=4, L=512, S=512, D=64, causal=True, seed=5)
    finally:
        for t in tuners:
            t.configs = pinned[t]
            t.cache.clear()


# ------------------------------------------------------------------ sparse_attention's CUDA routes
# Each route is asked for explicitly (``backend=``) and tested per dtype: these tests are the
# obligations of sparsenorm.kernels.cuda_proof, from which scripts/gpu_record.py writes the record
# that ``backend="auto"`` follows on CUDA.
DTYPE_IDS = dict(ids=lambda d: str(d).replace("torch.", ""))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], **DTYPE_IDS)
def test_flash_route_equals_reference_path(device, launchers, dtype):
    """``sparse_attention(..., "ev_softmax", backend="triton")`` (the flash kernel) against the same
    call in ``kernels.disabled()`` (dense reference), each against the float64 oracle."""
    compare_with_reference_path(device, dtypes=(dtype,), backend="triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], **DTYPE_IDS)
def test_flex_backend_equals_reference_path(device, dtype):
    """``sparse_attention(..., backend="flex")`` (FlexAttention; its backward runs on CUDA only)
    against the dense reference path, values and gradients."""
    pytest.importorskip("sparsenorm.kernels.attention.flex", reason="the FlexAttention path is not there yet")
    if device != "cuda":
        pytest.skip("FlexAttention's backward runs on CUDA only (the CPU forward is tested in tests/attention)")
    compare_with_reference_path(device, dtypes=(dtype,), backend="flex")


@pytest.mark.parametrize("case", ["decode", "prefill_chunk", "lengths_gqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], **DTYPE_IDS)
def test_flex_bottom_right_and_padding(device, dtype, case):
    """FlexAttention's ev-softmax with bottom-right causal alignment (decoding: 1 query over a
    cache; a chunk of queries), key lengths and left padding, GQA, against the float64 oracle."""
    if device != "cuda":
        pytest.skip("FlexAttention's backward runs on CUDA only")
    from sparsenorm.attention import sparse_attention

    B, Hq, Hk, D = 2, 4, 2, 32
    L, S = {"decode": (1, 77), "prefill_chunk": (24, 70), "lengths_gqa": (40, 40)}[case]
    gen = torch.Generator().manual_seed(L + S)
    q64, k64 = grid_normal((B, Hq, L, D), gen), grid_normal((B, Hk, S, D), gen)
    v64 = torch.randn(B, Hk, S, D, generator=gen, dtype=torch.float64).to(dtype).double()
    do64 = torch.randn(B, Hq, L, D, generator=gen, dtype=torch.float64).to(dtype).double()
    lens = torch.tensor([S, S - 9])
    keep = key_mask_for("left", B, S, seed=0) if case != "lengths_gqa" else None
    causal = case != "lengths_gqa"
    valid = valid_keys(B, L, S, lens, keep, causal, "cpu", causal_offset=S - L if causal else 0)
    s = q64 @ k64.repeat_interleave(Hq // Hk, 1).transpose(-1, -2)
    n = valid.sum(-1, keepdim=True).clamp_min(1)
    total = (s * valid).sum(-1, keepdim=True)
    tie = ((s * n == total) & valid).any(-1, keepdim=True)
    support = valid & (s * n >= total)
    do64 = do64.masked_fill(tie, 0.0)
    oracle = Oracle(*(t.to(device) for t in (q64, k64, v64, support)), D ** -0.5, dtype)
    want, bounds = oracle.grads(do64.to(device))
    q, k, v = (t.to(dtype).to(device).requires_grad_() for t in (q64, k64, v64))
    mask = None if keep is None else keep.view(B, 1, 1, S).to(device)
    out = sparse_attention(q, k, v, "ev_softmax", attn_mask=mask, is_causal=causal, key_lengths=lens.to(device),
                           causal_alignment="bottom_right", backend="flex")
    grads = torch.autograd.grad(out, (q, k, v), do64.to(dtype).to(device))
    rows = ~tie.expand(B, Hq, L, 1).to(device)
    what = f"flex {dtype} {case}"
    assert_within(out * rows, oracle.out * rows, oracle.out_bound, "output " + what)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert_within(g, want[name], bounds[name], f"{name} " + what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], **DTYPE_IDS)
def test_softmax_sdpa_route_equals_dense(device, dtype):
    """softmax attention by ``backend="sdpa"`` against the float64 oracle (causal, key padding, GQA),
    values and gradients: it differs from the exact result by the
    dtype's rounding of the weights and their products, bounded as the oracle's."""
    from sparsenorm.attention import sparse_attention

    gen = torch.Generator().manual_seed(21)
    B, Hq, Hk, L, S, D = 2, 4, 2, 24, 40, 32
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[1, ..., 29:] = False
    for causal in (False, True):
        q64, k64 = grid_normal((B, Hq, L, D), gen), grid_normal((B, Hk, S, D), gen)
        v64 = torch.randn(B, Hk, S, D, generator=gen, dtype=torch.float64).to(dtype).double()
        do64 = torch.randn(B, Hq, L, D, generator=gen, dtype=torch.float64).to(dtype).double()
        support = valid_keys(B, L, S, None, keep.view(B, S), causal, "cpu")
        oracle = Oracle(*(t.to(device) for t in (q64, k64, v64, support)), D ** -0.5, dtype)
        want, bounds = oracle.grads(do64.to(device))
        q, k, v = (t.to(dtype).to(device).requires_grad_() for t in (q64, k64, v64))
        out = sparse_attention(q, k, v, "softmax", attn_mask=keep.to(device), is_causal=causal, backend="sdpa")
        grads = torch.autograd.grad(out, (q, k, v), do64.to(dtype).to(device))
        what = f"sdpa {dtype} causal={causal}"
        # SDPA's kernels may round the weights to the dtype before P V and keep float32 sums:
        # the oracle's model (two roundings per product operand) covers that.
        assert_within(out, oracle.out, oracle.out_bound, "output " + what)
        for name, g in zip(("dq", "dk", "dv"), grads):
            assert_within(g, want[name], bounds[name], f"{name} " + what)


def compare_with_reference_path(device, attend=None, dtypes=(torch.float32, torch.bfloat16), causals=(False, True),
                                masks=("none", "per_sequence", "shared"), **options):
    """``sparse_attention(q, k, v, "ev_softmax", **options)`` and the same call without ``options``
    inside ``kernels.disabled()`` (the dense reference), each against the float64 oracle: values and
    gradients, padding masks of each broadcast form, causal or not, GQA, float32 and bfloat16. The
    scores are exact (grid inputs), and so is the reference's threshold (their mean: an exact sum,
    one division); another path may compute it otherwise (the flash kernel: q . mean(keys)), which
    can matter only where a score ties the mean exactly. Such rows (found exactly) get no gradient
    and their outputs are not compared. ``attend`` replaces ``sparse_attention`` on the tested
    path (e.g. a compiled one); ``dtypes``, ``causals`` and ``masks`` choose the cases."""
    from sparsenorm.attention import sparse_attention

    attend = attend or sparse_attention

    gen = torch.Generator().manual_seed(11)
    B, Hq, Hk, L, S, D = 2, 4, 2, 24, 40, 32
    scale = D ** -0.5
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[1, ..., 29:] = False
    forms = {"none": None, "per_sequence": keep, "shared": keep[0, 0, 0]}
    for dtype in dtypes:
        for causal in causals:
            for mask in (forms[m] for m in masks):
                q64, k64 = grid_normal((B, Hq, L, D), gen), grid_normal((B, Hk, S, D), gen)
                v64 = torch.randn(B, Hk, S, D, generator=gen, dtype=torch.float64).to(dtype).double()
                s = q64 @ k64.repeat_interleave(Hq // Hk, 1).transpose(-1, -2)
                valid = valid_keys(B, L, S, None, None if mask is None else mask.expand(B, 1, 1, S).reshape(B, S),
                                   causal, "cpu")
                n = valid.sum(-1, keepdim=True).clamp_min(1)
                total = (s * valid).sum(-1, keepdim=True)
                tie = ((s * n == total) & valid).any(-1, keepdim=True)
                assert tie.double().mean() < 0.25, "too many exact ties to compare"
                support = valid & (s * n >= total)  # s >= mean, exactly
                do64 = torch.randn(B, Hq, L, D, generator=gen, dtype=torch.float64).masked_fill(tie, 0.0)
                do64 = do64.to(dtype).double()
                oracle = Oracle(*(t.to(device) for t in (q64, k64, v64, support)), scale, dtype)
                want, bounds = oracle.grads(do64.to(device))
                rows = ~tie.expand(B, Hq, L, 1).to(device)
                for reference in (True, False):
                    q, k, v = (t.to(dtype).to(device).requires_grad_() for t in (q64, k64, v64))
                    md = None if mask is None else mask.to(device)
                    with sparsenorm.kernels.disabled() if reference else contextlib.nullcontext():
                        out = (sparse_attention if reference else attend)(
                            q, k, v, "ev_softmax", attn_mask=md, is_causal=causal, **({} if reference else options))
                        grads = torch.autograd.grad(out, (q, k, v), do64.to(dtype).to(device))
                    what = (f"{'reference' if reference else options or 'default'} {dtype} causal={causal} "
                            f"mask={None if mask is None else tuple(mask.shape)}")
                    assert_within(out * rows, oracle.out * rows, oracle.out_bound, "output " + what)
                    for name, g in zip(("dq", "dk", "dv"), grads):
                        assert_within(g, want[name], bounds[name], f"{name} " + what)
