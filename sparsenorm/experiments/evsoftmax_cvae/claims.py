"""Summaries over seeds and the verdicts on Sec. 4.1's claims, per training setting.

Each metric (see :mod:`.train`) is summarised per seed as its mean over the checkpoints of the
paper's figure window (the first ``window_steps`` steps; Fig. 3's x axis is checkpoint index x 100,
so its "6,000 iterations" are about 5,100 steps) and its value at the end of training, both
averaged over the two queries; then over seeds as mean, std (ddof 1) and standard error. Since every
normalizer of a setting trains on the same seeds, every comparison is paired by seed and judged by
the one rule of :mod:`sparsenorm.experiments._shared.verdict` (Wilcoxon signed-rank, 0.05): the
distance judged is the paper's Wasserstein distance between the digit distributions (``w_digits``);
the authors' variant and the parity mass are tested the same way and reported as notes.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .._shared import verdict
from .._shared.verdict import NOT_TESTABLE, Claim
from .model import QUERIES
from .paper import SOURCE
from .train import LOWER_IS_BETTER, METRICS

METRIC_NAMES = {"w_digits": "W, digit positions (ours)", "w_authors": "W, authors' metric (probabilities as values)",
                "parity_mass": "prior mass on the query's parity (direct test)"}
EV, POSTHOC = "ev_softmax", "posthoc_evidential"
MIN_PAIRS_FOR_TEST = verdict.min_pairs()  # below it no two-sided signed-rank p reaches the rule's level


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
                "per_seed_counts": {"prior_modes": [float(np.mean([modes[q][i] for q in QUERIES]))
                                                    for i in range(len(runs))],
                                    "posterior_classes": [float(r["posterior_classes_used"]) for r in runs]},
                "five_modes_seeds": sum(all(modes[q][i] == 5 for q in QUERIES) for i in range(len(runs))),
                "support_unchanged_seeds": sum(all(r["support"][q] == r["initial_support"][q] for q in QUERIES)
                                               for r in runs),
                "prior_change_since_init": stats([r["prior_change_since_init"] for r in runs]),
                "posterior_mean_support": stats([r["posterior_mean_support"] for r in runs]),
                "posterior_classes_used": stats([r["posterior_classes_used"] for r in runs]),
                "train_time_s": float(np.mean([rec["train_time_s"] for rec, _ in pairs])),
            }
    return {"lead": lead, "window_steps": window_steps, "titles": titles, "results": results}


def paired_comparison(table: Dict[str, Any], a: str, b: str, metric: str, when: str) -> Dict[str, Any]:
    """``a`` against ``b`` on the seeds both ran: in how many ``a`` scores better, and the two-sided
    Wilcoxon signed-rank p of the paired differences (``None`` below ``MIN_PAIRS_FOR_TEST`` pairs)."""
    score_a = dict(zip(table[a]["seeds"], table[a]["per_seed"][metric][when]))
    score_b = dict(zip(table[b]["seeds"], table[b]["per_seed"][metric][when]))
    seeds = sorted(set(score_a) & set(score_b))
    diffs = verdict.paired_differences(score_a, score_b, higher_is_better=not LOWER_IS_BETTER[metric])
    p = None
    if len(seeds) >= MIN_PAIRS_FOR_TEST:
        p = 1.0 if not diffs.any() else verdict.signed_rank_p(diffs)[0]
    return {"wins": int((diffs > 0).sum()), "n": len(seeds), "p": p}


def fmt_paired(c: Dict[str, Any]) -> str:
    """``7 of 10 (p 0.19)``."""
    return f"{c['wins']} of {c['n']}" + (f" (p {c['p']:.2g})" if c["p"] is not None else "")


JUDGED_METRIC = "w_digits"
"""The paper's distance to the true prior, computed between the distributions (see the module docstring);
the authors' variant (probabilities as values) and the parity mass are tested too, as notes."""


def _seed_map(table: Dict[str, Any], name: str, metric: str, when: str) -> Dict[int, float]:
    return dict(zip(table[name]["seeds"], table[name]["per_seed"][metric][when]))


def _beats(table: Dict[str, Any], a: str, b: str, metric: str, when: str) -> verdict.Test:
    """The rule's direction test: ``a`` scores better than ``b`` in ``metric`` at ``when``, paired by seed."""
    label = f"{a} vs {b}, {METRIC_NAMES[metric]}, {'first ~5k steps' if when == 'window' else 'end'}"
    diffs = verdict.paired_differences(_seed_map(table, a, metric, when), _seed_map(table, b, metric, when),
                                       higher_is_better=not LOWER_IS_BETTER[metric])
    return verdict.direction(diffs, label)


def _per_seed(table: Dict[str, Any], name: str, key: str) -> List[float]:
    return list(table[name]["per_seed_counts"][key])


def _bound(values: Sequence[float], limit: float, label: str, below: bool = True) -> verdict.Test:
    """Per-seed values below (or above) ``limit``: the rule's direction test of their distances to the bound."""
    diffs = [limit - v if below else v - limit for v in values]
    return verdict.direction(diffs, f"{label} {'<' if below else '>'} {limit:g}")


Triple = Tuple[str, str, str]  # (a, b, when): a scores better than b at "window" or "final"


def _notes(table: Dict[str, Any], triples: Sequence[Triple], primary: int) -> str:
    """The same tests under the other two scores, for the reader (not part of the verdict)."""
    other = [m for m in METRICS if m != JUDGED_METRIC]
    return "Under " + " and ".join(
        f"{METRIC_NAMES[m]}: "
        f"{verdict.claim('', [_beats(table, a, b, m, w) for a, b, w in triples], primary=primary).verdict}"
        for m in other)


def _comparison_claim(text: str, table: Dict[str, Any], triples: Sequence[Triple], key: str, primary: int = 1,
                      what: str = "") -> Claim:
    """The first ``primary`` triples are the claim's primary comparison (``what`` names it in the note)."""
    missing = sorted({n for a, b, _ in triples for n in (a, b) if n not in table})
    if missing or not triples:
        return Claim(text, NOT_TESTABLE, f"needs {', '.join(missing) or 'another normalizer'}", SOURCE, key)
    tests = [_beats(table, a, b, JUDGED_METRIC, w) for a, b, w in triples]
    note = (f"Primary: {what}. " if what else "") + _notes(table, triples, primary)
    return verdict.claim(text, tests, SOURCE, key, note=note, primary=primary)


def judge(table: Dict[str, Any]) -> List[Claim]:
    """The verdicts of Sec. 4.1's claims in one training setting (``table``: normalizer -> statistics)."""
    others = sorted((n for n in table if n != EV), key=lambda n: n != "softmax")  # softmax first in the evidence
    behind_posthoc = [n for n in others if n != POSTHOC]
    claims = [
        _comparison_claim("ev-softmax converges the fastest and to the lowest distance to the true prior", table,
                          [(EV, r, w) for r in others for w in ("window", "final")], "ev.cvae.fastest_lowest",
                          primary=max(1, 2 * len(others)),
                          what="ev-softmax vs every other normalizer, early and at the end (\"converges the fastest "
                               "and obtains the lowest distance\")"),
        _comparison_claim("post-hoc evidential ends second, converging more slowly than ev-softmax", table,
                          [(POSTHOC, r, "final") for r in behind_posthoc] + [(EV, POSTHOC, "window")],
                          "ev.cvae.posthoc_second", primary=max(1, len(behind_posthoc)),
                          what="post-hoc below every normalizer but ev-softmax at the end (\"the second lowest "
                               "Wasserstein distance\"); converging more slowly than ev-softmax secondary"),
        _comparison_claim("softmax converges more slowly than ev-softmax and to a worse distance", table,
                          [(EV, "softmax", "window"), (EV, "softmax", "final")], "ev.cvae.softmax_slower", primary=2,
                          what="both parts (the claim is this one comparison)"),
    ]
    # Sec. 4.1: sparsemax "collapsed both the prior and posterior distributions to a single mode";
    # entmax-1.5 "reduces the posterior latent space to fewer than ten classes"; both "do not allow
    # the model to converge toward the true prior". Judged per seed: the prior's nonzero modes (mean
    # over the two queries) and the latent classes the posterior uses, against the paper's bound;
    # and ev-softmax's end-of-training distance against theirs, paired by seed.
    for name, label, parts, key in (
            ("sparsemax", "sparsemax", (("prior", 1.5, "a single mode"), ("posterior", 1.5, "a single mode")),
             "ev.cvae.sparsemax_collapse"),
            ("entmax15", "entmax-1.5", (("posterior", 9.5, "fewer than ten classes"),), "ev.cvae.entmax_fewer")):
        what = " and ".join(f"the {where} to {words}" for where, _, words in parts)
        text = f"{label} collapses {what} and does not converge toward the true prior"
        if name not in table or EV not in table:
            claims.append(Claim(text, NOT_TESTABLE, f"needs {name} and ev_softmax", "Sec. 4.1", key))
            continue
        counts = {"prior": _per_seed(table, name, "prior_modes"),
                  "posterior": _per_seed(table, name, "posterior_classes")}
        tests = [_bound(counts[where], limit, f"{name}'s {where} " + ("nonzero modes" if where == "prior"
                                                                         else "latent classes used"))
                 for where, limit, _ in parts]
        tests.append(_beats(table, EV, name, JUDGED_METRIC, "final"))
        claims.append(verdict.claim(text, tests, "Sec. 4.1", key, digits=2, primary=len(parts),
                                    note="Primary: the collapse; secondary: ev-softmax ends closer to the true prior"))
    text = "ev-softmax learns a prior with five nonzero modes per query, on the digits of the query's parity"
    if EV not in table:
        claims.append(Claim(text, NOT_TESTABLE, "ev_softmax was not run", "Sec. 4.1, Fig. 2", "ev.cvae.five_modes"))
    else:
        s = table[EV]
        n = len(s["seeds"])
        tests = [verdict.equivalence([m - 5 for m in _per_seed(table, EV, "prior_modes")], 0.5,
                                     "nonzero prior modes (mean over the two queries) = 5"),
                 _bound(s["per_seed"]["parity_mass"]["final"], PARITY_MASS_BOUND,
                        "prior mass on the query's parity at the end", below=False)]
        claims.append(verdict.claim(
            text, tests, "Sec. 4.1, Fig. 2", "ev.cvae.five_modes",
            note=(f"Margin 0.5 modes: modes are whole numbers, so inside it means exactly five; parity-mass bound "
                  f"{PARITY_MASS_BOUND:g} (four fifths of the mass on the right digits). Primary: five modes; "
                  f"secondary: the parity mass. In {s['support_unchanged_seeds']} "
                  f"of {n} seeds the modes are exactly those of the prior at initialisation (total variation moved "
                  f"{fmt(s['prior_change_since_init'])})")))
    return claims


PARITY_MASS_BOUND = 0.8


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
