"""The experiment's settings and its :class:`~sparsenorm.experiments._shared.runner.Experiment` object.

Jobs are (data set, seed): each synthetic setting of the two sweeps and the real data set, each
seed training every method.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..._text import UserFacingError, positive_float
from .._shared.runner import Experiment, Job, Report, RunConfig, RunOptions
from . import claims as verdicts
from .data import average_label_sweep, document_length_sweep, load_real_data, make_synthetic
from .methods import RSoftmaxOptions, methods_for
from .paper import GATE
from .paper import (BATCH_SIZE, CLASS_COUNTS, COUNT_DECODES, COUNT_HEADS, DEFAULT_NORMALIZERS, FIXED_DOCUMENT_LENGTH,
                    HIDDEN, LEARNING_RATE, RATE_GRADS)
from .report import body, figures
from .train import make_split, run_datasets



@dataclass(frozen=True)
class Settings:
    quick: bool
    epochs: int
    seeds: int
    normalizers: Optional[Tuple[str, ...]]  # None: the papers' methods plus the sigmoid baseline
    count_head: str = "auto"  # "auto": train both heads, keep the one with the better selection F1
    count_decode: str = "argmax"
    rate_grad: str = "through"
    hourglass_q: float = 1.0  # the registry's default; Laha et al.'s code uses 10
    data: str = "all"  # "all", "real" or "synthetic"
    class_counts: Tuple[int, ...] = CLASS_COUNTS
    real_validation_fraction: float = 0.2
    hidden: int = HIDDEN
    batch_size: int = BATCH_SIZE
    learning_rate: float = LEARNING_RATE
    max_steps: Optional[int] = None
    workers: int = 1

    @property
    def count_heads(self) -> Tuple[str, ...]:
        return COUNT_HEADS if self.count_head == "auto" else (self.count_head,)


def _class_counts(text: str) -> Tuple[int, ...]:
    import argparse

    try:
        counts = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not counts or any(c < 2 for c in counts):
        raise argparse.ArgumentTypeError(f"class counts must be integers >= 2, got {text!r}")
    return counts


def synthetic_settings(quick: bool, class_counts) -> Dict[Tuple[int, int, int], str]:
    """(classes, average labels, document length) -> which sweep it belongs to ("labels", "length", "both")."""
    found: Dict[Tuple[int, int, int], str] = {}
    for c in class_counts:
        for k in average_label_sweep(c, quick):
            found[(c, k, FIXED_DOCUMENT_LENGTH)] = "labels"
        for length in document_length_sweep(quick):
            key = (c, c // 2, length)
            found[key] = "both" if found.get(key) == "labels" else "length"
    return found


def dataset_records(job_records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The per-(data set, seed) records inside the job records (a synthetic job holds several data sets)."""
    return [record for job in job_records for record in job["records"]]


class MultilabelExperiment(Experiment):
    name = "multilabel"
    regime_gate = GATE  # the paper's regime (paper.py): checked on every run, see _shared/regime.py
    description = ("Multi-label classification (r-softmax paper Sec. 4.1, Fig. 2 / Table 1): synthetic sweeps and "
                   "yeast; softmax+threshold, sigmoid, sparsemax (huber/hinge), sparsehourglass, r-softmax, ev-softmax")
    paper = "r-softmax (Bałazy et al. 2023), Sec. 4.1, Fig. 2, Table 1; sparsemax (Martins & Astudillo 2016)"
    default_normalizers = DEFAULT_NORMALIZERS
    full_runtime = ("150 epochs x 3 seeds x 8 trainings (both r-softmax count heads) on 27 synthetic settings and "
                    "yeast. A class count's 9 synthetic settings train side by side in one job per seed (stacked "
                    "networks, same results as one at a time); each job is cached in `runs/`, and `--data real` / "
                    "`--data synthetic --class-counts ...` run it in parts. Measured: the synthetic jobs 7,415 "
                    "CPU-s (69 min on 2 cores with 2 workers), yeast 331 CPU-s.")
    decisive_note = ("Decisive mode: 6 seeds, 100 epochs (full: 150), 3 points per sweep (full: 5) for 10, 20 and 30 "
                     "classes (15 synthetic settings) and yeast: about 50 min on 2 cores (estimated from full mode's "
                     "measured 7,415 CPU-s for 27 settings x 3 seeds x 150 epochs and 331 CPU-s for yeast). Leaves "
                     "out: the sweeps' middle points and the last 50 epochs.")
    quick_note = ("Quick mode trains 5 epochs instead of 150, with 2 seeds and 3 points per sweep: the models are not "
                  "converged, so its verdicts are indicative only.")
    # Job.params carries the data set; these only choose which jobs exist or how they are run.
    fingerprint_exclude = ("quick", "data", "class_counts", "workers")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--count-head", choices=("auto",) + COUNT_HEADS,
                            help="r-softmax's label-count head (default auto: both, the better on validation kept)")
        parser.add_argument("--count-decode", choices=COUNT_DECODES,
                            help="predicted count from the count logits (default argmax)")
        parser.add_argument("--rate-grad", choices=RATE_GRADS,
                            help="Eq. 4's gradient through the quantile threshold, or detached as in the authors' "
                                 "code (default through)")
        parser.add_argument("--hourglass-q", type=positive_float,
                            help="sparsehourglass's q (default 1, the registry's; Laha et al.'s code uses 10)")
        parser.add_argument("--data", choices=("all", "real", "synthetic"), help="which data sets to run (default all)")
        parser.add_argument("--class-counts", type=_class_counts, help="synthetic class counts (default 10,20,30)")
        parser.add_argument("--workers", type=int, help="processes running jobs in parallel on CPU (default: 2 on CPU)")

    def settings(self, config: RunConfig) -> Settings:
        extra = {k: v for k, v in config.extra.items() if v is not None}
        if "workers" in extra and extra["workers"] < 1:
            raise UserFacingError(f"--workers must be a positive integer, got {extra['workers']}")
        # (sweep points are 3 per sweep where ``quick`` is set: quick and decisive modes)
        epochs, seeds = {"quick": (5, 2), "decisive": (100, 6), "full": (150, 3)}[config.mode]
        base = Settings(quick=config.mode != "full", epochs=epochs, seeds=seeds, normalizers=None,
                        workers=min(2, os.cpu_count() or 1))
        return replace(
            base, epochs=config.epochs or base.epochs, seeds=config.seeds or base.seeds, max_steps=config.max_steps,
            normalizers=tuple(config.normalizers) if config.normalizers else None,
            count_head=extra.get("count_head", base.count_head),
            count_decode=extra.get("count_decode", base.count_decode),
            rate_grad=extra.get("rate_grad", base.rate_grad),
            hourglass_q=float(extra.get("hourglass_q", base.hourglass_q)),
            data=extra.get("data", base.data), class_counts=tuple(extra.get("class_counts", base.class_counts)),
            workers=int(extra.get("workers", base.workers)))

    def run_options(self, settings: Settings, device: torch.device) -> RunOptions:
        # A 128-wide MLP is too small to gain from intra-op threads; on a shared 2-core machine two
        # threads fighting for a core made an epoch up to 30x slower than one thread.
        return RunOptions(threads=1, workers=settings.workers if device.type == "cpu" else 1)

    def prepare(self, settings: Settings, config: RunConfig, device: torch.device) -> Dict[str, Any]:
        methods = methods_for(settings.normalizers, settings.count_heads)
        if settings.data == "synthetic":
            return {"real": None, "real_name": "yeast", "methods": methods}
        real = load_real_data(config.data_dir)  # before any training: a failed fetch stops the run at once
        return {"real": real, "real_name": real.name, "real_split": real.split, "real_summary": real.summary(),
                "methods": methods}

    def jobs(self, settings: Settings, config: RunConfig) -> List[Job]:
        jobs = []
        if settings.data in ("all", "synthetic"):
            by_classes: Dict[int, List[Dict[str, Any]]] = {}
            for (c, k, length), sweep in synthetic_settings(settings.quick, settings.class_counts).items():
                by_classes.setdefault(c, []).append({"n_labels": k, "length": length, "sweep": sweep})
            # One job per (class count, seed): its settings have equal shapes and train side by side.
            jobs += [Job(f"synthetic-L{c}__seed{s}", s, {"dataset": "synthetic", "n_classes": c, "settings": group})
                     for c, group in by_classes.items() for s in range(settings.seeds)]
        if settings.data in ("all", "real"):
            data_dir = str(config.data_dir) if config.data_dir else None
            jobs += [Job(f"real__seed{s}", s, {"dataset": "real", "data_dir": data_dir}) for s in range(settings.seeds)]
        return jobs

    def run_job(self, job: Job, context: Dict[str, Any], settings: Settings, device: torch.device) -> Dict[str, Any]:
        """``{"records": [...]}``: one record per data set of the job (see :func:`dataset_records`)."""
        p = job.params
        if p["dataset"] == "synthetic":
            datasets = [make_synthetic(p["n_classes"], g["n_labels"], g["length"], seed=job.seed)
                        for g in p["settings"]]
            splits = [make_split(d, device) for d in datasets]
            sweeps = [g["sweep"] for g in p["settings"]]
        else:
            datasets = [context["real"]]
            splits = [make_split(context["real"], device, hold_out=settings.real_validation_fraction, seed=job.seed)]
            sweeps = [None]
        rsoftmax = RSoftmaxOptions(count_decode=settings.count_decode, rate_grad=settings.rate_grad)
        records = run_datasets(datasets, splits, context["methods"], job.seed, settings.epochs, device,
                               settings.max_steps, keep_curves=p["dataset"] == "real",
                               hourglass_q=settings.hourglass_q, rsoftmax=rsoftmax)
        return {"records": [{"dataset": p["dataset"], "sweep": sweep, **record}
                            for sweep, record in zip(sweeps, records)]}

    def aggregate(self, records, settings: Settings) -> Dict[str, Any]:
        # not the default: claims.aggregate takes the per-data-set records inside the job records
        # (dataset_records) and the name of the real data set, read here from its records
        records = dataset_records(records)
        real = next((r["data"].get("name") for r in records if r["dataset"] == "real"), None)
        return verdicts.aggregate(records, real or "yeast")

    def report(self, out: Path, summary, records, settings: Settings, context) -> Report:
        figs = figures(out, dataset_records(records), summary, settings.class_counts)
        sweeps = {"labels": {c: average_label_sweep(c, settings.quick) for c in settings.class_counts},
                  "length": document_length_sweep(settings.quick)}
        headline = "labels" if "labels" in figs else ("curves" if "curves" in figs else None)
        return Report(body=body(summary, settings, context, figs, sweeps), figures=figs, headline=headline)


EXPERIMENT = MultilabelExperiment()
