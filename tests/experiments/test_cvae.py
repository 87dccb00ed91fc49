"""The CVAE experiment end to end on a tiny injected dataset (no network), plus its building blocks."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from sparsenorm import cli, registry
from sparsenorm._text import UserFacingError
from sparsenorm.experiments._shared import metrics, regime, runner
from sparsenorm.experiments.evsoftmax_cvae import EXPERIMENT, QUICK, claims, model, train
from sparsenorm.experiments.evsoftmax_cvae.train import TrainingSetting
from conftest import write_tiny_mnist

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AUTHORS = TrainingSetting("sgd", 1e-3, 0.01 / 64)


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory):
    """600 train / 100 validation / 100 test noisy 'digits' (a bar whose position is the label)."""
    return write_tiny_mnist(tmp_path_factory.mktemp("tiny_mnist"), 600, 100, 100).parent


@pytest.fixture(autouse=True)
def quiet(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))


def test_experiment_satisfies_the_protocol():
    assert isinstance(EXPERIMENT, runner.Experiment)


def test_smoke_run_through_the_cli_writes_results_report_figures_and_index(tiny_mnist, tmp_path):
    out = tmp_path / "out"
    argv = ["reproduce", "cvae", "--quick", "--seeds", "2", "--normalizers", "softmax,ev_softmax", "--device", "cpu",
            "--data-dir", str(tiny_mnist), "--max-steps", "20", "--eval-every", "5", "--kl-weight", "0.5",
            "--optimizer", "adam", "--lr", "0.002", "--temperature", "0.5", "--workers", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    payload = json.loads((out / "cvae" / "results.json").read_text())
    assert payload["experiment"] == "cvae"
    results = payload["results"]
    s = results["settings"]
    assert (s["kl_weight"], s["optimizer"], s["learning_rate"], s["temperature"], s["eval_every"]) == (
        0.5, "adam", 0.002, 0.5, 5)
    assert s["sweep"] == []  # quick mode: the lead setting only
    lead = "adam-lr0.002-kl0.5"
    assert results["summary"]["lead"] == lead
    # softmax and post-hoc would share a job; here: one job per normalizer and seed.
    # Seed-major, so that a run stopped part-way has every normalizer on its first seeds.
    assert results["jobs"]["jobs"] == [f"{lead}__softmax__seed0", f"{lead}__ev_softmax__seed0",
                                       f"{lead}__softmax__seed1", f"{lead}__ev_softmax__seed1"]
    for record in results["records"]:
        assert record["steps"] == 20 and record["setting"] == lead
        for name, r in record["normalizers"].items():
            curve = r["curve"]
            assert curve["iteration"] == [0, 5, 10, 15, 20]
            for q in ("even", "odd"):
                assert all(0.0 <= w <= 9.0 for w in curve["w_digits"][q])
                assert all(0.0 <= w <= 1.0 for w in curve["w_authors"][q] + curve["parity_mass"][q])
                assert len(r["prior"][q]) == 10 and abs(sum(r["prior"][q]) - 1) < 1e-5
                assert r["support"][q] == [k for k, p in enumerate(r["prior"][q]) if p > 0]
            assert len(r["decoded_digit"]) == 10
            assert ("images" in r) == (record["seed"] == 0)
    table = results["summary"]["results"][lead]
    assert set(table) == {"softmax", "ev_softmax"}
    for m in ("w_digits", "w_authors", "parity_mass"):
        assert set(table["ev_softmax"][m]) == {"window", "final", "final_even", "final_odd"}
        assert table["ev_softmax"][m]["final"]["n"] == 2
    # The softmax prior has full support; ev-softmax's evaluation form never does (K = 10).
    assert table["softmax"]["nonzero_prior_modes"]["even"]["mean"] == 10
    assert table["ev_softmax"]["nonzero_prior_modes"]["even"]["mean"] < 10
    assert len(results["claims"]) == 6
    assert results["regime"]["met"] in (True, False) and "aggregate posterior" in results["regime"]["measured"]
    judged = {runner.REPRODUCED, runner.PARTLY, runner.NOT_REPRODUCED, runner.INCONCLUSIVE}
    for c in results["claims"]:  # the rule's verdict, or, where the run misses its gate, the regime's
        assert c["verdict"] == runner.NOT_TESTABLE or (
            regime.is_out_of_regime(c["verdict"]) if not results["regime"]["met"] else c["verdict"] in judged)
    report = (out / "cvae" / "report.md").read_text()
    assert "indicative only" in report and "test accuracy" in report and "| ev_softmax |" in report
    assert "five equal modes of the wrong parity score 0" in report
    assert "not testable in this run" in report  # sparsemax, entmax, post-hoc were not run
    for figure in ("fig2_latent_classes.png", "fig3_curves.png"):
        assert (out / "cvae" / figure).read_bytes()[:8] == PNG_MAGIC
    index = (out / "README.md").read_text()
    assert "[cvae](cvae/report.md)" in index and "![cvae](cvae/fig3_curves.png)" in index

    # The classifier was cached next to the injected data; the jobs are reused from runs/.
    assert len(list(tiny_mnist.glob("digit-classifier-*.pt"))) == 1
    assert cli.main(argv + ["--seeds", "3"]) == 0
    again = json.loads((out / "cvae" / "results.json").read_text())["results"]
    assert again["jobs"]["run_now"] == [f"{lead}__softmax__seed2", f"{lead}__ev_softmax__seed2"]
    assert again["records"][:2] == results["records"][:2]


def test_full_settings_sweep_and_jobs():
    config = runner.RunConfig(out=".", normalizers=["softmax", "posthoc_evidential", "ev_softmax"])
    settings = EXPERIMENT.settings(config)
    assert settings.seeds == 10 and settings.sweep_seeds == 3 and settings.epochs == 20
    labels = [s.label for s in settings.training_settings()]
    assert labels == ["sgd-lr0.001-kl0.00015625", "sgd-lr0.001-kl0.015625", "sgd-lr0.001-kl1",
                      "adam-lr0.001-kl0.00015625", "sgd-lr0.001-kl0.00015625-prior-adam0.001"]
    jobs = EXPERIMENT.jobs(settings, config)
    # 10 lead seeds + 4 x 3 sweep seeds, each for two training groups (softmax+post-hoc share one).
    assert len(jobs) == 2 * (10 + 4 * 3)
    assert jobs[-1].params["prior_optimizer"] == "adam" and "prior_optimizer" not in jobs[0].params
    assert jobs[0].key == "sgd-lr0.001-kl0.00015625__softmax+posthoc_evidential__seed0"
    # A lead setting that is one of the sweep's is not run twice.
    moved = EXPERIMENT.settings(replace(config, extra={"kl_weight": 1.0}))
    assert [s.label for s in moved.training_settings()][0] == "sgd-lr0.001-kl1"
    assert len(moved.training_settings()) == 5
    # the prior's own optimizer as the lead (issue 49): the sweep's setting of that name is not run twice
    prior = EXPERIMENT.settings(replace(config, extra={"prior_optimizer": "adam"}))
    assert prior.lead.label == "sgd-lr0.001-kl0.00015625-prior-adam0.001" and len(prior.training_settings()) == 5
    off = EXPERIMENT.settings(replace(config, extra={"sweep": "off"}))
    assert off.training_settings() == [off.lead]
    # the report's note on this run names what the mode's note cannot: the lead, the sweep, the trainings
    note = EXPERIMENT.run_note(prior)
    assert "prior by ADAM lr 0.001 (not the authors')" in note and "10 seeds" in note
    assert "4 other setting(s), 3 seeds each" in note and f"{len(EXPERIMENT.jobs(prior, config))} trainings" in note
    assert "(not the authors')" not in EXPERIMENT.run_note(settings)
    assert "no sweep; 20 trainings" in EXPERIMENT.run_note(off)
    with pytest.raises(UserFacingError, match="--eval-every"):
        EXPERIMENT.settings(replace(config, extra={"eval_every": 0}))


def tiny_tensors(n=256):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(n, 784, generator=gen)
    y = torch.nn.functional.one_hot(torch.arange(n) % 2, 2).float()
    return {"x_train": x, "y_train": y, "x_val": x[:32], "y_val": y[:32]}


class ConstantClassifier(torch.nn.Module):
    def probs(self, images):
        return torch.full((len(images), 10), 0.1)


def _train(names, seed, setting=AUTHORS, **kw):
    return train.train_group(names, seed, setting, tiny_tensors(), ConstantClassifier(), epochs=1, batch_size=64,
                                temperature=0.67, smoothing=1e-6, eval_every=2, device=torch.device("cpu"),
                                max_steps=6, **kw)


def test_training_is_deterministic_per_seed_and_posthoc_shares_softmax_training():
    a, b, c = _train(["softmax", "posthoc_evidential"], 0, keep_images=True), \
        _train(["softmax", "posthoc_evidential"], 0), _train(["softmax", "posthoc_evidential"], 1)
    sa, sb, sc = (r["normalizers"]["softmax"] for r in (a, b, c))
    assert sa["prior"] == sb["prior"] and a["loss_curve"] == b["loss_curve"]
    assert sa["prior"] != sc["prior"]
    post = a["normalizers"]["posthoc_evidential"]
    assert post["trained_with"] == "softmax"
    assert post["images"] == sa["images"]  # one trained model evaluated two ways
    assert all(len(post["support"][q]) < 10 for q in ("even", "odd"))
    assert train.training_groups(["softmax", "sparsemax", "posthoc_evidential"]) == [
        ["softmax", "posthoc_evidential"], ["sparsemax"]]


def test_optimizer_and_kl_weight_change_training():
    sgd = _train(["softmax"], 0)["normalizers"]["softmax"]
    adam = _train(["softmax"], 0, TrainingSetting("adam", 1e-3, 0.01 / 64))["normalizers"]["softmax"]
    heavy = _train(["softmax"], 0, TrainingSetting("sgd", 1e-3, 1.0))["normalizers"]["softmax"]
    # With the authors' weight and SGD the prior hardly moves; Adam's step does not scale with the gradient.
    assert sgd["prior_change_since_init"] < 1e-3 < adam["prior_change_since_init"]
    assert heavy["prior_change_since_init"] > sgd["prior_change_since_init"]
    with pytest.raises(ValueError, match="optimizer"):
        _train(["softmax"], 0, TrainingSetting("rmsprop", 1e-3, 1.0))


def test_adam_on_the_prior_alone_moves_the_prior_and_leaves_the_rest_to_sgd():
    setting = TrainingSetting("sgd", 1e-3, 0.01 / 64, prior_optimizer="adam", prior_learning_rate=1e-3)
    sgd = _train(["softmax"], 0)
    prior_adam = _train(["softmax"], 0, setting)
    # the prior moves as under Adam; the encoder and decoder take SGD's steps (their loss curve stays near SGD's)
    assert prior_adam["normalizers"]["softmax"]["prior_change_since_init"] > 1e-3 > \
        sgd["normalizers"]["softmax"]["prior_change_since_init"]
    model = train.CVAE()
    opt = train._optimizer(setting, model.named_parameters())
    kinds = [type(o).__name__ for o in opt.optimizers]
    prior_ids = {id(p) for n, p in model.named_parameters() if n.startswith(train.PRIOR_PREFIX)}
    assert kinds == ["SGD", "Adam"] and prior_ids
    assert {id(p) for g in opt.optimizers[1].param_groups for p in g["params"]} == prior_ids
    assert not prior_ids & {id(p) for g in opt.optimizers[0].param_groups for p in g["params"]}
    with pytest.raises(ValueError, match="prior_learning_rate"):
        train._optimizer(TrainingSetting("sgd", 1e-3, 1.0, prior_optimizer="adam"), model.named_parameters())
    # the aggregate posterior per query is a distribution over the latent classes
    agg = prior_adam["normalizers"]["softmax"]["aggregate_posterior"]
    assert set(agg) == {"even", "odd"} and all(sum(v) == pytest.approx(1.0) for v in agg.values())


def _gate_records(moved: float, seeds: int = 4, aggregate: bool = True):
    """Softmax records of the lead setting whose prior moved ``moved`` of the way to the aggregate posterior."""
    rng = np.random.default_rng(7)
    out = []
    for seed in range(seeds):
        init = {q: list(rng.dirichlet(np.ones(10))) for q in ("even", "odd")}
        agg = {q: list(rng.dirichlet(np.ones(10))) for q in ("even", "odd")}
        end = {q: list((1 - moved) * np.array(init[q]) + moved * np.array(agg[q])) for q in init}
        curve = {"w_authors": {q: [0.2, 0.1] for q in init}}
        record = {"initial_prior": init, "prior": end, "decoded_digit": list(range(10)), "curve": curve}
        if aggregate:
            record["aggregate_posterior"] = agg
        out.append({"setting": "lead", "seed": seed, "normalizers": {"softmax": record}})
    return out


def test_gate_reads_the_prior_against_its_encoders_aggregate_posterior():
    from sparsenorm.experiments.evsoftmax_cvae import paper

    summary = {"lead": "lead"}
    met = paper._measure_gate(summary, _gate_records(0.7), None)  # 70 % of the way: gap left 0.3 <= 0.5
    assert met.met is True and "gap left 0.30" in met.figure and "Fig. 3's metric" in met.figure
    missed = paper._measure_gate(summary, _gate_records(0.2), None)
    assert missed.met is False and "gap left 0.80" in missed.figure
    old = paper._measure_gate(summary, _gate_records(0.7, aggregate=False), None)
    assert old.met is None and "no aggregate posterior" in old.figure and "decoder's digits" in old.figure


@pytest.mark.parametrize("name", EXPERIMENT.default_normalizers)
def test_negative_elbo_is_finite_with_finite_gradients(name):
    torch.manual_seed(0)
    net = model.CVAE()
    data = tiny_tensors(16)
    total, rec, kl = model.negative_elbo(net, registry.get(name), data["x_train"], data["y_train"], kl_weight=0.5,
                                         temperature=0.67, smoothing=1e-6, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(total) and kl >= -1e-4 and torch.allclose(total, rec + 0.5 * kl)
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
    assert net.prior_head.weight.grad.abs().sum() > 0  # the KL term trains the prior


def test_smoothed_log_probs_for_normalizers_without_log_prob():
    scores = torch.tensor([[3.0, 0.0, -2.0, 1.0]])
    log_p = model.latent_log_probs(registry.get("sparsemax"), scores, smoothing=1e-6)
    assert torch.isfinite(log_p).all()
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(1))
    assert log_p[0, 2] < -13  # a zero of sparsemax becomes ~1e-6
    log_ev = model.latent_log_probs(registry.get("ev_softmax"), scores, smoothing=1e-6)
    torch.testing.assert_close(log_ev, registry.get("ev_softmax").log_prob(scores, dim=-1))


def test_gumbel_softmax_sample_is_a_relaxed_one_hot():
    log_p = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0]]).clamp_min(1e-30)).expand(4000, 4)
    z = model.gumbel_softmax_sample(log_p, 0.1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(z.sum(-1), torch.ones(4000))
    freq = torch.bincount(z.argmax(-1), minlength=4).double() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1, 0.0], dtype=torch.double), atol=0.03, rtol=0)


def test_the_three_scores_tell_right_from_wrong_parity():
    digit_probs = np.eye(10)
    even, odd = metrics.parity_target("even"), metrics.parity_target("odd")
    right = metrics.marginal_digit_distribution(even, digit_probs)
    wrong = metrics.marginal_digit_distribution(odd, digit_probs)
    assert metrics.class_wasserstein(right, even) == pytest.approx(0.0, abs=1e-12)
    assert metrics.class_wasserstein(wrong, even) == pytest.approx(1.0)
    # The authors' metric: five equal modes of the wrong parity score 0, like the right ones.
    assert metrics.authors_wasserstein(wrong, even) == pytest.approx(0.0, abs=1e-12)
    assert metrics.authors_wasserstein(np.full(10, 0.1), even) == pytest.approx(0.1)
    digits = np.arange(10)
    assert metrics.parity_mass(even, digits, "even") == pytest.approx(1.0)
    assert metrics.parity_mass(even, digits, "odd") == pytest.approx(0.0)
    assert metrics.parity_mass(np.full(10, 0.1), digits, "odd") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="parity"):
        metrics.parity_mass(even, digits, "prime")
    with pytest.raises(ValueError, match="decoded_digits"):
        metrics.parity_mass(even, digits[:5], "even")


def _stats(v, sd=0.0):
    return {"mean": v, "std": sd, "sem": sd, "n": 3}


SEEDS = 10  # enough paired seeds for Holm over a claim's 8 parts to reach 0.05 (8 x 2 / 2**10)


def _row(w, speed, modes=5, used=3.0, unchanged=0, trained="x", n=SEEDS):
    """A normalizer's table whose per-seed scores scatter a little around the given means (distinct per seed,
    so that paired differences between rows are not all tied)."""
    jitter = [0.001 * i for i in range(n)]
    metric = lambda final, window: {"window": _stats(window), "final": _stats(final)}  # noqa: E731
    values = {"w_digits": (w, speed), "w_authors": (w / 10, speed / 10), "parity_mass": (1 - w, 1 - speed)}
    return {"seeds": list(range(n)), "steps": 100, "trained_with": trained,
            "per_seed": {m: {"window": [window + j for j in jitter], "final": [final + j for j in jitter]}
                         for m, (final, window) in values.items()},
            **{m: metric(final, window) for m, (final, window) in values.items()},
            "per_seed_counts": {"prior_modes": [float(modes)] * n, "posterior_classes": [float(used)] * n},
            "nonzero_prior_modes": {"even": _stats(modes), "odd": _stats(modes)},
            "five_modes_seeds": n if modes == 5 else 0, "support_unchanged_seeds": unchanged,
            "prior_change_since_init": _stats(0.2), "posterior_mean_support": _stats(1.0),
            "posterior_classes_used": _stats(used)}


def test_claims_follow_the_paired_tests():
    table = {"softmax": _row(0.4, 0.8, modes=10), "posthoc_evidential": _row(0.3, 0.7, modes=6),
             "ev_softmax": _row(0.15, 0.5), "sparsemax": _row(0.9, 0.95, modes=1, used=1.0),
             "entmax15": _row(0.8, 0.9, modes=3)}
    assert [c.verdict for c in claims.judge(table)] == [runner.REPRODUCED] * 6
    assert all(c.seeds == SEEDS for c in claims.judge(table))
    table["softmax"] = _row(0.1, 0.3, modes=10)  # softmax best under every score: three claims fail
    assert [c.verdict for c in claims.judge(table)][:3] == [runner.NOT_REPRODUCED] * 3
    # The paper says sparsemax collapses the prior AND the posterior: a multimodal prior fails the claim.
    table["sparsemax"]["per_seed_counts"]["prior_modes"] = [3.0] * SEEDS
    sparsemax = claims.judge(table)[3]
    assert sparsemax.verdict == runner.NOT_REPRODUCED and "prior nonzero modes" in sparsemax.evidence
    # Three seeds cannot decide anything, however consistent.
    few = {name: _row(w, s, n=3) for name, (w, s) in {"softmax": (0.4, 0.8), "ev_softmax": (0.2, 0.5)}.items()}
    assert claims.judge(few)[2].verdict == runner.INCONCLUSIVE


def test_a_better_mean_alone_does_not_reproduce():
    # ev-softmax better on the mean (one seed far better) but worse in 7 of 8 seeds: never reproduced.
    table = {"softmax": _row(0.4, 0.8), "ev_softmax": _row(0.4, 0.8)}
    table["ev_softmax"]["per_seed"]["w_digits"]["final"] = [0.41 + 0.001 * i for i in range(7)] + [-2.0]
    third = claims.judge(table)[2]
    assert third.verdict != runner.REPRODUCED and "end: inconclusive" in third.evidence


def test_seed_by_seed_comparison_counts_wins_and_tests_only_enough_pairs():
    def row(seeds, final):
        return {"seeds": seeds, "per_seed": {"parity_mass": {"window": final, "final": final},
                                             "w_digits": {"window": final, "final": final}}}
    seeds = list(range(8))
    better = [0.6 + 0.05 * i for i in range(7)] + [0.45]  # 7 wins; the one loss is the smallest difference
    table = {"ev_softmax": row(seeds, better), "softmax": row(seeds, [0.5] * 8)}
    higher = claims.paired_comparison(table, "ev_softmax", "softmax", "parity_mass", "final")
    assert (higher["wins"], higher["n"]) == (7, 8) and higher["p"] < 0.05
    lower = claims.paired_comparison(table, "ev_softmax", "softmax", "w_digits", "final")  # a distance: lower wins
    assert lower["wins"] == 1 and lower["p"] == higher["p"]
    # Pairs by seed, not by position; under MIN_PAIRS_FOR_TEST shared seeds there is no p.
    table["softmax"] = row([7, 6, 5, 99], [0.1, 0.9, 0.9, 0.9])
    few = claims.paired_comparison(table, "ev_softmax", "softmax", "parity_mass", "final")
    assert few == {"wins": 1, "n": 3, "p": None}
    assert claims.fmt_paired(few) == "1 of 3" and claims.fmt_paired(higher).startswith("7 of 8 (p 0.0")
    table["softmax"] = row(seeds, better)
    assert (claims.paired_comparison(table, "ev_softmax", "softmax", "parity_mass", "final")
            == {"wins": 0, "n": 8, "p": 1.0})


def test_lead_claims_list_the_sweep_settings_where_they_hold():
    good = {"softmax": _row(0.4, 0.8, modes=10), "ev_softmax": _row(0.2, 0.5)}
    bad = {"softmax": _row(0.1, 0.3, modes=10), "ev_softmax": _row(0.2, 0.5)}
    summary = {"lead": "a", "window_steps": 5100, "titles": {"a": "A", "b": "B"}, "results": {"a": bad, "b": good}}
    lead = claims.claims(summary)
    assert lead[0].verdict == runner.NOT_REPRODUCED
    assert "reproduced in B" in lead[0].evidence
    header, rows = claims.sweep_matrix(summary)
    assert header == ["claim", "A (lead)", "B"]
    assert rows[0][1:] == [runner.NOT_REPRODUCED, runner.REPRODUCED]


def test_window_summary_uses_the_first_steps_only():
    curve = {"iteration": [0, 100, 200, 300]}
    for m in train.METRICS:
        curve[m] = {"even": [1.0, 1.0, 0.0, 0.0], "odd": [1.0, 1.0, 0.0, 0.0]}
    scores = claims.seed_scores({"curve": curve}, window_steps=100)
    assert scores["w_digits"] == {"window": 1.0, "final": 0.0, "final_even": 0.0, "final_odd": 0.0}
    assert QUICK.sweep == ()


# ----------------------------------------------------------------------------- seeds trained stacked
# Error model for stacked vs separate (float64, u = 2^-53): stacking reorders sums only. The largest is
# the reconstruction's, over a batch of 64 x 784 pixels: N ~ 5e4 terms, worst case gamma_N = N u ~ 6e-12
# relative per step (Higham, Thm. 3.1), entering the parameters through the gradients (Adam's update is
# scale-free: <= 2x a relative gradient error); over T = 5 steps ~ T x 2 x gamma_N ~ 6e-11. The scores
# (priors, Wasserstein distances, support statistics) are Lipschitz in the parameters at this scale. We
# allow rtol 1e-9 (~15x that bound) and atol 1e-12 for values that are 0 up to rounding; two seeds' records
# differ by 1e-4 or more (checked below), so a seed given another's data order, noise or state would fail.
STACK_RTOL, STACK_ATOL = 1e-9, 1e-12


def _assert_records_close(got, want, path="record"):
    """Equal structure, equal non-float leaves, floats within the stacking tolerance."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), path
        for key in want:
            if key != "train_time_s":  # the stack's time is shared among its seeds
                _assert_records_close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, (list, tuple, np.ndarray)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_records_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert abs(got - want) <= STACK_ATOL + STACK_RTOL * abs(want), f"{path}: {got} != {want}"
    else:
        assert got == want, path


@pytest.fixture
def float64_default():
    saved, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)  # models, Gumbel noise and scores in float64: a tight tolerance
    torch.set_num_threads(1)  # as the runner's jobs
    yield
    torch.set_default_dtype(saved)
    torch.set_num_threads(threads)


def _tiny64():
    return {k: v.double() for k, v in tiny_tensors().items()}


@pytest.mark.parametrize("names,setting", [(["softmax", "posthoc_evidential"], TrainingSetting("adam", 1e-3, 1.0)),
                                           (["ev_softmax"], TrainingSetting("adam", 1e-3, 1.0)),
                                           (["sparsemax"], TrainingSetting("sgd", 1e-2, 1.0)),
                                           (["softmax"], TrainingSetting("sgd", 1e-2, 1.0, "adam", 1e-3))])
def test_stacked_seeds_give_each_seed_its_separate_record(float64_default, names, setting):
    """Loss curve (the running -ELBO per step), score curves at every checkpoint, final prior, support and
    posterior statistics: each seed's record from the stack equals its record trained alone."""
    seeds, data = [0, 1], _tiny64()
    # 4 steps per epoch: step 5 is in the second epoch (each seed reshuffles with its own generator)
    kw = dict(epochs=2, batch_size=64, temperature=0.67, smoothing=1e-6, eval_every=1, device=torch.device("cpu"),
              max_steps=5)
    stacked = train.train_group_stacked(names, seeds, setting, data, ConstantClassifier(), **kw,
                                           keep_images=[True, False])
    for seed, record in zip(seeds, stacked):
        alone = train.train_group(names, seed, setting, data, ConstantClassifier(), **kw, keep_images=seed == 0)
        assert len(alone["loss_curve"]["iteration"]) == 5  # one loss per step
        _assert_records_close(record, alone)
    # the seeds really differ (not two copies of one run), by 10^4 times the tolerance or more
    first, second = (r["loss_curve"]["neg_elbo_per_example"] for r in stacked)
    assert max(abs(a - b) / abs(a) for a, b in zip(first, second)) > 1e4 * STACK_RTOL


def test_a_stacked_seed_ignores_its_neighbours(float64_default):
    """Seed 0's record is the same, to the bit, whichever seeds it is stacked with."""
    kw = dict(epochs=1, batch_size=64, temperature=0.67, smoothing=1e-6, eval_every=2, device=torch.device("cpu"),
              max_steps=3)
    setting, data = TrainingSetting("adam", 1e-3, 1.0), _tiny64()
    with_1, with_5 = (train.train_group_stacked(["softmax"], [0, other], setting, data, ConstantClassifier(), **kw)
                      for other in (1, 5))
    with_1[0].pop("train_time_s"), with_5[0].pop("train_time_s")
    assert with_1[0] == with_5[0]
    assert with_1[1]["loss_curve"] != with_5[1]["loss_curve"]


def test_stack_seeds_through_the_cli_keeps_one_record_per_seed(tiny_mnist, tmp_path):
    """--stack-seeds 2: the seeds of each normalizer train as one stack; records and cache stay per seed, in the
    same format and order as without stacking (their values are compared in float64 above)."""
    common_args = ["reproduce", "cvae", "--quick", "--seeds", "2", "--normalizers", "softmax,ev_softmax", "--device",
                   "cpu", "--data-dir", str(tiny_mnist), "--max-steps", "4", "--eval-every", "2", "--workers", "1"]
    assert cli.main(common_args + ["--out", str(tmp_path / "alone")]) == 0
    assert cli.main(common_args + ["--stack-seeds", "2", "--out", str(tmp_path / "stacked")]) == 0
    load = lambda out: json.loads((out / "cvae" / "results.json").read_text())["results"]  # noqa: E731
    alone, stacked = load(tmp_path / "alone"), load(tmp_path / "stacked")
    assert stacked["settings"]["stack_seeds"] == 2
    assert stacked["jobs"]["jobs"] == alone["jobs"]["jobs"]
    assert len(list((tmp_path / "stacked" / "cvae" / "runs").glob("*.json"))) == 4
    for got, want in zip(stacked["records"], alone["records"]):
        assert (got["setting"], got["seed"], got["steps"]) == (want["setting"], want["seed"], want["steps"])
        assert got["normalizers"].keys() == want["normalizers"].keys()
        for name in want["normalizers"]:
            assert got["normalizers"][name].keys() == want["normalizers"][name].keys()
            assert got["normalizers"][name]["curve"]["iteration"] == [0, 2, 4]
    # stacking does not change what a job is: the stacked run's records serve a run without stacking
    assert cli.main(common_args + ["--out", str(tmp_path / "stacked")]) == 0
    assert load(tmp_path / "stacked")["jobs"]["run_now"] == []
    assert cli.main(common_args + ["--stack-seeds", "0", "--out", str(tmp_path / "bad")]) != 0
