"""``sparsenorm reproduce --index RESULTS``: ``RESULTS/README.md``, every claim of the three papers.

Built from the committed ``results.json`` (or ``results.json.gz``) files under
``RESULTS/<mode>/<experiment>/`` alone and from the catalogue of claims it is given (every claim of the papers,
gathered by :mod:`sparsenorm.experiments.catalogue` from each experiment's ``paper.py`` and
:mod:`.paper_claims`, which this module cannot import: ``_shared`` imports no experiment): each catalogued
claim gets the verdict of the run that judged it on the most paired units (a full or decisive run
before any quick one, whose verdicts are indicative; on equal units full before decisive),
its seeds, mode and a link to the report (and, when another run of equal standing reached another verdict, that
run's verdict beside it); a claim no run judged says why and what running it would
take; claims the runs made that the papers do not (new comparisons) follow in their own table.

Re-judging a committed run (and reusing its job records) loads the experiment, so it lives above
``_shared``: :mod:`sparsenorm.experiments.committed`; so does gathering the catalogue.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..._text import markdown_table
from . import regime
from .paper_claims import PaperClaim
from .verdict import NEW, NOT_RUN, NOT_TESTABLE, counts, label_mode, rule_paragraph

MODE_RANK = {"full": 0, "decisive": 1, "quick": 2}
CHECKED = "checked by tests"
MEASURED = "measured by the benchmark"
NO_COMMITTED_RUN = "no committed run"
CLOSING_NOTE = "verdict_changes.md"
"""A hand-written note under the results folder, appended to the index as its closing section."""


def read_results(path: Path) -> Optional[Dict[str, Any]]:
    """A ``results.json`` or ``results.json.gz`` file's payload; None when it cannot be read."""
    try:
        raw = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
        return json.loads(raw)
    except (OSError, ValueError):
        return None


def load_runs(root: Path) -> List[Dict[str, Any]]:
    """Every run under ``root`` (``<mode>/<experiment>/results.json[.gz]``, or ``<experiment>/...``)."""
    runs = []
    for path in sorted([*root.glob("*/results.json*"), *root.glob("*/*/results.json*")]):
        payload = read_results(path)
        if not payload or "claims" not in payload.get("results", {}):
            continue
        results = payload["results"]
        mode = results.get("mode", "?")
        runs.append({"folder": path.parent.relative_to(root).as_posix(), "experiment": payload.get("experiment"),
                     "mode": mode, "base_mode": mode.split()[0], "seeds": results.get("settings", {}).get("seeds"),
                     "claims": results["claims"], "paper": results.get("paper", ""), "regime": results.get("regime"),
                     "command": _command(payload)})
    return runs


def _command(payload: Dict[str, Any]) -> str:
    config = payload.get("config", {})
    mode = " --quick" if config.get("quick") else " --decisive" if config.get("decisive") else ""
    seeds = f" --seeds {config['seeds']}" if config.get("seeds") else ""
    return f"sparsenorm reproduce {payload.get('experiment')}{mode}{seeds}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def _parts(evidence: str) -> int:
    """How many parts a judged claim's evidence lists (its primary and secondary comparisons)."""
    return evidence.count("primary: ") + evidence.count("secondary: ")


def _standing(run: Dict[str, Any], claim: Dict[str, Any]) -> Tuple[Any, ...]:
    """How strong a run's judgement of a claim is; smaller sorts first (see :func:`_judgements`)."""
    return (run["base_mode"] == "quick", claim["verdict"] == NOT_TESTABLE, regime.is_out_of_regime(claim["verdict"]),
            -(claim.get("seeds") or 0), MODE_RANK.get(run["base_mode"], 9), -_parts(claim.get("evidence", "")))


def _judgements(entry: PaperClaim, runs: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """Every run's judgement of ``entry``, the strongest first."""
    found = [(run, c) for run in runs for c in run["claims"] if c.get("key") == entry.key]
    # More paired units is more evidence (e.g. a decisive run's 6 seeds per setting over a full run's 3);
    # a quick run is indicative whatever its count, so it only stands in when nothing else judged the claim.
    # A run in the paper's regime before one outside it (see .regime); on equal units and mode, the judgement that
    # tested more of the claim (more parts) is kept: a run that ran only some of a claim's rivals (e.g. one of the
    # Monte-Carlo estimators) does not stand for it.
    # A run that could not test the claim comes after every run that did, in the regime or not.
    found.sort(key=lambda rc: _standing(*rc))  # stable: on equal standing, the folders' order
    return found


def _disagreeing_peers(judgements: List[Tuple[Dict[str, Any], Dict[str, Any]]]) -> str:
    """The runs that judged a claim with as much evidence as the one shown (e.g. the same experiment on a second
    data set) and reached another verdict, named in the row: the index shows one run per claim, and must not hide
    that another of equal standing disagrees."""
    run, claim = judgements[0]
    shown = _standing(run, claim)
    peers = [(r, c) for r, c in judgements[1:] if _standing(r, c) == shown and c["verdict"] != claim["verdict"]]
    return "".join(f" *Another run of equal standing, [{r['folder']}]({r['folder']}/report.md), reads "
                   f"**{label_mode(c['verdict'], r['base_mode'] == 'quick')}**.*" for r, c in peers)


def index_rows(root: Path, claims: Sequence[PaperClaim]
               ) -> Tuple[List[List[str]], Dict[str, int], List[Dict[str, Any]]]:
    """One row per catalogued claim (of ``claims``); the verdict counts; the runs read."""
    runs = load_runs(root)
    rows, verdicts = [], []
    for entry in claims:
        gate = "–"
        judgements = _judgements(entry, runs)
        if judgements:
            run, c = judgements[0]
            verdict = label_mode(c["verdict"], run["base_mode"] == "quick")
            seeds = c.get("units") or (c.get("seeds") if c.get("seeds") is not None else run["seeds"])
            ours = ((f"*Caveat: {entry.caveat}.* " if entry.caveat else "") + _short(c["evidence"])
                    + _disagreeing_peers(judgements))
            link = f"[{run['folder']}]({run['folder']}/report.md)"
            mode = run["mode"]
            gate = regime.status(run.get("regime"))
        elif entry.tests:
            verdict, seeds, mode, ours, link = CHECKED, "–", "tests", entry.tests, "tests/"
        elif entry.measured:
            verdict, seeds, mode, ours = MEASURED, "–", "benchmark", entry.measured
            link = "[benchmarks/README.md](../benchmarks/README.md)"
        elif entry.experiment:
            verdict, seeds, mode, link = NO_COMMITTED_RUN, "–", "–", "–"
            ours = (f"judged by `sparsenorm reproduce {entry.experiment} --decisive` (or full mode); no run of it is "
                    "committed under this folder yet")
        else:
            verdict, seeds, mode, ours, link = NOT_RUN, "–", "–", entry.not_run, "–"
        verdicts.append(regime.tally_key(verdict))
        claim = entry.claim + (f" — the paper: “{entry.quote}”" if entry.quote else "") + (
            f" *Primary:* {entry.primary}." if entry.primary else "")
        rows.append([entry.key, _cell(entry.paper.split(" (")[0]), _cell(entry.where), _cell(claim),
                     _cell(entry.paper_value), _cell(ours), str(seeds), mode, _cell(gate), f"**{verdict}**", link])
    return rows, counts(verdicts), runs


def write_paper_index(root: Path, claims: Sequence[PaperClaim], own_claims: Sequence[PaperClaim] = ()) -> Path:
    """Write ``root/README.md``, the index of the papers' ``claims`` and, under their own heading, the claims of
    sparsenorm's own experiments ``own_claims`` (see the module docstring); return its path."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--index {root}: not a folder")
    rows, tally, runs = index_rows(root, claims)
    own_rows, own_tally, _ = index_rows(root, own_claims)
    per_paper: Dict[str, int] = {}
    for entry in claims:
        per_paper[entry.paper] = per_paper.get(entry.paper, 0) + 1
    lines = [
        "# Every claim of the three papers, and what sparsenorm's runs say",
        "",
        "Generated by `sparsenorm reproduce --index results/` from the `results.json(.gz)` files under "
        "`results/<mode>/<experiment>/` and the catalogue of claims (each experiment's `paper.py`, the rest in "
        "`sparsenorm/experiments/_shared/paper_claims.py`, gathered by `sparsenorm/experiments/catalogue.py`); do not "
        "edit by hand.",
        "",
        f"**{len(claims)} claims**: " + ", ".join(f"{n} from {paper}" for paper, n in per_paper.items()) + ". "
        "Verdicts: " + ", ".join(f"{n} {v}" for v, n in sorted(tally.items(), key=lambda kv: -kv[1])) + ".",
        "",
        rule_paragraph(),
        "",
        "Each claim shows the run that judged it on the most paired units (full or decisive mode before quick "
        "mode, whose verdicts are indicative; on equal units full before decisive); *paired "
        "units* is the largest paired sample a part of its verdict rests on (seeds, or (setting, seed) pairs pooled "
        "over a sweep). *checked by "
        "tests*: a property of a function, checked by the named tests rather than by an experiment. *measured by the "
        "benchmark*: a cost claim, measured by the committed benchmark named. *no committed "
        "run*: an experiment judges it, but none of its runs is committed here. *not run*: no experiment judges it; "
        "the row says why and what running it would take. *Paper's regime*: the judging run's regime gate (each "
        "experiment's `paper.py` states the condition under which the paper's comparison is meaningful, and why); a "
        f"run that misses it gives *{regime.NOT_IN_REGIME}* with the measured figure instead of the rule's verdict.",
        "",
        markdown_table(["id", "paper", "where", "claim", "paper's value", "ours (evidence)", "paired units", "mode",
                        "paper's regime", "verdict", "report"], rows),
        "",
    ]
    if own_claims:
        lines += [
            "## sparsenorm's own experiments (not claims of the papers)",
            "",
            f"**{len(own_claims)} claims** of experiments no paper ran (catalogue: `OWN_CLAIMS` in the experiment's "
            "`paper.py`), judged by the same rule, in its words (*reproduced*: the stated hypothesis holds); "
            "*expected* is what the issue that asked for the experiment had seen, if anything. Verdicts: "
            + ", ".join(f"{n} {v}" for v, n in sorted(own_tally.items(), key=lambda kv: -kv[1])) + ".",
            "",
            markdown_table(["id", "source", "where", "claim", "expected", "ours (evidence)", "paired units", "mode",
                            "regime", "verdict", "report"], own_rows),
            "",
        ]
    new = [[f"[{run['folder']}]({run['folder']}/report.md)", _cell(c["claim"]), _cell(_short(c["evidence"]))]
           for run in runs for c in run["claims"] if not c.get("key") and c["verdict"] == NEW]
    if new:
        lines += ["## New comparisons (not claims of the papers)", "",
                  markdown_table(["run", "comparison", "what was found"], new), ""]
    if runs:
        lines += ["## Result folders", "", markdown_table(
            ["folder", "mode", "seeds", "paper's regime", "command"],
            [[f"[{r['folder']}]({r['folder']}/report.md)", r["mode"], str(r["seeds"]),
              _cell(regime.status(r["regime"])), f"`{r['command']}`"]
             for r in runs]), ""]
    note = root / CLOSING_NOTE
    if note.is_file():  # the hand-written closing note: what changed in the last re-judging, and why
        lines += [note.read_text().strip(), ""]
    path = root / "README.md"
    path.write_text("\n".join(lines))
    return path
