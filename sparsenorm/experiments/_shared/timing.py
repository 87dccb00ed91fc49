"""How long things take: a stopwatch for the timings a run reports, and progress bars with an ETA."""
from __future__ import annotations

import os
import time
from typing import Iterable, Optional


def progress(iterable: Iterable, *, total: Optional[int] = None, desc: str = "", leave: bool = False):
    """A tqdm progress bar with ETA (on stderr), quiet when ``SPARSENORM_NO_PROGRESS`` is set."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=leave, dynamic_ncols=True,
                disable=bool(os.environ.get("SPARSENORM_NO_PROGRESS")))


class Stopwatch:
    """Seconds since it was made: ``elapsed``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
