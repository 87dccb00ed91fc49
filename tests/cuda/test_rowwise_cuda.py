"""Row-wise Triton kernels (ev-softmax Eq. 7/10 and its log, sparsemax, 1.5-entmax) on the GPU
against a float64 oracle, and the public functions' CUDA dispatch against the reference path
(``sparsenorm.kernels.disabled()``) on the same device: values and gradients, float32/float16/
bfloat16, rows of 1 to 65,536 entries (powers of two and not; the register-tile and the chunked
kernels), every not-there form (-inf, ``finfo.min``, boolean masks of every broadcast shape),
empty rows and NaN/+inf rows. Bounds: ``cuda_helpers`` (ulps x operation counts)."""
from __future__ import annotations

from typing import Optional

import pytest
import torch

import sparsenorm
from cuda_helpers import DTYPES, ULP32, assert_within, grid_rows, reduction_ops, rounding
from sparsenorm.kernels.reference import evidential as ref_ev

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

# Row lengths: each distinct power-of-two block compiles once per dtype and flag set (GPU time).
LENGTHS = [1, 3, 100, 1024, 4097, 8192, 8193, 65536]
INTERPRETER_MAX = 128  # rows longer than this take too long under the CPU interpreter
EV_VARIANTS = [(None, False), (1e-3, False), (1e-3, True), (0.0, True)]
CHUNK = 4096  # the chunked ev-softmax kernels' chunk (kernels/triton/evidential.py)
TILE_COLS = 8192


def n_rows_for(n_cols: int) -> int:
    return max(8, min(64, (1 << 21) // n_cols))


def special_rows(n_rows: int, n_cols: int, dtype: torch.dtype, seed: int):
    """``(x float64 on the dtype's grid, mask)``: random rows plus, from row 0, an empty row,
    a NaN row, a +inf row, ``finfo.min`` entries, masked entries and ``-inf`` entries."""
    mask = torch.ones(n_rows, n_cols, dtype=torch.bool)
    if n_cols > 1:
        mask[4, ::2] = False
    x = grid_rows(n_rows, n_cols, seed)
    x[0] = float("-inf")  # empty row
    x[1, n_cols // 2] = float("nan")
    x[2, n_cols - 1] = float("inf")
    if n_cols > 2:
        x[3, 1::3] = torch.finfo(dtype).min  # not there by the dtype's level
        x[5, ::3] = float("-inf")
    return x, mask


def oracle_input(x: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 rows as the reference sees them: not-there entries ``-inf``."""
    drop = (x <= torch.finfo(dtype).min / 2) | ~mask
    return x.masked_fill(drop, float("-inf"))


def skip_long_on_cpu(device, n_cols):
    if device == "cpu" and n_cols > INTERPRETER_MAX:
        pytest.skip("long rows are run on the GPU only (the CPU interpreter is too slow)")


def ev_bound(ref: torch.Tensor, dtype: torch.dtype, n_cols: int, log: bool, chunk: int = CHUNK,
             tile: int = TILE_COLS) -> torch.Tensor:
    """Output rounding plus float32 error: the exponent's argument (|x| < 8, the shift of Eq. 10)
    and the normalizer's reduction; probabilities relative to themselves, log form absolute. (A
    split row's reductions -- a tree per chunk, chunks per segment, segments in order -- collect
    fewer roundings than the chunked count.)"""
    fp32 = (16 + reduction_ops(n_cols, chunk if n_cols > tile else None)) * ULP32
    mag = ref.abs().nan_to_num(posinf=0.0)
    return rounding(dtype, mag) + (fp32 * (1 + mag) if log else fp32 * mag)


@pytest.mark.parametrize("n_cols", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps,log", EV_VARIANTS)
def test_ev_softmax_kernels_against_float64(device, launchers, dtype, n_cols, eps, log):
    skip_long_on_cpu(device, n_cols)
    check_ev_kernels(launchers, device, dtype, n_cols, eps, log)


def check_ev_kernels(launchers, device, dtype, n_cols, eps, log, chunk=CHUNK, tile=TILE_COLS, n_rows=None):
    """Forward on special_rows and backward from the oracle's rounded output, against float64."""
    x, mask = special_rows(n_rows or n_rows_for(n_cols), n_cols, dtype, seed=n_cols)
    xd, md = x.to(dtype).to(device), mask.to(device)
    out = launchers.ev_softmax_forward(xd, eps, log, mask=md)
    assert out.dtype == dtype and out.shape == xd.shape
    ref = ref_ev.ev_softmax_forward(oracle_input(x, mask, dtype), eps, log)
    assert_within(out, ref, ev_bound(ref, dtype, n_cols, log, chunk, tile), f"forward {dtype} N={n_cols}")
    assert (out[0] == (float("-inf") if log else 0.0)).all()  # empty row

    # Backward from the oracle's output rounded to the dtype (what the kernel would have saved).
    good = torch.ones(x.shape[0], dtype=torch.bool)
    good[1:3] = False  # the NaN and +inf rows
    saved = ref[good].to(dtype)
    g = grid_rows(int(good.sum()), n_cols, seed=n_cols + 7).to(dtype)
    dx = launchers.ev_softmax_backward(g.to(device), saved.to(device), log)
    o, gg = saved.double(), g.double()
    if log:
        gg = gg.masked_fill(o == float("-inf"), 0.0)
        p = o.exp()
        want = gg - p * gg.sum(-1, keepdim=True)
        scale = gg.abs() + p * gg.abs().sum(-1, keepdim=True)
    else:
        want = o * (gg - (gg * o).sum(-1, keepdim=True))
        scale = o.abs() * (gg.abs() + (gg * o).abs().sum(-1, keepdim=True))
    fp32 = (4 + reduction_ops(n_cols, chunk if n_cols > tile else None)) * ULP32
    assert_within(dx, want, rounding(dtype, want.abs()) + fp32 * scale, f"backward {dtype} N={n_cols}")


PROJECT_LENGTHS = [n for n in LENGTHS if n <= 8192] + [16384]


def project_bound(ref: torch.Tensor, dtype: torch.dtype, n_cols: int, kind: str,
                  chunk: Optional[int] = None) -> torch.Tensor:
    """Output rounding plus the threshold's float32 error: a sum over the support of entries of
    magnitude < 8 (rows shifted to max 0), divided by the support size, a few closed-form steps
    (count 8 more), times dp/dtau (1 for sparsemax, sqrt(p) <= 1 for 1.5-entmax). ``chunk``: the
    rows are split (a row the guarded finish takes sums chunk by chunk)."""
    mag = ref.abs()
    dtau = (8 + reduction_ops(n_cols, chunk)) * 8 * 4 * ULP32
    slope = 1.0 if kind == "sparsemax" else mag.sqrt()
    return rounding(dtype, mag) + dtau * slope


@pytest.mark.parametrize("n_cols", PROJECT_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_projection_kernels_against_float64(device, launchers, dtype, n_cols, kind):
    skip_long_on_cpu(device, n_cols)
    check_projection_kernels(launchers, device, dtype, n_cols, kind)


def check_projection_kernels(launchers, device, dtype, n_cols, kind, chunk=None, n_rows=None):
    """Forward on special_rows and the backward from the oracle's rounded output, against float64."""
    x, mask = special_rows(n_rows or n_rows_for(n_cols), n_cols, dtype, seed=3 * n_cols)
    out = launchers.project(x.to(dtype).to(device), kind, mask=mask.to(device))
    assert out.dtype == dtype
    ref = getattr(sparsenorm, kind)(oracle_input(x, mask, dtype))  # float64; NaN/+inf rows NaN
    assert_within(out, ref, project_bound(ref, dtype, n_cols, kind, chunk), f"{kind} {dtype} N={n_cols}")
    assert (out[0] == 0).all()

    good = torch.ones(x.shape[0], dtype=torch.bool)
    good[1:3] = False
    p = ref[good].to(dtype)
    g = grid_rows(int(good.sum()), n_cols, seed=n_cols + 11).to(dtype)
    dx = launchers.project_backward(p.to(device), g.to(device), kind)
    pp, gg = p.double(), g.double()
    w = (pp > 0).double() if kind == "sparsemax" else pp.clamp_min(0).sqrt()
    total = w.sum(-1, keepdim=True)
    q = (w * gg).sum(-1, keepdim=True) / total.where(total > 0, torch.ones_like(total))
    want = w * (gg - q)
    scale = w * (gg.abs() + (w * gg).abs().sum(-1, keepdim=True) / total.where(total > 0, torch.ones_like(total)))
    fp32 = (4 + reduction_ops(n_cols, chunk)) * ULP32
    assert_within(dx, want, rounding(dtype, want.abs()) + fp32 * scale, f"{kind} backward {dtype} N={n_cols}")


# --------------------------------------------------------------------------- split long rows
# Rows past the register tile are split over several programs per row (kernels/triton/evidential.py,
# projection.py). Lengths that cross every branch, from the kernels' own sizes: just past the tile
# (a last segment of one entry), a ragged number of segments, many segments (131,079 on the GPU:
# the benchmark's 128k, ragged), four tiles. On the CPU interpreter the sizes are lowered
# (SPLIT_ON_CPU), and the lengths with them.
SPLIT_LENGTHS = {
    "just-above-tile": lambda tile, seg: tile + 1,
    "ragged": lambda tile, seg: tile + 2 * seg + seg // 2 + 3,
    "many-segments": lambda tile, seg: 16 * seg + 7,
    "four-tiles": lambda tile, seg: 4 * tile,
}
SPLIT_ON_CPU = dict(TILE_COLS=32, MAX_COLS=64, SEGMENT=16, CHUNK=8)
SPLIT_ROWS_ON_CPU = 8  # special_rows' cases and two random rows: the interpreter runs program after program


@pytest.fixture
def split_sizes(device, launchers, monkeypatch):
    """The split kernels' modules with their sizes (lowered on the CPU interpreter)."""
    from sparsenorm.kernels.triton import evidential, projection

    if device == "cpu":
        for module in (evidential, projection):
            for name, value in SPLIT_ON_CPU.items():
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, value)
    return evidential, projection


@pytest.mark.parametrize("case", list(SPLIT_LENGTHS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps,log", EV_VARIANTS)
def test_ev_softmax_split_rows_against_float64(device, launchers, split_sizes, dtype, case, eps, log):
    """ev-softmax rows split over several programs (three launches forward, two backward)."""
    ev = split_sizes[0]
    n_cols = SPLIT_LENGTHS[case](ev.TILE_COLS, ev.SEGMENT)
    assert n_cols > ev.TILE_COLS
    check_ev_kernels(launchers, device, dtype, n_cols, eps, log, chunk=ev.CHUNK, tile=ev.TILE_COLS,
                     n_rows=SPLIT_ROWS_ON_CPU if device == "cpu" else None)


@pytest.mark.parametrize("case", list(SPLIT_LENGTHS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_projection_split_rows_against_float64(device, launchers, split_sizes, dtype, case, kind):
    """sparsemax / 1.5-entmax rows split over several programs (gather and solve; the guarded
    finish for rows with too many candidates), and the split backward."""
    proj = split_sizes[1]
    n_cols = SPLIT_LENGTHS[case](proj.MAX_COLS, proj.SEGMENT)
    assert n_cols > proj.MAX_COLS
    check_projection_kernels(launchers, device, dtype, n_cols, kind, chunk=proj.CHUNK,
                             n_rows=SPLIT_ROWS_ON_CPU if device == "cpu" else None)


# --------------------------------------------------------------------------- the public functions
PUBLIC = {
    "ev_softmax": lambda x, m: sparsenorm.ev_softmax(x, mask=m),
    "ev_softmax_train": lambda x, m: sparsenorm.ev_softmax_train(x, eps=1e-3, mask=m),
    "log_ev_softmax_train": lambda x, m: sparsenorm.log_ev_softmax_train(x, eps=1e-3, mask=m),
    "sparsemax": lambda x, m: sparsenorm.sparsemax(x, mask=m),
    "entmax15": lambda x, m: sparsenorm.entmax15(x, mask=m),
}
PUBLIC_LENGTHS = [1, 100, 8193, 20000]  # 20000: past the projection kernels' 16384 (reference there)


def mask_forms(n_rows: int, n_cols: int):
    """Every broadcast shape a mask may take for (rows, cols) inputs."""
    full = torch.ones(n_rows, n_cols, dtype=torch.bool)
    full[4, ::2] = n_cols == 1
    per_col = torch.ones(n_cols, dtype=torch.bool)
    per_col[n_cols // 3] = n_cols == 1
    per_row = torch.ones(n_rows, 1, dtype=torch.bool)
    per_row[6] = False  # a whole row masked: empty
    return {"none": None, "full": full, "per_column": per_col, "per_row": per_row}


@pytest.mark.parametrize("n_cols", PUBLIC_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(PUBLIC))
def test_public_functions_dispatch_equals_reference_path(device, dtype, n_cols, name):
    """Values and gradients of the public function on ``device`` against the same call inside
    ``kernels.disabled()`` (the reference ops) on the same device, for every mask form."""
    skip_long_on_cpu(device, n_cols)
    fn = PUBLIC[name]
    n_rows = 8
    for form, mask in mask_forms(n_rows, n_cols).items():
        x = grid_rows(n_rows, n_cols, seed=n_cols + len(form))
        x[0] = float("-inf")
        x[1, 0] = float("nan")
        if n_cols > 2:
            x[2, 1] = torch.finfo(dtype).min
        md = None if mask is None else mask.to(device)
        g = grid_rows(n_rows, n_cols, seed=99).to(dtype).to(device)
        results = []
        for reference in (False, True):
            xd = x.to(dtype).to(device).requires_grad_()
            if reference:
                with sparsenorm.kernels.disabled():
                    y = fn(xd, md)
                    (dx,) = torch.autograd.grad(y, xd, g.to(y.dtype).masked_fill(torch.isinf(y), 0.0))
            else:
                y = fn(xd, md)
                (dx,) = torch.autograd.grad(y, xd, g.to(y.dtype).masked_fill(torch.isinf(y), 0.0))
            results.append((y.detach(), dx))
        (y, dx), (y_ref, dx_ref) = results
        assert y.dtype == y_ref.dtype and y.device == y_ref.device
        log = name.startswith("log")
        fp32 = 2 * (16 + reduction_ops(n_cols, CHUNK)) * ULP32  # both paths' float32 error
        mag = y_ref.double().abs().nan_to_num(posinf=0.0)
        bound = 2 * rounding(dtype, mag) + fp32 * ((1 + mag) if log else 8 * (1 + mag))
        assert_within(y, y_ref, bound, f"{name} {dtype} N={n_cols} mask={form}")
        # Gradients: every row but the NaN one (whose gradient the paths may spell differently).
        rows = torch.arange(n_rows) != 1
        gmag = dx_ref[rows].double().abs()
        gbound = 2 * rounding(dtype, gmag.cpu()) + fp32 * 8 * (1 + g[rows].double().abs().sum(-1, keepdim=True).cpu())
        assert_within(dx[rows], dx_ref[rows], gbound, f"{name} gradient {dtype} N={n_cols} mask={form}")


@pytest.mark.parametrize("n_cols", [7, 1000, 16384])
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_against_the_entmax_package(device, kind, n_cols):
    """An independent implementation (the entmax package, sort-based) in float64 on the same device
    as the oracle of ours in float32: values and gradients (bounds as the projection kernels')."""
    entmax = pytest.importorskip("entmax")
    skip_long_on_cpu(device, n_cols)
    x = grid_rows(16, n_cols, seed=n_cols).to(device)
    g = grid_rows(16, n_cols, seed=n_cols + 1).to(device)
    ours_x, peer_x = x.float().requires_grad_(), x.clone().requires_grad_()
    ours, peer = getattr(sparsenorm, kind)(ours_x), getattr(entmax, kind)(peer_x, dim=-1)
    assert_within(ours, peer, project_bound(peer.detach().cpu(), torch.float32, n_cols, kind), f"{kind} N={n_cols}")
    (d_ours,), (d_peer,) = torch.autograd.grad(ours, ours_x, g.float()), torch.autograd.grad(peer, peer_x, g)
    # The gradient depends on the support; an entry within our output's error of the support's edge
    # may be on it for one and off it for the other, which changes its whole row: such rows are
    # left out. Elsewhere our backward reads our float32 output, off by p_err: w = 1{p > 0} does not
    # move, w = sqrt(p) moves by p_err / (2 sqrt(p)); times |g| <= 4, in w g and in sum(w g).
    p_err = project_bound(peer.detach().cpu(), torch.float32, n_cols, kind).to(device)
    edge = ((peer.detach() <= p_err) & ((peer > 0) | (ours > 0))).any(-1)
    assert edge.double().mean() <= 0.25, "too many rows at the support's edge to compare"
    w = (peer.detach() > 0).double() if kind == "sparsemax" else peer.detach().clamp_min(0).sqrt()
    total = w.sum(-1, keepdim=True)
    scale = w * (g.abs() + (w * g).abs().sum(-1, keepdim=True) / total)
    w_err = torch.zeros_like(w) if kind == "sparsemax" else torch.where(w > 0, p_err / (2 * w), 0.0)
    moved = 8 * (w_err + w * w_err.sum(-1, keepdim=True) / total)
    bound = rounding(torch.float32, d_peer.abs()) + (4 + reduction_ops(n_cols)) * ULP32 * scale + moved
    keep = ~edge
    assert_within(d_ours[keep], d_peer[keep], bound[keep], f"{kind} gradient N={n_cols}")
