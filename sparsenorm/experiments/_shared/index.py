"""``OUT/README.md``: every claim of every experiment in one table, then each experiment's headline figure.

Built from the ``results.json`` files under ``OUT`` alone (the runner writes the claims and the
headline figure's name there), so a new experiment appears here with no change to this module.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from ..._text import markdown_table
from . import regime
from .verdict import label_mode, rule_paragraph


def _load_results(root: Path) -> List[Dict[str, Any]]:
    found = []
    for path in sorted(root.glob("*/results.json")):
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        results = payload.get("results", {})
        if "claims" in results:
            found.append({"folder": path.parent.name, "experiment": payload.get("experiment", path.parent.name),
                          "wall_time_s": payload.get("wall_time_s"), **results})
    return found


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_index(root: Path) -> Path:
    """Write ``root/README.md`` from ``root/*/results.json``; return its path."""
    root = Path(root)
    experiments = _load_results(root)
    rows = []
    for exp in experiments:
        link = f"[{exp['folder']}]({exp['folder']}/report.md)"
        for c in exp["claims"]:
            claim = c["claim"] + (f" ({c['source']})" if c.get("source") else "")
            verdict = label_mode(c["verdict"], exp.get("mode", "").startswith("quick"))
            rows.append([link, _cell(exp.get("paper", "")), _cell(claim), f"**{verdict}**", _cell(c["evidence"])])
    lines = ["# sparsenorm reproductions: every claim", "", rule_paragraph(), ""]
    quick = [e["folder"] for e in experiments if e.get("mode", "").startswith("quick")]
    partial = [e["folder"] for e in experiments if "partial" in e.get("mode", "")]
    if partial:
        lines += [f"Partial results for {', '.join(partial)}: not every job of the configuration had finished; "
                  "each report lists the missing ones.", ""]
    if quick:
        lines += [f"Quick mode for {', '.join(quick)}: these verdicts are indicative only (fewer epochs and seeds; "
                  "each report says what quick mode leaves out). Full mode: `sparsenorm reproduce all`.", ""]
    if rows:
        lines += [markdown_table(["experiment", "paper", "claim", "verdict", "key numbers"], rows), ""]
    else:
        lines += ["No experiment results found here.", ""]
    timing = [[e["folder"], e.get("mode", "?"), _cell(regime.status(e.get("regime"))),
               f"{e['wall_time_s']:.0f} s" if e.get("wall_time_s") else "?"] for e in experiments]
    if timing:
        lines += ["## Run times and regime gates", "",
                  markdown_table(["experiment", "mode", "paper's regime", "wall time"],
                                                                     timing), ""]
    for exp in experiments:
        if exp.get("headline_figure"):
            lines += [f"## {exp['folder']}", "", f"![{exp['folder']}]({exp['folder']}/{exp['headline_figure']})", ""]
    path = root / "README.md"
    path.write_text("\n".join(lines))
    return path
