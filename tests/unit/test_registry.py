"""The registry: every name resolves, each entry's pieces fit together, unknown names fail clearly."""
import pytest
import torch
from torch import nn

from sparsenorm import registry

from knife_edge import band

EPS64 = torch.finfo(torch.float64).eps / 2  # unit roundoff

ALL = registry.names()


def test_lists_every_normalizer_of_the_issue():
    assert set(ALL) == {"softmax", "ev_softmax", "sparsemax", "entmax15", "entmax_bisect",
                        "posthoc_evidential", "t_softmax", "r_softmax", "sparsehourglass"}


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="ev_softmax.*sparsemax"):
        registry.get("softmaxx")


def test_unknown_parameter_override_is_rejected():
    with pytest.raises(ValueError, match="alpha"):
        registry.get("sparsemax", alpha=1.2)


@pytest.mark.parametrize("name", ALL)
def test_forward_and_train_forward_are_distributions(name):
    norm = registry.get(name)
    x = torch.randn(5, 7, dtype=torch.float64)
    for fn in (norm.forward, norm.train_forward):
        p = fn(x, dim=-1)
        assert p.shape == x.shape
        assert (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=torch.float64))


@pytest.mark.parametrize("name", [n for n in ALL if registry.get(n).log_prob is not None])
def test_log_prob_is_log_of_train_forward(name):
    norm = registry.get(name)
    x = torch.randn(4, 9, dtype=torch.float64)
    torch.testing.assert_close(norm.log_prob(x, dim=-1), norm.train_forward(x, dim=-1).log())


@pytest.mark.parametrize("name", ALL)
def test_losses_are_finite_and_differentiable(name):
    norm = registry.get(name)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    multi_hot = torch.zeros(6, 5, dtype=torch.float64)
    multi_hot[torch.arange(6), labels] = 1
    multi_hot[:, 4] = 1
    for loss in (norm.single_label_loss(x, labels), norm.multi_label_loss(x, multi_hot)):
        assert loss.dim() == 0 and torch.isfinite(loss)
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.mark.parametrize("name", ALL)
def test_sparse_flag_matches_behaviour(name):
    norm = registry.get(name)
    x = torch.tensor([[3.0, 2.0, -4.0, -5.0, -6.0]], dtype=torch.float64)
    layer = nn.Linear(5, 5, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(5))
        layer.bias.zero_()
    p = norm.probs_from_linear(x, layer)
    assert bool((p == 0).any()) == norm.sparse


def test_posthoc_equals_ev_softmax_of_the_layer_output():
    torch.manual_seed(0)
    layer = nn.Linear(8, 10, dtype=torch.float64)
    h = torch.randn(16, 8, dtype=torch.float64)
    p = registry.get("posthoc_evidential").probs_from_linear(h, layer)
    torch.testing.assert_close(p, registry.get("ev_softmax").forward(layer(h), dim=-1))


def test_override_rebinds_parameters():
    x = torch.randn(3, 6, dtype=torch.float64)
    a13 = registry.get("entmax_bisect", alpha=1.3)
    assert a13.params["alpha"] == 1.3
    torch.testing.assert_close(
        a13.forward(x, dim=-1),
        registry.get("entmax_bisect").forward.func(x, alpha=1.3, dim=-1),
    )
    assert registry.get("entmax_bisect").params["alpha"] == 1.5  # the table itself is unchanged


def test_submodules_are_attributes_of_the_package():
    import importlib

    import sparsenorm

    assert sparsenorm.registry is importlib.import_module("sparsenorm.registry")
    assert sparsenorm.kernels is importlib.import_module("sparsenorm.kernels")
    for name in ("attention", "hf", "marginalize"):  # created by other work; importable once present
        try:
            importlib.import_module(f"sparsenorm.{name}")
        except ImportError as exc:
            missing = exc.__cause__ if isinstance(exc.__cause__, ModuleNotFoundError) else exc
            if name == "hf" and getattr(missing, "name", None) == "transformers":
                continue  # sparsenorm.hf needs the hf extra (not in the floor leg): its ImportError names it
            if not isinstance(exc, ModuleNotFoundError) or exc.name != f"sparsenorm.{name}":
                raise
            with pytest.raises(AttributeError, match=name):
                getattr(sparsenorm, name)
        else:
            assert getattr(sparsenorm, name) is importlib.import_module(f"sparsenorm.{name}")
    with pytest.raises(AttributeError, match="no_such_thing"):
        sparsenorm.no_such_thing  # noqa: B018


def test_capability_fields_match_what_the_functions_do():
    import inspect

    from sparsenorm.kernels import cpu

    for name in registry.names():
        entry = registry.get(name)
        x = torch.randn(3, 6)
        mask = torch.tensor([True, False, True, True, False, True])
        if entry.supports_mask:
            assert "mask" in inspect.signature(entry.forward).parameters
            assert (entry.forward(x, dim=-1, mask=mask)[:, ~mask] == 0).all(), name
        if entry.attention:
            assert entry.supports_mask and not entry.posthoc
        # cpu_kernel: the forward runs an operator with a C++ implementation
        assert entry.cpu_kernel == (name in ("ev_softmax", "sparsemax", "entmax15", "r_softmax")), name
        if entry.entmax_twin is not None:
            entmax = pytest.importorskip("entmax")
            twin = getattr(entmax, entry.entmax_twin)
            torch.testing.assert_close(entry.forward(x, dim=-1), twin(x, dim=-1, **entry.params))
    assert {e.stem for e in cpu.EXTENSIONS} == {"evidential", "projection", "rsoftmax", "evidential_attention"}


def test_for_mode_is_the_post_hoc_switch():
    for name in registry.names():
        entry = registry.get(name)
        if entry.posthoc:
            assert entry.for_mode(training=True) is registry.get("softmax")
            assert entry.for_mode(training=False) is registry.get("ev_softmax")
        else:
            assert entry.for_mode(training=True) is entry and entry.for_mode(training=False) is entry
        assert entry.for_mode(True).attention and entry.for_mode(False).attention


def test_attention_capabilities_describe_the_maps():
    """``"known"``: the support is the entries at or above the row mean, a linear function of the
    keys; ``"searched"``: the map is alpha-entmax with the entry's ``alpha`` (what a threshold
    search over key blocks computes); ``"softmax"``: the map is softmax."""
    import sparsenorm

    x = torch.randn(5, 9, dtype=torch.float64)
    for name in registry.names():
        entry = registry.get(name)
        if entry.attention_threshold == "known":
            # the support is {x >= mean}, read by the contract: entries farther from the mean than
            # its rounding (a sum of 9 terms in float64, either order) are decided alike
            clear_in, clear_out, _ = band(x, x.mean(-1, keepdim=True), 4 * 13 * EPS64 * x.abs().amax(-1, keepdim=True))
            p = entry.forward(x, dim=-1)
            assert (p[clear_in] > 0).all() and (p[clear_out] == 0).all(), name
        elif entry.attention_threshold == "searched":
            torch.testing.assert_close(entry.forward(x, dim=-1), sparsenorm.entmax_bisect(x, alpha=entry.alpha, dim=-1,
                                                                                           n_iter=200), msg=name)
        elif entry.attention_threshold == "softmax":  # its attention is torch's fused SDPA
            torch.testing.assert_close(entry.forward(x, dim=-1), torch.softmax(x, -1), msg=name)
        else:
            assert entry.attention_threshold is None and entry.alpha is None, name
    assert registry.get("entmax_bisect", alpha=1.3).alpha == 1.3
