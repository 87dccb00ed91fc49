"""From job records to the summary: means over seeds, the validation-selected setting per normalizer."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional

import numpy as np

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
            {"layer": rows[0]["layer"], **{m: float(np.mean([r[m] for r in rows])) for m in ("zero_fraction", "attended", "keys")}}
            for rows in zip(*(e["layers"] for e in evals))
        ]
    return out


def summarize(records: List[Dict[str, Any]]) -> Dict[str, Any]:
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
            "validation_accuracy": float(np.mean([r["validation"]["accuracy"] for r in recs])), **test,
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
        normalizers[name] = _best([c for c in configs if c["normalizer"] == name])
    r_curve = []
    for r_final in sorted({c["r_final"] for c in configs if c["normalizer"] == "r_softmax"}):
        best = _best([c for c in configs if c["normalizer"] == "r_softmax" and c["r_final"] == r_final])
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
                "note": "the softmax-fine-tuned model (softmax's selected learning rate) evaluated with ev-softmax attention",
            }
    cost = {"jobs": len(records), "job_seconds": float(sum(r["job_seconds"] for r in records)),
            "job_cpu_seconds": float(sum(r["job_cpu_seconds"] for r in records))}
    return {"configs": configs, "normalizers": normalizers, "r_curve": r_curve, "swapped": swapped, "cost": cost}


def _best(configs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The setting with the highest mean validation accuracy (the first of equals)."""
    return max(configs, key=lambda c: c["validation_accuracy"]) if configs else None
