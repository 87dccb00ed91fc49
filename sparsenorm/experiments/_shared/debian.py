"""Data that ships inside Debian packages: ``dpkg-deb -x`` a package fetched by
:func:`.provenance.fetch_artifact` (pinned version and SHA-256, see :mod:`.artifacts`).

The packages are never installed; their files are unpacked into a folder and read from there.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..._text import UserFacingError


def extract_deb(deb: Path, target: Path, how_to: str) -> Path:
    """``dpkg-deb -x DEB TARGET``; returns ``target``. ``how_to`` (in every error) says what to do instead:
    what to extract by hand, and the loader's path option (``--data-dir``) to give it."""
    if shutil.which("dpkg-deb") is None:
        raise UserFacingError(f"dpkg-deb is needed to unpack {Path(deb).name}; install dpkg, or {how_to}")
    result = subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        raise UserFacingError(f"could not unpack {deb}: {result.stderr.strip() or 'dpkg-deb failed'}; {how_to}")
    return Path(target)
