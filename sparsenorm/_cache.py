"""Where sparsenorm keeps files it fetches or builds: data sets, trained helper models, compiled kernels."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPARSENORM_CACHE`` if set, else ``$XDG_CACHE_HOME/sparsenorm`` (``~/.cache/sparsenorm``)."""
    env = os.environ.get("SPARSENORM_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "sparsenorm"
