"""The seam with PyTorch's fused cross-entropy (issue 50, item 2): ``sparsenorm.fused_linear_loss``
takes ``torch.nn.functional.linear_cross_entropy``'s arguments (``input, weight, target, bias``, then
``reduction``, ``ignore_index``, ``label_smoothing`` by keyword) and, with no normalizer, gives its
value and gradients; ``label_smoothing`` and ``softcap`` for every streamable normalizer against the
registry's loss of the smoothed target distribution; the ``(V, d)`` layout and a swapped weight/input
(Liger's order) named in the errors.

Error model (as ``tests/unit/test_linear_loss.py``): both sides compute the same logits by dot
products of length ``d`` in other blocks (``|dz| <= d eps sum|h W|``); every loss here is 2-Lipschitz
in the logits (``|p - q|_1 <= 2``), the cap is 1-Lipschitz, and the reductions add ``~(V + N) eps``
relative. ``error_bound`` (``tests/unit/linear_loss_checks.py``) is that bound with a factor 8 of slack.
"""
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import sparsenorm
from sparsenorm import registry
from sparsenorm.linear_loss import streamable_normalizers

from linear_loss_checks import NAMES, assert_close, error_bound, linear_inputs, random_grads  # tests/unit/

_inputs = partial(linear_inputs, n=13, d=5, v=40, scale=1.5, ignored_row=2)


# ----------------------------------------------------------------------------- PyTorch's fused CE
def test_torch_has_linear_cross_entropy():
    """The comparison below is with torch's own ``linear_cross_entropy`` (new in torch 2.13)."""
    assert hasattr(F, "linear_cross_entropy")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_default_is_torch_linear_cross_entropy(reduction, bias, label_smoothing):
    """Same positional arguments (``input, weight, target``; the bias fourth here, ``linear_bias=``
    there), same keywords: same loss and gradients as ``F.linear_cross_entropy`` and
    ``F.cross_entropy(F.linear(...))``, float64; a 3-D input here (torch's takes 1-D or 2-D: it gets
    the flattened one)."""
    _, h, w, b, y = _inputs(1, bias=bias)
    h3, y3 = h[:12].reshape(3, 4, -1), y[:12].reshape(3, 4)
    kw = dict(reduction=reduction, ignore_index=-100, label_smoothing=label_smoothing)
    got = sparsenorm.fused_linear_loss(h3, w, y3, b, **kw)
    torch_fused = F.linear_cross_entropy(h3.flatten(0, -2), w, y3.flatten(), linear_bias=b, **kw)
    composed = F.cross_entropy(F.linear(h3, w, b).flatten(0, -2), y3.flatten(), **kw)
    if reduction == "none":
        torch_fused, composed = torch_fused.reshape(y3.shape), composed.reshape(y3.shape)
    tol = error_bound(h, w, torch.float64)
    for ref, what in ((torch_fused, "linear_cross_entropy"), (composed, "cross_entropy(linear)")):
        assert_close(got.detach(), ref.detach(), tol, f"loss vs {what}")
        for a, r, name in zip(random_grads(got, (h, w, b)), random_grads(ref, (h, w, b)), ("input", "weight", "bias")):
            assert_close(a, r, tol, f"grad {name} vs {what}")


def test_default_float32_within_the_error_model_of_float64():
    _, h, w, b, y = _inputs(2, n=64, d=32, v=3000, dtype=torch.float32)
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, w, b))
    oracle = F.linear_cross_entropy(h64, w64, y, linear_bias=b64, label_smoothing=0.1)
    tol = error_bound(h, w, torch.float32)
    for got in (sparsenorm.fused_linear_loss(h, w, y, b, label_smoothing=0.1),
                F.linear_cross_entropy(h, w, y, linear_bias=b, label_smoothing=0.1)):
        assert_close(got.detach().double(), oracle.detach(), tol, "loss")
        for a, r in zip(random_grads(got, (h, w, b)), random_grads(oracle, (h64, w64, b64))):
            assert_close(a.double(), r, tol, "grad")


def test_module_default_is_cross_entropy_loss():
    _, h, w, b, y = _inputs(3)
    module = sparsenorm.FusedLinearLoss(label_smoothing=0.1, reduction="sum")
    got = module(h, w, y, b)
    ref = torch.nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")(F.linear(h, w, b), y)
    assert_close(got.detach(), ref.detach(), error_bound(h, w, torch.float64), "module loss")
    assert "label_smoothing=0.1" in repr(module) and "normalizer='softmax'" in repr(module)


# ----------------------------------------------------------------------------- smoothing and cap, every normalizer
def _oracle_rows(name, h, w, b, y, smoothing, softcap, mask):
    """Per-row loss of the materialised logits against ``q = (1 - s) e_y + s u`` (``u`` uniform over
    the entries that are there), by the registry's loss of a target distribution; 0 on ignored rows."""
    z = F.linear(h, w, b)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    there = torch.ones(w.shape[0], dtype=torch.bool) if mask is None else mask
    z = z.masked_fill(~there, float("-inf"))
    ok = y != -100
    yc = y.clamp_min(0)
    q = there.to(z.dtype).expand_as(z) * (smoothing / there.sum().to(z.dtype))
    q = q + (1 - smoothing) * F.one_hot(yc, w.shape[0]).to(z.dtype)
    if name == "softmax":
        logp = torch.log_softmax(z, -1)
        rows = -torch.where(q != 0, q * logp, torch.zeros_like(logp)).sum(-1)
    else:
        rows = registry.get(name).single_label_loss(z, q, reduction="none")
    return torch.where(ok, rows, torch.zeros_like(rows)), ok


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("smoothing, softcap", [(0.15, None), (0.0, 2.0), (0.15, 2.0), (1.0, None)])
@pytest.mark.parametrize("vocab_chunk", [0, 7])
def test_smoothing_and_softcap_match_the_registry_loss(name, smoothing, softcap, vocab_chunk):
    """Every streamable loss with label smoothing and/or a tanh cap, whole vocabulary rows and
    streamed chunks (the sparse kinds' candidate search), a padded vocabulary (``vocab_mask``),
    reductions 'none' and 'mean', value and gradients."""
    _, h, w, b, y = _inputs(4)
    mask = torch.ones(w.shape[0], dtype=torch.bool)
    mask[-3:] = False
    y = torch.where(y >= 0, y % (w.shape[0] - 3), y)  # targets that are there (else both sides are inf)
    rows, ok = _oracle_rows(name, h, w, b, y, smoothing, softcap, mask)
    tol = error_bound(h, w, torch.float64) * (1 + abs(softcap or 0))
    kw = dict(normalizer=name, label_smoothing=smoothing, softcap=softcap, vocab_mask=mask, token_chunk=5,
              vocab_chunk=vocab_chunk)
    got = sparsenorm.fused_linear_loss(h, w, y, b, reduction="none", **kw)
    assert_close(got.detach(), rows.detach(), tol, "rows")
    for a, r, what in zip(random_grads(got, (h, w, b)), random_grads(rows, (h, w, b)), ("input", "weight", "bias")):
        assert_close(a, r, tol, f"grad {what} (none)")
    mean = sparsenorm.fused_linear_loss(h, w, y, b, reduction="mean", **kw)
    ref = rows.sum() / ok.sum()
    assert_close(mean.detach(), ref.detach(), tol, "mean")
    for a, r, what in zip(random_grads(mean, (h, w, b)), random_grads(ref, (h, w, b)), ("input", "weight", "bias")):
        assert_close(a, r, tol, f"grad {what} (mean)")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradcheck_float64_smoothing_and_softcap(name, reduction):
    _, h, w, b, y = _inputs(5, n=5, d=3, v=11)

    def f(h, w, b):
        return sparsenorm.fused_linear_loss(h, w, y, b, normalizer=name, reduction=reduction, label_smoothing=0.2,
                                            softcap=1.5, token_chunk=2, vocab_chunk=4)

    assert torch.autograd.gradcheck(f, (h, w, b), eps=1e-6, atol=1e-7)


def test_softcap_bounds_the_logits():
    """A huge logit scale: the capped loss is that of logits in [-c, c], finite, as Gemma's cap means."""
    _, h, w, b, y = _inputs(6, scale=1e4)
    got = sparsenorm.fused_linear_loss(h, w, y, b, softcap=3.0, reduction="none")
    ref = F.cross_entropy(3.0 * torch.tanh(F.linear(h, w, b) / 3.0), y, reduction="none")
    assert_close(got.detach(), ref.detach(), error_bound(h, w, torch.float64), "capped loss")
    assert float(got.detach().max()) <= 6.0 + math.log(40) + 1e-9  # lse - z_y <= log V + 2c


def test_every_streamable_normalizer_takes_the_options():
    _, h, w, b, y = _inputs(7)
    for name in streamable_normalizers():
        loss = sparsenorm.fused_linear_loss(h, w, y, b, normalizer=name, label_smoothing=0.1, softcap=5.0)
        assert torch.isfinite(loss)


# ----------------------------------------------------------------------------- errors
def test_bad_options_name_the_argument():
    _, h, w, b, y = _inputs(8)
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="label_smoothing must be a number in"):
            sparsenorm.fused_linear_loss(h, w, y, label_smoothing=bad)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="softcap must be None or a finite number > 0"):
            sparsenorm.fused_linear_loss(h, w, y, softcap=bad)
    with pytest.raises(ValueError, match="label_smoothing needs 'ev_softmax' with eps > 0"):
        sparsenorm.fused_linear_loss(h, w, y, normalizer="ev_softmax", eps=0.0, label_smoothing=0.1)
    with pytest.raises(ValueError, match="label_smoothing must be"):
        sparsenorm.FusedLinearLoss(label_smoothing=2.0)
    with pytest.raises(TypeError, match="normalizer is a keyword argument: normalizer='entmax15'"):
        sparsenorm.fused_linear_loss(h, w, y, "entmax15")  # the old 4th positional argument


def test_shape_errors_name_the_v_d_layout():
    _, h, w, b, y = _inputs(9)
    cases = [
        lambda: sparsenorm.fused_linear_loss(h, w.t(), y),         # transposed weight
        lambda: sparsenorm.fused_linear_loss(h[:, :3], w, y),      # wrong feature dim
        lambda: sparsenorm.fused_linear_loss(h, w[None], y),       # 3-D weight
        lambda: sparsenorm.fused_linear_loss(h, w, y, b[:3]),      # bias
        lambda: sparsenorm.fused_linear_loss(h, w, y, vocab_mask=torch.ones(3, dtype=torch.bool)),
        lambda: sparsenorm.fused_linear_loss(h, w[:0], y),         # no vocabulary
    ]
    for case in cases:
        with pytest.raises(ValueError, match=r"\(V, d\)"):
            case()
    with pytest.raises(ValueError, match="weight looks transposed"):
        cases[0]()


def test_swapped_weight_and_input_are_named():
    """Liger's ``LigerFusedLinearCrossEntropyLoss()(weight, input, target)`` order, on our module and
    function: the error says the two look swapped, not that the target has the wrong shape."""
    _, h, w, b, y = _inputs(10)
    with pytest.raises(ValueError, match="look swapped.*Liger"):
        sparsenorm.FusedLinearLoss()(w, h, y)
    with pytest.raises(ValueError, match="look swapped"):
        sparsenorm.fused_linear_loss(w, h, y)
