"""Data that ships inside Debian packages: ``apt-get download`` a package, ``dpkg-deb -x`` it.

The packages are never installed; their files are unpacked into a folder and read from there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .common import UserFacingError


def download_deb(package: str, workdir: Path, what: str, how_to: str) -> Path:
    """``apt-get download PACKAGE`` into ``workdir`` (after ``apt-get update`` when root and the
    package lists are missing); ``what`` names the data for the error message, ``how_to`` says
    what the user can do instead."""
    if shutil.which("apt-get") is None:
        raise UserFacingError(f"{what} comes from the Debian package {package}, but apt-get is not available; {how_to}")

    def download() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", package], cwd=workdir, capture_output=True, text=True)

    result = download()
    if result.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        result = download()
    debs = sorted(Path(workdir).glob(f"{package}_*.deb"))
    if result.returncode != 0 or not debs:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise UserFacingError(
            f"could not fetch {what}: `apt-get download {package}` failed ({detail[-1] if detail else 'no output'}); "
            f"run `apt-get update` (as root) and retry, {how_to}"
        )
    return debs[-1]


def extract_deb(deb: Path, target: Path, how_to: str) -> Path:
    """``dpkg-deb -x DEB TARGET``; returns ``target``. ``how_to`` says what to extract by hand."""
    if shutil.which("dpkg-deb") is None:
        raise UserFacingError(f"dpkg-deb is needed to unpack {Path(deb).name}; install dpkg, or {how_to}")
    result = subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        raise UserFacingError(f"could not unpack {deb}: {result.stderr.strip() or 'dpkg-deb failed'}")
    return Path(target)
