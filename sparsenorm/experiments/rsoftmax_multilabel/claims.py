"""Summaries over seeds and the verdicts, with example-based, micro and macro F1 side by side.

A comparison holds on the real data when it holds for the mean over seeds of the test scores, and
on synthetic data when it holds in at least two thirds of the settings (means over seeds per
setting). Each claim is judged under each F1; the verdict is *reproduced* when it is reproduced
(real and synthetic) under all three, *not reproduced* when it holds nowhere, else *partly*.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from .._shared.runner import NEW, NOT_REPRODUCED, NOT_TESTABLE, PARTLY, REPRODUCED, Claim
from .methods import BEST_SOFTMAX

F1S = ("example_f1", "micro_f1", "macro_f1")
F1_NAMES = {"example_f1": "example F1", "micro_f1": "micro F1", "macro_f1": "macro F1"}
SUMMARY_METRICS = F1S + ("mean_set_size", "true_mean_set_size", "known_count_topk_f1", "count_accuracy", "select_f1")
APPROX_TOLERANCE = 0.02  # "r-softmax ~ best softmax": within 2 F1 points
SPARSE_RIVALS = ("sparsemax+huber", "sparsemax+hinge", "sparsehourglass")
SOURCE = "r-softmax paper Sec. 4.1, Fig. 2, Table 1"


def setting_key(record: Dict[str, Any]) -> str:
    d = record["data"]
    return f"L={d['n_classes']}, labels={d['n_labels_param']:g}, length={d['length_param']:g}"


def _stats(values: Sequence[float]) -> Dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0, "n": int(arr.size)}


def _summarise(records: List[Dict[str, Any]], variants: Sequence[str]) -> Dict[str, Dict[str, Dict[str, float]]]:
    out = {}
    for v in variants:
        entries = [r["methods"][v] for r in records if v in r["methods"]]
        if entries:
            out[v] = {m: _stats([e[m] for e in entries]) for m in SUMMARY_METRICS if m in entries[0]}
    return out


def variants_in(records: List[Dict[str, Any]]) -> List[str]:
    """Every prediction variant present, in a stable order (per-threshold softmax, best softmax, the rest)."""
    seen: List[str] = []
    for r in records:
        for v in r["methods"]:
            if v not in seen:
                seen.append(v)
    thresholds = [v for v in seen if v.startswith("softmax (p0=")]
    rest = [v for v in seen if v not in thresholds and v != BEST_SOFTMAX]
    return thresholds + ([BEST_SOFTMAX] if BEST_SOFTMAX in seen else []) + rest


def aggregate(records: List[Dict[str, Any]], real_name: str) -> Dict[str, Any]:
    real = [r for r in records if r["dataset"] == "real"]
    synthetic = [r for r in records if r["dataset"] == "synthetic"]
    variants = variants_in(records)
    by_setting: Dict[str, List[Dict[str, Any]]] = {}
    for r in synthetic:
        by_setting.setdefault(setting_key(r), []).append(r)
    chosen = {name: [r["methods"][name]["chosen"] for r in records if name in r["methods"]]
              for name in (BEST_SOFTMAX, "r_softmax")}
    return {
        "real_name": real_name,
        "variants": variants,
        "real": _summarise(real, variants),
        "synthetic": {k: _summarise(rs, variants) for k, rs in by_setting.items()},
        "chosen": {name: {c: picks.count(c) for c in sorted(set(picks))} for name, picks in chosen.items()},
        "seconds_per_run": {m: float(np.mean([r["seconds"][m] for r in records if m in r["seconds"]]))
                            for m in dict.fromkeys(k for r in records for k in r["seconds"])},
    }


def _mean(table: Dict[str, Any], variant: str, metric: str) -> float:
    return table[variant][metric]["mean"] if variant in table and metric in table[variant] else float("nan")


def _word(real_ok: bool, synth_ok: bool, have_real: bool, have_synth: bool) -> str:
    checks = [ok for ok, have in ((real_ok, have_real), (synth_ok, have_synth)) if have]
    if not checks:
        return NOT_TESTABLE
    return REPRODUCED if all(checks) else (PARTLY if any(checks) else NOT_REPRODUCED)


def _combine(words: Sequence[str]) -> str:
    if all(w == REPRODUCED for w in words):
        return REPRODUCED
    if all(w in (NOT_REPRODUCED, NOT_TESTABLE) for w in words):
        return NOT_TESTABLE if all(w == NOT_TESTABLE for w in words) else NOT_REPRODUCED
    return PARTLY


def _comparison(summary: Dict[str, Any], text: str, source: str, subject: str, rivals: Sequence[str],
                test: Callable[[float, float], bool], describe: Callable[[float, float], str]) -> Claim:
    """``subject`` against each rival under each F1; ``test(subject_value, rival_value)``."""
    real, synth = summary["real"], summary["synthetic"]
    present = [v for v in rivals if v in summary["variants"]]
    if subject not in summary["variants"] or not present:
        return Claim(text, NOT_TESTABLE, f"needs {subject} and one of {', '.join(rivals)}", source)
    words, parts = [], []
    for f1 in F1S:
        real_ok = bool(real) and all(test(_mean(real, subject, f1), _mean(real, v, f1)) for v in present)
        wins = {v: sum(test(_mean(t, subject, f1), _mean(t, v, f1)) for t in synth.values()) for v in present}
        synth_ok = bool(synth) and all(w >= 2 / 3 * len(synth) for w in wins.values())
        word = _word(real_ok, synth_ok, bool(real), bool(synth))
        words.append(word)
        detail = ", ".join(
            (f"vs {v}: {summary['real_name']} {describe(_mean(real, subject, f1), _mean(real, v, f1))}" if real else f"vs {v}:")
            + (f", synthetic {wins[v]}/{len(synth)} settings" if synth else "") for v in present)
        parts.append(f"{F1_NAMES[f1]} — {word}: {detail}")
    return Claim(text, _combine(words), "; ".join(parts), source)


def claims(summary: Dict[str, Any]) -> List[Claim]:
    rs = "r_softmax"
    out = [
        _comparison(summary, "r-softmax beats sparsemax (huber and hinge losses) and sparsehourglass", SOURCE, rs,
                    SPARSE_RIVALS, lambda a, b: a > b, lambda a, b: f"{a:.3f} vs {b:.3f}"),
        _comparison(summary, f"r-softmax is on par with softmax at its best threshold (within {APPROX_TOLERANCE:.2f} "
                    "F1 or better)", SOURCE, rs, [BEST_SOFTMAX], lambda a, b: a >= b - APPROX_TOLERANCE,
                    lambda a, b: f"{a - b:+.3f}"),
        _comparison(summary, "sparsemax with its own loss is competitive with softmax + threshold and with "
                    f"per-label logistic outputs (within {APPROX_TOLERANCE:.2f} F1 or better)",
                    "sparsemax paper (Martins & Astudillo 2016), multi-label experiments", "sparsemax+huber",
                    [BEST_SOFTMAX, "sigmoid"], lambda a, b: a >= b - APPROX_TOLERANCE, lambda a, b: f"{a - b:+.3f}"),
    ]
    out += [_count_claim(summary), _ev_claim(summary)]
    return [c for c in out if c is not None]


def _count_claim(summary: Dict[str, Any]) -> Claim:
    """Whether r-softmax's failures are failures of its ranking or of its label count."""
    text = "r-softmax: ranking vs. label count (known-count top-k F1 and count accuracy)"
    real, synth, rs = summary["real"], summary["synthetic"], "r_softmax"
    if rs not in summary["variants"]:
        return Claim(text, NOT_TESTABLE, "r_softmax was not run", "new diagnostic")
    tables = ([(summary["real_name"], real)] if real else []) + list(synth.items())
    rivals = [v for v in ("sparsemax+hinge", BEST_SOFTMAX, "ev_softmax") if v in summary["variants"]]
    parts = []
    for name, t in tables:
        if rs not in t:
            continue
        parts.append(f"{name}: count accuracy {_mean(t, rs, 'count_accuracy'):.2f}, example F1 "
                     f"{_mean(t, rs, 'example_f1'):.3f}, known-count top-k F1 {_mean(t, rs, 'known_count_topk_f1'):.3f}"
                     + "".join(f" ({v} {_mean(t, v, 'known_count_topk_f1'):.3f})" for v in rivals))
    heads = summary["chosen"].get("r_softmax", {})
    if heads:
        parts.insert(0, "count head chosen on validation: " + ", ".join(f"{k.split('(')[1].split()[0]} {n}×"
                                                                          for k, n in heads.items()))
    return Claim(text, NEW, "; ".join(parts), "new diagnostic")


def _ev_claim(summary: Dict[str, Any]) -> Claim:
    text = "where ev-softmax lands (neither paper tried it)"
    if "ev_softmax" not in summary["variants"]:
        return Claim(text, NOT_TESTABLE, "ev_softmax was not run", "new comparison")
    shown = [v for v in summary["variants"] if not v.startswith("softmax (p0=") and not v.startswith("r_softmax (")]
    parts = []
    for f1 in F1S:
        if summary["real"]:
            order = sorted(shown, key=lambda v: -_mean(summary["real"], v, f1))
            rank = f"rank {order.index('ev_softmax') + 1} of {len(order)} on {summary['real_name']}"
        else:
            rank = "no real data"
        ranks = [sorted(shown, key=lambda v: -_mean(t, v, f1)).index("ev_softmax") + 1
                 for t in summary["synthetic"].values()]
        parts.append(f"{F1_NAMES[f1]}: {rank}" + (f", mean rank {np.mean(ranks):.1f} over {len(ranks)} synthetic "
                                                  "settings" if ranks else ""))
    if summary["real"]:
        parts.append(f"{summary['real_name']} example F1, best first: " + ", ".join(
            f"{v} {_mean(summary['real'], v, 'example_f1'):.3f}"
            for v in sorted(shown, key=lambda v: -_mean(summary["real"], v, "example_f1"))))
    return Claim(text, NEW, "; ".join(parts), "new comparison")


def setting_table(summary: Dict[str, Any], metric: str = "example_f1") -> Tuple[List[str], List[List[str]]]:
    shown = [v for v in summary["variants"] if not v.startswith("softmax (p0=")]
    rows = []
    for key, table in summary["synthetic"].items():
        values = [_mean(table, v, metric) for v in shown]
        top = np.nanmax(values)
        rows.append([key] + [f"**{x:.3f}**" if x == top else f"{x:.3f}" for x in values])
    return ["setting"] + shown, rows
