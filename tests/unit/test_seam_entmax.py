"""The seam with the ``entmax`` package (issue 50, item 1): switching is a change of import.

Every public function and module that sparsenorm shares by name with ``entmax`` 1.3 (the test
extra pins it; it is the oracle here) takes ``entmax``'s arguments in ``entmax``'s order with its
defaults, and returns the same thing: each call below is made on both packages with the same
positional and keyword arguments, and the results (type, shape, dtype, values) and the gradients
with respect to the input are compared. Extra sparsenorm arguments (``mask``; the losses' ``weight``,
``ignore_index``, ``reduction``) come after ``entmax``'s and have defaults, so no ``entmax`` call
binds them.
"""
import inspect

import pytest
import torch

import sparsenorm

entmax = pytest.importorskip("entmax")

# Every name the two packages share (a new shared name fails test_the_shared_names_are_all_covered
# until it has calls below).
FUNCTIONS = ["sparsemax", "entmax15", "sparsemax_bisect", "entmax_bisect"]
LOSS_FUNCTIONS = ["sparsemax_loss", "entmax15_loss", "sparsemax_bisect_loss", "entmax_bisect_loss"]
MODULES = ["Sparsemax", "Entmax15", "SparsemaxBisect", "EntmaxBisect"]
LOSS_MODULES = ["SparsemaxLoss", "Entmax15Loss", "SparsemaxBisectLoss", "EntmaxBisectLoss"]
SHARED = FUNCTIONS + LOSS_FUNCTIONS + MODULES + LOSS_MODULES

# (name, positional arguments after the input(s), keyword arguments): the same call on both sides.
MAP_CALLS = [
    ("sparsemax", (), {}),
    ("sparsemax", (0,), {}),
    ("sparsemax", (-1, 2), {}),
    ("sparsemax", (), {"dim": 1, "k": 3}),
    ("entmax15", (), {}),
    ("entmax15", (0,), {}),
    ("entmax15", (-1, 2), {}),
    ("entmax15", (), {"dim": 0, "k": 1}),
    ("sparsemax_bisect", (), {}),
    ("sparsemax_bisect", (0, 60), {}),
    ("sparsemax_bisect", (-1, 50, False), {}),
    ("sparsemax_bisect", (), {"n_iter": 70, "ensure_sum_one": True}),
    ("entmax_bisect", (), {}),
    ("entmax_bisect", (1.3,), {}),
    ("entmax_bisect", (2.0, 0, 60), {}),
    ("entmax_bisect", (1.7, -1, 50, False), {}),
    ("entmax_bisect", (), {"alpha": 1.25, "dim": 1, "n_iter": 70}),
]
LOSS_CALLS = [
    ("sparsemax_loss", (), {}),
    ("sparsemax_loss", (2,), {}),
    ("sparsemax_loss", (), {"k": 3}),
    ("entmax15_loss", (), {}),
    ("entmax15_loss", (2,), {}),
    ("entmax15_loss", (), {"k": 4}),
    ("sparsemax_bisect_loss", (), {}),
    ("sparsemax_bisect_loss", (60,), {}),
    ("sparsemax_bisect_loss", (), {"n_iter": 70}),
    ("entmax_bisect_loss", (), {}),
    ("entmax_bisect_loss", (1.7,), {}),
    ("entmax_bisect_loss", (1.3, 60), {}),
    ("entmax_bisect_loss", (), {"alpha": 2.0, "n_iter": 70}),
]
# (name, constructor's positional arguments, constructor's keyword arguments); called on X (and the target).
MODULE_CALLS = [
    ("Sparsemax", (), {}),
    ("Sparsemax", (0, 2), {}),
    ("Sparsemax", (), {"dim": -1, "k": 3}),
    ("Entmax15", (), {}),
    ("Entmax15", (0, 2), {}),
    ("Entmax15", (), {"dim": 1, "k": 1}),
    ("SparsemaxBisect", (), {}),
    ("SparsemaxBisect", (0, 60), {}),
    ("SparsemaxBisect", (), {"n_iter": 70}),
    ("EntmaxBisect", (), {}),
    ("EntmaxBisect", (1.3,), {}),
    ("EntmaxBisect", (2.0, 0, 60), {}),
    ("EntmaxBisect", (), {"alpha": 1.7, "n_iter": 70}),
    ("SparsemaxLoss", (), {}),
    ("SparsemaxLoss", (2, 1, "sum"), {}),
    ("SparsemaxLoss", (), {"k": 3, "ignore_index": 0, "reduction": "none"}),
    ("Entmax15Loss", (), {}),
    ("Entmax15Loss", (3, 1, "none"), {}),
    ("Entmax15Loss", (), {"ignore_index": 2, "reduction": "sum"}),
    ("SparsemaxBisectLoss", (), {}),
    ("SparsemaxBisectLoss", (60, 1, "sum"), {}),
    ("SparsemaxBisectLoss", (), {"n_iter": 70, "reduction": "none"}),
    ("EntmaxBisectLoss", (), {}),
    ("EntmaxBisectLoss", (1.7,), {}),
    ("EntmaxBisectLoss", (1.3, 60, 1, "sum"), {}),
    ("EntmaxBisectLoss", (), {"alpha": 2.0, "n_iter": 70, "ignore_index": 0, "reduction": "none"}),
]


def _data(seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 7, generator=gen, dtype=dtype) * 2
    target = torch.randint(0, 7, (6,), generator=gen)
    target[1] = 1  # a row for the modules' ignore_index=1 cases
    return x, target, gen


def _both(fn_ours, fn_theirs, x, *rest, gen):
    """Values and input gradients of both calls (one random cotangent for both)."""
    outs, grads, cotangent = [], [], None
    for fn in (fn_ours, fn_theirs):
        xi = x.clone().requires_grad_(True)
        out = fn(xi, *rest)
        if cotangent is None:
            cotangent = torch.rand(out.shape, generator=gen, dtype=out.dtype)
        (grad,) = torch.autograd.grad(out, xi, cotangent)
        outs.append(out.detach())
        grads.append(grad)
    return outs, grads


def _assert_same(ours, theirs, what, atol=1e-10):
    assert type(ours) is type(theirs), what
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol, msg=what)


def test_the_shared_names_are_all_covered():
    shared = {name for name in dir(entmax) if not name.startswith("_") and hasattr(sparsenorm, name)
              and not inspect.ismodule(getattr(entmax, name))}
    assert shared == set(SHARED)
    called = {c[0] for c in MAP_CALLS + LOSS_CALLS + MODULE_CALLS}
    assert called == set(SHARED)


def _params(fn):
    return list(inspect.signature(fn).parameters.values())


@pytest.mark.parametrize("name", SHARED)
def test_same_arguments_in_the_same_order_with_the_same_defaults(name):
    theirs, ours = getattr(entmax, name), getattr(sparsenorm, name)
    pairs = [(theirs, ours)]
    if inspect.isclass(theirs):
        pairs = [(theirs.__init__, ours.__init__), (theirs.forward, ours.forward)]
    for t, o in pairs:
        tp, op = _params(t), _params(o)
        assert [(p.name, p.default) for p in op[:len(tp)]] == [(p.name, p.default) for p in tp], (name, t)
        assert all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in op[:len(tp)]), name
        for extra in op[len(tp):]:  # sparsenorm's own arguments: optional, after entmax's
            assert extra.default is not inspect.Parameter.empty, (name, extra.name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", range(len(MAP_CALLS)), ids=lambda i: f"{MAP_CALLS[i][0]}{MAP_CALLS[i][1:]}")
def test_maps_give_entmax_results(case, dtype):
    name, args, kwargs = MAP_CALLS[case]
    x, _, gen = _data(100 + case, dtype)
    ours = lambda z: getattr(sparsenorm, name)(z, *args, **kwargs)  # noqa: E731
    theirs = lambda z: getattr(entmax, name)(z, *args, **kwargs)  # noqa: E731
    (o, t), (go, gt) = _both(ours, theirs, x, gen=gen)
    atol = 1e-10 if dtype == torch.float64 else 2e-6
    _assert_same(o, t, f"{name}{args}{kwargs}", atol)
    _assert_same(go, gt, f"gradient of {name}{args}{kwargs}", atol)


@pytest.mark.parametrize("case", range(len(LOSS_CALLS)), ids=lambda i: f"{LOSS_CALLS[i][0]}{LOSS_CALLS[i][1:]}")
def test_loss_functions_give_entmax_per_row_losses(case):
    name, args, kwargs = LOSS_CALLS[case]
    x, target, gen = _data(200 + case)
    ours = lambda z, y: getattr(sparsenorm, name)(z, y, *args, **kwargs)  # noqa: E731
    theirs = lambda z, y: getattr(entmax, name)(z, y, *args, **kwargs)  # noqa: E731
    (o, t), (go, gt) = _both(ours, theirs, x, target, gen=gen)
    assert o.shape == (6,)  # one loss per row, as entmax returns
    _assert_same(o, t, f"{name}{args}{kwargs}")
    _assert_same(go, gt, f"gradient of {name}{args}{kwargs}")


@pytest.mark.parametrize("case", range(len(MODULE_CALLS)),
                         ids=lambda i: f"{MODULE_CALLS[i][0]}{MODULE_CALLS[i][1:]}")
def test_modules_give_entmax_results(case):
    name, args, kwargs = MODULE_CALLS[case]
    ours, theirs = getattr(sparsenorm, name)(*args, **kwargs), getattr(entmax, name)(*args, **kwargs)
    for attribute, value in vars(theirs).items():  # dim, k, n_iter, alpha, ignore_index, reduction
        if not attribute.startswith("_") and attribute != "training":
            assert getattr(ours, attribute) == value, (name, attribute)
    x, target, gen = _data(300 + case)
    rest = (target,) if name.endswith("Loss") else ()
    (o, t), (go, gt) = _both(ours, theirs, x, *rest, gen=gen)
    _assert_same(o, t, f"{name}{args}{kwargs}")
    _assert_same(go, gt, f"gradient of {name}{args}{kwargs}")


def test_sparsenorms_own_loss_api_is_there_by_keyword():
    """weight, ignore_index and reduction (CrossEntropyLoss's conventions) are keywords after entmax's arguments."""
    x, target, _ = _data(400)
    w = torch.linspace(0.5, 2.0, 7, dtype=torch.float64)
    per_row = sparsenorm.entmax15_loss(x, target)
    torch.testing.assert_close(sparsenorm.entmax15_loss(x, target, weight=w, reduction="mean"),
                               (per_row * w[target]).sum() / w[target].sum())
    ignored = target.clone()
    ignored[0] = -100
    torch.testing.assert_close(sparsenorm.entmax15_loss(x, ignored, reduction="sum"), per_row[1:].sum())
    torch.testing.assert_close(sparsenorm.sparsemax_loss(x, target, 3, reduction="mean"),
                               entmax.SparsemaxLoss(k=3)(x, target))
    with pytest.raises(TypeError, match="positional"):  # entmax's third positional is k; weight is a keyword
        sparsenorm.sparsemax_loss(x, target, None, w)
