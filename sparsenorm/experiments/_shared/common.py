"""Machinery shared by every experiment: config, seeding, device, progress bars, cache, outputs.

The contract an experiment implements (settings, jobs, claims, report) is the ``Experiment``
protocol of :mod:`.runner`, which also runs it.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
import torch

from ..._cache import cache_dir  # noqa: F401  (re-exported for the data loaders)
from ..._text import UserFacingError, markdown_table  # noqa: F401


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


def positive_float(text: str) -> float:
    """An argparse ``type`` for experiment options that must be a positive number."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a CPU generator seeded the same way.

    With the same seed, a run on CPU is deterministic (torch's CPU kernels are deterministic for the
    ops the experiments use).
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else must be a valid torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: CUDA is not available on this machine; use cpu or auto")
    return dev


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``. A CPU tensor bound for CUDA is copied from pinned memory without blocking:
    a plain copy from pageable memory waits for the GPU's queue, a host sync on every training step."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def mixed_precision(device: torch.device):
    """bfloat16 autocast on CUDA, for the forward pass and loss of the transformer experiments
    (translation, fine-tuning); nothing elsewhere, so CPU results stay bit-identical."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def progress(iterable: Iterable, *, total: Optional[int] = None, desc: str = "", leave: bool = False):
    """A tqdm progress bar with ETA (on stderr), quiet when ``SPARSENORM_NO_PROGRESS`` is set."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=leave, dynamic_ncols=True,
                disable=bool(os.environ.get("SPARSENORM_NO_PROGRESS")))


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


def load_cached_model(path: Path, model: torch.nn.Module, keys: Iterable[str], what: str) -> Optional[Dict[str, Any]]:
    """Load the weights :func:`cache_model` saved at ``path`` into ``model`` and return the saved ``keys`` of its
    info; None when there is no such file or it cannot be read (a stale or corrupt cache is retrained, not fatal:
    the warning names ``what``)."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["state_dict"])
        return {k: saved[k] for k in keys}
    except Exception as exc:
        print(f"sparsenorm: retraining the {what} ({path} unreadable: {exc})", file=sys.stderr)
        return None


def save_atomically(obj: Any, path: Path) -> None:
    """``torch.save`` through a ``.part`` file beside ``path``, then a rename: an interrupted save leaves the
    previous file (or none), never a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    torch.save(obj, partial)
    partial.replace(path)


def cache_model(path: Path, model: torch.nn.Module, info: Dict[str, Any], what: str) -> Optional[str]:
    """Save ``model``'s weights (on CPU) and ``info`` at ``path`` through a ``.part`` file (an interrupted save
    leaves no truncated cache); the path, or None with a warning naming ``what`` when the folder cannot be
    written (the run goes on without the cache)."""
    try:
        save_atomically({"state_dict": {k: v.cpu() for k, v in model.state_dict().items()}, **info}, path)
        return str(path)
    except OSError as exc:
        print(f"sparsenorm: could not cache the {what} in {path.parent}: {exc}", file=sys.stderr)
        return None


def save_figure(fig, path: Path) -> Path:
    """Save a matplotlib figure as PNG and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def headless_pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
