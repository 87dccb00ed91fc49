"""Reproducible experiments, one folder per paper experiment; ``EXPERIMENTS`` maps CLI names to packages.

Each package defines ``EXPERIMENT``, an :class:`._shared.runner.Experiment` that the shared runner
carries out (:func:`run`).
"""
import re
from importlib import import_module, metadata
from pathlib import Path
from types import ModuleType
from typing import Optional

from .._text import UserFacingError

EXPERIMENTS = {
    "cvae": "sparsenorm.experiments.evsoftmax_cvae",
    "multilabel": "sparsenorm.experiments.rsoftmax_multilabel",
    "ssvae": "sparsenorm.experiments.evsoftmax_ssvae",
    "mt": "sparsenorm.experiments.evsoftmax_translation",
    "vqvae": "sparsenorm.experiments.evsoftmax_vqvae",
    "finetune": "sparsenorm.experiments.rsoftmax_finetune",
}


# the optional-dependency groups each experiment needs, checked before it is imported or run
EXTRAS = {
    "cvae": ("experiments",),
    "multilabel": ("experiments",),
    "ssvae": ("experiments",),
    "mt": ("experiments", "mt"),
    "vqvae": ("experiments",),
    "finetune": ("experiments", "hf"),
}

# import names that differ from the name of the distribution providing them
_DISTRIBUTION_OF_MODULE = {"sklearn": "scikit-learn"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_providing(module: str) -> Optional[str]:
    """The optional-dependency group (``pip install 'sparsenorm[<it>]'``) that installs ``module``,
    read from the installed package's metadata; None if no group does (or there is no metadata)."""
    top = module.split(".")[0]
    wanted = _canonical(_DISTRIBUTION_OF_MODULE.get(top, top))
    for distribution, extra in _extra_requirements():
        if _canonical(distribution) == wanted and extra != "test":
            return extra
    return None


def _extra_requirements():
    """``(distribution, extra)`` for every optional requirement of the installed package."""
    try:
        requirements = metadata.requires("sparsenorm") or []
    except metadata.PackageNotFoundError:  # run from a source tree without metadata
        return []
    pairs = []
    for requirement in requirements:  # e.g. 'scipy>=1.9; extra == "experiments"', in pyproject order
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*).*;.*extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if match:
            pairs.append((match.group(1), match.group(2)))
    return pairs


def missing_extra(name: str) -> Optional[str]:
    """The one line saying which extras to install for experiment ``name``, or None if all are."""
    missing: dict = {}  # extra -> its first distribution not installed
    for distribution, extra in _extra_requirements():
        if extra in EXTRAS[name] and extra not in missing:
            try:
                metadata.version(distribution)
            except metadata.PackageNotFoundError:
                missing[extra] = distribution
    if not missing:
        return None
    return (f"the {name} experiment needs {', '.join(missing.values())}: "
            f"pip install 'sparsenorm[{','.join(missing)}]'")


def load(name: str) -> ModuleType:
    """The experiment's package; a :class:`UserFacingError` naming the extra to install when one of
    its optional dependencies is missing (checked up front: some are imported only late in a run)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}, all")
    missing = missing_extra(name)
    if missing:
        raise UserFacingError(missing)
    try:  # a module no extra lists (or no metadata to read): still name the extra if one provides it
        return import_module(EXPERIMENTS[name])
    except ModuleNotFoundError as exc:
        extra = extra_providing(exc.name or "")
        if extra is None:
            raise
        raise UserFacingError(f"the {name} experiment needs {exc.name}: pip install 'sparsenorm[{extra}]'") from None


def run(name: str, config) -> Path:
    """Run the experiment called ``name`` with a :class:`._shared.common.RunConfig`; return its output folder."""
    from ._shared.runner import run_experiment

    return run_experiment(load(name).EXPERIMENT, config)
