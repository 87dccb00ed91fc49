"""Summaries over seeds and the verdicts on Sec. 4.1's claims, per training setting.

Each metric (see :mod:`.training`) is summarised per seed as its mean over the checkpoints of the
paper's figure window (the first ``window_steps`` steps; Fig. 3's x axis is checkpoint index x 100,
so its "6,000 iterations" are about 5,100 steps) and its value at the end of training, both
averaged over the two queries; then over seeds as mean, std (ddof 1) and standard error. Since every
normalizer of a setting trains on the same seeds, ev-softmax is also compared with the others seed by
seed (wins and a Wilcoxon signed-rank test): a difference of means within the spread over seeds shows
there.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats as scipy_stats

from .._shared.runner import NOT_REPRODUCED, NOT_TESTABLE, PARTLY, REPRODUCED, Claim
from .model import QUERIES
from .training import LOWER_IS_BETTER, METRICS

METRIC_NAMES = {"w_digits": "W, digit positions (ours)", "w_authors": "W, authors' metric (probabilities as values)",
                "parity_mass": "prior mass on the query's parity (direct test)"}
EV, POSTHOC = "ev_softmax", "posthoc_evidential"
SOURCE = "Sec. 4.1, Fig. 3"
# Below 6 pairs no two-sided Wilcoxon signed-rank p can reach 0.05 (its smallest value is 2 / 2**n).
MIN_PAIRS_FOR_TEST = 6


def stats(values: Sequence[float]) -> Dict[str, float]:
    arr = np.asarray(values, dtype=float)
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "sem": std / np.sqrt(arr.size), "n": int(arr.size)}


def fmt(s: Dict[str, float], digits: int = 3) -> str:
    """``mean ± std (se)``."""
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} ({s['sem']:.{digits}f})"


def seed_scores(result: Dict[str, Any], window_steps: int) -> Dict[str, Dict[str, float]]:
    """Per metric: mean over the figure window and final value (both averaged over queries), final per query."""
    curve = result["curve"]
    steps = np.asarray(curve["iteration"])
    inside = steps <= window_steps
    out = {}
    for m in METRICS:
        values = np.mean([curve[m][q] for q in QUERIES], axis=0)
        out[m] = {"window": float(values[inside].mean()), "final": float(values[-1]),
                  **{f"final_{q}": float(curve[m][q][-1]) for q in QUERIES}}
    return out


def aggregate(records: List[Dict[str, Any]], window_steps: int, lead: str, titles: Dict[str, str]) -> Dict[str, Any]:
    """``summary["results"][setting][normalizer]``: the statistics over seeds; ``lead`` names the lead setting."""
    grouped: Dict[str, Dict[str, List[Tuple[Dict[str, Any], Dict[str, Any]]]]] = {}
    for record in records:
        for name, result in record["normalizers"].items():
            grouped.setdefault(record["setting"], {}).setdefault(name, []).append((record, result))
    results: Dict[str, Dict[str, Any]] = {}
    for setting, by_name in grouped.items():
        results[setting] = {}
        for name, pairs in by_name.items():
            per_seed = [seed_scores(r, window_steps) for _, r in pairs]
            runs = [r for _, r in pairs]
            modes = {q: [len(r["support"][q]) for r in runs] for q in QUERIES}
            results[setting][name] = {
                "seeds": [rec["seed"] for rec, _ in pairs],
                "steps": pairs[0][0]["steps"],
                "trained_with": runs[0]["trained_with"],
                **{m: {k: stats([s[m][k] for s in per_seed]) for k in per_seed[0][m]} for m in METRICS},
                "per_seed": {m: {k: [s[m][k] for s in per_seed] for k in ("window", "final")} for m in METRICS},
                "nonzero_prior_modes": {q: stats(modes[q]) for q in QUERIES},
                "modes_above_1pct": {q: stats([r["modes_above_1pct"][q] for r in runs]) for q in QUERIES},
                "five_modes_seeds": sum(all(modes[q][i] == 5 for q in QUERIES) for i in range(len(runs))),
                "support_unchanged_seeds": sum(all(r["support"][q] == r["initial_support"][q] for q in QUERIES)
                                               for r in runs),
                "prior_change_since_init": stats([r["prior_change_since_init"] for r in runs]),
                "posterior_mean_support": stats([r["posterior_mean_support"] for r in runs]),
                "posterior_classes_used": stats([r["posterior_classes_used"] for r in runs]),
                "train_time_s": float(np.mean([rec["train_time_s"] for rec, _ in pairs])),
            }
    return {"lead": lead, "window_steps": window_steps, "titles": titles, "results": results}


def _better(metric: str, a: float, b: float) -> bool:
    return a < b if LOWER_IS_BETTER[metric] else a > b


def _ranking(table: Dict[str, Any], metric: str, when: str) -> List[str]:
    sign = 1 if LOWER_IS_BETTER[metric] else -1
    return sorted(table, key=lambda n: sign * table[n][metric][when]["mean"])


def _listing(table: Dict[str, Any], metric: str, when: str, names: Sequence[str]) -> str:
    """The values of ``names`` and of the best normalizer, best first."""
    order = _ranking(table, metric, when)
    shown = [n for n in order if n in names or n == order[0]]
    return ", ".join(f"{n} {table[n][metric][when]['mean']:.3f}" for n in shown)


def paired_comparison(table: Dict[str, Any], a: str, b: str, metric: str, when: str) -> Dict[str, Any]:
    """``a`` against ``b`` on the seeds both ran: in how many ``a`` scores better, and the two-sided
    Wilcoxon signed-rank p of the paired differences (``None`` below ``MIN_PAIRS_FOR_TEST`` pairs)."""
    score_a = dict(zip(table[a]["seeds"], table[a]["per_seed"][metric][when]))
    score_b = dict(zip(table[b]["seeds"], table[b]["per_seed"][metric][when]))
    seeds = sorted(set(score_a) & set(score_b))
    diffs = np.array([score_a[s] - score_b[s] for s in seeds])
    p = None
    if len(seeds) >= MIN_PAIRS_FOR_TEST:
        p = 1.0 if not diffs.any() else float(scipy_stats.wilcoxon(diffs).pvalue)
    return {"wins": sum(_better(metric, score_a[s], score_b[s]) for s in seeds), "n": len(seeds), "p": p}


def fmt_paired(c: Dict[str, Any]) -> str:
    """``7 of 10 (p 0.19)``."""
    return f"{c['wins']} of {c['n']}" + (f" (p {c['p']:.2g})" if c["p"] is not None else "")


def _per_metric_verdict(holds: Dict[str, bool]) -> str:
    if all(holds.values()):
        return REPRODUCED
    return PARTLY if any(holds.values()) else NOT_REPRODUCED


def _metric_claim(text: str, table: Dict[str, Any], needed: Sequence[str], test, rivals: Sequence[str] = ()) -> Claim:
    """A claim judged under each metric (on means over seeds): reproduced under all, partly under some,
    not under none. The evidence adds, per metric, how many seeds ev-softmax beats each of ``rivals`` in."""
    missing = [n for n in needed if n not in table]
    if missing or len(table) < 2:
        return Claim(text, NOT_TESTABLE, f"needs {', '.join(needed)} and another normalizer", SOURCE)
    holds = {m: bool(test(m)) for m in METRICS}

    def seed_by_seed(m: str) -> str:
        found = [r for r in rivals if r in table]
        if not found:
            return ""
        return " (seeds where ev_softmax is better, first ~5k / end: " + ", ".join(
            f"vs {r} {fmt_paired(paired_comparison(table, EV, r, m, 'window'))} / "
            f"{fmt_paired(paired_comparison(table, EV, r, m, 'final'))}" for r in found) + ")"

    evidence = "; ".join(
        f"{METRIC_NAMES[m]} {'holds' if holds[m] else 'fails'}: first ~5k steps {_listing(table, m, 'window', needed)}"
        f" / end {_listing(table, m, 'final', needed)}{seed_by_seed(m)}" for m in METRICS)
    return Claim(text, _per_metric_verdict(holds), evidence, SOURCE)


def judge(table: Dict[str, Any]) -> List[Claim]:
    """The verdicts of Sec. 4.1's claims in one training setting (``table``: normalizer -> statistics)."""
    def best(m: str, when: str) -> Optional[str]:
        return _ranking(table, m, when)[0] if table else None

    claims = [
        _metric_claim("ev-softmax converges the fastest and to the lowest distance to the true prior", table, [EV],
                      lambda m: best(m, "window") == EV and best(m, "final") == EV, rivals=["softmax", POSTHOC]),
        _metric_claim("post-hoc evidential ends second, converging more slowly than ev-softmax", table, [EV, POSTHOC],
                      lambda m: len(table) > 1 and _ranking(table, m, "final")[1] == POSTHOC
                      and _better(m, table[EV][m]["window"]["mean"], table[POSTHOC][m]["window"]["mean"]),
                      rivals=[POSTHOC]),
        _metric_claim("softmax converges more slowly than ev-softmax and to a worse distance", table, [EV, "softmax"],
                      lambda m: all(_better(m, table[EV][m][w]["mean"], table["softmax"][m][w]["mean"])
                                    for w in ("window", "final")), rivals=["softmax"]),
    ]
    # Sec. 4.1: sparsemax "collapsed both the prior and posterior distributions to a single mode";
    # entmax-1.5 "reduces the posterior latent space to fewer than ten classes"; both "do not allow
    # the model to converge toward the true prior": judged on the posterior (latent classes ever
    # chosen) and the end-of-training scores against ev-softmax's.
    for name, label, limit, wording in (("sparsemax", "sparsemax", 2, "a single latent class"),
                                        ("entmax15", "entmax-1.5", 10, "fewer than ten latent classes")):
        text = f"{label} collapses the posterior to {wording} and does not converge toward the true prior"
        if name not in table:
            claims.append(Claim(text, NOT_TESTABLE, f"{name} was not run", "Sec. 4.1"))
            continue
        s = table[name]
        worse = EV not in table or all(not _better(m, s[m]["final"]["mean"], table[EV][m]["final"]["mean"])
                                       for m in ("w_digits", "parity_mass"))
        claims.append(Claim.judge(
            text, s["posterior_classes_used"]["mean"] < limit and worse,
            f"latent classes used by the posterior {fmt(s['posterior_classes_used'], 1)} (support "
            f"{fmt(s['posterior_mean_support'], 2)} per image); at the end W (digits) {s['w_digits']['final']['mean']:.3f}, "
            f"parity mass {s['parity_mass']['final']['mean']:.3f}"
            + (f" vs ev-softmax {table[EV]['w_digits']['final']['mean']:.3f}, {table[EV]['parity_mass']['final']['mean']:.3f}"
               if EV in table else "")
            + f"; nonzero prior modes even {fmt(s['nonzero_prior_modes']['even'], 1)}, odd {fmt(s['nonzero_prior_modes']['odd'], 1)}",
            "Sec. 4.1"))
    text = "ev-softmax learns a prior with five nonzero modes per query, on the digits of the query's parity"
    if EV not in table:
        claims.append(Claim(text, NOT_TESTABLE, "ev_softmax was not run", "Sec. 4.1, Fig. 2"))
    else:
        s = table[EV]
        n = len(s["seeds"])
        mass = s["parity_mass"]["final"]["mean"]
        five = s["five_modes_seeds"] == n
        learned = s["support_unchanged_seeds"] <= n / 2
        verdict = REPRODUCED if five and mass >= 0.8 and learned else (PARTLY if five else NOT_REPRODUCED)
        claims.append(Claim(text, verdict,
                            f"{s['five_modes_seeds']} of {n} seeds have exactly five modes for both queries; "
                            f"prior mass on the query's parity at the end {fmt(s['parity_mass']['final'])}; in "
                            f"{s['support_unchanged_seeds']} of {n} seeds the modes are exactly those of the prior at "
                            f"initialisation (total variation moved {fmt(s['prior_change_since_init'])})",
                            "Sec. 4.1, Fig. 2"))
    return claims


def claims(summary: Dict[str, Any]) -> List[Claim]:
    """The lead setting's verdicts, each with the sweep settings where the same claim holds."""
    results, lead = summary["results"], summary["lead"]
    if lead not in results:
        return []
    lead_claims = judge(results[lead])
    others = {s: judge(t) for s, t in results.items() if s != lead}
    for i, claim in enumerate(lead_claims):
        if not others:
            continue
        by_verdict: Dict[str, List[str]] = {}
        for setting, judged in others.items():
            by_verdict.setdefault(judged[i].verdict, []).append(summary["titles"].get(setting, setting))
        claim.evidence += ". Other settings of the sweep: " + "; ".join(
            f"{verdict} in {', '.join(names)}" for verdict, names in by_verdict.items())
    return lead_claims


def sweep_matrix(summary: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Rows: claims; columns: settings (lead first); cells: verdicts."""
    order = [summary["lead"]] + [s for s in summary["results"] if s != summary["lead"]]
    order = [s for s in order if s in summary["results"]]
    judged = {s: judge(summary["results"][s]) for s in order}
    header = ["claim"] + [summary["titles"].get(s, s) + (" (lead)" if s == summary["lead"] else "") for s in order]
    rows = [[c.claim] + [judged[s][i].verdict for s in order] for i, c in enumerate(judged[order[0]])] if order else []
    return header, rows
