"""The multi-label experiment: F1 metrics against scikit-learn, each method's training step, a smoke run."""
from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from sparsenorm.experiments._shared import metrics
from sparsenorm.experiments import multilabel as ml
from sparsenorm.experiments._shared.common import RunConfig

# ------------------------------------------------------------------ metrics vs scikit-learn

AVERAGES = {"samples": metrics.example_f1, "micro": metrics.micro_f1, "macro": metrics.macro_f1}


def _sklearn(y_true, y_pred, average, zero_division):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f1_score(y_true, y_pred, average=average, zero_division=zero_division)


@pytest.mark.parametrize("average", list(AVERAGES))
@pytest.mark.parametrize("zero_division", [0.0, 1.0])
def test_f1_agrees_with_sklearn_on_random_sets(average, zero_division):
    rng = np.random.default_rng(0)
    for trial in range(30):
        n, labels = rng.integers(1, 12), rng.integers(2, 7)  # one column is "binary" to sklearn
        density = rng.uniform(0.05, 0.9)
        y_true = (rng.random((n, labels)) < density).astype(int)
        y_pred = (rng.random((n, labels)) < rng.uniform(0.05, 0.9)).astype(int)
        ours = AVERAGES[average](y_true, y_pred, zero_division=zero_division)
        assert ours == pytest.approx(_sklearn(y_true, y_pred, average, zero_division), abs=1e-12), (trial, average)


@pytest.mark.parametrize("average", list(AVERAGES))
@pytest.mark.parametrize("zero_division", [0.0, 1.0])
def test_f1_edge_cases_agree_with_sklearn(average, zero_division):
    cases = [
        (np.array([[1, 0, 0], [0, 0, 0]]), np.array([[0, 0, 0], [0, 0, 0]])),  # empty prediction, empty truth
        (np.array([[0, 0], [0, 0]]), np.array([[0, 0], [0, 0]])),  # nothing anywhere
        (np.array([[0, 0], [0, 0]]), np.array([[1, 0], [0, 1]])),  # predictions without truth
        (np.array([[1, 1], [1, 0]]), np.array([[1, 1], [1, 0]])),  # perfect
    ]
    for y_true, y_pred in cases:
        ours = AVERAGES[average](y_true, y_pred, zero_division=zero_division)
        assert ours == pytest.approx(_sklearn(y_true, y_pred, average, zero_division), abs=1e-12)


def test_f1_hand_computed_values_and_convention():
    y_true = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    y_pred = np.array([[1, 0, 0], [0, 0, 0], [0, 1, 0]])
    # examples: 2*1/(2+1) = 2/3; empty/empty -> zero_division; 0
    assert metrics.example_f1(y_true, y_pred) == pytest.approx((2 / 3 + 0 + 0) / 3)
    assert metrics.example_f1(y_true, y_pred, zero_division=1.0) == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert metrics.micro_f1(y_true, y_pred) == pytest.approx(2 * 1 / (2 * 1 + 1 + 2))
    scores = metrics.multilabel_scores(y_true, y_pred)
    assert scores["mean_set_size"] == pytest.approx(2 / 3) and scores["true_mean_set_size"] == pytest.approx(1.0)


def test_f1_accepts_booleans_and_tensors_and_rejects_bad_input():
    y = torch.tensor([[True, False], [False, True]])
    assert metrics.example_f1(y, y) == 1.0
    with pytest.raises(ValueError, match="same shape"):
        metrics.micro_f1(np.zeros((2, 3)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="0/1"):
        metrics.macro_f1(np.full((2, 2), 2), np.zeros((2, 2)))


# ------------------------------------------------------------------ methods


def test_default_methods_and_restriction():
    keys = [m.key for m in ml.methods_for(None)]
    assert keys == ["softmax", "sparsemax+huber", "sparsemax+hinge", "sparsehourglass", "r_softmax", "ev_softmax", "sigmoid"]
    assert [m.key for m in ml.methods_for(["ev_softmax", "entmax15"])] == ["ev_softmax", "entmax15"]
    with pytest.raises(ValueError, match="known normalizers"):
        ml.methods_for(["nope"])


def _pairwise_hinge_alpha_one(z, y):
    """Laha et al.'s multi-label hinge at alpha = 1, written out pair by pair (an independent oracle)."""
    total = 0.0
    for row_z, row_y in zip(z.tolist(), y.tolist()):
        eta = [v / sum(row_y) for v in row_y]
        for i in range(len(row_z)):
            for j in range(len(row_z)):
                d = (eta[i] - eta[j]) - (row_z[i] - row_z[j])
                if row_y[i] and row_y[j]:
                    total += abs(d) / 2
                elif row_y[i] and not row_y[j]:
                    total += max(d, 0.0)
    return total / len(z)


def test_sparsemax_hinge_is_the_alpha_one_pairwise_hinge():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(5, 6, generator=gen, dtype=torch.float64) * 3
    y = (torch.rand(5, 6, generator=gen) < 0.5).double()
    y[:, 0] = 1
    assert ml.sparsemax_hinge_loss(z, y).item() == pytest.approx(_pairwise_hinge_alpha_one(z, y), rel=1e-9)
    # zero exactly when sparsemax(z) equals eta: z = eta plus a constant reproduces eta on the support
    eta = y / y.sum(1, keepdim=True)
    assert ml.sparsemax_hinge_loss(eta + 5.0, y).item() == pytest.approx(0.0, abs=1e-9)


def _tiny_problem(n=64, d=8, labels=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, labels))
    y = (x @ w > 0.3).astype(np.float32)
    y[y.sum(1) == 0, 0] = 1
    return torch.from_numpy(x), torch.from_numpy(y)


@pytest.mark.parametrize("method", ml.methods_for(None) + ml.methods_for(["entmax15", "posthoc_evidential"]),
                         ids=lambda m: m.key)
def test_training_steps_reduce_each_methods_loss(method):
    x, y = _tiny_problem()
    torch.manual_seed(0)
    model = ml.MultilabelNet(x.shape[1], y.shape[1], hidden=16, rate_head=method.key == "r_softmax")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.no_grad():
        before = ml.training_loss(method, model, x, y).item()
    for _ in range(30):
        loss = ml.training_loss(method, model, x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = ml.training_loss(method, model, x, y).item()
    assert math.isfinite(before) and math.isfinite(after)
    assert after < 0.8 * before, (method.key, before, after)
    sets = ml.predict_sets(method, model, x)
    assert set(sets) == set(method.variants())
    for pred in sets.values():
        assert pred.shape == tuple(y.shape) and pred.dtype == bool
    if method.normalizer not in (None, "softmax"):
        # a sparse output's support always holds at least one label
        assert all(p.sum(1).min() >= 1 for p in sets.values())


def test_train_method_picks_the_best_selection_epoch():
    x, y = _tiny_problem(n=80)
    split = ml.Split(x[:60], y[:60], x[60:], y[60:].numpy().astype(int), x[60:], y[60:].numpy().astype(int), True)
    result = ml.train_method(ml.methods_for(["softmax"])[0], split, seed=0, epochs=4, device=torch.device("cpu"))
    for variant, entry in result.items():
        assert len(entry["curve"]) == 4
        assert entry["example_f1"] == pytest.approx(max(entry["curve"]))
        assert entry["curve"][entry["best_epoch"] - 1] == pytest.approx(entry["example_f1"])
    scores = dict(result)
    ml.add_best_softmax(scores)
    best = scores[ml.BEST_SOFTMAX]
    assert best["select_f1"] == max(result[v]["select_f1"] for v in result)


# ------------------------------------------------------------------ smoke run


def _user_file(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6))
    y = (x[:, :4] > 0).astype(int)
    y[y.sum(1) == 0, 0] = 1
    np.savez(tmp_path / "mine.npz", X=x, Y=y)
    return tmp_path / "mine.npz"


def test_smoke_run_writes_results_and_figures(tmp_path, monkeypatch):
    """Tiny settings, no network: small synthetic sets plus user data passed as the real data set."""
    monkeypatch.setattr(ml, "average_label_sweep", lambda n_classes, quick: [n_classes // 2])
    monkeypatch.setattr(ml, "document_length_sweep", lambda quick: [2000])
    monkeypatch.setattr(ml, "make_synthetic", functools.partial(ml.make_synthetic, n_samples=200))
    config = RunConfig(out=tmp_path / "out", quick=True, seeds=1, epochs=2, max_steps=3,
                       data_dir=_user_file(tmp_path), extra={"workers": 1})
    out = ml.run(config)
    payload = json.loads((out / "results.json").read_text())
    assert payload["experiment"] == "multilabel"
    results = payload["results"]
    assert [r["n_classes"] for r in results["synthetic"]] == [10, 20, 30]  # one setting per class count
    assert results["synthetic"][0]["data"]["n_train"] == 160
    expected = ["softmax (p0=0.05)", "softmax (p0=0.1)", "softmax (p0=0.15)", "softmax (p0=0.2)", "softmax (p0=0.3)",
                ml.BEST_SOFTMAX, "sparsemax+huber", "sparsemax+hinge", "sparsehourglass", "r_softmax", "ev_softmax", "sigmoid"]
    assert results["variants"] == expected
    for record in results["synthetic"] + results["real"]["runs"]:
        assert set(record["methods"]) == set(expected)
        for entry in record["methods"].values():
            assert 0.0 <= entry["example_f1"] <= 1.0 and entry["best_epoch"] in (1, 2)  # max_steps=3 stops early
    assert results["real"]["name"] == "mine"
    assert {v["claim"][:9] for v in results["verdicts"]} >= {"r-softmax", "where ev-"}
    assert set(results["figures"]) == {"labels", "length", "curves"}
    for name in results["figures"].values():
        png = out / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "Table 1-style" in report and "Verdicts" in report and "f1_vs_average_labels.png" in report


def test_parallel_workers_give_the_same_results(tmp_path, monkeypatch):
    """Two worker processes (the CPU default) reproduce the one-process results exactly."""
    monkeypatch.setattr(ml, "CLASS_COUNTS", ())  # real data only: keeps the spawned workers cheap
    results = []
    for workers in (1, 2):
        config = RunConfig(out=tmp_path / f"out{workers}", seeds=2, epochs=2, data_dir=_user_file(tmp_path),
                           normalizers=["softmax", "ev_softmax"], extra={"workers": workers})
        payload = json.loads((ml.run(config) / "results.json").read_text())
        results.append([{k: v["example_f1"] for k, v in run["methods"].items()} for run in payload["results"]["real"]["runs"]])
    assert results[0] == results[1]
