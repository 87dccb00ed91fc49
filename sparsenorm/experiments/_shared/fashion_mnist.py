"""Real Fashion-MNIST (Xiao et al. 2017): 60,000 training / 10,000 test 28x28 grey images, 10 classes.

Returned as an :class:`mnist.MNIST` (the same layout as MNIST: float32 ``(N, 784)`` in [0, 1]; the
last 10,000 training images are the validation split). Where the data comes from, in order:

1. ``data_dir`` holding the four IDX files (the original distribution's names, optionally ``.gz``:
   ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
   ``t10k-labels-idx1-ubyte``), or an ``mnist.npz``/pickle in MNIST's formats (see :mod:`.mnist`);
2. the cache folder ``fashion-mnist/`` in ``data_dir`` (if given) or :func:`sparsenorm._cache.cache_dir`, used
   while its provenance record names the pinned package and its digest matches
   (:func:`.provenance.use_derived`; in ``data_dir``, one without a record is the user's);
3. the Debian package ``dataset-fashion-mnist`` (31 MB, Expat licence; version and SHA-256 pinned in
   :mod:`.artifacts`): a ``.deb`` of it in ``data_dir`` (or the cache folder), else fetched with
   ``apt-get download`` (:func:`.provenance.fetch_artifact`), verified, unpacked with ``dpkg-deb -x``;
   its IDX files (``/usr/share/datasets/fashion-mnist/``) are copied into that cache.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional

from ..._cache import cache_dir
from ..._text import UserFacingError
from . import provenance
from .debian import extract_deb
from .mnist import IDX_FILES, MNIST, _load_user_dir, load_mnist

ARTIFACT = PACKAGE = "dataset-fashion-mnist"
PATH_IN_PACKAGE = "usr/share/datasets/fashion-mnist"
CACHE_FOLDER = "fashion-mnist"
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")

_HOW_TO = (f"or download {PACKAGE}_*.deb by hand (https://packages.debian.org/stable/{PACKAGE}) into the data "
           f"folder (--data-dir DIR or $SPARSENORM_CACHE/{CACHE_FOLDER}), or put the four Fashion-MNIST IDX files "
           f"({', '.join(IDX_FILES.values())}, optionally .gz) into a folder and pass it with --data-dir")


def _has_idx(folder: Path) -> bool:
    return folder.is_dir() and any((folder / f"{stem}{ext}").is_file()
                                   for stem in IDX_FILES.values() for ext in ("", ".gz"))


def load_fashion_mnist(data_dir: Optional[Path] = None, *, fetch: bool = True) -> MNIST:
    """Fashion-MNIST from the user's IDX files in ``data_dir``, else the cache, else a one-time fetch.

    ``fetch=False`` raises instead of downloading.
    """
    if data_dir is not None:
        data_dir = Path(data_dir).expanduser()
        if data_dir.is_file() or _has_idx(data_dir):
            return _named(load_mnist(data_dir, fetch=False))
    store = (data_dir if data_dir is not None else cache_dir()) / CACHE_FOLDER
    if not (_has_idx(store) and provenance.use_derived(store, "Fashion-MNIST cache (--data-dir)",
                                                       user_folder=data_dir is not None)):
        _fetch_into(store, fetch)
    found = _load_user_dir(store)  # the cache's IDX files (recorded above as the cache, not as user data)
    if found is None:
        raise UserFacingError(f"the Fashion-MNIST cache {store} holds no IDX files; delete it to unpack again")
    return _named(found[0])


def _named(data: MNIST) -> MNIST:
    from dataclasses import replace

    return replace(data, source=f"Fashion-MNIST, {data.source}")


def _fetch_into(store: Path, download: bool = True) -> None:
    """The verified package (a local .deb, the artifact cache, or fetched when ``download``), unpacked;
    its IDX files copied into ``store`` with the provenance record."""
    deb = provenance.fetch_artifact(
        ARTIFACT, store.parent, search=[store], how_to=_HOW_TO, download=download,
        missing=f"Fashion-MNIST is not in {store} and fetching is off; {_HOW_TO}")
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFacingError(f"cannot create the cache folder {store}: {exc}; set SPARSENORM_CACHE or --data-dir "
                              f"to a writable folder") from None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        unpacked = extract_deb(deb, work / "unpacked", _HOW_TO) / PATH_IN_PACKAGE
        files = [unpacked / f"{stem}.gz" for stem in IDX_FILES.values()]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UserFacingError(f"{deb.name} lacks {', '.join(missing)} under /{PATH_IN_PACKAGE}; {_HOW_TO}")
        for f in files:  # copy then rename: a killed run never leaves a half-written IDX file
            partial = store / (f.name + ".part")
            shutil.copyfile(f, partial)
            partial.replace(store / f.name)
    provenance.write_derived(store, [deb])
