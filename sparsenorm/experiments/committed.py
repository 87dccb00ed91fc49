"""Committed runs: re-judge one under the current rule, or put its job records into a new run's cache.

``python -m sparsenorm.experiments.committed rejudge RESULTS/full/cvae`` re-judges a committed run under
the current rule from the per-seed records in its ``results.json(.gz)``, without training, and rewrites
its claims section (see :func:`rejudge`); ``python -m sparsenorm.experiments.committed reuse FOLDER OUT
KEY...`` puts the records of jobs ``KEY`` into the job cache of ``OUT`` (see :func:`reuse_records`). Both
load the experiment (:func:`sparsenorm.experiments.load`), so they live here rather than in ``_shared``
(whose :mod:`~._shared.paper_index` writes the index of every claim, from the catalogue that
:mod:`.catalogue` gathers).
"""
from __future__ import annotations

import gzip
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import load
from ._shared import paper_index, regime
from ._shared.verdict import rule_paragraph


def _write(path: Path, payload: Dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2)
    if path.suffix == ".gz":
        with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: the same content gives the same bytes
            f.write(text.encode())
    else:
        path.write_text(text)


def _committed_run(folder: Path, out: Optional[Path] = None):
    """``(results path, payload, experiment, config, settings)`` of the committed run in ``folder``: its
    results file read, its experiment loaded, its run configuration rebuilt (``out``: the ``--out`` of a new
    run of it, else the run's own) and its settings under the current code."""
    from ._shared.runner import RunConfig

    path = next((p for p in (folder / "results.json.gz", folder / "results.json") if p.is_file()), None)
    payload = paper_index.read_results(path) if path else None
    if payload is None:
        raise FileNotFoundError(f"no results.json(.gz) in {folder}")
    experiment = load(payload["experiment"]).EXPERIMENT
    config = dict(payload["config"])
    config["out"] = Path(out) / payload["experiment"] if out is not None else Path(config["out"])
    config["data_dir"] = Path(config["data_dir"]) if config.get("data_dir") else None
    config = RunConfig(**{k: v for k, v in config.items() if k in RunConfig.__dataclass_fields__})
    return path, payload, experiment, config, experiment.settings(config)


def rejudge(folder: Path) -> List[Tuple[str, str, str]]:
    """Re-judge a committed run under the current rule from the per-seed records of its results file, without
    training: recompute the summary and the claims, write them back, and replace the report's claims section
    (the rest of the report is as the run wrote it). Returns (claim, old verdict, new verdict) per claim."""
    from ._shared.runner import claims_table

    folder = Path(folder)
    path, payload, experiment, config, settings = _committed_run(folder)
    results = payload["results"]
    summary = experiment.aggregate(results["records"], settings)
    claims = experiment.claims(summary, results["records"], settings)
    gate, claims = regime.judge(experiment, summary, results["records"], settings, claims)
    before = {c["claim"][:40]: c["verdict"] for c in results["claims"]}  # the opening words name a claim
    changes = [(c.claim, before.get(c.claim[:40], "(new claim)"), c.verdict) for c in claims]
    results["summary"], results["claims"], results["regime"] = summary, [asdict(c) for c in claims], gate
    _write(path, payload)
    report = folder / "report.md"
    if report.is_file():
        text = _with_regime_section(report.read_text(), gate)
        start, end = text.find("## Claims"), text.find("## What ran")
        if start >= 0 and end > start:
            section = ["## Claims", "", "*Re-judged under the current rule from this run's per-seed records, without "
                       "retraining; the sections above are as the run wrote them (where they speak of verdicts on "
                       "means, this section supersedes them).*", "", rule_paragraph(), "",
                       claims_table(claims, config.quick), "", ""]
            report.write_text(text[:start] + "\n".join(section) + text[end:])
    return changes


def _with_regime_section(text: str, gate: Optional[Dict[str, Any]]) -> str:
    """A report's text with its "Paper's regime" section replaced by (or, before "## Claims", given) ``gate``'s."""
    heading = "## Paper's regime"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        return text[:start] + regime.section(gate) + (text[end + 1:] if end >= 0 else "")
    claims_at = text.find("## Claims")
    if claims_at < 0 or gate is None:
        return text
    return text[:claims_at] + regime.section(gate) + text[claims_at:]


def reuse_records(folder: Path, out: Path, keys: List[str]) -> List[str]:
    """Put the job records of the committed run in ``folder`` for ``keys`` into the job cache of ``out`` (the
    ``--out`` of a new run of the same experiment and mode), under the fingerprints the current code gives those
    jobs, so that the new run reuses them instead of recomputing. For jobs whose code path did not change and whose
    records are deterministic (check by re-running one and comparing); the new run's results list them under
    ``reused_from_cache`` and its report should say where they came from. Keys already cached are left alone.
    Returns the keys written."""
    from ._shared.runner import JobCache, fingerprint

    _, payload, experiment, config, settings = _committed_run(Path(folder), out)
    jobs = {job.key: job for job in experiment.jobs(settings, config)}
    records = dict(zip(payload["results"]["jobs"]["jobs"], payload["results"]["records"]))
    cache, exclude = JobCache(Path(config.out)), ("seeds", *getattr(experiment, "fingerprint_exclude", ()))
    written = []
    for key in keys:
        if key not in jobs or key not in records:
            raise KeyError(f"{key}: not a job of both the committed run and the current code")
        stamp = fingerprint(settings, jobs[key], config, exclude)
        if cache.load(jobs[key], stamp) is None:
            cache.save(jobs[key], stamp, records[key])
            written.append(key)
    return written


def _main(argv: List[str]) -> int:
    if len(argv) >= 2 and argv[0] == "rejudge":
        for folder in argv[1:]:
            for claim, before, after in rejudge(Path(folder)):
                print(f"{folder}: {before} -> {after}: {claim}")
        return 0
    if len(argv) >= 4 and argv[0] == "reuse":
        print("reused: " + ", ".join(reuse_records(Path(argv[1]), Path(argv[2]), argv[3:])))
        return 0
    print("usage: python -m sparsenorm.experiments.committed rejudge FOLDER...\n"
          "       python -m sparsenorm.experiments.committed reuse FOLDER OUT KEY...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
