"""The CVAE experiment end to end on a tiny injected dataset (no network), plus its building blocks."""
import json

import numpy as np
import pytest
import torch

from sparsenorm import registry
from sparsenorm.experiments import cvae
from sparsenorm.experiments._shared import common, metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory):
    """600 train / 100 validation / 100 test noisy 'digits' (a bar whose position is the label)."""
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("tiny_mnist")

    def split(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, d in enumerate(labels):
            images[i, 2 + 2 * d:4 + 2 * d, 4:24] = 255
        return images, labels

    (xtr, ytr), (xva, yva), (xte, yte) = split(600), split(100), split(100)
    np.savez(folder / "mnist.npz", x_train=xtr, y_train=ytr, x_val=xva, y_val=yva, x_test=xte, y_test=yte)
    return folder


@pytest.fixture(autouse=True)
def quiet(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))


def test_smoke_run_writes_results_report_and_figures(tiny_mnist, tmp_path):
    out = tmp_path / "out"
    config = common.RunConfig(out=out, quick=True, seeds=2, epochs=10, normalizers=["softmax", "ev_softmax"],
                              device="cpu", data_dir=tiny_mnist, max_steps=60)
    assert cvae.run(config) == out

    payload = json.loads((out / "results.json").read_text())
    assert payload["experiment"] == "cvae"
    assert payload["config"]["normalizers"] == ["softmax", "ev_softmax"]
    results = payload["results"]
    assert 0.0 <= results["classifier"]["test_accuracy"] <= 1.0
    assert results["steps_per_run"] == 60
    assert set(results["summary"]) == set(results["per_seed"]) == {"softmax", "ev_softmax"}
    for name, runs in results["per_seed"].items():
        assert [r["seed"] for r in runs] == [0, 1]
        for r in runs:
            curve = r["curve"]
            assert curve["iteration"][0] == 0 and curve["iteration"][-1] == 60
            assert len(curve["even"]) == len(curve["odd"]) == len(curve["iteration"])
            assert all(0.0 <= w <= 9.0 for w in curve["even"] + curve["odd"])
            for q in ("even", "odd"):
                assert len(r["prior"][q]) == 10 and abs(sum(r["prior"][q]) - 1) < 1e-5
                assert r["nonzero_prior_modes"][q] == sum(p > 0 for p in r["prior"][q])
            assert len(r["decoded_digit"]) == 10
        summary = results["summary"][name]
        assert summary["seeds"] == 2
        assert set(summary["final_wasserstein"]) == {"even", "odd", "mean"}
    # The softmax prior has full support; ev-softmax's evaluation form never does (K = 10).
    assert all(r["nonzero_prior_modes"]["even"] == 10 for r in results["per_seed"]["softmax"])
    assert all(r["nonzero_prior_modes"][q] < 10 for r in results["per_seed"]["ev_softmax"] for q in ("even", "odd"))
    verdicts = {c["verdict"] for c in results["claims"]}
    assert len(results["claims"]) == 6
    assert verdicts <= {"reproduced", "not reproduced", "not testable in this run"}

    report = (out / "report.md").read_text()
    assert "test accuracy" in report and "| softmax |" in report and "| ev_softmax |" in report
    assert "not testable in this run" in report  # sparsemax, entmax, post-hoc were not run
    for figure in ("fig2_latent_classes.png", "fig3_wasserstein.png"):
        assert (out / figure).read_bytes()[:8] == PNG_MAGIC

    # The classifier was cached next to the injected data and is reused.
    cached = list(tiny_mnist.glob("digit-classifier-*.pt"))
    assert len(cached) == 1
    config2 = common.RunConfig(out=tmp_path / "out2", quick=True, seeds=1, normalizers=["softmax"],
                               device="cpu", data_dir=tiny_mnist, max_steps=5)
    cvae.run(config2)
    assert json.loads((tmp_path / "out2" / "results.json").read_text())["results"]["classifier"]["cached"] is True


def tiny_tensors(n=256):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(n, 784, generator=gen)
    y = torch.nn.functional.one_hot(torch.arange(n) % 2, 2).float()
    return {"x_train": x, "y_train": y, "x_val": x[:32], "y_val": y[:32]}


class ConstantClassifier(torch.nn.Module):
    def probs(self, images):
        return torch.full((len(images), 10), 0.1)


def test_training_is_deterministic_per_seed_and_posthoc_shares_softmax_training():
    settings = cvae.Settings(epochs=1, seeds=1, eval_every=2, max_steps=6)
    run = lambda seed: cvae.train_group(["softmax", "posthoc_evidential"], seed, tiny_tensors(),  # noqa: E731
                                        ConstantClassifier(), settings, torch.device("cpu"), registry)
    a, b, c = run(0), run(0), run(1)
    assert a["softmax"]["prior"] == b["softmax"]["prior"]
    assert a["softmax"]["loss_curve"] == b["softmax"]["loss_curve"]
    assert a["softmax"]["prior"] != c["softmax"]["prior"]
    # One trained model evaluated two ways: same decoded images, the post-hoc prior is sparse.
    assert a["posthoc_evidential"]["trained_with"] == "softmax"
    np.testing.assert_array_equal(a["softmax"]["_images"], a["posthoc_evidential"]["_images"])
    assert all(a["posthoc_evidential"]["nonzero_prior_modes"][q] < 10 for q in ("even", "odd"))
    assert cvae._training_groups(["softmax", "sparsemax", "posthoc_evidential"], registry) == [
        ["softmax", "posthoc_evidential"], ["sparsemax"]]


@pytest.mark.parametrize("name", cvae.DEFAULT_NORMALIZERS)
def test_negative_elbo_is_finite_with_finite_gradients(name):
    torch.manual_seed(0)
    model = cvae.CVAE()
    data = tiny_tensors(16)
    settings = cvae.Settings(epochs=1, seeds=1)
    total, rec, kl = cvae.negative_elbo(model, registry.get(name), data["x_train"], data["y_train"], settings,
                                        torch.Generator().manual_seed(0))
    assert torch.isfinite(total) and kl >= -1e-4 and torch.allclose(total, rec + settings.kl_weight * kl)
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.prior_head.weight.grad.abs().sum() > 0  # the KL term trains the prior


def test_smoothed_log_probs_for_normalizers_without_log_prob():
    scores = torch.tensor([[3.0, 0.0, -2.0, 1.0]])
    log_p = cvae.latent_log_probs(registry.get("sparsemax"), scores, smoothing=1e-6)
    assert torch.isfinite(log_p).all()
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(1))
    assert log_p[0, 2] < -13  # a zero of sparsemax becomes ~1e-6
    log_ev = cvae.latent_log_probs(registry.get("ev_softmax"), scores, smoothing=1e-6)
    torch.testing.assert_close(log_ev, registry.get("ev_softmax").log_prob(scores, dim=-1))


def test_gumbel_softmax_sample_is_a_relaxed_one_hot():
    log_p = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0]]).clamp_min(1e-30)).expand(4000, 4)
    z = cvae.gumbel_softmax_sample(log_p, 0.1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(z.sum(-1), torch.ones(4000))
    freq = torch.bincount(z.argmax(-1), minlength=4).double() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1, 0.0], dtype=torch.double), atol=0.03, rtol=0)


def test_claims_follow_the_numbers():
    def summary(final, speed, modes):
        s = lambda v: {"mean": v, "std": 0.0}  # noqa: E731
        return {"final_wasserstein": {"even": s(final), "odd": s(final), "mean": s(final)},
                "mean_wasserstein_over_training": s(speed),
                "nonzero_prior_modes": {"even": s(modes), "odd": s(modes)},
                "posterior_mean_support": s(1.0), "posterior_classes_used": s(3.0)}

    table = {"softmax": summary(0.4, 0.8, 10), "posthoc_evidential": summary(0.3, 0.7, 6),
             "ev_softmax": summary(0.2, 0.5, 5), "sparsemax": summary(2.0, 2.0, 1), "entmax15": summary(1.0, 1.5, 3)}
    table["sparsemax"]["posterior_classes_used"] = {"mean": 1.0, "std": 0.0}
    per_seed = {"ev_softmax": [{"seed": 0, "nonzero_prior_modes": {"even": 5, "odd": 5}}]}
    verdicts = [c["verdict"] for c in cvae.assess_claims(table, per_seed)]
    assert verdicts == ["reproduced"] * 6
    table["softmax"] = summary(0.1, 0.3, 10)  # softmax best: three claims fail
    per_seed["ev_softmax"][0]["nonzero_prior_modes"]["odd"] = 4
    verdicts = [c["verdict"] for c in cvae.assess_claims(table, per_seed)]
    assert verdicts == ["not reproduced", "not reproduced", "not reproduced", "reproduced", "reproduced",
                        "not reproduced"]
    table["sparsemax"]["posterior_classes_used"] = {"mean": 3.0, "std": 0.0}  # not a single class any more
    assert cvae.assess_claims(table, per_seed)[3]["verdict"] == "not reproduced"


def test_wasserstein_of_the_decoded_prior_uses_digit_positions():
    # A prior on latent classes decoding to the right digits is at 0; on the wrong ones at 1.
    digit_probs = np.eye(10)
    right = metrics.marginal_digit_distribution(metrics.parity_target("even"), digit_probs)
    wrong = metrics.marginal_digit_distribution(metrics.parity_target("odd"), digit_probs)
    assert metrics.class_wasserstein(right, metrics.parity_target("even")) == pytest.approx(0.0, abs=1e-12)
    assert metrics.class_wasserstein(wrong, metrics.parity_target("even")) == pytest.approx(1.0)
