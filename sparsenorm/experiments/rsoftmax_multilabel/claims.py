"""Summaries over seeds and the verdicts, with example-based, micro and macro F1 side by side.

Every method of a (data set, seed) trains on the same split, so methods are compared by paired
differences, under the one rule of :mod:`sparsenorm.experiments._shared.verdict`: on the real data
set the pairs are its seeds; on synthetic data the unit is the *setting* of the sweeps (its mean over
seeds, paired across methods): the seeds of one setting share its generator parameters, so they are
not independent replicates of the sweep, and pooling (setting, seed) pairs would overstate the
evidence (15 settings x 6 seeds is 15 units, not 90). A claim is judged part by part: each rival,
under each F1, on real and on synthetic data; its primary comparison is every rival the paper's
sentence names (all of them: "outperforms other sparse softmax alternatives", "the best results"),
in each F1 judged (the paper says only "F1"), on the paper's kind of data (real for Table 1, the
sweep for Fig. 2); the rest secondary. "On par" claims are non-inferiority tests with the margin
:data:`APPROX_TOLERANCE`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._shared import verdict
from .._shared.verdict import NEW, NOT_TESTABLE, Claim
from .methods import fixed_softmax_variant
from .paper import BEST_SOFTMAX, CLASS_COUNTS, FIXED_THRESHOLDS, SOURCE

F1S = ("example_f1", "micro_f1", "macro_f1")
F1_NAMES = {"example_f1": "example F1", "micro_f1": "micro F1", "macro_f1": "macro F1"}
SUMMARY_METRICS = F1S + ("mean_set_size", "true_mean_set_size", "known_count_topk_f1", "count_accuracy", "select_f1")
APPROX_TOLERANCE = 0.02
"""Margin of the "on par" claims, in F1: at least the standard error of a test-set F1 here (per-example F1
lies in [0, 1], so its standard deviation is at most 0.5 and the SE on yeast's ~900 test examples at most
0.017); a gap smaller than that could not be told apart on one test set even with many seeds."""
MARGIN_SOURCE = "the standard error of a test-set F1 on yeast's ~900 test examples"
SPARSE_RIVALS = ("sparsemax+huber", "sparsemax+hinge", "sparsehourglass")
MANY_CLASSES = 20
"""Fig. 2a: r-softmax is best "especially when the data set has a large number of possible output classes" (20, 30)."""
SUBSET_NAMES = {"many_classes_label_sweep": f"label-count sweep, {MANY_CLASSES}+ classes",
                "many_classes": f"every synthetic setting with {MANY_CLASSES}+ classes",
                "length_sweep": "document-length sweep", "real_curve_area": "yeast, mean of the test learning curve",
                "real_curve_early": "yeast, mean of the first tenth of the test learning curve",
                "few_classes": f"every synthetic setting with fewer than {MANY_CLASSES} classes"}


EARLY_FRACTION = 0.1
"""Fig. 3's "converge faster": the first tenth of the epochs (10 of 100 in decisive mode)."""


def _early(curve: Sequence[float]) -> Sequence[float]:
    return list(curve)[:max(1, int(round(EARLY_FRACTION * len(curve))))]


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


def _paired(records: List[Dict[str, Any]], variants: Sequence[str], unit) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``{variant: {f1: {unit: score}}}``: the scores of every paired unit (a seed, or a setting and seed)."""
    return {v: {f1: {unit(r): r["methods"][v][f1] for r in records if v in r["methods"]} for f1 in F1S}
            for v in variants}


def _paired_settings(records: List[Dict[str, Any]], variants: Sequence[str]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``{variant: {f1: {setting: mean over its seeds}}}``: the setting as the paired unit (seeds that every compared
    variant has are averaged; a variant's mean is over the seeds it ran)."""
    by_setting: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        by_setting.setdefault(setting_key(r), []).append(r)
    return {v: {f1: {k: float(np.mean([r["methods"][v][f1] for r in rs if v in r["methods"]]))
                     for k, rs in by_setting.items() if any(v in r["methods"] for r in rs)} for f1 in F1S}
            for v in variants}


def seeds_per_setting(records: List[Dict[str, Any]]) -> int:
    """The largest number of seeds a synthetic setting has (for "N settings x S seeds")."""
    counts: Dict[str, int] = {}
    for r in records:
        if r["dataset"] == "synthetic":
            counts[setting_key(r)] = counts.get(setting_key(r), 0) + 1
    return max(counts.values(), default=0)


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
        # synthetic: the setting is the unit (its mean over seeds); real: the seed
        "seeds_per_setting": seeds_per_setting(synthetic),
        "paired": {"real": _paired(real, variants, lambda r: str(r["seed"])),
                   "synthetic": _paired_settings(synthetic, variants)},
        # Fig. 2a with many classes (20 and 30) and Fig. 2b: the sweeps' own subsets of the synthetic settings.
        "paired_subsets": {
            "many_classes_label_sweep": _paired_settings([r for r in synthetic if r.get("sweep") in ("labels", "both")
                                                          and r["data"]["n_classes"] >= MANY_CLASSES], variants),
            "length_sweep": _paired_settings([r for r in synthetic if r.get("sweep") in ("length", "both")], variants),
            # Fig. 2's omitted fixed thresholds: every setting of either sweep at 20 and 30 classes
            "many_classes": _paired_settings([r for r in synthetic if r["data"]["n_classes"] >= MANY_CLASSES],
                                             variants),
            # Fig. 3: the learning curve's mean over epochs (its area) per seed, on the real data's test F1
            "real_curve_area": {v: {"example_f1": {str(r["seed"]): float(np.mean(r["methods"][v]["curve"]))
                                                   for r in real if "curve" in r["methods"].get(v, {})}}
                                for v in variants},
            # Fig. 3 "converge faster": the curve's mean over its first EARLY_FRACTION of epochs, per seed
            "real_curve_early": {v: {"example_f1": {str(r["seed"]): float(np.mean(_early(r["methods"][v]["curve"])))
                                                    for r in real if "curve" in r["methods"].get(v, {})}}
                                 for v in variants},
            # Fig. 2 (10 output classes): every setting of either sweep at fewer than MANY_CLASSES classes
            "few_classes": _paired_settings([r for r in synthetic if r["data"]["n_classes"] < MANY_CLASSES], variants)},
        "real": _summarise(real, variants),
        "synthetic": {k: _summarise(rs, variants) for k, rs in by_setting.items()},
        "chosen": {name: {c: picks.count(c) for c in sorted(set(picks))} for name, picks in chosen.items()},
        "seconds_per_run": {m: float(np.mean([r["seconds"][m] for r in records if m in r["seconds"]]))
                            for m in dict.fromkeys(k for r in records for k in r["seconds"])},
    }


def _mean(table: Dict[str, Any], variant: str, metric: str) -> float:
    return table[variant][metric]["mean"] if variant in table and metric in table[variant] else float("nan")


def _comparison(summary: Dict[str, Any], text: str, source: str, subject: str, rivals: Sequence[str], key: str,
                margin: Optional[float] = None, subset: Optional[str] = None, primary_where: str = "real",
                equivalent: bool = False) -> Claim:
    """``subject`` against each rival under each F1, on real seeds and on synthetic settings (or on one subset of
    the synthetic settings): a direction test ("beats"), or with ``margin`` a non-inferiority test ("on par or
    better"). Primary: every rival present (the paper's sentences name them as a group), in each F1 judged, on
    ``primary_where`` (or the subset); the other data secondary."""
    present = [v for v in rivals if v in summary["variants"]]
    if subject not in summary["variants"] or not present:
        return Claim(text, NOT_TESTABLE, f"needs {subject} and one of {', '.join(rivals)}", source, key)
    tests = []
    tables = ({k: summary["paired"][k] for k in ("real", "synthetic")} if subset is None
              else {subset: summary.get("paired_subsets", {}).get(subset, {})})
    per_setting = summary.get("seeds_per_setting")
    for where, paired in tables.items():
        names = {"real": summary["real_name"], "synthetic": "synthetic sweeps"}
        name = names.get(where, SUBSET_NAMES.get(where, where))
        unit = "seeds" if where in ("real", "real_curve_area", "real_curve_early") else (
            f"settings × {per_setting} seeds" if per_setting else "settings")
        for v in present:
            for f1 in F1S:
                if not paired.get(subject, {}).get(f1) or not paired.get(v, {}).get(f1):
                    continue
                d = verdict.paired_differences(paired[subject][f1], paired[v][f1])
                label = f"vs {v}, {F1_NAMES[f1]}, {name}"
                if margin is None:
                    test = verdict.direction(d, label)
                elif equivalent:
                    test = verdict.equivalence(d, margin, label)
                else:
                    test = verdict.non_inferiority(d, margin, label, margin_source=MARGIN_SOURCE)
                is_primary = subset is not None or where == primary_where
                tests.append((not is_primary, replace(test, unit=unit)))
    if not tests:
        return Claim(text, NOT_TESTABLE, "no paired scores for this comparison in this run", source, key)
    ordered = [t for _, t in sorted(tests, key=lambda bt: bt[0])]  # primary parts first, order kept otherwise
    primary = sum(1 for secondary, _ in tests if not secondary) or len(ordered)
    where_name = {"real": summary["real_name"], "synthetic": "the synthetic sweeps"}.get(primary_where, primary_where)
    judged_f1s = [F1_NAMES[f1] for f1 in F1S if any(f" {F1_NAMES[f1]}, " in t.label for t in ordered[:primary])]
    f1_words = ", ".join(judged_f1s) or "F1"
    note = (f"Primary: vs {', '.join(present)} in {f1_words}" + ("" if subset else f" on {where_name}") +
            ("; the rest secondary" if primary < len(ordered) else ""))
    return verdict.claim(text, ordered, source, key, note=note, primary=primary)


def claims(summary: Dict[str, Any]) -> List[Claim]:
    rs = "r_softmax"
    out = [
        _comparison(summary, "r-softmax beats sparsemax (huber and hinge losses) and sparsehourglass", SOURCE, rs,
                    SPARSE_RIVALS, "r.multilabel.beats_sparse"),
        _comparison(summary, f"r-softmax is on par with softmax at its best threshold (at most {APPROX_TOLERANCE:.2f} "
                    "F1 below, or better)", SOURCE, rs, [BEST_SOFTMAX], "r.multilabel.on_par_softmax",
                    margin=APPROX_TOLERANCE),
        _comparison(summary, "sparsemax with its own loss is competitive with softmax + threshold and with "
                    f"per-label logistic outputs (at most {APPROX_TOLERANCE:.2f} F1 below, or better)",
                    "sparsemax paper (Martins & Astudillo 2016), multi-label experiments", "sparsemax+huber",
                    [BEST_SOFTMAX, "sigmoid"], "sm.multilabel.competitive", margin=APPROX_TOLERANCE,
                    primary_where="synthetic"),
    ]
    rivals = [BEST_SOFTMAX, *SPARSE_RIVALS]
    out += [
        _comparison(summary, f"r-softmax is the best method as the average number of labels grows with {MANY_CLASSES}+ "
                    "classes (beats the best softmax and the sparse rivals)", "r-softmax paper Sec. 4.1, Fig. 2a", rs,
                    rivals, "r.multilabel.best_many_labels", subset="many_classes_label_sweep"),
        _comparison(summary, f"r-softmax is superior or comparable across document lengths (at most "
                    f"{APPROX_TOLERANCE:.2f} F1 below any rival, or better)", "r-softmax paper Sec. 4.1, Fig. 2b", rs,
                    rivals, "r.multilabel.document_length", margin=APPROX_TOLERANCE, subset="length_sweep"),
    ]
    fixed = ", ".join(f"{p:g}" for p in FIXED_THRESHOLDS)
    out.append(_comparison(summary, f"softmax with a fixed threshold p0 in {{{fixed}}} "
                           f"does worse with {MANY_CLASSES}+ classes than softmax with its threshold chosen on "
                           "validation (the paper omits it from Fig. 2 as 'significantly worse')",
                           "r-softmax paper Sec. 4.1, Fig. 2", BEST_SOFTMAX,
                           [fixed_softmax_variant(p) for p in FIXED_THRESHOLDS], "r.multilabel.fixed_threshold_fails",
                           subset="many_classes"))
    out.append(_comparison(summary, "r-softmax learns better than the other sparse alternatives over training (its "
                           "learning curve lies above theirs)", "r-softmax paper Sec. 4.1, Fig. 3", rs, SPARSE_RIVALS,
                           "r.multilabel.learning_curves", subset="real_curve_area"))
    out.append(_comparison(summary, f"with few output classes ({CLASS_COUNTS[0]}) all functions give similar "
                           f"results: r-softmax within ±{APPROX_TOLERANCE:.2f} F1 of the best softmax and the sparse "
                           "rivals",
                           "r-softmax paper Sec. 4.1, Fig. 2 caption, Fig. 2a-2b text", rs, rivals,
                           "r.multilabel.similar_few_classes", margin=APPROX_TOLERANCE, subset="few_classes",
                           equivalent=True))
    out.append(_comparison(summary, "some softmax versions with a particular threshold converge faster than r-softmax "
                           "(judged: softmax at its validation-chosen threshold above r-softmax over the first tenth "
                           "of the epochs)", "r-softmax paper Sec. 4.1, Fig. 3", BEST_SOFTMAX, [rs],
                           "r.multilabel.softmax_converges_faster", subset="real_curve_early"))
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
