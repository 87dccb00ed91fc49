"""Data that ships inside Debian packages: ``apt-get download`` a ``.deb`` and unpack it with ``dpkg-deb -x``.

The package is never installed; only the files the loader needs are copied out of it. Both steps
raise :class:`common.UserFacingError` naming the package and what to do by hand (``how_to``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .common import UserFacingError


def download_deb(package: str, workdir: Path, how_to: str) -> Path:
    """``apt-get download PACKAGE`` into ``workdir`` (after ``apt-get update`` when that fails and we are
    root, i.e. the package lists may be missing); the path of the ``.deb``."""
    if shutil.which("apt-get") is None:
        raise UserFacingError(f"the data comes from the Debian package {package}, but apt-get is not available; "
                              f"{how_to}")
    workdir = Path(workdir)

    def download() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", package], cwd=workdir, capture_output=True, text=True)

    result = download()
    if result.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        result = download()
    debs = sorted(workdir.glob(f"{package}_*.deb"))
    if result.returncode != 0 or not debs:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise UserFacingError(
            f"`apt-get download {package}` failed ({detail[-1] if detail else 'no output'}); "
            f"run `apt-get update` (as root) and retry, {how_to}"
        )
    return debs[-1]


def extract_deb(deb: Path, target: Path) -> Path:
    """Unpack ``deb`` into ``target`` with ``dpkg-deb -x``; return ``target``."""
    if shutil.which("dpkg-deb") is None:
        raise UserFacingError(f"dpkg-deb is needed to unpack {Path(deb).name}; install dpkg, or unpack it by hand "
                              f"(`ar x` then `tar xf data.tar.*`)")
    result = subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        raise UserFacingError(f"could not unpack {deb}: {result.stderr.strip() or 'dpkg-deb failed'}")
    return Path(target)
