"""The row-wise Triton kernels against the reference normalizers (values, gradients, every "not
there" form, empty/NaN/+inf rows, float32/float16/bfloat16). On a machine without CUDA they run
under Triton's interpreter on CPU tensors (small shapes: the interpreter is slow per element)."""
import os
import sys

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is first imported: set it before anything imports it.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install 'sparsenorm[gpu]')")

import sparsenorm  # noqa: E402
from sparsenorm.kernels.triton import _common  # noqa: E402
from sparsenorm.kernels.triton import evidential as tev  # noqa: E402
from sparsenorm.kernels.triton import projection as tproj  # noqa: E402
from knife_edge import assert_ev_softmax_by_contract  # noqa: E402

DEVICE = "cpu" if _common.INTERPRET else "cuda"
# Triton imported earlier in this process without the interpreter, and no GPU: run this file in
# a fresh interpreter process instead (test_in_subprocess), rather than skip it.
IN_PROCESS = _common.INTERPRET or torch.cuda.is_available()
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy inf/NaN arithmetic in the interpreter
in_process = pytest.mark.skipif(not IN_PROCESS, reason="run in a subprocess with TRITON_INTERPRET=1")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rows_with_every_case(dtype, n_cols=33, seed=0):
    """Random rows plus: -inf, finfo.min, masked entries, an empty row, NaN and +inf rows, an
    all-equal row, a row with a single entry there, tiny differences."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(10, n_cols, generator=g) * 2).to(dtype)
    x[1, ::3] = float("-inf")
    x[2, :5] = torch.finfo(dtype).min  # additive mask value: not there
    x[3] = float("-inf")  # empty row
    x[4, 2] = float("nan")
    x[5, 1] = float("inf")
    x[6] = 0.5  # all equal
    x[7, 1:] = float("-inf")  # a single entry there
    x[8] = (torch.linspace(0, 1e-3, n_cols)).to(dtype)
    mask = torch.ones(10, n_cols, dtype=torch.bool)
    mask[9, ::2] = False
    return x.to(DEVICE), mask.to(DEVICE)


def not_there_as_neg_inf(x, mask):
    """The input as the reference sees it: compute dtype, every not-there entry -inf."""
    drop = (x <= torch.finfo(x.dtype).min / 2) | ~mask
    return x.float().masked_fill(drop, float("-inf"))


BAD_ROWS = [4, 5]  # NaN / +inf: the whole row is NaN, other rows unaffected
GOOD_ROWS = [r for r in range(10) if r not in BAD_ROWS]


def check_rows(out, ref, dtype):
    assert out.shape == ref.shape
    assert torch.isnan(out[BAD_ROWS]).all()
    torch.testing.assert_close(out[GOOD_ROWS].float(), ref[GOOD_ROWS].to(dtype).float(),
                               atol=TOL[dtype], rtol=TOL[dtype])


def check_ev_rows(out, ref, x, mask, eps, log, dtype):
    """ev-softmax rows by the contract (tests/knife_edge.py): row 8's entries are 1e-3 / 32 apart
    around a mean that sits on one of them, so the kernel and the CPU path (which sum the mean
    in other orders) may decide it differently; each is checked against the float64 formula on
    its own support."""
    assert out.shape == ref.shape
    assert torch.isnan(out[BAD_ROWS]).all()
    scores = not_there_as_neg_inf(x, mask).cpu()[GOOD_ROWS]
    assert_ev_softmax_by_contract({"triton": out[GOOD_ROWS].float(), "cpu": ref[GOOD_ROWS].float()}, scores, eps, log,
                                  rtol=TOL[dtype], atol=TOL[dtype], out_dtype=dtype)


def ev_reference(x, eps, log):
    if log:
        return sparsenorm.log_ev_softmax_train(x, eps=0.0 if eps is None else eps)
    if eps is None or eps == 0.0:
        return sparsenorm.ev_softmax(x)
    return sparsenorm.ev_softmax_train(x, eps=eps)


@in_process
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps,log", [(None, False), (1e-3, False), (0.1, True), (0.0, True), (None, True)])
def test_ev_softmax_forward_matches_reference(dtype, eps, log):
    x, mask = rows_with_every_case(dtype)
    out = tev.ev_softmax_forward(x, eps, log, mask=mask)
    assert out.dtype == dtype
    ref = ev_reference(not_there_as_neg_inf(x, mask).cpu(), eps, log)
    check_ev_rows(out.cpu(), ref, x.cpu(), mask.cpu(), eps, log, dtype)
    if log:  # not there, and off the support with eps = 0, is exactly -inf
        assert (out[3] == float("-inf")).all()
    else:
        assert (out[3] == 0).all() and (out[1, ::3] == 0).all() and (out[9, ::2] == 0).all()


@in_process
@pytest.mark.parametrize("eps,log", [(None, False), (1e-3, False), (1e-3, True), (0.0, True)])
def test_ev_softmax_long_rows_are_streamed_in_chunks(eps, log, monkeypatch):
    """Rows longer than TILE_COLS take the chunked kernels (here made short: 33 entries, chunks of 16)."""
    monkeypatch.setattr(tev, "TILE_COLS", 8)
    monkeypatch.setattr(tev, "CHUNK", 16)
    x, mask = rows_with_every_case(torch.float16, seed=5)
    out = tev.ev_softmax_forward(x, eps, log, mask=mask)
    ref = ev_reference(not_there_as_neg_inf(x, mask).cpu(), eps, log)
    check_ev_rows(out.cpu(), ref, x.cpu(), mask.cpu(), eps, log, torch.float16)
    g = torch.randn(ref.shape)
    good = torch.tensor(GOOD_ROWS)
    dx = tev.ev_softmax_backward(g.to(DEVICE), out.float(), log)
    monkeypatch.setattr(tev, "TILE_COLS", 8192)
    torch.testing.assert_close(dx[good].cpu(), tev.ev_softmax_backward(g.to(DEVICE), out.float(), log)[good].cpu())


# Split rows (kernels longer than the register tile, made short here): (n_cols, TILE_COLS, SEGMENT, CHUNK).
SPLIT_LAYOUTS = {
    "just-above-tile": (9, 8, 8, 8),  # two segments, the second of one entry
    "three-ragged": (33, 8, 16, 8),  # 16 + 16 + 1
    "segment-not-chunk-multiple": (33, 8, 12, 8),  # 12 + 12 + 9, chunks cut at the segment's end
    "one-ragged-segment": (33, 8, 64, 16),  # one program per row, its segment half empty
}


def split_rows(module, layout, monkeypatch, limit="TILE_COLS"):
    """Make ``module``'s long-row path take rows of ``SPLIT_LAYOUTS[layout]``; returns n_cols."""
    n_cols, tile, segment, chunk = SPLIT_LAYOUTS[layout]
    monkeypatch.setattr(module, limit, tile)
    monkeypatch.setattr(module, "SEGMENT", segment)
    monkeypatch.setattr(module, "CHUNK", chunk)
    assert n_cols > tile
    return n_cols


# Every layout in float16 (the coarsest rounding of the mean), every dtype on one layout: the
# interpreter's time per test is what limits the product.
SPLIT_CASES = ([(layout, torch.float16) for layout in SPLIT_LAYOUTS]
               + [("three-ragged", dtype) for dtype in (torch.float32, torch.bfloat16)])


@in_process
@pytest.mark.parametrize("layout,dtype", SPLIT_CASES)
@pytest.mark.parametrize("eps,log", [(None, False), (1e-3, False), (0.1, True), (0.0, True), (None, True)])
def test_ev_softmax_split_rows_forward(dtype, eps, log, layout, monkeypatch):
    """Rows split over several programs (statistics, normalizer, output: three launches) against the
    reference by the contract: masks, -inf and finfo.min entries, segments with no entry there
    (row 7), an empty row, NaN and +inf rows, ties and near-equal entries."""
    n_cols = split_rows(tev, layout, monkeypatch)
    x, mask = rows_with_every_case(dtype, n_cols=n_cols, seed=20 + n_cols)
    out = tev.ev_softmax_forward(x, eps, log, mask=mask)
    assert out.dtype == dtype
    ref = ev_reference(not_there_as_neg_inf(x, mask).cpu(), eps, log)
    check_ev_rows(out.cpu(), ref, x.cpu(), mask.cpu(), eps, log, dtype)
    if log:
        assert (out[3] == float("-inf")).all() and (out[7, 1:] == float("-inf")).all()
    else:
        assert (out[3] == 0).all() and (out[1, ::3] == 0).all() and (out[9, ::2] == 0).all()


@in_process
@pytest.mark.parametrize("layout,dtype", [(layout, torch.float32) for layout in SPLIT_LAYOUTS]
                         + [("three-ragged", torch.float16)])
@pytest.mark.parametrize("eps,log", [(None, False), (1e-3, False), (1e-3, True), (0.0, True)])
def test_ev_softmax_split_rows_backward(dtype, eps, log, layout, monkeypatch):
    """The split backward (per-segment sums, then dx: two launches) against the reference's float64
    autograd, with the error model of test_ev_softmax_backward_matches_autograd."""
    n_cols = split_rows(tev, layout, monkeypatch)
    x, mask = rows_with_every_case(dtype, n_cols=n_cols, seed=40 + n_cols)
    xr = not_there_as_neg_inf(x, mask).cpu()[GOOD_ROWS].double().requires_grad_()
    out = ev_reference(xr, eps, log)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(n_cols))
    out.backward(g)
    dx = tev.ev_softmax_backward(g.to(dtype).to(DEVICE), out.detach().to(dtype).to(DEVICE), log)
    assert dx.dtype == dtype
    expect = xr.grad
    if log:
        expect = torch.where(out.detach() == float("-inf"), 0.0, expect)
    torch.testing.assert_close(dx.cpu().double(), expect, atol=20 * TOL[dtype], rtol=20 * TOL[dtype])
    assert (dx.cpu()[GOOD_ROWS.index(3)] == 0).all()


@in_process
@pytest.mark.parametrize("n_cols", [1, 2, 64])
def test_ev_softmax_short_and_power_of_two_rows(n_cols):
    x = torch.randn(5, n_cols).to(DEVICE)
    torch.testing.assert_close(tev.ev_softmax_forward(x).cpu(), sparsenorm.ev_softmax(x.cpu()), atol=2e-6, rtol=2e-6)


@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("eps,log", [(None, False), (1e-3, False), (1e-3, True), (0.0, True)])
def test_ev_softmax_backward_matches_autograd(dtype, eps, log):
    x, mask = rows_with_every_case(dtype, seed=1)
    xr = not_there_as_neg_inf(x, mask).cpu()[GOOD_ROWS].double().requires_grad_()
    out = ev_reference(xr, eps, log)
    g = torch.randn(out.shape, dtype=torch.float64)
    out.backward(g)
    dx = tev.ev_softmax_backward(g.to(dtype).to(DEVICE), out.detach().to(dtype).to(DEVICE), log)
    assert dx.dtype == dtype
    expect = xr.grad
    if log:  # the kernel sees the rounded output; compare where the reference is finite
        expect = torch.where(out.detach() == float("-inf"), 0.0, expect)
    torch.testing.assert_close(dx.cpu().double(), expect, atol=20 * TOL[dtype], rtol=20 * TOL[dtype])
    assert (dx.cpu()[GOOD_ROWS.index(3)] == 0).all()  # the empty row gets zero gradient


@in_process
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_projection_forward_matches_reference(dtype, kind):
    x, mask = rows_with_every_case(dtype, seed=2)
    out = tproj.project(x, kind, mask=mask)
    assert out.dtype == dtype
    ref = getattr(sparsenorm, kind)(not_there_as_neg_inf(x, mask).cpu())
    check_rows(out.cpu(), ref, dtype)
    assert (out[3] == 0).all() and (out[9, ::2] == 0).all()
    torch.testing.assert_close(out[GOOD_ROWS].float().sum(-1).cpu()[[0, 1, 2, 4, 5, 6, 7]],
                               torch.ones(7), atol=10 * TOL[dtype], rtol=0)


@in_process
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("max_iter", [0, 1])
def test_projection_bisection_fallback_is_exact(kind, max_iter, monkeypatch):
    """Rows not converged within MAX_ITER passes are finished by bisection + the closed form."""
    monkeypatch.setattr(tproj, "MAX_ITER", max_iter)
    x = (torch.randn(8, 50) * torch.tensor([0.1, 1, 3, 10, 0.01, 1, 2, 5]).view(8, 1)).to(DEVICE)
    ref = getattr(sparsenorm, kind)(x.cpu())
    torch.testing.assert_close(tproj.project(x, kind).cpu(), ref, atol=2e-6, rtol=2e-6)


@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_projection_backward_matches_autograd(dtype, kind):
    x = (torch.randn(6, 40, dtype=torch.float64) * 2)
    x[1, ::2] = float("-inf")
    x[2] = float("-inf")  # empty row: zero gradient
    assert_projection_backward(x, torch.randn_like(x), kind, dtype, nan_col=0)


def assert_projection_backward(x, grad, kind, dtype, nan_col):
    """The Triton backward of ``kind`` at ``x`` (float64; row 2 all not there) against the reference's
    float64 autograd: ``dtype`` out, within the error model, zero gradient on the empty row 2, and a NaN
    at ``p[0, nan_col]`` makes row 0's whole gradient NaN."""
    xr = x.clone().requires_grad_()
    p = getattr(sparsenorm, kind)(xr)
    p.backward(grad)
    dx = tproj.project_backward(p.detach().to(dtype).to(DEVICE), grad.to(dtype).to(DEVICE), kind)
    assert dx.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(dx.cpu().double(), xr.grad, atol=tol, rtol=tol)
    assert (dx.cpu()[2] == 0).all()
    nan_p = p.detach().to(dtype).clone()
    nan_p[0, nan_col] = float("nan")
    assert torch.isnan(tproj.project_backward(nan_p.to(DEVICE), grad.to(dtype).to(DEVICE), kind)[0]).all()


@in_process
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("max_iter", [None, 0])
def test_projection_rows_longer_than_the_register_tile(kind, max_iter, monkeypatch):
    """Rows of 20,000 entries (past MAX_COLS = 16,384, as every LM vocabulary) at the real segment
    and chunk sizes: split over three programs per row (the last segment ragged); the all-equal and
    near-equal rows have more candidates than the solve holds and take the guarded finish, and
    (max_iter 0) the bisection fallbacks; forward and backward against the reference, every
    not-there form and the empty/NaN/+inf rows included."""
    if max_iter is not None:
        monkeypatch.setattr(tproj, "MAX_ITER", max_iter)
    n_cols = 20000
    assert n_cols > tproj.MAX_COLS
    x, mask = rows_with_every_case(torch.float32, n_cols=n_cols, seed=6)
    x = x * 3  # supports of a few to a few hundred entries
    out = tproj.project(x, kind, mask=mask)
    ref = getattr(sparsenorm, kind)(not_there_as_neg_inf(x, mask).cpu())
    check_rows(out.cpu(), ref, torch.float32)
    assert (out[3] == 0).all() and (out[9, ::2] == 0).all()
    good = torch.tensor(GOOD_ROWS)
    p = ref[good].double().clone()
    g = torch.randn(p.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expect = sparsenorm.kernels.reference.projection.dense_backward(p, g, kind)
    dx = tproj.project_backward(p.float().to(DEVICE), g.float().to(DEVICE), kind)
    torch.testing.assert_close(dx.cpu().double(), expect, atol=2e-5, rtol=2e-5)


def observe_split(monkeypatch):
    """Record the split projection forward's per-row candidate counts and done flags (test hook)."""
    seen = []
    monkeypatch.setattr(tproj, "_observe", lambda d: seen.append({k: v.cpu().clone() for k, v in d.items()}))
    return seen


@in_process
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("layout,dtype,max_iter", [(layout, torch.float32, None) for layout in SPLIT_LAYOUTS]
                         + [("three-ragged", torch.float16, None), ("three-ragged", torch.bfloat16, None),
                            ("segment-not-chunk-multiple", torch.float32, 0)])
def test_projection_split_rows_forward(kind, layout, dtype, max_iter, monkeypatch):
    """Rows split over several programs (statistics, gather of the entries above the lower bound,
    solve in registers, output) against the reference: masks, -inf and finfo.min entries, segments
    with no entry there, an empty row, NaN/+inf rows, an all-equal row, near-equal entries; max_iter
    0 sends the solve to its bisection. Every row is solved from the gathered candidates here."""
    n_cols = split_rows(tproj, layout, monkeypatch, limit="MAX_COLS")
    if max_iter is not None:
        monkeypatch.setattr(tproj, "MAX_ITER", max_iter)
    seen = observe_split(monkeypatch)
    x, mask = rows_with_every_case(dtype, n_cols=n_cols, seed=60 + n_cols)
    out = tproj.project(x, kind, mask=mask)
    assert out.dtype == dtype
    ref = getattr(sparsenorm, kind)(not_there_as_neg_inf(x, mask).cpu())
    check_rows(out.cpu(), ref, dtype)
    assert (out[3] == 0).all() and (out[9, ::2] == 0).all() and (out[1, ::3] == 0).all()
    assert len(seen) == 1 and bool(seen[0]["done"].all())
    assert int(seen[0]["candidates"][3]) == 0 and int(seen[0]["candidates"][4]) == 0  # empty, NaN rows gather none


def adversarial_rows(n_cols, seed):
    """float64 rows whose threshold needs many entries near the max: all equal, ties at the
    threshold, values clustered within 1e-6, a small-scale row; then ordinary rows (few entries
    within 2 of the max), an empty row and a NaN row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, n_cols, generator=g, dtype=torch.float64) * 4
    x[0] = 0.25
    x[1] = torch.where(torch.arange(n_cols) % 2 == 0, 1.0, 0.5)  # ties: sparsemax keeps the 1.0s
    x[2] = 3.0 + torch.randn(n_cols, generator=g, dtype=torch.float64) * 1e-6
    x[3] = torch.randn(n_cols, generator=g, dtype=torch.float64) * 0.1
    x[6] = float("-inf")
    x[7, 3] = float("nan")
    return x


@in_process
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("layout,max_iter", [("three-ragged", None), ("just-above-tile", None),
                                             ("segment-not-chunk-multiple", 0)])
def test_projection_split_rows_guarded_finish(kind, layout, max_iter, monkeypatch):
    """Rows with more candidates (entries within 1, resp. 2, of the max) than the solve holds (8
    here) are finished by the one-program-per-row kernel (max_iter 0: its bisection); the others
    are not touched by it. The done flags are exactly "at most 8 candidates" (float64 count), the
    adversarial rows among the finished, and every row equals the reference."""
    n_cols = split_rows(tproj, layout, monkeypatch, limit="MAX_COLS")
    monkeypatch.setattr(tproj, "SPLIT_CANDIDATES", 8)
    if max_iter is not None:
        monkeypatch.setattr(tproj, "MAX_ITER", max_iter)
    seen = observe_split(monkeypatch)
    x = adversarial_rows(n_cols, seed=70 + n_cols)
    out = tproj.project(x.float().to(DEVICE), kind).cpu()
    ref = getattr(sparsenorm, kind)(x.float().double())
    lower = 1.0 if kind == "sparsemax" else 2.0
    z = x.float().double() - x.float().double().nan_to_num(nan=float("-inf")).amax(-1, keepdim=True)
    expect = (z > -lower).sum(-1)
    expect[[6, 7]] = 0
    assert torch.equal(seen[0]["candidates"], expect.int())
    done = seen[0]["done"].bool()
    assert torch.equal(done, expect <= 8)
    assert not done[:4].any() and done[6:].all()  # the adversarial rows took the finish
    assert torch.isnan(out[7]).all() and (out[6] == 0).all()
    torch.testing.assert_close(out[:7], ref[:7].float(), atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(out[:6].sum(-1), torch.ones(6), atol=1e-5, rtol=0)


@in_process
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("layout,dtype", [(layout, torch.float32) for layout in SPLIT_LAYOUTS]
                         + [("three-ragged", torch.float16)])
def test_projection_split_rows_backward(kind, layout, dtype, monkeypatch):
    """The split backward (per-segment sums of w and w g, then dx: two launches) against the
    reference's float64 autograd, error model of test_projection_backward_matches_autograd."""
    n_cols = split_rows(tproj, layout, monkeypatch, limit="MAX_COLS")
    g = torch.Generator().manual_seed(80 + n_cols)
    x = torch.randn(6, n_cols, generator=g, dtype=torch.float64) * 2
    x[1, ::2] = float("-inf")
    x[2] = float("-inf")  # empty row: zero gradient
    x[3, n_cols // 2:] = float("-inf")  # whole segments not there
    gr = torch.randn(x.shape, generator=g, dtype=torch.float64)
    assert_projection_backward(x, gr, kind, dtype, nan_col=-1)  # a NaN in the last segment: the whole row NaN


@in_process
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("vocab_chunk", [0, 64])
def test_fused_linear_loss_with_the_triton_row_kernel(kind, vocab_chunk):
    """The fused linear + loss's algorithm (kernels/reference/linear_loss.py) with the Triton row
    kernel as its row-wise step, as it runs on CUDA: loss and gradients equal the materialised
    Fenchel-Young loss (float32, error model of tests/unit/test_linear_loss.py)."""
    import torch.nn.functional as F

    from sparsenorm import registry
    from sparsenorm.kernels.reference import linear_loss as ref_linear

    g = torch.Generator().manual_seed(9)
    h = torch.randn(10, 8, generator=g).to(DEVICE)
    w = torch.randn(200, 8, generator=g).to(DEVICE)
    y = torch.randint(0, 200, (10,), generator=g).to(DEVICE)
    plan = ref_linear.make_plan(10, 200, 4, vocab_chunk, 16)
    loss, gh, gw, _, _ = ref_linear.forward(h, w, None, y, None, kind, 0.0, -100, torch.ones(10, device=DEVICE), True,
                                            plan, lambda z: tproj.project(z, kind))
    hr, wr = h.cpu().double().requires_grad_(), w.cpu().double().requires_grad_()
    expect = registry.get(kind).single_label_loss(F.linear(hr, wr), y.cpu(), reduction="sum")
    expect.backward()
    tol = 64 * 8 * torch.finfo(torch.float32).eps * float(h.abs().max() * w.abs().max()) * 200
    torch.testing.assert_close(loss.cpu().double(), expect.detach(), atol=tol, rtol=0)
    torch.testing.assert_close(gh.cpu().double(), hr.grad, atol=tol, rtol=0)
    torch.testing.assert_close(gw.cpu().double(), wr.grad, atol=tol, rtol=0)


@in_process
@pytest.mark.parametrize("ev", [False, True])
@pytest.mark.parametrize("n_cols", [300, 5000])
def test_linear_loss_block_step_matches_the_reference(ev, n_cols):
    """The fused linear + loss's softmax/ev-softmax block step (one program per row, rows streamed in
    chunks of 4096: 5000 columns take two) against the reference's ``dense_block_``: loss, log Z,
    threshold and the in-place gradient, with not-there entries, an ignored row and a target not there."""
    from sparsenorm.kernels.reference import linear_loss as ref_linear
    from sparsenorm.kernels.triton import linear_loss as tlin

    g = torch.Generator().manual_seed(11)
    z = torch.randn(6, n_cols, generator=g) * 3
    z[1, ::7] = float("-inf")
    y = torch.randint(0, n_cols, (6,), generator=g)
    y[1] = 7  # a target that is not there: infinite loss, no target term in the gradient
    w = torch.rand(6, generator=g)
    w[2] = 0.0  # an ignored row
    wy = w.clone()
    wy[1] = 0.0
    thr = z.masked_fill(z == float("-inf"), 0).mean(1)
    shift = ref_linear.off_support_shift(1e-3)
    expect_z = z.clone()
    expect = ref_linear.dense_block_(expect_z, thr, y, w, wy, ev, shift, True)
    got_z = z.clone().to(DEVICE)
    got = tlin.block_rows(got_z, thr.to(DEVICE), y.to(DEVICE), w.to(DEVICE), wy.to(DEVICE), ev, shift, True)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_z.cpu(), expect_z, atol=1e-6, rtol=1e-5)
    assert got[0][1].item() == float("inf") and float(got_z[2].abs().max()) == 0.0


@in_process
@pytest.mark.parametrize("name", ["softmax", "ev_softmax"])
def test_fused_linear_loss_with_the_triton_block_step(name):
    """The fused algorithm with the Triton block step, as it runs on CUDA, against the materialised loss."""
    import torch.nn.functional as F

    from sparsenorm import registry
    from sparsenorm.kernels.reference import linear_loss as ref_linear
    from sparsenorm.kernels.triton import linear_loss as tlin

    g = torch.Generator().manual_seed(12)
    h = torch.randn(10, 8, generator=g).to(DEVICE)
    w = torch.randn(200, 8, generator=g).to(DEVICE)
    y = torch.randint(0, 200, (10,), generator=g).to(DEVICE)
    plan = ref_linear.make_plan(10, 200, 4, 0, 0)
    loss, gh, gw, _, _ = ref_linear.forward(h, w, None, y, None, name, 1e-6, -100, torch.ones(10, device=DEVICE),
                                            True, plan, None, tlin.block_rows)
    hr, wr = h.cpu().double().requires_grad_(), w.cpu().double().requires_grad_()
    expect = registry.get(name).single_label_loss(F.linear(hr, wr), y.cpu(), reduction="sum")
    expect.backward()
    tol = 64 * 8 * torch.finfo(torch.float32).eps * float(h.abs().max() * w.abs().max()) * 200
    torch.testing.assert_close(loss.cpu().double(), expect.detach(), atol=tol, rtol=0)
    torch.testing.assert_close(gh.cpu().double(), hr.grad, atol=tol, rtol=0)
    torch.testing.assert_close(gw.cpu().double(), wr.grad, atol=tol, rtol=0)


@in_process
def test_launchers_reject_bad_input_by_name():
    x = torch.randn(3, 4).to(DEVICE)
    with pytest.raises(TypeError, match="x must have dtype"):
        tev.ev_softmax_forward(x.double())
    with pytest.raises(ValueError, match="eps"):
        tev.ev_softmax_forward(x, eps=-1.0)
    with pytest.raises(ValueError, match="kind"):
        tproj.project(x, "softmax")
    with pytest.raises(ValueError, match="mask"):
        tev.ev_softmax_forward(x, mask=torch.ones(5, dtype=torch.bool, device=DEVICE))
    assert tev.ev_softmax_forward(x[:0]).shape == (0, 4)
    assert tproj.supports(torch.randn(2, tproj.MAX_COLS + 1).to(DEVICE))  # long rows are streamed


@pytest.mark.skipif(IN_PROCESS, reason="ran in this process")
def test_in_subprocess(run_under_interpreter):
    run_under_interpreter(__file__)


@in_process
def test_cuda_registrations_of_the_ops_call_the_triton_kernels():
    """The kernels registered for "cuda" on the ops (called here directly, on interpreter tensors)
    give the reference's values and gradients; inside ``kernels.disabled()`` they fall back to it."""
    from sparsenorm.kernels import ops
    from sparsenorm.kernels.reference import evidential as ref_ev
    from sparsenorm.kernels.reference import projection as ref_proj

    x, mask = rows_with_every_case(torch.float16)
    x = not_there_as_neg_inf(x, mask)[GOOD_ROWS]  # the ops see compute-dtype rows, not-there as -inf
    for eps, log in [(None, False), (1e-6, False), (1e-6, True)]:
        torch.testing.assert_close(ops.evidential._ev_softmax_cuda(x, eps, log), ref_ev.ev_softmax_forward(x, eps, log),
                                   atol=2e-6, rtol=2e-6)
    for kind in ("sparsemax", "entmax15"):
        p = ops.projection._project_cuda(x, kind, None)
        torch.testing.assert_close(p, ref_proj.project_sorted(x, kind), atol=2e-6, rtol=0)
        g = torch.randn_like(p)
        torch.testing.assert_close(ops.projection._project_backward_cuda(p, g, kind),
                                   ref_proj.dense_backward(p, g, kind),
                                   atol=2e-6, rtol=0)
    assert sparsenorm.kernels.policy.triton_launchers() is not None
    with sparsenorm.kernels.disabled():
        assert sparsenorm.kernels.policy.triton_launchers() is None
