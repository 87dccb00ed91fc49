"""The 16-bit entry path (issue 48, item 4): an op that takes float16/bfloat16 rows itself gets them
as they are from ``run_on_rows`` -- no upcast, no marking pass, no cast back -- with the mask applied;
every other op, and every op on CPU, still gets float32 rows with the not-there entries marked."""
import math

import pytest
import torch

from sparsenorm._validation import run_on_rows
from sparsenorm.kernels import ops


class RecordingOp:
    """Stands in for a registered op: records the rows it is given and returns them as floats."""

    def __init__(self, takes):
        self.takes_low_precision = takes
        self.seen = []

    def __call__(self, rows, *args):
        self.seen.append(rows)
        return rows.float().softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_op_that_takes_16_bit_rows_gets_them_as_they_are(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, generator=g).to(dtype)
    x[0, 2] = torch.finfo(dtype).min  # "not there": the op's own rule, left to it
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 4] = False
    op = RecordingOp(lambda device_type, dt, n: True)
    out = run_on_rows(op, x, -1, mask, marks_not_there=False)
    rows = op.seen[-1]
    assert rows.dtype == dtype and out.dtype == dtype
    assert rows[0, 2] == torch.finfo(dtype).min  # not marked here
    assert rows[1, 4] == -math.inf  # the mask is applied
    assert torch.equal(rows[2], x[2])


def test_other_ops_and_marking_ops_get_float32_marked_rows():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, generator=g).to(torch.bfloat16)
    x[0, 1] = torch.finfo(torch.bfloat16).min
    for op, marks in ((RecordingOp(lambda *a: False), False), (RecordingOp(lambda *a: True), True)):
        run_on_rows(op, x, -1, None, marks_not_there=marks)
        rows = op.seen[-1]
        assert rows.dtype == torch.float32
        if marks:
            assert rows[0, 1] == -math.inf


def test_ev_softmax_takes_16_bit_rows_on_cuda_only_where_its_triton_kernel_is_proven(monkeypatch):
    from sparsenorm.kernels import cuda_proof

    takes = ops.ev_softmax.takes_low_precision
    assert not takes("cpu", torch.bfloat16, 100)  # CPU: computed in float32 (the C++ kernels take float32)
    monkeypatch.setattr(cuda_proof, "RECORD", {})
    assert not takes("cuda", torch.bfloat16, 100)
    monkeypatch.setattr(cuda_proof, "RECORD", {("rows", "ev_softmax", "bfloat16"): ("triton", "results/gpu/x", 1)})
    from sparsenorm.kernels.policy import triton_launchers
    assert takes("cuda", torch.bfloat16, 100) == (triton_launchers() is not None)


def test_the_op_decides_whether_the_entry_path_marks():
    """``treats_not_there`` on the op (a bool, or a function of the call's params) decides whether
    run_on_rows marks the not-there entries; no public function passes ``marks_not_there`` (issue 51:
    every public function reads check -> run_on_rows(op, ...); the op decides what it fuses)."""
    from pathlib import Path

    x = torch.tensor([[0.5, torch.finfo(torch.float32).min, 1.0]])
    for treats, marked in ((True, False), (False, True), (lambda params: params["a"] > 1, False)):
        op = RecordingOp(lambda *a: False)
        op.treats_not_there = treats
        run_on_rows(op, x, -1, None, params={"a": 2.0})
        assert (op.seen[-1][0, 1] == -math.inf) == marked
    from sparsenorm.kernels.ops import projection

    assert projection.entmax_bisect_rows.treats_not_there({"alpha": 1.5})  # the fused op
    assert not projection.entmax_bisect_rows.treats_not_there({"alpha": torch.tensor([1.5])})  # the Function
    package = Path(__file__).resolve().parents[2] / "sparsenorm"
    callers = [p for p in package.rglob("*.py") if p.name != "_validation.py" and "marks_not_there=" in p.read_text()]
    assert callers == []
