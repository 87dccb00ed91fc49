"""The contract every experiment implements, and the one runner that carries it out.

An experiment is a small object (see :class:`Experiment`) that says *what* to run; the runner says
*how*: it validates the normalizer names, resolves the device, guards the thread count, calls
``prepare`` once (data, helper models; a missing data set fails here, before any training), runs
each :class:`Job` (one setting x seed) with its seed set, caches each job's record in
``OUT/runs/<key>.json`` so that an interrupted or split run completes without redoing work, then
aggregates, judges the claims and writes ``results.json`` and ``report.md`` (the skeleton: title,
mode, settings, the experiment's own body, the claims table, what ran and how long it took, and the
provenance of the data and weights the run read: :mod:`.provenance`).

    config -> settings -> prepare -> jobs -> run_job (per seed, cached) -> aggregate -> claims -> report

With ``RunOptions.stack`` > 1 and an experiment that defines ``stack_key`` and ``run_stack``, the
pending jobs of one setting (other seeds) run as one stack (:func:`stacks`; the experiment trains
them as one stacked network, see :mod:`.stacking`); their records are still cached one per job, so a
seed trained stacked and the same seed trained alone are the same job.

An experiment's ``report`` writes its figures and returns a :class:`Report` whose ``body`` is the
Markdown between the skeleton's header and the claims table. Claims are :class:`Claim` objects;
``reproduce all`` collects them from every experiment's ``results.json`` into one index
(:mod:`sparsenorm.experiments._shared.index`) with no experiment-specific code.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import multiprocessing
import platform
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np
import torch

from ..._text import UserFacingError, markdown_table
from . import provenance, regime
from .devices import resolve_device, seed_everything
from .timing import Stopwatch, progress

# The verdict words and the Claim record live with the judging rule; re-exported here for the experiments.
from .verdict import (  # noqa: E402,F401
    INCONCLUSIVE, NEW, NOT_REPRODUCED, NOT_TESTABLE, PARTLY, REPRODUCED, Claim, label_mode, rule_paragraph,
)


@dataclass
class RunConfig:
    """What the CLI passes to an experiment; ``None`` fields mean "the experiment's default"."""

    out: Path
    quick: bool = False
    decisive: bool = False  # the smallest setting where every claim can reach a verdict (see each experiment)
    seeds: Optional[int] = None
    epochs: Optional[int] = None
    normalizers: Optional[List[str]] = None
    device: str = "auto"
    data_dir: Optional[Path] = None
    max_steps: Optional[int] = None  # caps optimisation steps per run (smoke tests)
    report_only: bool = False  # no training: report the jobs already cached (a long run still going, or stopped)
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """``quick``, ``decisive`` or ``full``."""
        if self.quick and self.decisive:
            raise UserFacingError("--quick and --decisive exclude each other")
        return "quick" if self.quick else "decisive" if self.decisive else "full"

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out)
        d["data_dir"] = None if self.data_dir is None else str(self.data_dir)
        return d


@dataclass
class Job:
    """One independent unit of work: a setting and a seed. ``key`` names its cache file."""

    key: str
    seed: int
    params: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """What an experiment's ``report`` returns: the Markdown body and the figures it wrote."""

    body: str
    figures: Dict[str, Path] = field(default_factory=dict)
    headline: Optional[str] = None
    """Key in ``figures`` of the figure the index of ``reproduce all`` shows for this experiment."""


@runtime_checkable
class Experiment(Protocol):
    """What an experiment declares. Attributes first, then the stages in the order the runner calls them."""

    name: str  # the CLI name: ``sparsenorm reproduce NAME``
    description: str  # one line
    paper: str  # e.g. "ev-softmax (Chen et al. 2021), Sec. 4.1, Fig. 2-3"
    default_normalizers: Sequence[str]  # registry names
    full_runtime: str  # a sentence: how long full mode takes, and on what
    quick_note: str  # a sentence: what quick mode leaves out
    # Optional: ``fingerprint_exclude`` (settings fields that do not change a job's record, see
    # :func:`fingerprint`), ``run_options(settings, device) -> RunOptions`` (threads, workers, stack),
    # and, to train several seeds as one stacked network (``RunOptions.stack`` > 1), both of
    # ``stack_key(job) -> Hashable | None`` (jobs with equal keys, other than None, may train together:
    # the same setting, other seeds) and ``run_stack(jobs, context, settings, device) -> [record per job]``
    # (seeds each job itself; each record must equal what ``run_job`` returns for that job, up to float
    # rounding, since the cache does not tell them apart). ``more_jobs(settings, config, records) -> [Job]``:
    # jobs that depend on finished ones (e.g. the other seeds of the setting chosen on a validation split),
    # asked for after each round with the records so far, until it names no job not yet known.
    # ``run_note(settings) -> str``: a sentence naming what this run's settings change from the mode's defaults
    # (which its note states), e.g. another lead setting; the report prints it after the mode's note ("" for none).

    def add_arguments(self, parser) -> None:
        """Add the experiment's own CLI options; their values arrive in ``config.extra``."""

    def settings(self, config: RunConfig) -> Any:
        """The settings of this run (a dataclass): quick/full defaults with the CLI's overrides applied."""

    def prepare(self, settings: Any, config: RunConfig, device: torch.device) -> Any:
        """Load data and helper models once (the context passed to every job); fail fast on missing data."""

    def jobs(self, settings: Any, config: RunConfig) -> List[Job]:
        """The independent (setting, seed) units."""

    def run_job(self, job: Job, context: Any, settings: Any, device: torch.device) -> Dict[str, Any]:
        """Run one unit (seeded by the runner) and return its JSON-able record."""

    def aggregate(self, records: List[Dict[str, Any]], settings: Any) -> Dict[str, Any]:
        """Summaries over seeds (means, spreads) from all job records.

        By default (an experiment that subclasses :class:`Experiment`): ``aggregate`` of the experiment's
        own ``claims`` module, given the arguments of these that it declares (:func:`from_claims_module`)."""
        return from_claims_module(self, "aggregate", records=records, settings=settings)

    def claims(self, summary: Dict[str, Any], records: List[Dict[str, Any]], settings: Any) -> List[Claim]:
        """One verdict per claim of the paper, computed from this run's numbers.

        By default: ``claims`` of the experiment's own ``claims`` module, as for :meth:`aggregate`."""
        return from_claims_module(self, "claims", summary=summary, records=records, settings=settings)

    def report(self, out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings: Any,
               context: Any) -> Report:
        """Write the figures into ``out`` and return the report's body (tables next to the paper's numbers)."""


def from_claims_module(experiment: Experiment, function: str, **arguments: Any) -> Any:
    """Call ``function`` of the ``claims`` module beside the experiment's class (``<its package>.claims``) with
    those of ``arguments`` its signature names: ``aggregate(records)`` gets the records alone,
    ``claims(summary, settings)`` the summary and the settings. The module is imported on the first call."""
    package = type(experiment).__module__.rpartition(".")[0]
    target = getattr(importlib.import_module(f"{package}.claims"), function)
    declared = inspect.signature(target).parameters
    return target(**{name: value for name, value in arguments.items() if name in declared})


@dataclass
class RunOptions:
    """How the runner executes jobs; an experiment may expose ``run_options(settings, device)`` to set them."""

    threads: Optional[int] = 1
    """torch intra-op threads during the jobs on CPU (None: leave as is). Small models run fastest on one."""
    workers: int = 1
    """Processes running jobs in parallel (CPU only; spawn context, one thread each)."""
    stack: int = 1
    """At most this many pending jobs with the same ``stack_key`` run as one ``run_stack`` call (1: each alone)."""


def _settings_dict(settings: Any) -> Dict[str, Any]:
    return asdict(settings) if is_dataclass(settings) else dict(settings)


def fingerprint(settings: Any, job: Job, config: RunConfig, exclude: Sequence[str] = ("seeds",)) -> str:
    """What a cached job record must match to be reused: the settings, the job, the step cap and the data folder.

    Settings fields in ``exclude`` do not change what one job computes (the number of seeds; an
    experiment whose jobs carry their normalizer in ``Job.params`` also excludes the normalizer
    list), so adding seeds or normalizers reuses the jobs already done.
    """
    kept = {k: v for k, v in _settings_dict(settings).items() if k not in exclude}
    payload = {"settings": kept, "job": asdict(job), "max_steps": config.max_steps}
    if config.data_dir is not None:  # the user's own data set: other jobs than the default data's
        payload["data_dir"] = str(config.data_dir)
    text = json.dumps(_jsonable(payload), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class JobCache:
    """``OUT/runs/<key>.json``: one finished job's record with the fingerprint it was made under."""

    def __init__(self, out: Path) -> None:
        self.folder = out / "runs"

    def load(self, job: Job, stamp: str) -> Optional[Dict[str, Any]]:
        path = self.folder / f"{job.key}.json"
        if not path.is_file():
            return None
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # a half-written file from an interrupted run: redo the job
        return payload["record"] if payload.get("fingerprint") == stamp else None

    def save(self, job: Job, stamp: str, record: Dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{job.key}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(_jsonable({"fingerprint": stamp, "record": record})))
        partial.replace(path)  # atomic: a killed run never leaves a truncated record


def _check_normalizers(names: Optional[Sequence[str]]) -> None:
    from ... import registry

    for name in names or ():
        try:
            registry.get(name)
        except ValueError as exc:
            raise UserFacingError(str(exc)) from None


def _run_unit(experiment: Experiment, unit: List[Job], context: Any, settings: Any, device: torch.device,
              threads: Optional[int]) -> List[Dict[str, Any]]:
    """The records of one unit: a job alone (seeded here), or a stack of jobs trained together by
    ``run_stack`` (which seeds each job itself)."""
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    if len(unit) == 1:
        seed_everything(unit[0].seed)
        return [experiment.run_job(unit[0], context, settings, device)]
    records = experiment.run_stack(unit, context, settings, device)
    if len(records) != len(unit):
        raise ValueError(f"{experiment.name}.run_stack returned {len(records)} records for {len(unit)} jobs")
    return list(records)


def stacks(experiment: Experiment, pending: List[Job], size: int) -> List[List[Job]]:
    """``pending`` cut into units: jobs with the same ``stack_key`` (not None) in groups of at most ``size``, in the
    order of each group's first job; every other job alone. Only jobs not cached are stacked, so a stack
    never retrains a seed already done."""
    if size <= 1 or not hasattr(experiment, "stack_key"):
        return [[job] for job in pending]
    groups: Dict[Any, List[Job]] = {}
    units: List[List[Job]] = []
    for job in pending:
        key = experiment.stack_key(job)
        if key is None:
            units.append([job])
            continue
        if key not in groups or len(groups[key]) == size:
            groups[key] = []
            units.append(groups[key])
        groups[key].append(job)
    return units


def _execute(experiment: Experiment, pending: List[Job], context: Any, settings: Any, device: torch.device,
             options: RunOptions, on_done) -> None:
    units = stacks(experiment, pending, options.stack)
    desc = f"{experiment.name}: {len(pending)} job(s)" + (
        f" in {len(units)} stacks" if len(units) < len(pending) else "")

    def done(unit: List[Job], records: List[Dict[str, Any]]) -> None:
        for job, record in zip(unit, records):
            on_done(job, record)

    if options.workers <= 1 or device.type != "cpu" or len(units) <= 1:
        for unit in progress(units, total=len(units), desc=desc):
            done(unit, _run_unit(experiment, unit, context, settings, device, options.threads))
        return
    # Jobs are independent and seeded, so which worker runs which does not change the results.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(options.workers, mp_context=spawn) as pool:
        futures = {pool.submit(_run_unit, experiment, unit, context, settings, device, options.threads): i
                   for i, unit in enumerate(units)}
        for future in progress(as_completed(futures), total=len(units), desc=f"{desc}, {options.workers} workers"):
            done(units[futures[future]], future.result())


def _run_jobs(experiment: Experiment, jobs: List[Job], config: RunConfig, settings, context, device: torch.device,
              options: RunOptions, out: Path) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """The record of every job: from the cache in ``out`` where its fingerprint matches, else run now (and
    cached as it finishes); with ``--report-only`` the cached ones only. Returns the records and the reused keys;
    ``jobs`` is extended in place by the experiment's ``more_jobs`` rounds, if it has them."""
    cache = JobCache(out)
    exclude = ("seeds", *getattr(experiment, "fingerprint_exclude", ()))
    stamps = {job.key: fingerprint(settings, job, config, exclude) for job in jobs}
    records: Dict[str, Dict[str, Any]] = {}
    for job in jobs:
        cached = cache.load(job, stamps[job.key])
        if cached is not None:
            records[job.key] = cached
    reused = sorted(records)

    def on_done(job: Job, record: Dict[str, Any]) -> None:
        cache.save(job, stamps[job.key], record)
        records[job.key] = record

    pending = [j for j in jobs if j.key not in records]
    if config.report_only:
        if not records:
            raise UserFacingError(f"--report-only: no finished job of this configuration in {cache.folder}")
    else:
        _execute(experiment, pending, context, settings, device, options, on_done)
    # Rounds of jobs chosen from finished ones (``more_jobs``); with --report-only, the cached ones of each round.
    while hasattr(experiment, "more_jobs"):
        known = {job.key for job in jobs}
        ordered = [records[job.key] for job in jobs if job.key in records]
        extra = [job for job in experiment.more_jobs(settings, config, ordered) if job.key not in known]
        if not extra:
            break
        jobs.extend(extra)
        stamps.update({job.key: fingerprint(settings, job, config, exclude) for job in extra})
        pending = []
        for job in extra:
            cached = cache.load(job, stamps[job.key])
            if cached is None:
                pending.append(job)
            else:
                records[job.key] = cached
                reused.append(job.key)
        if config.report_only:
            if len(pending) == len(extra):
                break  # none of this round finished: later rounds cannot be chosen from it
        else:
            _execute(experiment, pending, context, settings, device, options, on_done)
    return records, sorted(reused)


def run_experiment(experiment: Experiment, config: RunConfig) -> Path:
    """Run ``experiment`` under ``config``; write ``results.json`` and ``report.md`` into ``config.out``."""
    clock = Stopwatch()
    _check_normalizers(config.normalizers)
    device = resolve_device(config.device)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = experiment.settings(config)
    options = experiment.run_options(settings, device) if hasattr(experiment, "run_options") else RunOptions()

    threads = torch.get_num_threads()
    provenance.start_run()  # the loaders record each artifact or user path they read
    try:
        context = experiment.prepare(settings, config, device)
        prepare_s = clock.elapsed
        jobs = experiment.jobs(settings, config)
        keys = [job.key for job in jobs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{experiment.name}: job keys must be unique, got {keys}")
        records, reused = _run_jobs(experiment, jobs, config, settings, context, device, options, out)
        keys = [job.key for job in jobs]  # with the rounds of ``more_jobs``
        jobs_s = clock.elapsed - prepare_s
    finally:
        torch.set_num_threads(threads)

    missing = [key for key in keys if key not in records]
    keys = [key for key in keys if key in records]
    ordered = [records[key] for key in keys]
    summary = experiment.aggregate(ordered, settings)
    claims = experiment.claims(summary, ordered, settings)
    gate, claims = regime.judge(experiment, summary, ordered, settings, claims)  # after the verdicts: see regime.py
    report = experiment.report(out, summary, ordered, settings, context)
    report.body = regime.section(gate) + report.body
    read = provenance.records()
    timing = {"prepare_s": round(prepare_s, 1), "jobs_s": round(jobs_s, 1), "total_s": round(clock.elapsed, 1)}
    ran = {"jobs": keys, "reused_from_cache": reused, "run_now": [k for k in keys if k not in reused],
           "missing": missing}
    _write_report(out, experiment, config, settings, report, claims, ran, timing, device, read)
    results = {
        "paper": experiment.paper,
        "mode": config.mode + (" (partial)" if missing else ""),
        "settings": _settings_dict(settings),
        "device": str(device),
        "jobs": ran,
        "timing": timing,
        "summary": summary,
        "claims": [asdict(c) for c in claims],
        "regime": gate,
        "figures": {k: Path(v).name for k, v in report.figures.items()},
        "headline_figure": Path(report.figures[report.headline]).name if report.headline else None,
        "records": ordered,
        "provenance": read,
    }
    write_results(out, experiment.name, config, results, clock.elapsed)
    return out


def environment_info() -> Dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return _jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and obj != obj:
        return None  # JSON has no NaN
    return obj


def write_results(out: Path, experiment: str, config: RunConfig, results: Dict[str, Any],
                  wall_time_s: float) -> Path:
    """Write ``results.json``: experiment name, config, environment, wall time and results."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "experiment": experiment,
        "config": config.to_json(),
        "environment": environment_info(),
        "wall_time_s": round(wall_time_s, 1),
        "results": results,
    }
    path = out / "results.json"
    path.write_text(json.dumps(_jsonable(payload), indent=2))
    return path


def claims_table(claims: Sequence[Claim], quick: bool = False) -> str:
    return markdown_table(["claim", "verdict", "evidence"],
                          [[c.claim + (f" ({c.source})" if c.source else ""), f"**{label_mode(c.verdict, quick)}**",
                            c.evidence] for c in claims])


def _write_report(out: Path, experiment: Experiment, config: RunConfig, settings: Any, report: Report,
                  claims: Sequence[Claim], ran: Dict[str, List[str]], timing: Dict[str, float],
                  device: torch.device, read: Sequence[Dict[str, Any]] = ()) -> Path:
    if config.quick:
        mode = f"**Quick mode — indicative only, not a verdict on the paper.** {experiment.quick_note}"
    else:
        # every experiment's decisive note begins "Decisive mode: ..."; one without a note still names the mode
        mode = ((getattr(experiment, "decisive_note", "") or "Decisive mode.") if config.decisive
                else f"Full mode. {experiment.full_runtime}")
        if config.seeds is not None:  # the note states the mode's default seed count; --seeds overrides it
            mode += f" **This run: {config.seeds} seeds** (`--seeds {config.seeds}`), not the default."
    run_note = getattr(experiment, "run_note", lambda settings: "")(settings)
    if run_note:
        mode += f" {run_note}"
    if ran["missing"]:
        mode += (f"\n\n**Partial report: {len(ran['jobs'])} of {len(ran['jobs']) + len(ran['missing'])} jobs of "
                 "this configuration had finished; every number below covers only those** (the missing ones are "
                 "listed under \"What ran\").")
    env = environment_info()
    lines = [
        f"# {experiment.description}",
        "",
        f"Paper: {experiment.paper}.",
        "",
        mode,
        "",
        report.body.strip(),
        "",
        "## Claims",
        "",
        rule_paragraph(),
        "",
        claims_table(claims, config.quick) if claims else "(this run judged no claim)",
        "",
        "## What ran",
        "",
        f"- {len(ran['jobs'])} job(s): {len(ran['run_now'])} run now, {len(ran['reused_from_cache'])} reused from "
        f"`runs/` (same settings; delete that folder to rerun them)."
        + (" Not run (missing from this report): " + ", ".join(f"`{k}`" for k in ran["missing"]) + "."
           if ran["missing"] else ""),
        f"- Wall time: {timing['total_s']:.0f} s (prepare {timing['prepare_s']:.0f} s, jobs {timing['jobs_s']:.0f} s) "
        f"on {device}, torch {env['torch']}, {env['threads']} thread(s) outside the jobs.",
        "- Settings: " + ", ".join(f"`{k}={v}`" for k, v in _settings_dict(settings).items()) + ".",
        "",
        "## Data provenance",
        "",
        (provenance.provenance_table(read) + "\n\nPinned artifacts are checked against their SHA-256 before use "
         "(`sparsenorm/experiments/_shared/artifacts.py`); `results.json` (`provenance`) has the paths and each "
         "file of a folder.") if read else "This run read no fetched or user-given file (generated data only).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
