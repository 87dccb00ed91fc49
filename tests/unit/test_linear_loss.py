"""The fused linear + single-label loss (``sparsenorm.fused_linear_loss``, op ``sparsenorm::linear_loss``)
against the materialised ``registry.get(name).single_label_loss(F.linear(h, W, b), y)``.

Error model. The fused path computes the same logits by the same dot products in other blocks, so a
logit differs by at most ``gamma_d * sum_i |h_i W_vi|`` (``gamma_d ~ d eps``); every loss here is
2-Lipschitz in the logits (``|dL/dz|_1 = |p - e_y|_1 <= 2``), and the normalisers add a rounding of
``~ V eps`` relative. The gradients ``G W`` and ``G^T h`` inherit ``|dG|_1 <= 2 |dz|_inf`` times the
largest ``|W|`` or ``|h|``, plus the products' own ``~ V eps`` (or ``N eps``). :func:`_tol` is that
bound with a factor 8 of slack; in float64 it is ~1e-12 (``linear_loss_checks.py``).
"""
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import sparsenorm
from sparsenorm import registry
from sparsenorm.kernels.ops import linear_loss as linear_loss_ops
from sparsenorm.linear_loss import streamable_normalizers

from linear_loss_checks import NAMES, assert_close, error_bound, linear_inputs, random_grads  # tests/unit/

_inputs = partial(linear_inputs, n=23, d=6, v=70)


def _materialised(name, h, w, b, y, reduction="mean", mask=None, **params):
    z = F.linear(h, w, b)
    if mask is not None:  # the one rule: not there = -inf (F.cross_entropy takes no mask argument)
        z = z.masked_fill(~mask, float("-inf"))
    return registry.get(name, **params).single_label_loss(z, y, reduction=reduction)


def test_registry_flags_the_streamable_losses():
    names = streamable_normalizers()
    for name in ["softmax", "ev_softmax", "sparsemax", "entmax15", "entmax_bisect"]:
        assert name in names
    assert registry.get("t_softmax").linear_loss is None
    assert registry.get("sparsemax").linear_loss == "sparsemax"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("vocab_chunk", [0, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_materialised_float64(name, reduction, vocab_chunk, bias):
    _, h, w, b, y = _inputs(1, scale=1.5, bias=bias)
    got = sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b, reduction=reduction, token_chunk=7,
                                       vocab_chunk=vocab_chunk)
    ref = _materialised(name, h, w, b, y, reduction)
    tol = error_bound(h, w, torch.float64)
    assert_close(got.detach(), ref.detach(), tol, "loss")
    for a, r, what in zip(random_grads(got, (h, w, b)), random_grads(ref, (h, w, b)), ("hidden", "weight", "bias")):
        assert_close(a, r, tol, f"grad {what}")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("vocab_chunk", [0, 5])
def test_gradcheck_float64(name, reduction, vocab_chunk):
    _, h, w, b, y = _inputs(2, n=5, d=3, v=12)
    y[1] = 4

    def f(h, w, b):
        return sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b, reduction=reduction, token_chunk=2,
                                            vocab_chunk=vocab_chunk)

    assert torch.autograd.gradcheck(f, (h, w, b), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_float32_each_side_within_error_model_of_float64(name):
    _, h, w, b, y = _inputs(3, n=40, d=32, v=500, dtype=torch.float32)
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, w, b))
    oracle = _materialised(name, h64, w64, b64, y, "none")
    og = random_grads(oracle.sum(), (h64, w64, b64))
    tol = error_bound(h, w, torch.float32)
    for got in (sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b, reduction="none", vocab_chunk=128),
                _materialised(name, h, w, b, y, "none")):
        assert_close(got.detach().double(), oracle.detach(), tol, "loss")
        for a, r in zip(random_grads(got.sum(), (h, w, b)), og):
            assert_close(a.double(), r, tol, "grad")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("ignore_index", [-100, -1, 3])
def test_ignore_index(name, ignore_index):
    _, h, w, b, y = _inputs(4)
    y[1] = 5
    y[::3] = ignore_index
    for reduction in ("mean", "sum", "none"):
        got = sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b, ignore_index=ignore_index,
                                           reduction=reduction)
        ref = _materialised(name, h, w, b, y, reduction) if ignore_index == -100 else \
            registry.get(name).single_label_loss(F.linear(h, w, b), y, ignore_index=ignore_index, reduction=reduction)
        assert_close(got.detach(), ref.detach(), error_bound(h, w, torch.float64), f"{reduction} loss")
        if reduction == "none":
            assert bool((got[y == ignore_index] == 0).all())
        gh = random_grads(got, (h,))[0]
        assert bool((gh[y == ignore_index] == 0).all())


@pytest.mark.parametrize("name", NAMES)
def test_every_row_ignored_gives_zero(name):
    _, h, w, b, y = _inputs(5)
    y.fill_(-100)
    loss = sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b)
    assert float(loss.detach()) == 0.0
    gh, gw, gb = random_grads(loss, (h, w, b))
    assert float(gh.abs().max()) == 0 and float(gw.abs().max()) == 0 and float(gb.abs().max()) == 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("vocab_chunk", [0, 16])
def test_vocab_entries_not_there(name, vocab_chunk):
    """Padding rows of a padded vocabulary: ``vocab_mask`` False, or a bias of -inf / finfo.min: zero
    probability, out of ev-softmax's mean, no gradient, as the materialised loss with the mask."""
    _, h, w, b, y = _inputs(6, v=70)
    mask = torch.ones(70, dtype=torch.bool)
    mask[60:] = False
    y = torch.where((y >= 60), torch.zeros_like(y), y)
    b_pad = b.detach().clone()
    b_pad[60:65] = float("-inf")
    b_pad[65:] = torch.finfo(torch.float64).min
    b_pad.requires_grad_()
    ref = _materialised(name, h, w, b, y, "none", mask=mask)
    rg = random_grads(ref, (h, w, b))
    tol = error_bound(h, w, torch.float64)
    got = sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b, reduction="none", vocab_mask=mask,
                                       vocab_chunk=vocab_chunk)
    assert_close(got.detach(), ref.detach(), tol, "loss (mask)")
    for a, r in zip(random_grads(got, (h, w, b)), rg):
        assert_close(a, r, tol, "grad (mask)")
    got_b = sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b_pad, reduction="none",
                                             vocab_chunk=vocab_chunk)
    assert_close(got_b.detach(), ref.detach(), tol, "loss (bias)")
    gh, gw, gb = random_grads(got_b, (h, w, b_pad))
    assert_close(gh, rg[0], tol, "grad hidden (bias)")
    assert float(gw[60:].abs().max()) == 0 and float(gb[60:].abs().max()) == 0
    # a target that is not there: an infinite loss, as the materialised loss gives
    y2 = y.clone()
    y2[0] = 65
    inf_loss = sparsenorm.fused_linear_loss(h, w, y2, normalizer=name, bias=b, reduction="none", vocab_mask=mask,
                                            vocab_chunk=vocab_chunk)
    assert inf_loss[0].item() == math.inf and bool(torch.isfinite(inf_loss[2:]).all())


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_bisect"])
@pytest.mark.parametrize("scale", [0.05, 3.0])
def test_candidate_search_falls_back_when_the_support_is_wider(name, scale):
    """k = 2 candidates per vocabulary chunk of 8: flat logits (scale 0.05) have supports far wider
    than the candidates, so the exactness check fails and whole rows are redone; peaked logits
    (scale 3) pass it. Both equal the materialised loss."""
    _, h, w, b, y = _inputs(7, n=9, d=4, v=64, scale=scale)
    y[1] = 2
    alpha = registry.get(name).alpha
    kind = registry.get(name).linear_loss
    row_w = torch.full((9,), 1.0, dtype=torch.float64)
    hd, wd, bd = h.detach(), w.detach(), b.detach()
    loss, gh, gw, gb, stats = linear_loss_ops.linear_loss(hd, wd, bd, y, None, row_w, kind, alpha, -100, True,
                                                         4, 8, 2)
    ref = _materialised(name, h, w, b, y, "sum")
    tol = error_bound(h, w, torch.float64)
    assert_close(loss, ref.detach(), tol, "loss")
    for a, r in zip((gh, gw, gb), torch.autograd.grad(ref, (h, w, b))):
        assert_close(a, r, tol, "grad")
    p = registry.get(name).forward(F.linear(hd, wd, bd), dim=-1)
    support = (p > 0).sum(-1)
    assert bool((support > 2).any()) == (scale < 1)  # the fallback was needed exactly for the flat logits


@pytest.mark.parametrize("vocab_chunk", [0, 7])
def test_ev_softmax_mean_above_every_logit_by_rounding(vocab_chunk):
    """Equal logits whose mean rounds above them: the threshold is ``min(mean, max)``, so every
    entry is on the support and the distribution uniform. d = 1 makes every logit the same single
    product ``h w`` (no summation order), and ``w`` is picked so that ``mean(W)`` rounds up."""
    w_value = next(k / 97.0 for k in range(1, 200)
                   if torch.full((30,), k / 97.0, dtype=torch.float64).mean() > k / 97.0)
    h = torch.tensor([[1.0], [2.0], [3.5]], dtype=torch.float64, requires_grad=True)
    w = torch.full((30, 1), w_value, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 7, 29])
    assert bool((h.detach() @ w.detach().mean(0) > (h.detach() @ w.detach().t()).amax(1)).all())
    got = sparsenorm.fused_linear_loss(h, w, y, normalizer="ev_softmax", reduction="none", vocab_chunk=vocab_chunk)
    assert_close(got.detach(), torch.full((3,), math.log(30), dtype=torch.float64), 1e-12, "uniform loss")
    ref = _materialised("ev_softmax", h, w, None, y, "none")
    for a, r in zip(random_grads(got, (h, w)), random_grads(ref, (h, w))):
        assert_close(a, r, 1e-12, "grad")


def test_shapes_dtypes_and_module():
    _, h, w, b, y = _inputs(9, n=12)
    h3 = h.detach().reshape(3, 4, -1).requires_grad_()
    y3 = y.reshape(3, 4)
    rows = sparsenorm.fused_linear_loss(h3, w, y3, normalizer="entmax15", bias=b, reduction="none")
    assert rows.shape == (3, 4)
    module = sparsenorm.FusedLinearLoss("entmax_bisect", reduction="sum", alpha=1.3)
    assert "alpha=1.3" in repr(module)
    got = module(h, w, y, bias=b)
    ref = _materialised("entmax_bisect", h, w, b, y, "sum", alpha=1.3)
    assert_close(got.detach(), ref.detach(), error_bound(h, w, torch.float64), "module")
    hb = h.detach().to(torch.bfloat16).requires_grad_()
    out = sparsenorm.fused_linear_loss(hb, w.detach().to(torch.bfloat16), y, normalizer="ev_softmax")
    assert out.dtype == torch.bfloat16
    out.backward()
    assert hb.grad.dtype == torch.bfloat16


def test_backward_twice_with_retain_graph_gives_the_same_gradients():
    _, h, w, b, y = _inputs(10)
    loss = sparsenorm.fused_linear_loss(h, w, y, normalizer="sparsemax", bias=b)
    first = torch.autograd.grad(loss, (h, w, b), retain_graph=True)
    second = torch.autograd.grad(loss, (h, w, b))
    for a, c in zip(first, second):
        assert torch.equal(a, c)


def test_bad_input_names_the_argument():
    _, h, w, b, y = _inputs(11)
    with pytest.raises(ValueError, match="unknown normalizer"):
        sparsenorm.fused_linear_loss(h, w, y, normalizer="nope")
    with pytest.raises(ValueError, match="no streamable single-label loss"):
        sparsenorm.fused_linear_loss(h, w, y, normalizer="t_softmax")
    with pytest.raises(ValueError, match="input.s last dim"):
        sparsenorm.fused_linear_loss(h[:, :3], w, y)
    with pytest.raises(TypeError, match="target must be an integer"):
        sparsenorm.fused_linear_loss(h, w, y.double())
    with pytest.raises(ValueError, match="target must have input.s shape"):
        sparsenorm.fused_linear_loss(h, w, y[:3])
    with pytest.raises(ValueError, match="bias must have shape"):
        sparsenorm.fused_linear_loss(h, w, y, bias=b[:3])
    with pytest.raises(TypeError, match="vocab_mask must be a boolean"):
        sparsenorm.fused_linear_loss(h, w, y, vocab_mask=torch.ones(70))
    with pytest.raises(ValueError, match="reduction must be one of"):
        sparsenorm.fused_linear_loss(h, w, y, reduction="avg")
    with pytest.raises(IndexError, match="class index 70"):
        sparsenorm.fused_linear_loss(h, w, torch.full_like(y, 70))
    with pytest.raises(ValueError, match="no parameter"):
        sparsenorm.fused_linear_loss(h, w, y, normalizer="sparsemax", alpha=1.2)


def test_fake_and_schema():
    _, h, w, b, y = _inputs(12, n=6, v=20)
    args = (h.detach(), w.detach(), b.detach(), y, None, torch.ones(6, dtype=torch.float64), "ev_softmax", 1e-6,
            -100, True, 4, 8, 0)
    torch.library.opcheck(linear_loss_ops.linear_loss, args, test_utils=("test_schema", "test_faketensor"))
    stats = linear_loss_ops.linear_loss(*args[:5], None, "ev_softmax", 1e-6, -100, False, 4, 8, 0)[4]
    bargs = (h.detach(), w.detach(), b.detach(), y, None, stats, torch.ones(6, dtype=torch.float64), "ev_softmax",
             1e-6, -100, 4, 8)
    torch.library.opcheck(linear_loss_ops.linear_loss_backward, bargs, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("name", ["ev_softmax", "entmax15"])
def test_frozen_weight_and_no_grad(name):
    """Only ``hidden`` requires a gradient (a frozen output layer); under ``no_grad`` no gradient is
    computed and the value is the same."""
    _, h, w, b, y = _inputs(13)
    w_frozen, b_frozen = w.detach(), b.detach()
    loss = sparsenorm.fused_linear_loss(h, w_frozen, y, normalizer=name, bias=b_frozen)
    (gh,) = torch.autograd.grad(loss, (h,))
    ref = _materialised(name, h, w_frozen, b_frozen, y)
    (rh,) = torch.autograd.grad(ref, (h,))
    tol = error_bound(h, w, torch.float64)
    assert_close(gh, rh, tol, "grad hidden")
    with torch.no_grad():
        value = sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b)
    assert not value.requires_grad
    assert_close(value, ref.detach(), tol, "no_grad value")


@pytest.mark.parametrize("name, reduction", [("ev_softmax", "mean"), ("entmax15", "none")])
def test_compiles_without_graph_breaks(name, reduction):
    """``torch.compile(fullgraph=True)`` traces the functional and the ops (fakes, autograd) and gives
    the eager values and gradients."""
    torch._dynamo.reset()
    _, h, w, b, y = _inputs(14, n=12, v=40)

    def f(h, w, b):
        return sparsenorm.fused_linear_loss(h, w, y, normalizer=name, bias=b, reduction=reduction)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    got, ref = compiled(h, w, b), f(h, w, b)
    assert_close(got.detach(), ref.detach(), 0.0, "loss")
    for a, r in zip(random_grads(got, (h, w, b)), random_grads(ref, (h, w, b))):
        assert_close(a, r, 0.0, "grad")


def _blocks(plan):
    return plan.token_chunk, plan.vocab_chunk


def test_default_plan_keeps_whole_vocabulary_rows_with_enough_tokens_per_block():
    """The default blocks: about 32 MiB of float32 logits of whole vocabulary rows (170 tokens of a
    49k vocabulary, issue 38's shape, unchanged); at a 128k vocabulary, where 32 MiB is 65 tokens and
    each block re-reads all of W, at least ROW_TOKENS = 128 (at most the hidden size); vocabulary chunks
    only where the hidden size is too small to allow even MIN_TOKENS whole rows."""
    from sparsenorm.kernels.reference.linear_loss import MIN_TOKENS, ROW_TOKENS, make_plan

    assert _blocks(make_plan(4096, 49152, n_hidden=576)) == (170, 49152)
    assert _blocks(make_plan(2048, 128256, n_hidden=576)) == (ROW_TOKENS, 128256)
    assert _blocks(make_plan(2048, 128256, n_hidden=96)) == (96, 128256)  # no larger than W's gradient
    assert _blocks(make_plan(50, 128256, n_hidden=576)) == (50, 128256)  # never more tokens than there are
    assert make_plan(4096, 1_000_000, n_hidden=MIN_TOKENS - 1).vocab_chunk < 1_000_000
    assert _blocks(make_plan(2048, 128256, n_hidden=0)) == (65, 128256)  # hidden size unknown: bytes alone
    assert _blocks(make_plan(2048, 128256, token_chunk=7, n_hidden=576)) == (7, 128256)  # a given chunk is kept


def test_the_op_passes_the_hidden_size_to_the_plan():
    """The op's plan at a 128k vocabulary is the 128-token one (so fused_linear_loss gets it by default)."""
    h = torch.empty(300, 576, device="meta")  # the plan reads shapes and the element size only
    w = torch.empty(128256, 576, device="meta")
    assert _blocks(linear_loss_ops._plan(h, w, 0, 0, 0)) == (128, 128256)
