"""Reproducible experiments, one per paper experiment; ``EXPERIMENTS`` maps CLI names to modules.

A module either defines ``EXPERIMENT`` (an :class:`._shared.runner.Experiment`, run by the shared
runner) or, until it is moved onto the runner, ``run(config) -> Path``.
"""
from importlib import import_module
from pathlib import Path
from types import ModuleType

EXPERIMENTS = {
    "cvae": "sparsenorm.experiments.cvae",
    "multilabel": "sparsenorm.experiments.multilabel",
    "finetune": "sparsenorm.experiments.rsoftmax_finetune",
}


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}, all")
    return import_module(EXPERIMENTS[name])


def run(name: str, config) -> Path:
    """Run the experiment called ``name`` with a :class:`._shared.common.RunConfig`; return its output folder."""
    module = load(name)
    if hasattr(module, "EXPERIMENT"):
        from ._shared.runner import run_experiment

        return run_experiment(module.EXPERIMENT, config)
    return module.run(config)
