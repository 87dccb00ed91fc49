"""Model weights on disk: saves that an interruption cannot truncate, and the cache of the helper models
an experiment trains once and reuses (the digit and image classifiers)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import torch


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
