"""From job records to the summary (:func:`aggregate`: means over seeds, the validation-selected setting per
normalizer), and the verdicts on the r-softmax paper's Sec. 4.2 (fine-tuning BERT, Table 2), each through the one
rule of :mod:`sparsenorm.experiments._shared.verdict`: every normalizer is fine-tuned on the same
seeds, so test accuracies are compared by paired differences over seeds (the validation-selected
learning rate and final r per normalizer)."""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Dict, List, Optional

import numpy as np

from .._shared import verdict
from .._shared.verdict import NEW, NOT_TESTABLE, Claim
from .paper import PAPER_BEST_R_SST2, PAPER_BREAK_GAPS, PAPER_TABLE2

SOURCE = "Sec. 4.2, Table 2"
BREAK_MARGIN = 0.05
""""Breaks the pretrained model" = significantly more than 5 accuracy points below softmax (the paper's gaps on
SST-2, :data:`.paper.PAPER_BREAK_GAPS`, are well beyond it)."""


def match_margin(test_examples: Optional[int], accuracy: Optional[float] = None) -> float:
    """Margin of "matches softmax": two standard errors of a test accuracy ``accuracy`` (a fraction) on this test set,
    ``2 sqrt(p (1 - p) / n)``: a gap smaller than that is within what the test set alone can resolve. ``accuracy``
    is our own softmax baseline's; None gives the paper's softmax SST-2 accuracy (Table 2), shown beside it."""
    p = PAPER_TABLE2["softmax"]["SST-2"] / 100 if accuracy is None else accuracy
    n = test_examples or 872
    return 2 * math.sqrt(p * (1 - p) / n)


def _paired(a: Dict[str, Any], b: Dict[str, Any]):
    return verdict.paired_differences({int(k): v for k, v in a["accuracy_by_seed"].items()},
                                      {int(k): v for k, v in b["accuracy_by_seed"].items()})


def _r_softmax_matches_softmax(summary: Dict[str, Any], rows: Dict[str, Any], acc: Dict[str, float],
                               soft: Optional[Dict[str, Any]]) -> List[Claim]:
    """Table 2: r-softmax attention is on par with softmax (non-inferiority)."""
    claims: List[Claim] = []
    paper_soft = PAPER_TABLE2["softmax"]["SST-2"]
    r = rows.get("r_softmax")
    text, key = "r-softmax attention matches or beats softmax after fine-tuning", "r.finetune.matches_softmax"
    if soft is None or r is None:
        claims.append(Claim(text, NOT_TESTABLE, "needs both softmax and r_softmax runs", SOURCE, key))
    else:
        n = soft.get("test_examples") or 872
        margin, paper_margin = match_margin(n, soft["accuracy"]), match_margin(n)
        d = _paired(r, soft)
        at_paper = verdict.non_inferiority(d, paper_margin, "the same at the paper-based margin")
        claims.append(verdict.claim(
            text, [verdict.non_inferiority(d, margin, "test accuracy, r-softmax vs softmax",
                                           margin_source=f"2 standard errors of our softmax's {acc['softmax']:.1f} % "
                                                         f"on {n} sentences")], SOURCE, key,
            note=(f"test accuracy r-softmax {acc['r_softmax']:.2f} (final r {r['r_final']:g}, lr {r['lr']:g}) vs "
                  f"softmax {acc['softmax']:.2f}; margin = 2 standard errors of our own softmax baseline's test "
                  f"accuracy ({100 * margin:.2f} points on {n} sentences); beside it, the paper-based margin (2 SE at "
                  f"the paper's {paper_soft} %: {100 * paper_margin:.2f} points) gives {at_paper.verdict} (p "
                  f"{'n/a' if at_paper.p is None else f'{at_paper.p:.2g}'}); paper SST-2: "
                  f"{PAPER_TABLE2['r_softmax']['SST-2']} vs {paper_soft}")))
    return claims


def _sparsemax_and_hourglass_break(summary: Dict[str, Any], rows: Dict[str, Any], acc: Dict[str, float],
                                   soft: Optional[Dict[str, Any]]) -> List[Claim]:
    """Table 2: sparsemax and sparsehourglass attention break the pretrained model."""
    claims: List[Claim] = []
    paper_soft = PAPER_TABLE2["softmax"]["SST-2"]
    for name, key in (("sparsemax", "r.finetune.sparsemax_breaks"),
                      ("sparsehourglass", "r.finetune.sparsehourglass_breaks")):
        text = f"{name} attention breaks the pretrained model"
        if soft is None or name not in rows:
            claims.append(Claim(text, NOT_TESTABLE, f"needs both softmax and {name} runs", SOURCE, key))
            continue
        gap = [d - BREAK_MARGIN for d in _paired(soft, rows[name])]
        claims.append(verdict.claim(
            text, [verdict.direction(gap, f"softmax minus {name} minus {100 * BREAK_MARGIN:g} points (margin: the "
                                          f"paper's gaps of {PAPER_BREAK_GAPS}, a 'break' well beyond test noise)")],
            SOURCE, key,
            note=(f"test accuracy {name} {acc[name]:.2f} vs softmax {acc['softmax']:.2f}; 'breaks' = more than "
                  f"{100 * BREAK_MARGIN:g} points below (paper SST-2: {PAPER_TABLE2[name]['SST-2']} vs {paper_soft})")))

    return claims


def _small_r_better(summary: Dict[str, Any], rows: Dict[str, Any], acc: Dict[str, float],
                    soft: Optional[Dict[str, Any]]) -> List[Claim]:
    """Sec. 4.2: a small final r works better than a large one."""
    claims: List[Claim] = []
    curve = summary.get("r_curve", [])
    small = [c for c in curve if c["r_final"] <= PAPER_BEST_R_SST2]
    large = [c for c in curve if c["r_final"] >= 0.5]
    text, key = "a small final r (<= 0.2) works better than a large one (0.5)", "r.finetune.small_r"
    if small and large and all("accuracy_by_seed" in c for c in curve):
        best_small = max(small, key=lambda c: c["validation_accuracy"])
        best_large = max(large, key=lambda c: c["validation_accuracy"])
        claims.append(verdict.claim(
            text, [verdict.direction(_paired(best_small, best_large),
                                     f"test accuracy, final r {best_small['r_final']:g} vs {best_large['r_final']:g}")],
            "Sec. 4.2, Results", key,
            note="test accuracy by final r: " + ", ".join(f"{c['r_final']:g}: {c['accuracy'] * 100:.2f}"
                                                          for c in curve)))
    else:
        claims.append(Claim(text, NOT_TESTABLE, "needs final r values on both sides (full mode runs 0.05-0.5)",
                            "Sec. 4.2, Results", key))

    return claims


def _new_findings(summary: Dict[str, Any], rows: Dict[str, Any], acc: Dict[str, float],
                  soft: Optional[Dict[str, Any]]) -> List[Claim]:
    """Not in the paper: measured sparsity, other fine-tuned normalizers, post-hoc, swaps."""
    claims: List[Claim] = []
    r = rows.get("r_softmax")
    if r is not None:
        claims.append(Claim(
            "r is the fraction of zero attention weights (the paper states the intended r, not a measured one)", NEW,
            f"measured on test sentences: {r['zero_fraction']:.3f} of the weights are zero at final r "
            f"{r['r_final']:g}; {r['attended']:.2f} of {r['keys']:.2f} keys attended per query", "Sec. 4.2"))
    for name, what in (("ev_softmax", "ev-softmax attention, fine-tuned"),
                       ("entmax15", "1.5-entmax attention, fine-tuned")):
        if name in acc and soft is not None:
            row = rows[name]
            claims.append(Claim(f"{what}, vs softmax (not in the paper)", NEW,
                                f"test accuracy {acc[name]:.2f} vs softmax {acc['softmax']:.2f}; zero weights "
                                f"{row['zero_fraction']:.3f}, {row['attended']:.2f} of {row['keys']:.2f} keys per "
                                "query"))
    if "posthoc_evidential" in acc and soft is not None:
        row = rows["posthoc_evidential"]
        claims.append(Claim("post-hoc evidential attention (softmax-fine-tuned, ev-softmax at test, no retraining) "
                            "keeps softmax's accuracy (not in the paper)", NEW,
                            f"test accuracy {acc['posthoc_evidential']:.2f} vs softmax {acc['softmax']:.2f}; zero "
                            f"weights {row['zero_fraction']:.3f}, {row['attended']:.2f} of {row['keys']:.2f} keys per "
                            "query"))
    swapped = summary.get("swapped", {})
    if swapped and soft is not None:
        claims.append(Claim("each sparse normalizer swapped into the softmax-fine-tuned model without fine-tuning "
                            "(not in the paper)", NEW,
                            "; ".join(f"{n} {s['accuracy'] * 100:.2f}" for n, s in swapped.items())
                            + f" (softmax {acc['softmax']:.2f})"))
    return claims


def claims(summary: Dict[str, Any]) -> List[Claim]:
    rows = summary["normalizers"]
    acc = {n: row["accuracy"] * 100 for n, row in rows.items()}  # test accuracy in %
    judges = (_r_softmax_matches_softmax, _sparsemax_and_hourglass_break, _small_r_better, _new_findings)
    return [claim for judge in judges for claim in judge(summary, rows, acc, rows.get("softmax"))]


# ---------------------------------------------------------------------------------------------- aggregate
MEASURES = ("accuracy", "zero_fraction", "attended", "keys")


def _mean_eval(evals: List[Dict[str, Any]], seeds: List[int]) -> Dict[str, Any]:
    """Means over seeds of one evaluation (accuracy, sparsity, per-layer sparsity), and the accuracy per seed
    (the claims compare normalizers seed by seed)."""
    out: Dict[str, Any] = {m: float(np.mean([e[m] for e in evals])) for m in MEASURES}
    out["accuracy_by_seed"] = {int(s): float(e["accuracy"]) for s, e in zip(seeds, evals)}
    out["test_examples"] = int(evals[0]["n"]) if evals and "n" in evals[0] else None
    out["accuracy_std"] = float(np.std([e["accuracy"] for e in evals]))
    if all("layers" in e for e in evals):
        out["layers"] = [
            {"layer": rows[0]["layer"],
             **{m: float(np.mean([r[m] for r in rows])) for m in ("zero_fraction", "attended", "keys")}}
            for rows in zip(*(e["layers"] for e in evals))
        ]
    return out


def aggregate(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``configs`` (every setting, means over seeds), ``normalizers`` (the validation-selected setting
    per normalizer: test accuracy, sparsity, cost), ``r_curve`` (r-softmax per final r, each at its
    best learning rate), ``swapped`` (sparse normalizers in the selected softmax model, no retraining)."""
    groups: "OrderedDict[tuple, List[Dict[str, Any]]]" = OrderedDict()
    for rec in records:
        groups.setdefault((rec["normalizer"], rec["lr"], rec["r_final"]), []).append(rec)
    configs = []
    for (name, lr, r_final), recs in groups.items():
        test = _mean_eval([r["test"] for r in recs], [r["seed"] for r in recs])
        configs.append({
            "normalizer": name, "lr": lr, "r_final": r_final, "seeds": len(recs),
            "validation_accuracy": float(np.mean([r["validation"]["accuracy"] for r in recs])),
            "validation_by_seed": {int(r["seed"]): float(r["validation"]["accuracy"]) for r in recs}, **test,
            "train_seconds": float(np.mean([r["train"]["seconds"] for r in recs])),
            "train_cpu_seconds": float(np.mean([r["train"]["cpu_seconds"] for r in recs])),
            "job_seconds": float(np.mean([r["job_seconds"] for r in recs])),
            "job_cpu_seconds": float(np.mean([r["job_cpu_seconds"] for r in recs])),
            "steps": int(np.mean([r["train"]["steps"] for r in recs])),
            "seconds_per_step": float(np.mean([r["train"]["seconds_per_step"] for r in recs])),
            "eval_seconds": float(np.mean([r["test"]["seconds"] + r["validation"]["seconds"] for r in recs])),
            "keys_in_records": [r["key"] for r in recs],
        })
    normalizers: Dict[str, Dict[str, Any]] = OrderedDict()
    for name in dict.fromkeys(c["normalizer"] for c in configs):
        normalizers[name] = choose([c for c in configs if c["normalizer"] == name])
    r_curve = []
    for r_final in sorted({c["r_final"] for c in configs if c["normalizer"] == "r_softmax"}):
        best = choose([c for c in configs if c["normalizer"] == "r_softmax" and c["r_final"] == r_final])
        r_curve.append({k: best[k] for k in ("r_final", "lr", "accuracy", "accuracy_std", "validation_accuracy",
                                             "zero_fraction", "attended", "keys", "accuracy_by_seed")})
    swapped: Dict[str, Any] = OrderedDict()
    soft = normalizers.get("softmax")
    if soft is not None:
        recs = groups[("softmax", soft["lr"], None)]
        for label in recs[0].get("swapped", {}):
            swapped[label] = _mean_eval([r["swapped"][label] for r in recs], [r["seed"] for r in recs])
        if "posthoc_evidential" in swapped:
            normalizers["posthoc_evidential"] = {
                "normalizer": "posthoc_evidential", "lr": soft["lr"], "r_final": None, "seeds": soft["seeds"],
                "validation_accuracy": None, **swapped["posthoc_evidential"],
                "train_seconds": 0.0, "train_cpu_seconds": 0.0, "steps": 0, "seconds_per_step": None,
                "eval_seconds": None, "job_seconds": 0.0, "job_cpu_seconds": 0.0,
                "note": "the softmax-fine-tuned model (softmax's selected learning rate) evaluated with ev-softmax "
                        "attention",
            }
    cost = {"jobs": len(records), "job_seconds": float(sum(r["job_seconds"] for r in records)),
            "job_cpu_seconds": float(sum(r["job_cpu_seconds"] for r in records)),
            # records before resumed_at_step existed have none; their resumed jobs cannot be told apart
            "resumed": {r["key"]: r["train"]["resumed_at_step"] for r in records
                        if r["train"].get("resumed_at_step", 0) > 0}}
    return {"configs": configs, "normalizers": normalizers, "r_curve": r_curve, "swapped": swapped, "cost": cost}


def choose(configs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The setting with the highest mean validation accuracy over the seeds every candidate ran (the first of
    equals): in decisive mode the grid seeds, since the chosen setting alone then runs the other seeds."""
    if not configs:
        return None
    common = set.intersection(*(set(c.get("validation_by_seed", {})) for c in configs))

    def score(c: Dict[str, Any]) -> float:
        by_seed = c.get("validation_by_seed")
        return float(np.mean([by_seed[s] for s in common])) if common and by_seed else c["validation_accuracy"]

    return max(configs, key=score)
