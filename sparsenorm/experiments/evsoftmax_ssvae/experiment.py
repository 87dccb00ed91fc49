"""``sparsenorm reproduce ssvae``: the ev-softmax paper's semi-supervised VAE (Sec. 4.2, Table 2, App. E.2)
on the shared runner: settings -> prepare (MNIST) -> one job per (training group, seed) -> aggregate
-> claims -> report."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Dict, List

import numpy as np
import torch

from .._shared.common import RunConfig, UserFacingError
from .._shared.runner import NEW, NOT_REPRODUCED, PARTLY, REPRODUCED, Claim, Job, Report, RunOptions
from .data import DataRef
from .report import write_report
from .train import Settings, normalizer, run_group, training_groups

PAPER = "ev-softmax (Chen et al. 2021), Sec. 4.2, Table 2, App. E.2"
DEFAULT_NORMALIZERS = ["softmax", "sparsemax", "entmax15", "posthoc_evidential", "ev_softmax", "r_softmax"]
SOFTMAX_CALLS = 10

# Table 2 (marginalisation rows): accuracy in %, decoder calls per example.
PAPER_TABLE2 = {
    "softmax": {"accuracy": 96.93, "accuracy_se": 0.1, "decoder_calls": 10.0, "decoder_calls_se": 0.0},
    "sparsemax": {"accuracy": 96.87, "accuracy_se": 0.1, "decoder_calls": 1.01, "decoder_calls_se": 0.01},
    "entmax15": {"accuracy": 97.20, "accuracy_se": 0.1, "decoder_calls": 1.01, "decoder_calls_se": 0.01},
    "posthoc_evidential": {"accuracy": 96.90, "accuracy_se": 0.1, "decoder_calls": 1.72, "decoder_calls_se": 0.05},
    "ev_softmax": {"accuracy": 97.30, "accuracy_se": 0.1, "decoder_calls": 1.64, "decoder_calls_se": 0.01},
}

FULL = dict(epochs=200, seeds=10, pretrain_epochs=100, steps_per_epoch=None, selection_examples=None)
QUICK = dict(epochs=3, seeds=2, pretrain_epochs=10, steps_per_epoch=100, selection_examples=2000)


class SemiSupervisedVAE:
    name = "ssvae"
    description = "Semi-supervised VAE (M2) on MNIST with 10% labels: exact sparse marginalisation (ev-softmax paper Sec. 4.2, Table 2)"
    paper = PAPER
    default_normalizers = DEFAULT_NORMALIZERS
    full_runtime = ("Full mode (paper settings: 100 labelled-only warm-start epochs, 200 semi-supervised epochs of "
                    "704 steps, 10 seeds, 5 trained models + post-hoc): estimated from quick mode's measured step "
                    "cost at about 85 CPU-hours (1.8 days on 2 idle cores; see the README).")
    quick_note = ("Quick mode: 2 seeds, 10 labelled-only warm-start epochs (the authors' code: 100), 3 "
                  "semi-supervised 'epochs' of 100 steps each (19,200 unlabelled images, 0.4 of one pass; the "
                  "paper: 200 full passes), model selection on the -ELBO of the first 2,000 validation images. "
                  "In this short semi-supervised phase the unlabelled term still lowers the warm start's accuracy "
                  "(see the curve), so accuracies are far below the paper's and their ranking says nothing about "
                  "the paper's; decoder calls and the cost comparison are already meaningful.")
    fingerprint_exclude = ("normalizers", "workers")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--r", type=float, help="r-softmax's sparsity rate (default 0.8: 2 of 10 classes kept)")
        parser.add_argument("--select-on", choices=["elbo", "accuracy"],
                            help="model selection on validation: lowest marginal -ELBO (default, as the authors) or accuracy")
        parser.add_argument("--steps-per-epoch", type=int,
                            help="semi-supervised steps per epoch (default: quick 100, full one pass = 704)")
        parser.add_argument("--pretrain-epochs", type=int, help="labelled-only warm-start epochs (quick 3, full 100)")
        parser.add_argument("--workers", type=int, help="parallel jobs on CPU (default: the number of CPU cores)")

    def settings(self, config: RunConfig) -> Settings:
        base = dict(QUICK if config.quick else FULL)
        extra = config.extra
        if config.epochs:
            base["epochs"] = config.epochs
        if config.seeds:
            base["seeds"] = config.seeds
        for key in ("steps_per_epoch", "pretrain_epochs"):
            if extra.get(key) is not None:
                if extra[key] < (1 if key == "steps_per_epoch" else 0):
                    raise UserFacingError(f"--{key.replace('_', '-')} must be positive, got {extra[key]}")
                base[key] = extra[key]
        settings = Settings(normalizers=tuple(config.normalizers or DEFAULT_NORMALIZERS),
                            max_steps=config.max_steps, **base)
        if extra.get("r") is not None:
            if not 0.0 <= extra["r"] < 1.0:
                raise UserFacingError(f"--r must be in [0, 1), got {extra['r']}")
            settings = replace(settings, r=extra["r"])
        if extra.get("select_on"):
            settings = replace(settings, select_on=extra["select_on"])
        self._workers = extra.get("workers") or os.cpu_count() or 1
        return settings

    def run_options(self, settings: Settings, device: torch.device) -> RunOptions:
        return RunOptions(threads=1, workers=max(1, getattr(self, "_workers", 1)))

    def prepare(self, settings: Settings, config: RunConfig, device: torch.device) -> DataRef:
        ref = DataRef(config.data_dir)
        mnist = ref.load(fetch=True)
        n = len(mnist.train_labels)
        if not 1 <= round(settings.labelled_fraction * n) < n:
            raise UserFacingError(f"{n} training images are too few for a {settings.labelled_fraction:.0%} labelled split")
        return ref

    def jobs(self, settings: Settings, config: RunConfig) -> List[Job]:
        return [Job(key=f"{'+'.join(group)}-seed{seed}", seed=seed, params={"group": group})
                for group in training_groups(settings.normalizers, settings) for seed in range(settings.seeds)]

    def run_job(self, job: Job, context: DataRef, settings: Settings, device: torch.device) -> Dict[str, Any]:
        return run_group(job.params["group"], job.seed, context.load(), settings, device)

    def aggregate(self, records: List[Dict[str, Any]], settings: Settings) -> Dict[str, Any]:
        return aggregate(records, settings)

    def claims(self, summary: Dict[str, Any], records: List[Dict[str, Any]], settings: Settings) -> List[Claim]:
        return judge_claims(summary["per_normalizer"], settings)

    def report(self, out, summary, records, settings, context) -> Report:
        return write_report(out, summary, records, settings, PAPER_TABLE2)


# ---------------------------------------------------------------------------------------------- aggregate
def _mean_se(values) -> Dict[str, float]:
    arr = np.asarray(values, dtype=float)
    se = float(arr.std(ddof=1) / np.sqrt(arr.size)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "se": se, "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0}


def aggregate(records: List[Dict[str, Any]], settings: Settings) -> Dict[str, Any]:
    """Per normalizer, means and standard errors over seeds (the paper's Table 2 reports mean ± SE)."""
    per: Dict[str, Dict[str, Any]] = {}
    for name in settings.normalizers:
        runs = [(r, r["evaluations"][name]) for r in records if name in r["evaluations"]]
        acc = _mean_se([100 * e["test_accuracy"] for _, e in runs])
        calls = _mean_se([e["decoder_calls_mean"] for _, e in runs])
        curves = np.array([e["curve"]["test_accuracy"] for _, e in runs], dtype=float) * 100
        per[name] = {
            "seeds": len(runs),
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
            "trained_with": "+".join(runs[0][0]["group"]) if runs else None,
            "test_accuracy_curve": curves.mean(0).tolist() if runs else [],
            "curve_epochs": runs[0][0]["curve"]["epoch"] if runs else [],
        }
    return {"per_normalizer": per, "paper_table2": PAPER_TABLE2, "r": settings.r}


# ---------------------------------------------------------------------------------------------- claims
def _fmt_acc(s: Dict[str, Any]) -> str:
    return f"{s['accuracy']:.2f} ± {s['accuracy_se']:.2f} %"


def _fmt_calls(s: Dict[str, Any]) -> str:
    return f"{s['decoder_calls']:.2f} ± {s['decoder_calls_se']:.2f}"


def _trains_sparse(name: str, settings: Settings) -> bool:
    """Whether the model is trained with exact zeros in the marginal (post-hoc is sparsified only at evaluation)."""
    norm = normalizer(name, settings)
    return norm.sparse and not norm.posthoc


def judge_claims(per: Dict[str, Dict[str, Any]], settings: Settings) -> List[Claim]:
    have = lambda *names: all(n in per and per[n]["seeds"] for n in names)  # noqa: E731
    claims: List[Claim] = []

    # 1. ev-softmax is the most accurate of the marginalisation methods.
    rivals = [n for n in ("softmax", "sparsemax", "entmax15", "posthoc_evidential") if have(n)]
    text = "ev-softmax gives the highest test accuracy of the marginalisation methods (softmax, sparsemax, entmax-1.5, post-hoc evidential)"
    if have("ev_softmax") and rivals:
        ev = per["ev_softmax"]
        best = max(rivals, key=lambda n: per[n]["accuracy"])
        margin = ev["accuracy"] - per[best]["accuracy"]
        se = float(np.hypot(ev["accuracy_se"], per[best]["accuracy_se"]))
        evidence = (", ".join(f"{n} {_fmt_acc(per[n])}" for n in ["ev_softmax", *rivals])
                    + f" (mean ± SE over seeds); ev-softmax minus the best other ({best}): {margin:+.2f} points, "
                    f"{'more' if abs(margin) > se else 'less'} than the SE of the difference ({se:.2f}); paper: 97.30 vs 97.20 (entmax-1.5)")
        claims.append(Claim.judge(text, margin > 0, evidence, "Sec. 4.2, Table 2"))
    else:
        claims.append(Claim.judge(text, None, "needs ev_softmax and at least one of the others", "Sec. 4.2, Table 2"))

    # 2. Sparse normalizers cut decoder calls by ~84-90 %.
    sparse = [n for n in ("sparsemax", "entmax15", "ev_softmax") if have(n)]
    text = ("sparse normalizers cut decoder calls per example by about 84-90 % (sparsemax 1.01, entmax-1.5 1.01, "
            "ev-softmax 1.64 of 10); judged: at least 80 % fewer calls than softmax's 10 for each")
    if sparse:
        cuts = {n: 100 * (1 - per[n]["decoder_calls"] / SOFTMAX_CALLS) for n in sparse}
        ok = [n for n in sparse if cuts[n] >= 80]
        verdict = REPRODUCED if len(ok) == len(sparse) else (PARTLY if ok else NOT_REPRODUCED)
        evidence = ", ".join(f"{n} {_fmt_calls(per[n])} calls ({cuts[n]:.0f} % fewer)" for n in sparse) + \
            " on the test set, mean ± SE over seeds"
        claims.append(Claim(text, verdict, evidence, "Sec. 4.2, Table 2"))
    else:
        claims.append(Claim.judge(text, None, "needs sparsemax, entmax15 or ev_softmax", "Sec. 4.2, Table 2"))

    # 3. ev-softmax keeps more than one mode where sparsemax / entmax keep about one.
    text = ("ev-softmax keeps more latent classes than sparsemax and entmax-1.5, which keep about one; judged: "
            "ev-softmax's calls exceed both by at least 0.25 and exceed 1.25")
    others = [n for n in ("sparsemax", "entmax15") if have(n)]
    if have("ev_softmax") and others:
        ev_calls = per["ev_softmax"]["decoder_calls"]
        holds = ev_calls > 1.25 and all(ev_calls - per[n]["decoder_calls"] >= 0.25 for n in others)
        evidence = f"ev-softmax {_fmt_calls(per['ev_softmax'])}, " + ", ".join(
            f"{n} {_fmt_calls(per[n])}" for n in others) + " (paper: 1.64 vs 1.01, 1.01)"
        claims.append(Claim.judge(text, holds, evidence, "Sec. 4.2, Table 2"))
    else:
        claims.append(Claim.judge(text, None, "needs ev_softmax and sparsemax or entmax15", "Sec. 4.2, Table 2"))

    # 4. Post-hoc evidential: more classes than ev-softmax, more variance, lower accuracy.
    text = ("post-hoc evidential sparsification keeps more latent classes than ev-softmax, with a higher variance "
            "(over seeds), and is less accurate")
    if have("posthoc_evidential", "ev_softmax"):
        ph, ev = per["posthoc_evidential"], per["ev_softmax"]
        parts = {"more classes": ph["decoder_calls"] > ev["decoder_calls"],
                 "higher variance": ph["decoder_calls_seed_std"] > ev["decoder_calls_seed_std"],
                 "lower accuracy": ph["accuracy"] < ev["accuracy"]}
        held = sum(parts.values())
        verdict = REPRODUCED if held == 3 else (PARTLY if held else NOT_REPRODUCED)
        evidence = (f"post-hoc {_fmt_calls(ph)} calls (seed std {ph['decoder_calls_seed_std']:.2f}), {_fmt_acc(ph)}; "
                    f"ev-softmax {_fmt_calls(ev)} (seed std {ev['decoder_calls_seed_std']:.2f}), {_fmt_acc(ev)}; "
                    + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in parts.items())
                    + " (paper: 1.72 ± 0.05 vs 1.64 ± 0.01 calls, 96.90 vs 97.30 %)")
        claims.append(Claim(text, verdict, evidence, "Sec. 4.2, Table 2"))
    else:
        claims.append(Claim.judge(text, None, "needs posthoc_evidential and ev_softmax", "Sec. 4.2, Table 2"))

    # 5. The compute saving shows in training time.
    text = ("sparse marginalisation reduces the cost of training: CPU time per semi-supervised epoch below "
            "softmax's for every sparse trained normalizer")
    trained_sparse = [n for n in settings.normalizers if have(n) and _trains_sparse(n, settings)]
    if have("softmax") and trained_sparse:
        base = per["softmax"]["epoch_cpu_seconds"]
        faster = {n: per[n]["epoch_cpu_seconds"] < base for n in trained_sparse}
        evidence = f"softmax {base:.1f} CPU s/epoch; " + ", ".join(
            f"{n} {per[n]['epoch_cpu_seconds']:.1f} s ({per[n]['epoch_cpu_seconds'] / base:.2f}x)"
            for n in trained_sparse) + f" ({settings.steps_per_epoch or 'all'} steps/epoch, one thread per job)"
        claims.append(Claim.judge(text, all(faster.values()), evidence, "Sec. 1, Sec. 6"))
    else:
        claims.append(Claim.judge(text, None, "needs softmax and a sparse normalizer", "Sec. 1, Sec. 6"))

    # 6. New: per-example packing vs the authors' batch-level skipping.
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


EXPERIMENT = SemiSupervisedVAE()
