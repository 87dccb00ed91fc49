"""Reading objects from an R package's lazy-load database (``data/Rdata.rdb`` + ``Rdata.rdx``) without R.

The index ``Rdata.rdx`` (a compressed RDS) gives each object's offset and length in the ``.rdb``; an
entry is a 4-byte big-endian length followed by zlib data (R's ``lazyLoadDBfetch``). An object that
keeps data in an environment (an mlr task keeps its data frame there) refers to it by name
(``env::N``), a separate entry of the database: an ordinary serialised list, parsed with the
``rdata`` package (imported when a database is read).
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import re
import zlib
from pathlib import Path
from typing import List, Tuple

import numpy as np


def decompress_rds(raw: bytes) -> bytes:
    """An RDS file's payload: R writes gzip by default, bzip2 or xz on request."""
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:3] == b"BZh":
        return bz2.decompress(raw)
    if raw[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(raw)
    return raw


def lazyload_entry(rdb: bytes, offset: int, length: int, compressed: int) -> bytes:
    """One serialised object of an R lazy-load database (R's ``lazyLoadDBfetch``).

    Each entry is a 4-byte big-endian uncompressed length, then (compression type 1, the default)
    zlib data; types 2 and 3 put a byte '2' (bzip2), 'Z' (xz) or '0' (stored) before the data.
    """
    blob = rdb[offset:offset + length]
    if len(blob) != length or length < 5:
        raise ValueError(f"entry at offset {offset} (length {length}) lies outside the database")
    size = int.from_bytes(blob[:4], "big")
    if compressed in (2, 3):
        kind, body = blob[4:5], blob[5:]
        data = {b"2": bz2.decompress, b"Z": lzma.decompress, b"0": bytes}[kind](body)
    else:
        data = zlib.decompress(blob[4:])
    if len(data) != size:
        raise ValueError(f"entry at offset {offset}: expected {size} bytes, got {len(data)}")
    return data


def read_mlr_multilabel_task(rdb_path: Path, rdx_path: Path, name: str
                             ) -> Tuple[np.ndarray, np.ndarray, List[str], List[str]]:
    """Features, 0/1 labels, feature names and label names of an mlr multi-label task.

    ``rdb_path``/``rdx_path`` are an R package's ``data/Rdata.rdb`` and ``Rdata.rdx``. The task's
    data frame lives in an environment stored as a separate entry (a persistent reference
    ``env::N``); its logical columns are the labels, its numeric columns the features.
    """
    import warnings

    import rdata

    def parse(data: bytes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rdata warns that raw bytes have no file extension
            return rdata.conversion.convert(rdata.parser.parse_data(data))

    index = parse(decompress_rds(Path(rdx_path).read_bytes()))
    rdb = Path(rdb_path).read_bytes()
    compressed = int(np.asarray(index.get("compressed", [1])).ravel()[0])
    variables = {str(k): v for k, v in index["variables"].items()}
    references = {str(k): v for k, v in index["references"].items()}
    if name not in variables:
        raise KeyError(f"{name!r} is not in {rdx_path}; it holds {', '.join(sorted(variables))}")
    task_bytes = lazyload_entry(rdb, *map(int, variables[name]), compressed)
    env_names = sorted({m.decode() for m in re.findall(rb"env::\d+", task_bytes)})
    if len(env_names) != 1 or env_names[0] not in references:
        raise ValueError(f"{name}: expected one environment reference holding its data, found {env_names}")
    env = parse(lazyload_entry(rdb, *map(int, references[env_names[0]]), compressed))
    frame = env["bindings"]["data"]
    label_cols = [c for c in frame.columns if str(frame[c].dtype).lower() in ("bool", "boolean")]
    feature_cols = [c for c in frame.columns if c not in label_cols]
    if not label_cols or not feature_cols:
        raise ValueError(f"{name}: expected logical label columns and numeric feature columns")
    labels = frame[label_cols]
    if labels.isna().to_numpy().any() or frame[feature_cols].isna().to_numpy().any():
        raise ValueError(f"{name}: the data frame has missing values")
    x = frame[feature_cols].to_numpy(dtype=np.float64)
    y = labels.to_numpy(dtype=np.int8)
    return x, y, [str(c) for c in feature_cols], [str(c) for c in label_cols]
