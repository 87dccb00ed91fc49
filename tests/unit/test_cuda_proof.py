"""Dispatch by proof (issue 48): on CUDA ``auto`` chooses only what a committed GPU run proved, the
record's every citation holds against that run's log, and ``auto`` follows ``plan()`` exactly."""
import importlib.util
import itertools
import warnings
from pathlib import Path

import pytest
import torch

import sparsenorm
from sparsenorm.attention import plan as attention_plan
from sparsenorm.attention import sparse_attention
from sparsenorm.kernels import cuda_proof
from sparsenorm.kernels.attention import dispatch as attention_dispatch
from sparsenorm.kernels.policy import triton_launchers
from sparsenorm.kernels.auto_plan import choose_attention, plan_rows

ROOT = Path(__file__).resolve().parents[2]


def _gpu_record_script():
    spec = importlib.util.spec_from_file_location("gpu_record", ROOT / "scripts" / "gpu_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_citation_holds_against_its_runs_log():
    """Each record entry: the cited run folder is committed, and every CUDA-suite test of the
    entry's obligation (as the suite is collected now) is PASSED in that run's logs, none failed."""
    script = _gpu_record_script()
    tests = script.collected()
    assert tests, "no CUDA-suite test collected"
    obligations = {(ob.kind, ob.name, ob.backend): ob for ob in cuda_proof.OBLIGATIONS}
    assert cuda_proof.RECORD, "the record is empty: no CUDA path would ever be chosen"
    for (kind, name, dtype), (backend, run, count) in cuda_proof.RECORD.items():
        folder = ROOT / run
        assert folder.is_dir() and list(folder.glob("*.log")), f"{run} has no committed log"
        ok, matched, why = script.proof(obligations[(kind, name, backend)], dtype, tests, script.outcomes(folder))
        assert ok, f"{(kind, name, dtype)} -> {backend} cites {run}, but {why}"
        assert len(matched) == count


def fake_record(*entries):
    return {(kind, name, dtype): (backend, "results/gpu/fake-run", 1) for kind, name, dtype, backend in entries}


@pytest.fixture
def empty_record(monkeypatch):
    monkeypatch.setattr(cuda_proof, "RECORD", {})


def test_cuda_attention_without_a_record_runs_no_device_kernel(empty_record):
    for dtype, L in itertools.product((torch.float32, torch.float16, torch.bfloat16), (1, 100, 4096)):
        for normalizer in ("ev_softmax", "softmax", "sparsemax"):
            chosen = attention_plan(normalizer, device="cuda", dtype=dtype, q_len=L, k_len=4096, head_dim=64)
            assert chosen.backend in ("dense", "blockwise", "decode"), (normalizer, dtype, L, chosen)
            assert chosen.proof is None


def test_cuda_attention_follows_a_fake_record(monkeypatch):
    monkeypatch.setattr(cuda_proof, "RECORD", fake_record(("attention", "ev_softmax", "bfloat16", "flex"),
                                                          ("attention", "softmax", "float16", "sdpa")))
    ev = attention_plan("ev_softmax", device="cuda", dtype=torch.bfloat16, causal=True, q_len=4096, k_len=4096,
                        head_dim=64, mask="keys")
    assert (ev.backend, ev.proof) == ("flex", "results/gpu/fake-run")
    # Not proven in float16: the same call goes to a pure-PyTorch path, and says why.
    ev16 = attention_plan("ev_softmax", device="cuda", dtype=torch.float16, q_len=4096, k_len=4096, head_dim=64)
    assert ev16.backend == "blockwise" and any(b == "flex" and "proves" in why for b, why in ev16.rejected)
    # Decoding stays on the decode path (Flex compiles per shape; a growing cache would recompile).
    assert attention_plan("ev_softmax", device="cuda", dtype=torch.bfloat16, q_len=1, k_len=5000,
                          head_dim=64).backend == "decode"
    assert attention_plan("softmax", device="cuda", dtype=torch.float16, q_len=512, k_len=512,
                          head_dim=64).backend == "sdpa"
    assert attention_plan("softmax", device="cuda", dtype=torch.bfloat16, q_len=512, k_len=512,
                          head_dim=64).backend == "dense"
    # The flash kernel is never chosen by auto (it is not measured faster than Flex), proven or not.
    monkeypatch.setattr(cuda_proof, "RECORD", fake_record(("attention", "ev_softmax", "bfloat16", "triton")))
    assert attention_plan("ev_softmax", device="cuda", dtype=torch.bfloat16, q_len=4096, k_len=4096,
                          head_dim=64).backend == "blockwise"
    # What the memory-efficient kernels cannot give goes dense, with the reason.
    weights = attention_plan("ev_softmax", device="cuda", dtype=torch.bfloat16, q_len=4096, k_len=4096, head_dim=64,
                             need_weights=True)
    assert weights.backend == "dense" and all("weights" in why for _, why in weights.rejected)


def test_trusting_lifts_the_rule(empty_record):
    with cuda_proof.trusting():
        assert attention_plan("ev_softmax", device="cuda", dtype=torch.float16, q_len=4096, k_len=4096,
                              head_dim=64).backend == "flex"
    assert attention_plan("ev_softmax", device="cuda", dtype=torch.float16, q_len=4096, k_len=4096,
                          head_dim=64).backend != "flex"


def test_row_plans_follow_the_record(monkeypatch):
    monkeypatch.setattr(cuda_proof, "RECORD", fake_record(("rows", "sparsemax", "float32", "triton")))
    cpu_plan = plan_rows("ev_softmax", device="cpu", dtype=torch.float32, row_len=1000)
    assert cpu_plan.backend in ("cpp", "reference") and cpu_plan.reason
    assert plan_rows("ev_softmax", device="cpu", dtype=torch.bfloat16, row_len=10).backend == "reference"
    assert plan_rows("t_softmax", device="cuda", dtype=torch.float32, row_len=10).backend == "reference"
    unproven = plan_rows("entmax15", device="cuda", dtype=torch.float32, row_len=1000)
    proven = plan_rows("sparsemax", device="cuda", dtype=torch.float32, row_len=1000)
    assert unproven.backend == "reference"
    if triton_launchers() is None:
        assert proven.backend == "reference" and "triton" in proven.reason
    else:
        assert (proven.backend, proven.proof) == ("triton", "results/gpu/fake-run")
    with sparsenorm.kernels.disabled():
        assert plan_rows("sparsemax", device="cuda", dtype=torch.float32, row_len=1000).backend == "reference"


def test_long_rows_need_their_own_proof(monkeypatch):
    """The split kernels (rows past the tile, kernels/tiles.py) are other code than the tile kernels:
    a record that proves the tile kernel leaves long rows on the reference path, and the reverse."""
    from sparsenorm.kernels.tiles import TRITON_TILE_COLS

    tile = TRITON_TILE_COLS["ev_softmax"]
    monkeypatch.setattr(cuda_proof, "RECORD", fake_record(("rows", "ev_softmax", "float32", "triton")))
    short = plan_rows("ev_softmax", device="cuda", dtype=torch.float32, row_len=tile)
    long = plan_rows("ev_softmax", device="cuda", dtype=torch.float32, row_len=tile + 1)
    assert long.backend == "reference"
    if triton_launchers() is not None:
        assert short.backend == "triton" and "split kernel" in long.reason
    monkeypatch.setattr(cuda_proof, "RECORD", fake_record(("long_rows", "ev_softmax", "float32", "triton")))
    assert plan_rows("ev_softmax", device="cuda", dtype=torch.float32, row_len=tile).backend == "reference"
    if triton_launchers() is not None:
        assert plan_rows("ev_softmax", device="cuda", dtype=torch.float32, row_len=tile + 1).backend == "triton"


def test_plans_reject_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="normalizer"):
        attention_plan("evsoftmax", q_len=1, k_len=1, head_dim=8)
    with pytest.raises(ValueError, match="mask"):
        attention_plan("ev_softmax", q_len=1, k_len=1, head_dim=8, mask="padding")
    with pytest.raises(ValueError, match="q_len"):
        attention_plan("ev_softmax", q_len=-1, k_len=1, head_dim=8)
    with pytest.raises(ValueError, match="name"):
        sparsenorm.kernels.plan("", device="cpu", dtype=torch.float32, row_len=3)
    with pytest.raises(TypeError, match="dtype"):
        sparsenorm.kernels.plan("ev_softmax", device="cpu", dtype=torch.int64, row_len=3)
    with pytest.raises(ValueError, match="row_len"):
        sparsenorm.kernels.plan("ev_softmax", device="cpu", dtype=torch.float32, row_len=2.5)


def test_an_unproven_explicit_backend_warns_once(monkeypatch, empty_record):
    monkeypatch.setattr(cuda_proof, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda_proof.warn_unproven("attention", "ev_softmax", torch.bfloat16, "triton")
        cuda_proof.warn_unproven("attention", "ev_softmax", torch.bfloat16, "triton")
    assert len([w for w in caught if "has not passed the CUDA suite" in str(w.message)]) == 1


@pytest.mark.parametrize("normalizer", ["ev_softmax", "softmax", "sparsemax", "t_softmax"])
def test_auto_runs_exactly_what_plan_names(monkeypatch, normalizer):
    """``sparse_attention(..., backend="auto")`` on CPU over shapes, masks, dtypes and gradients:
    the kernel that ran (each wrapped to record its name) is the one ``plan()`` names."""
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 600)
    ran = []
    for threshold, kernels in attention_dispatch.KERNELS.items():
        for backend, kernel in list(kernels.items()):
            def wrapped(call, _kernel=kernel, _backend=backend):
                ran.append(_backend)
                return _kernel(call)
            monkeypatch.setitem(kernels, backend, wrapped)
    gen = torch.Generator().manual_seed(7)
    cases = itertools.product((1, 8, 40), (30,), (False, True), (None, "keys", "general"),
                              (torch.float32, torch.bfloat16), (False, True))
    for L, S, causal, mask, dtype, grad in cases:
        q = torch.randn(2, 4, L, 16, generator=gen).to(dtype).requires_grad_(grad)
        k, v = (torch.randn(2, 2, S, 16, generator=gen).to(dtype) for _ in range(2))
        attn_mask = {None: None, "keys": torch.arange(S) < 25,
                     "general": torch.rand(L, S, generator=gen) < 0.8}[mask]
        kind = "keys" if mask == "general" and L == 1 else mask  # one query: the mask varies over keys only
        planned = attention_plan(normalizer, device="cpu", dtype=dtype, causal=causal, q_len=L, k_len=S, head_dim=16,
                                 mask=kind, requires_grad=grad)
        ran.clear()
        sparse_attention(q, k, v, normalizer, attn_mask=attn_mask, is_causal=causal)
        assert ran[-1:] == ([] if planned.backend == "dense" else [planned.backend]), (
            normalizer, L, causal, mask, dtype, grad, planned)


def test_choose_attention_is_what_plan_returns():
    from sparsenorm.kernels.auto_plan import AttentionSpec

    spec = AttentionSpec("ev_softmax", "known", "cpu", torch.float32, True, 4096, 4096, 64, 64, "keys")
    assert choose_attention(spec) == attention_plan("ev_softmax", device="cpu", dtype=torch.float32, causal=True,
                                                    q_len=4096, k_len=4096, head_dim=64, mask="keys")
