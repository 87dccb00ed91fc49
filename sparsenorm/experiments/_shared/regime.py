"""Regime gates: the measurable condition under which a paper's comparison is meaningful, checked on every run.

A paper makes its claims in a regime (a classifier that the unlabelled data helps, a codebook that is
used, a translation model that translates, ...). A run outside that regime still gives paired
differences, but they judge our small setup rather than the method. So every experiment states one
:class:`Gate` in its ``paper.py``, beside the paper's numbers, with the reason the comparison needs it,
and a ``measure`` that reads the gate's figure from the run's own summary and records (so a committed
``results.json(.gz)`` is re-judged without training, see ``sparsenorm.experiments.committed.rejudge``).

The gate is a separate step applied *after* a claim's verdict is formed by the rule of
:mod:`.verdict`::

    result = regime.evaluate(gate, summary, records, settings)   # once per run; stored in results.json
    claim = regime.apply(result, claim)                  # per claim

When the run meets its gate the verdict is unchanged. When it misses it, or the gate cannot be
measured from the run, every verdict of the rule (reproduced, partly, not reproduced, inconclusive)
reads :data:`NOT_IN_REGIME` with the measured figure and the gate, e.g. "not in the paper's regime
(measured softmax 86.6 %; gate softmax >= 95 %)", and the rule's own verdict opens the evidence.
A run that misses its gate therefore never reads "not reproduced" (nor "reproduced"). Verdicts that
are not judgements of the rule (new comparison, not testable, not run) are left as they are.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .verdict import INCONCLUSIVE, NOT_REPRODUCED, PARTLY, REPRODUCED

NOT_IN_REGIME = "not in the paper's regime"
"""The verdict of a claim judged by a run that misses its experiment's gate (followed by the figure)."""

JUDGED = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE)
"""The rule's verdicts, which a missed gate replaces."""


@dataclass(frozen=True)
class Measured:
    """What a gate's ``measure`` returns: whether the run meets the gate, and the figure it measured."""

    met: Optional[bool]
    """True / False; None when this run cannot measure it (e.g. the normalizer the gate reads did not run)."""
    figure: str
    """The measured figure in a few words, e.g. "softmax 86.6 %, 5 of 5 methods below their warm start"."""
    detail: str = ""
    """More of the measurement (per method, per seed) for the report and the evidence; not in the verdict."""


@dataclass(frozen=True)
class Gate:
    """An experiment's regime gate, stated in its ``paper.py``."""

    condition: str
    """The measurable condition, with its threshold (a sentence)."""
    short: str
    """The threshold in a few words, as the verdict shows it (e.g. "softmax >= 95 %, no fall")."""
    reason: str
    """Why the paper's comparison needs it."""
    paper: str
    """The paper's (or the published) figure the condition is set against."""
    measure: Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], Any], Measured]
    """``measure(summary, records, settings)``: the figure, from the run's own aggregate, per-job records and
    settings (all three are in its ``results.json``)."""


def evaluate(gate: Optional[Gate], summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
             settings: Any = None) -> Optional[Dict[str, Any]]:
    """The gate's result on one run, as stored in ``results.json["regime"]`` (None: the experiment has no gate).

    A ``measure`` that fails on this run's numbers (a missing key: the run lacks what the gate reads)
    gives ``met = None`` with the reason, which :func:`apply` treats as a miss."""
    if gate is None:
        return None
    try:
        measured = gate.measure(summary, records, settings)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        measured = Measured(None, f"not measurable from this run ({type(exc).__name__}: {exc})")
    if measured.met not in (True, False, None):
        raise TypeError(f"a gate's measure must return met True, False or None, got {measured.met!r}")
    return {"condition": gate.condition, "short": gate.short, "reason": gate.reason, "paper": gate.paper,
            "met": measured.met, "measured": measured.figure, "detail": measured.detail}


def missed(result: Optional[Mapping[str, Any]]) -> bool:
    """Whether a gate result (from :func:`evaluate` or a results.json) puts the run outside the paper's regime."""
    return result is not None and result.get("met") is not True


def regime_verdict(result: Mapping[str, Any]) -> str:
    """The verdict a missed gate gives: :data:`NOT_IN_REGIME` with the measured figure and the gate."""
    return f"{NOT_IN_REGIME} (measured {result['measured']}; gate {result['short']})"


def is_out_of_regime(verdict: str) -> bool:
    """Whether a verdict (as stored) is a missed gate's."""
    return verdict.startswith(NOT_IN_REGIME)


def tally_key(verdict: str) -> str:
    """A verdict as counted in summaries: every missed gate's verdict counts as :data:`NOT_IN_REGIME`."""
    return NOT_IN_REGIME if is_out_of_regime(verdict) else verdict


def apply(result: Optional[Mapping[str, Any]], claim):
    """``claim`` (a :class:`.verdict.Claim`) as the gate ``result`` leaves it (see the module docstring)."""
    if not missed(result) or claim.verdict not in JUDGED:
        return claim
    measured = result["measured"] + (f" ({result['detail']})" if result.get("detail") else "")
    evidence = (f"The rule alone would read *{claim.verdict}*: {claim.evidence} [Outside the paper's regime: "
                f"{result['condition']} Measured: {measured}.]")
    return dataclasses.replace(claim, verdict=regime_verdict(result), evidence=evidence)


def apply_all(result: Optional[Mapping[str, Any]], claims: Sequence[Any]) -> List[Any]:
    return [apply(result, c) for c in claims]


def gate_of(experiment: Any) -> Optional[Gate]:
    """The gate an experiment declares (its ``regime_gate`` attribute, from its ``paper.py``), or None."""
    return getattr(experiment, "regime_gate", None)


def judge(experiment: Any, summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]], settings: Any,
          claims: Sequence[Any]):
    """The runner's (and ``rejudge``'s) one step: the gate's result on this run and the claims it leaves."""
    result = evaluate(gate_of(experiment), summary, records, settings)
    return result, apply_all(result, claims)


def status(result: Optional[Mapping[str, Any]]) -> str:
    """The gate in a table cell: "met (figure)", "missed (figure)", "not measured (...)", or "–" without a gate."""
    if result is None:
        return "–"
    word = {True: "met", False: "missed"}.get(result.get("met"), "not measured")
    return f"{word}: {result['measured']} (gate {result['short']})"


def section(result: Optional[Mapping[str, Any]]) -> str:
    """The report's "Paper's regime" section (empty without a gate)."""
    if result is None:
        return ""
    verdict = {True: "**Met.**", False: "**Missed.**"}.get(result.get("met"), "**Not measured.**")
    consequence = ("The verdicts below are the rule's." if result.get("met") is True else
                   f"Every verdict of the rule below therefore reads *{NOT_IN_REGIME}* (with the measured figure); "
                   "the rule's own verdict is kept in its evidence.")
    measured = result["measured"] + (f" ({result['detail']})" if result.get("detail") else "")
    return (f"## Paper's regime\n\n{verdict} Gate: {result['condition']} Measured: {measured}. "
            f"Paper: {result['paper']}. Why: {result['reason']} {consequence}\n\n")


__all__ = ["NOT_IN_REGIME", "JUDGED", "Measured", "Gate", "evaluate", "missed", "regime_verdict", "is_out_of_regime",
           "tally_key", "apply", "apply_all", "gate_of", "judge", "status", "section"]
