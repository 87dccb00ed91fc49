"""The evaluation text, cut into chunks of tokens: the paired units of every claim.

Default text: Jane Austen's six novels (public domain; *Emma*, *Mansfield Park*, *Northanger Abbey*,
*Persuasion*, *Pride and Prejudice*, *Sense and Sensibility*, about 4.5 M characters) from the Debian
package ``r-cran-janeaustenr`` 1.0.0-1 (version and SHA-256 pinned in :mod:`.._shared.artifacts`),
fetched once by :func:`.._shared.provenance.fetch_artifact` (never installed), unpacked with
``dpkg-deb -x``, read from its R lazy-load database (``data/Rdata.rdb``: one character vector of
lines per novel, parsed with PyPI ``rdata``), and cached as one text file per novel with a
provenance record. ``--data-dir``: the user's own English text instead, a ``.txt`` file or a folder
of them (used as given, digest recorded).

Chunks (:func:`make_chunks`): the text's paragraphs (blank-line separated; lines joined), and
``n`` start paragraphs spaced evenly over the whole text; a chunk is the first ``chunk_tokens``
tokens of the paragraphs from its start on. No weight is trained here, and the few chunks that calibrate
the truncation samplers and the sparsity-matched rivals (:mod:`.evaluate`) are interleaved with the
evaluation chunks and never evaluated: the evaluation chunks are *not used for calibration*. They are
not held out from pretraining: public texts such as these are very likely in the model's pretraining
data (see :data:`.paper.TEXT_WORDS`).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..._cache import cache_dir
from ..._text import UserFacingError
from .._shared import provenance

TEXT_ARTIFACT = "r-cran-janeaustenr"
TEXT_SUBDIR = "jane-austen"
RDB_IN_PACKAGE = "usr/lib/R/site-library/janeaustenr/data"
NOVELS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")
MIN_PARAGRAPH_CHARS = 200
"""A chunk starts at a paragraph of at least this many characters (not a chapter heading or a line of verse)."""


@dataclass
class Chunk:
    """One stretch of text (evaluation or calibration): its token ids and where it starts."""

    ids: List[int]
    source: str
    """``file:paragraph`` of its first paragraph."""
    calibration: bool = False
    """True for the chunks that calibrate the truncation samplers (never evaluated)."""


# ---------------------------------------------------------------- the text

def austen_folder() -> Path:
    """The cache folder with one ``<novel>.txt`` per novel, made once from the pinned Debian package."""
    folder = cache_dir() / TEXT_SUBDIR
    if all((folder / f"{n}.txt").is_file() for n in NOVELS) and \
            provenance.use_derived(folder, "Jane Austen's novels", user_folder=False):
        return folder
    from .._shared.debian import extract_deb
    from .._shared.r_lazyload import decompress_rds, lazyload_entry

    deb = provenance.fetch_artifact(TEXT_ARTIFACT, how_to="or pass your own English text with --data-dir")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        unpacked = extract_deb(deb, Path(tmp) / "deb", "pass your own English text with --data-dir")
        data = unpacked / RDB_IN_PACKAGE
        try:
            index = _parse_r(decompress_rds((data / "Rdata.rdx").read_bytes()))
            rdb = (data / "Rdata.rdb").read_bytes()
            compressed = int(_first(index.get("compressed", 1)))
            variables = {str(k): v for k, v in index["variables"].items()}
            staging = Path(tmp) / "text"
            staging.mkdir()
            for novel in NOVELS:
                lines = _parse_r(lazyload_entry(rdb, *map(int, variables[novel]), compressed))
                (staging / f"{novel}.txt").write_text("\n".join(str(line) for line in lines) + "\n")
        except (OSError, KeyError, ValueError) as exc:
            raise UserFacingError(f"cannot read the novels from {deb.name} ({type(exc).__name__}: {exc}); pass your "
                                  f"own English text with --data-dir") from None
        if folder.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(folder)
        os.replace(staging, folder)
    provenance.write_derived(folder, [deb])
    return folder


def _parse_r(raw: bytes):
    import warnings

    import rdata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rdata warns that raw bytes have no file extension
        return rdata.conversion.convert(rdata.parser.parse_data(raw))


def _first(value) -> object:
    try:
        return list(value)[0]
    except TypeError:
        return value


POLICY_ARTIFACT = "debian-policy"
POLICY_SUBDIR = "debian-policy"
POLICY_IN_PACKAGE = "usr/share/doc/debian-policy/policy.txt.gz"


def policy_folder() -> Path:
    """The cache folder with ``policy.txt``, the Debian Policy Manual, made once from the pinned Debian package (the
    second text of issue 49: technical prose, another domain than the novels)."""
    import gzip

    folder = cache_dir() / POLICY_SUBDIR
    if (folder / "policy.txt").is_file() and provenance.use_derived(folder, "the Debian Policy Manual",
                                                                    user_folder=False):
        return folder
    from .._shared.debian import extract_deb

    deb = provenance.fetch_artifact(POLICY_ARTIFACT, how_to="or pass your own English text with --data-dir")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        unpacked = extract_deb(deb, Path(tmp) / "deb", "pass your own English text with --data-dir")
        try:
            text = gzip.decompress((unpacked / POLICY_IN_PACKAGE).read_bytes()).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserFacingError(f"cannot read {POLICY_IN_PACKAGE} from {deb.name} ({type(exc).__name__}: {exc}); "
                                  "pass your own English text with --data-dir") from None
        staging = Path(tmp) / "text"
        staging.mkdir()
        (staging / "policy.txt").write_text(text)
        if folder.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(folder)
        os.replace(staging, folder)
    provenance.write_derived(folder, [deb])
    return folder


def load_texts(data_dir: Optional[Path] = None, text: str = "austen") -> Tuple[List[Tuple[str, str]], str]:
    """``([(name, text), ...], description)``: the user's ``.txt`` file or folder of them, else the built-in ``text``:
    ``"austen"`` (Austen's novels) or ``"debian-policy"`` (the Debian Policy Manual)."""
    if data_dir is None and text == "debian-policy":
        folder = policy_folder()
        return [("policy", (folder / "policy.txt").read_text())], \
            "the Debian Policy Manual (Debian debian-policy 4.6.2.0, policy.txt)"
    if data_dir is None and text != "austen":
        raise ValueError(f"unknown built-in text {text!r} (austen or debian-policy)")
    if data_dir is None:
        folder = austen_folder()
        return [(n, (folder / f"{n}.txt").read_text()) for n in NOVELS], \
            "Jane Austen's six novels (Debian r-cran-janeaustenr 1.0.0-1)"
    path = Path(data_dir)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    else:
        raise UserFacingError(f"--data-dir {path} does not exist (give a .txt file or a folder of .txt files)")
    if not files:
        raise UserFacingError(f"--data-dir {path} holds no .txt file (give a .txt file or a folder of .txt files)")
    texts = []
    for f in files:
        try:
            texts.append((f.name, f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise UserFacingError(f"--data-dir: cannot read {f} as UTF-8 text ({exc})") from None
    if path.is_file():
        provenance.record_user_path(path, "evaluation text (--data-dir)")
    else:
        provenance.record_user_path(path, "evaluation text (--data-dir)", files)
    return texts, f"the user's text ({len(files)} file(s) from {path})"


def paragraphs(text: str) -> List[str]:
    """Blank-line separated paragraphs, each with its lines joined by single spaces."""
    out = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        para = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if para:
            out.append(para)
    return out


# ---------------------------------------------------------------- chunks

def make_chunks(texts: Sequence[Tuple[str, str]], tokenizer, n: int, calibration: int,
                chunk_tokens: int) -> List[Chunk]:
    """``n + calibration`` chunks of ``chunk_tokens`` tokens each, their starts spaced evenly over the paragraphs of
    ``texts`` (in order); ``calibration`` of them, spread among the others, are marked for calibration.

    Raises a :class:`UserFacingError` when the text is too short for that many disjoint chunks."""
    if n < 1 or calibration < 0 or chunk_tokens < 2:
        raise ValueError(f"need n >= 1, calibration >= 0, chunk_tokens >= 2; got {n}, {calibration}, {chunk_tokens}")
    paras = [(name, i, p) for name, text in texts for i, p in enumerate(paragraphs(text))]
    starts = [k for k, (_, _, p) in enumerate(paras) if len(p) >= MIN_PARAGRAPH_CHARS]
    total = n + calibration
    if len(starts) < total:
        raise UserFacingError(f"the evaluation text has {len(starts)} paragraphs of at least {MIN_PARAGRAPH_CHARS} "
                              f"characters; {total} chunks need one each")
    picked = [starts[int(round((j + 0.5) * len(starts) / total - 0.5))] for j in range(total)]
    cal = {int((j + 0.5) * total / calibration) for j in range(calibration)} if calibration else set()
    chunks = []
    for j, first in enumerate(picked):
        limit = picked[j + 1] if j + 1 < total else len(paras)
        ids: List[int] = []
        k = first
        while len(ids) < chunk_tokens and k < limit:
            ids += tokenizer((" " if ids else "") + paras[k][2] + "\n\n", add_special_tokens=False)["input_ids"]
            k += 1
        if len(ids) < chunk_tokens:
            raise UserFacingError(f"the evaluation text is too short for {total} disjoint chunks of {chunk_tokens} "
                                  f"tokens (chunk {j} from {paras[first][0]} reaches {len(ids)}); ask for fewer or "
                                  f"shorter chunks")
        chunks.append(Chunk(ids[:chunk_tokens], f"{paras[first][0]}:{paras[first][1]}", calibration=j in cal))
    return chunks
