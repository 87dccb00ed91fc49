"""The verdicts on Sec. 4.2's claims (Table 2), each through the one rule of
:mod:`sparsenorm.experiments._shared.verdict`: every normalizer trains on the same seeds, so
accuracies, decoder calls and CPU times are compared by paired differences per seed."""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from .._shared import verdict
from .._shared.verdict import NEW, NOT_TESTABLE, Claim
from .paper import (ONE_CALL_ESTIMATORS, PAPER_ACC, PAPER_ACCURACY, PAPER_CALL_CUTS, PAPER_CALLS, PAPER_TABLE2, SOURCE,
                    TWO_CALL_ESTIMATORS)
from .train import Settings, normalizer

CALL_BOUND = 2.0
"""At least 80 % fewer decoder calls than softmax's 10 (the paper's cuts, :data:`.paper.PAPER_CALL_CUTS`, are
larger): at most 2 per example."""


def _fmt_acc(s: Dict[str, Any]) -> str:
    return f"{s['accuracy']:.2f} ± {s['accuracy_se']:.2f} %"


def _fmt_calls(s: Dict[str, Any]) -> str:
    return f"{s['decoder_calls']:.2f} ± {s['decoder_calls_se']:.2f}"


def _trains_sparse(name: str, settings: Settings) -> bool:
    """Whether the model is trained with exact zeros in the marginal (post-hoc is sparsified only at evaluation)."""
    norm = normalizer(name, settings)
    return norm.sparse and not norm.posthoc


def _seeds(per: Dict[str, Dict[str, Any]], name: str, key: str) -> Dict[int, float]:
    return {int(k): v for k, v in per[name]["per_seed"][key].items()}


def _paired(per, a: str, b: str, key: str, higher_is_better: bool, label: str) -> verdict.Test:
    d = verdict.paired_differences(_seeds(per, a, key), _seeds(per, b, key), higher_is_better)
    return verdict.direction(d, label)


def _most_accurate(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """ev-softmax is the most accurate of the marginalisation methods."""
    claims: List[Claim] = []
    # Post-hoc's accuracy is softmax's by construction (the same classifier, the same argmax): not a part of its own.
    rivals = [n for n in ("softmax", "sparsemax", "entmax15") if have(n)]
    text = ("ev-softmax gives the highest test accuracy of the marginalisation methods (softmax, sparsemax, "
            "entmax-1.5, post-hoc evidential)")
    key = "ev.ssvae.most_accurate"
    if have("ev_softmax") and rivals:
        tests = [_paired(per, "ev_softmax", r, "accuracy", True, f"accuracy, ev_softmax vs {r}") for r in rivals]
        # primary: every rival ("the highest classification accuracy of models using ... marginalization")
        claims.append(verdict.claim(text, tests, SOURCE, key, digits=2, primary=len(tests), note=", ".join(
            f"{n} {_fmt_acc(per[n])}" for n in ["ev_softmax", *rivals]) + " (mean ± SE over seeds); paper: "
            f"{PAPER_ACC['ev_softmax']} vs {PAPER_ACC['entmax15']} (entmax-1.5). Primary: ev-softmax vs every "
            "marginalisation method (the paper: the highest accuracy of them). Post-hoc evidential's accuracy equals "
            "softmax's by construction (the same classifier and argmax), so ev-softmax vs softmax stands for it"))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs ev_softmax and at least one of the others", SOURCE, key))
    return claims


def _beats_monte_carlo(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """ev-softmax is more accurate than the Monte-Carlo estimators (Table 2's upper rows, Correia et al.'s numbers)."""
    claims: List[Claim] = []
    # primary: every one-call estimator (the paper: the highest accuracy of the Monte Carlo methods)
    estimators = sorted((e for e in settings.estimators if have(e) and e in ONE_CALL_ESTIMATORS),
                        key=lambda e: -PAPER_ACCURACY[e][0])
    text = ("ev-softmax is more accurate than the Monte-Carlo gradient estimators (score function, NVIL, "
            "Gumbel-softmax relaxed and straight-through)")
    key = "ev.ssvae.beats_monte_carlo"
    missing = [e for e in ONE_CALL_ESTIMATORS if e not in estimators]
    if have("ev_softmax") and estimators:
        tests = [_paired(per, "ev_softmax", e, "accuracy", True, f"accuracy, ev_softmax vs {e}") for e in estimators]
        claims.append(verdict.claim(text, tests, SOURCE, key, digits=2, primary=len(tests), note=", ".join(
            f"{n} {_fmt_acc(per[n])}" for n in ["ev_softmax", *estimators])
            + f" (paper: {PAPER_ACC['ev_softmax']} vs " + ", ".join(
            f"{e} {PAPER_ACCURACY[e][0]:.2f}" for e in estimators) + "; one decoder call per example each). Primary: "
            "every estimator that ran (the paper: the highest accuracy of the Monte Carlo methods)" + (
                f"; not run here: {', '.join(missing)}" if missing else "")))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs ev_softmax and a Monte-Carlo estimator (--estimators)", SOURCE,
                            key))
    return claims


def _sum_and_sample(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """ev-softmax is more accurate than SFE with a self-critic baseline (SFE+) and sum-and-sample (two calls each)."""
    claims: List[Claim] = []
    estimators = sorted((e for e in TWO_CALL_ESTIMATORS if e in settings.estimators and have(e)),
                        key=lambda e: -PAPER_ACCURACY[e][0])
    text = "ev-softmax is more accurate than SFE with a self-critic baseline (SFE+) and sum-and-sample"
    key = "ev.ssvae.sum_and_sample"
    if have("ev_softmax") and estimators:
        tests = [_paired(per, "ev_softmax", e, "accuracy", True, f"accuracy, ev_softmax vs {e}") for e in estimators]
        claims.append(verdict.claim(text, tests, SOURCE, key, digits=2, primary=len(tests), note=", ".join(
            f"{n} {_fmt_acc(per[n])}" for n in ["ev_softmax", *estimators])
            + f" (paper: {PAPER_ACC['ev_softmax']} vs " + ", ".join(
            f"{e} {PAPER_ACCURACY[e][0]:.2f}" for e in estimators) + "; two decoder calls per example each). Primary: "
            "both (the paper: the highest accuracy of the Monte Carlo methods)"))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs ev_softmax and sfe_plus or sum_and_sample (--estimators)",
                            SOURCE, key))
    return claims


def _fewer_calls(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """Sparse normalizers cut decoder calls by Table 2's :data:`.paper.PAPER_CALL_CUTS`."""
    claims: List[Claim] = []
    sparse = [n for n in ("ev_softmax", "sparsemax", "entmax15") if have(n)]  # primary: ev-softmax
    text = (f"sparse normalizers cut decoder calls per example by about {PAPER_CALL_CUTS} "
            f"(sparsemax {PAPER_CALLS['sparsemax']}, entmax-1.5 {PAPER_CALLS['entmax15']}, "
            f"ev-softmax {PAPER_CALLS['ev_softmax']} of {PAPER_TABLE2['softmax']['decoder_calls']:g}); "
            f"judged: at most {CALL_BOUND:g} calls (80 % fewer than softmax's 10) for each")
    key = "ev.ssvae.fewer_calls"
    if sparse:
        tests = [verdict.direction([CALL_BOUND - c for c in _seeds(per, n, "decoder_calls").values()],
                                   f"{n}: {CALL_BOUND:g} minus its calls") for n in sparse]
        claims.append(verdict.claim(text, tests, SOURCE, key, digits=2, note=", ".join(
            f"{n} {_fmt_calls(per[n])} calls" for n in sparse) + " on the test set, mean ± SE over seeds; primary: "
            "ev-softmax"))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs sparsemax, entmax15 or ev_softmax", SOURCE, key))
    return claims


def _more_modes(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """ev-softmax keeps more than one mode where sparsemax / entmax keep about one."""
    claims: List[Claim] = []
    text = "ev-softmax keeps more latent classes than sparsemax and entmax-1.5, which keep about one"
    key = "ev.ssvae.more_modes"
    others = [n for n in ("sparsemax", "entmax15") if have(n)]
    if have("ev_softmax") and others:
        tests = [_paired(per, "ev_softmax", n, "decoder_calls", True, f"decoder calls, ev_softmax vs {n}")
                 for n in others]
        claims.append(verdict.claim(text, tests, SOURCE, key, digits=2, primary=len(tests),
                                    note="both rivals primary (the paper names them together); ev-softmax "
                                         f"{_fmt_calls(per['ev_softmax'])}, "
                                    + ", ".join(f"{n} {_fmt_calls(per[n])}" for n in others)
                                    + f" (paper: {PAPER_CALLS['ev_softmax']} vs {PAPER_CALLS['sparsemax']}, "
                                      f"{PAPER_CALLS['entmax15']})"))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs ev_softmax and sparsemax or entmax15", SOURCE, key))
    return claims


def _posthoc_worse(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """Post-hoc evidential: more classes than ev-softmax, more variance, lower accuracy."""
    claims: List[Claim] = []
    text = ("post-hoc evidential sparsification keeps more latent classes than ev-softmax, with a higher variance "
            "(over seeds), and is less accurate")
    key = "ev.ssvae.posthoc_worse"
    if have("posthoc_evidential", "ev_softmax"):
        ph, ev = per["posthoc_evidential"], per["ev_softmax"]
        tests = [_paired(per, "posthoc_evidential", "ev_softmax", "decoder_calls", True, "more classes"),
                 verdict.larger_spread(list(_seeds(per, "posthoc_evidential", "decoder_calls").values()),
                                       list(_seeds(per, "ev_softmax", "decoder_calls").values()),
                                       "higher variance of the calls over seeds"),
                 _paired(per, "ev_softmax", "posthoc_evidential", "accuracy", True, "lower accuracy")]
        claims.append(verdict.claim(text, tests, SOURCE, key, digits=2, note=(
            "primary: more classes; secondary: variance, accuracy (post-hoc's accuracy is softmax's by construction, "
            f"so this part is ev-softmax vs the softmax model). post-hoc {_fmt_calls(ph)} calls, {_fmt_acc(ph)}; "
            f"ev-softmax {_fmt_calls(ev)}, {_fmt_acc(ev)} (paper: {_fmt_calls(PAPER_TABLE2['posthoc_evidential'])} vs "
            f"{_fmt_calls(PAPER_TABLE2['ev_softmax'])} calls, {PAPER_ACC['posthoc_evidential']} vs "
            f"{PAPER_ACC['ev_softmax']} %)")))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs posthoc_evidential and ev_softmax", SOURCE, key))
    return claims


def _cheaper(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """The compute saving shows in training time."""
    claims: List[Claim] = []
    text = ("sparse marginalisation reduces the cost of training: CPU time per semi-supervised epoch below "
            "softmax's for every sparse trained normalizer")
    key = "ev.ssvae.cheaper"
    trained_sparse = sorted((n for n in settings.normalizers if have(n) and _trains_sparse(n, settings)),
                            key=lambda n: n != "ev_softmax")  # primary: every one (sparse normalizers in general)
    if have("softmax") and trained_sparse:
        base = per["softmax"]["epoch_cpu_seconds"]
        tests = [_paired(per, n, "softmax", "epoch_cpu_seconds", False, f"CPU s per epoch, {n} vs softmax")
                 for n in trained_sparse]
        claims.append(verdict.claim(text, tests, "Sec. 1, Sec. 6", key, digits=2, primary=len(tests), note=(
            f"softmax {base:.1f} CPU s/epoch; " + ", ".join(
                f"{n} {per[n]['epoch_cpu_seconds']:.1f} s ({per[n]['epoch_cpu_seconds'] / base:.2f}x)"
                for n in trained_sparse) + f" ({settings.steps_per_epoch or 'all'} steps/epoch, one thread per job). "
            "Primary: every sparse trained normalizer (the paper: sparse normalization functions in general)")))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs softmax and a sparse normalizer", "Sec. 1, Sec. 6", key))
    return claims


def _new_findings(per: Dict[str, Dict[str, Any]], settings: Settings, have) -> List[Claim]:
    """New: per-example packing vs the authors' batch-level skipping, and r-softmax as the latent distribution."""
    claims: List[Claim] = []
    packed = [n for n in settings.normalizers if have(n) and not normalizer(n, settings).posthoc]
    if packed:
        evidence = ", ".join(f"{n}: {per[n]['decoder_rows_evaluated']:.2f} vs {per[n]['batch_level_rows']:.2f}"
                             for n in packed)
        claims.append(Claim("decoder rows evaluated per unlabelled training example: sparsenorm.marginalize "
                            "(per-example support) vs the authors' code (a class is skipped only when no example "
                            "of the batch of 64 uses it)", NEW, evidence + " rows per example", "authors' marg.py"))
    if have("r_softmax"):
        rs = per["r_softmax"]
        claims.append(Claim(f"r-softmax (r = {settings.r}, fixed) as the latent distribution (not in the paper)", NEW,
                            f"{_fmt_acc(rs)}, {_fmt_calls(rs)} decoder calls, {rs['decoder_rows_evaluated']:.2f} rows "
                            f"per training example"))
    return claims


def claims(summary: Dict[str, Any], settings: Settings) -> List[Claim]:
    per = summary["per_normalizer"]
    have = lambda *names: all(n in per and per[n]["seeds"] for n in names)  # noqa: E731
    judges = (_most_accurate, _beats_monte_carlo, _sum_and_sample, _fewer_calls, _more_modes, _posthoc_worse, _cheaper,
              _new_findings)
    return [claim for judge in judges for claim in judge(per, settings, have)]


# ---------------------------------------------------------------------------------------------- aggregate
def _mean_se(values) -> Dict[str, float]:
    arr = np.asarray(values, dtype=float)
    se = float(arr.std(ddof=1) / np.sqrt(arr.size)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "se": se, "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0}


def aggregate(records: List[Dict[str, Any]], settings: Settings) -> Dict[str, Any]:
    """Per normalizer, means and standard errors over seeds (the paper's Table 2 reports mean ± SE)."""
    per: Dict[str, Dict[str, Any]] = {}
    for name in [*settings.normalizers, *settings.estimators]:
        runs = [(r, r["evaluations"][name]) for r in records if name in r["evaluations"]]
        if not runs:  # not run (a partial cache, a report of some jobs): no seeds, and no mean of nothing
            per[name] = {"seeds": 0}
            continue
        acc = _mean_se([100 * e["test_accuracy"] for _, e in runs])
        calls = _mean_se([e["decoder_calls_mean"] for _, e in runs])
        curves = np.array([e["curve"]["test_accuracy"] for _, e in runs], dtype=float) * 100
        per[name] = {
            "seeds": len(runs),
            "per_seed": {"accuracy": {r["seed"]: 100 * e["test_accuracy"] for r, e in runs},
                         "decoder_calls": {r["seed"]: e["decoder_calls_mean"] for r, e in runs},
                         "epoch_cpu_seconds": {r["seed"]: r["epoch_cpu_seconds"] for r, e in runs}},
            "accuracy": acc["mean"], "accuracy_se": acc["se"], "accuracy_std": acc["std"],
            "decoder_calls": calls["mean"], "decoder_calls_se": calls["se"], "decoder_calls_seed_std": calls["std"],
            "decoder_calls_example_std": float(np.mean([e["decoder_calls_std"] for _, e in runs])),
            "decoder_rows_evaluated": float(np.mean([r["decoder_rows_per_example"] for r, _ in runs])),
            "batch_level_rows": float(np.mean([r["batch_level_rows_per_example"] for r, _ in runs])),
            "test_neg_elbo": _mean_se([e["test_neg_elbo"] for _, e in runs])["mean"],
            "test_neg_elbo_se": _mean_se([e["test_neg_elbo"] for _, e in runs])["se"],
            "val_accuracy": float(np.mean([100 * e["val_accuracy"] for _, e in runs])),
            "warm_start_accuracy": float(np.mean([100 * e["curve"]["test_accuracy"][0] for _, e in runs])),
            "epoch_seconds": float(np.mean([r["epoch_seconds"] for r, _ in runs])),
            "epoch_cpu_seconds": float(np.mean([r["epoch_cpu_seconds"] for r, _ in runs])),
            "step_cpu_seconds": float(np.mean([r["epoch_cpu_seconds"] / r["steps_per_epoch"] for r, _ in runs])),
            "pretrain_seconds": float(np.mean([r["pretrain_seconds"] for r, _ in runs])),
            "selected_epochs": [r["selected_epoch"] for r, _ in runs],
            "trained_with": "+".join(runs[0][0]["group"]),
            "test_accuracy_curve": curves.mean(0).tolist(),
            "curve_epochs": runs[0][0]["curve"]["epoch"],
        }
    return {"per_normalizer": per, "paper_table2": PAPER_TABLE2, "r": settings.r}
