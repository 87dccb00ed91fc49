"""Reproducible experiments, one folder per paper experiment; ``EXPERIMENTS`` maps CLI names to packages.

Each package defines ``EXPERIMENT``, an :class:`._shared.runner.Experiment` that the shared runner
carries out (:func:`run`).
"""
from importlib import import_module
from pathlib import Path
from types import ModuleType

EXPERIMENTS = {
    "cvae": "sparsenorm.experiments.evsoftmax_cvae",
    "multilabel": "sparsenorm.experiments.rsoftmax_multilabel",
    "ssvae": "sparsenorm.experiments.evsoftmax_ssvae",
    "mt": "sparsenorm.experiments.evsoftmax_translation",
    "vqvae": "sparsenorm.experiments.evsoftmax_vqvae",
    "finetune": "sparsenorm.experiments.rsoftmax_finetune",
}


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}, all")
    return import_module(EXPERIMENTS[name])


def run(name: str, config) -> Path:
    """Run the experiment called ``name`` with a :class:`._shared.common.RunConfig`; return its output folder."""
    from ._shared.runner import run_experiment

    return run_experiment(load(name).EXPERIMENT, config)
