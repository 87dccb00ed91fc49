"""Reproducible experiments, one module each; ``EXPERIMENTS`` maps CLI names to modules."""
from importlib import import_module
from types import ModuleType

EXPERIMENTS = {
    "cvae": "sparsenorm.experiments.cvae",
    "multilabel": "sparsenorm.experiments.multilabel",
}


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}, all")
    return import_module(EXPERIMENTS[name])
