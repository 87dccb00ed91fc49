"""Sentence classification data: Rotten Tomatoes sentences (the SST-2 stand-in) or the user's GLUE TSVs.

**Rotten Tomatoes** (default). The 10,605 movie-review sentences SST was built from, with the mean
human sentiment score in [-4, 4] of Hutto & Gilbert (ICWSM 2014), ship inside the *source* package
of PyPI ``vaderSentiment`` 3.3.2 (``additional_resources/hutto_ICWSM_2014.tar.gz`` ->
``movieReviewSnippets_GroundTruth.txt``, lines ``id<TAB>score<TAB>sentence``). The sdist (version
and SHA-256 pinned in :mod:`.._shared.artifacts`) is fetched once and verified by
:func:`.._shared.provenance.fetch_artifact` (never installed) and the text file is cached with a
provenance record. Label: positive iff the mean score is > 0; the 37 sentences with score exactly 0
are left out (neither side). Split: stratified 80 / 10 / 10 train / validation / test with
:data:`SPLIT_SEED` (scikit-learn ``train_test_split``), the same for every run seed.

**GLUE-style TSVs** (``--data-dir`` holding ``train.tsv`` and ``dev.tsv``): the files as GLUE
distributes them (a header row; SST-2 ``sentence``/``label``, RTE ``sentence1``/``sentence2``/``label``,
QNLI ``question``/``sentence``/``label``, QQP ``question1``/``question2``/``is_duplicate``, MRPC
``#1 String``/``#2 String``/``Quality``). GLUE's test labels are hidden, so ``dev.tsv`` is the
reported (test) set, as in the paper's Table 2, and the validation set for choosing the learning
rate is a stratified 10 % of ``train.tsv`` (:data:`SPLIT_SEED`). Labels are mapped to 0..K-1 in
sorted order of the training labels.
"""
from __future__ import annotations

import csv
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..._cache import cache_dir
from ..._text import UserFacingError
from .._shared import provenance
from .._shared.artifacts import ARTIFACTS

VADER_ARTIFACT = "vaderSentiment"
VADER_PACKAGE = ARTIFACTS[VADER_ARTIFACT].spec  # "vaderSentiment==3.3.2"
INNER_ARCHIVE = "additional_resources/hutto_ICWSM_2014.tar.gz"
SENTENCES_FILE = "movieReviewSnippets_GroundTruth.txt"
CACHE_SUBDIR = "rotten_tomatoes"
SPLIT_SEED = 0
VALIDATION_FRACTION = 0.1
TEST_FRACTION = 0.1

# (text columns, label column) of the GLUE tasks, tried in order.
GLUE_TEXT_COLUMNS = (("sentence1", "sentence2"), ("question1", "question2"), ("question", "sentence"),
                     ("#1 String", "#2 String"), ("sentence",))
GLUE_LABEL_COLUMNS = ("label", "is_duplicate", "Quality")


@dataclass
class Split:
    """Texts (one or two strings per example) and integer labels."""

    texts: List[Tuple[str, ...]]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, size: Optional[int], seed: int) -> "Split":
        """A stratified subset of ``size`` examples (the whole split when ``size`` is None or too large)."""
        if size is None or size >= len(self):
            return self
        from sklearn.model_selection import train_test_split

        keep, _ = train_test_split(np.arange(len(self)), train_size=size, stratify=self.labels, random_state=seed)
        keep = np.sort(keep)
        return Split([self.texts[i] for i in keep], self.labels[keep])


@dataclass
class TextData:
    name: str
    train: Split
    validation: Split
    test: Split
    label_names: List[str]
    source: str
    """Where it came from and how it was split, in words (goes into the report)."""

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def summary(self) -> dict:
        return {part: {"n": len(s), "positive_fraction" if self.num_labels == 2 else "label_counts":
                       float(s.labels.mean()) if self.num_labels == 2 else np.bincount(s.labels).tolist()}
                for part, s in (("train", self.train), ("validation", self.validation), ("test", self.test))}


def load_data(data_dir: Optional[Path] = None) -> TextData:
    """GLUE TSVs when ``data_dir`` holds ``train.tsv``; else the Rotten Tomatoes sentences (cached in ``data_dir``)."""
    if data_dir is not None and (Path(data_dir) / "train.tsv").is_file():
        data = load_glue_tsv(Path(data_dir))
        provenance.record_user_path(Path(data_dir), "GLUE-style TSVs (--data-dir)",
                                    [Path(data_dir) / "train.tsv", Path(data_dir) / "dev.tsv"])
        return data
    return load_rotten_tomatoes(data_dir)


# ---------------------------------------------------------------- Rotten Tomatoes

def load_rotten_tomatoes(data_dir: Optional[Path] = None) -> TextData:
    """The sentences, binary labels and the seeded stratified split (module docstring)."""
    path = sentences_file(data_dir)
    texts, scores = parse_sentences(path.read_text(encoding="utf-8"), str(path))
    keep = scores != 0
    texts = [t for t, k in zip(texts, keep) if k]
    labels = (scores[keep] > 0).astype(np.int64)
    train, validation, test = stratified_split(texts, labels, VALIDATION_FRACTION, TEST_FRACTION)
    source = (f"Rotten Tomatoes sentences (Hutto & Gilbert 2014, from PyPI {VADER_PACKAGE} source package; "
              f"{len(scores)} sentences, {int((~keep).sum())} with mean score 0 left out; positive iff score > 0); "
              f"stratified {1 - VALIDATION_FRACTION - TEST_FRACTION:.0%}/{VALIDATION_FRACTION:.0%}/{TEST_FRACTION:.0%} "
              f"train/validation/test split with seed {SPLIT_SEED}")
    return TextData("rotten_tomatoes", train, validation, test, ["negative", "positive"], source)


def parse_sentences(text: str, where: str) -> Tuple[List[Tuple[str]], np.ndarray]:
    """``id<TAB>score<TAB>sentence`` lines -> (texts, scores); a malformed line is a clear error."""
    texts, scores = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rstrip("\r").split("\t", 2)
        try:
            score = float(parts[1])
            sentence = parts[2].strip()
        except (IndexError, ValueError):
            raise UserFacingError(f"{where}, line {number}: expected 'id<TAB>score<TAB>sentence', "
                                  f"got {line[:80]!r}") from None
        texts.append((sentence,))
        scores.append(score)
    if not texts:
        raise UserFacingError(f"{where} holds no sentences")
    return texts, np.asarray(scores)


def stratified_split(texts: Sequence[Tuple[str, ...]], labels: np.ndarray, val_fraction: float,
                     test_fraction: float) -> Tuple[Split, Split, Split]:
    from sklearn.model_selection import train_test_split

    index = np.arange(len(texts))
    rest, test = train_test_split(index, test_size=test_fraction, stratify=labels, random_state=SPLIT_SEED)
    train, val = train_test_split(rest, test_size=val_fraction / (1 - test_fraction), stratify=labels[rest],
                                  random_state=SPLIT_SEED)
    pick = lambda idx: Split([texts[i] for i in np.sort(idx)], labels[np.sort(idx)])  # noqa: E731
    return pick(train), pick(val), pick(test)


def sentences_file(data_dir: Optional[Path] = None) -> Path:
    """``movieReviewSnippets_GroundTruth.txt`` in ``data_dir`` (or the cache), fetched once from PyPI."""
    folder = Path(data_dir) if data_dir is not None else cache_dir() / CACHE_SUBDIR
    path = folder / SENTENCES_FILE
    if provenance.use_derived(path, "Rotten Tomatoes sentences (--data-dir)", user_folder=data_dir is not None):
        return path
    if data_dir is not None and not folder.is_dir():
        raise UserFacingError(f"--data-dir {folder} does not exist (give a folder with train.tsv/dev.tsv, "
                              f"or one holding or to receive {SENTENCES_FILE})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFacingError(f"cannot create {folder}: {exc}; set SPARSENORM_CACHE or --data-dir") from None
    sdist = provenance.fetch_artifact(VADER_ARTIFACT, data_dir, how_to=f"place {SENTENCES_FILE} in --data-dir")
    raw = extract_sentences(sdist)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_bytes(raw)
    os.replace(partial, path)
    provenance.write_derived(path, [sdist])
    return path


def extract_sentences(sdist: Path) -> bytes:
    """The sentences file from the nested archive inside the vaderSentiment sdist."""
    try:
        with tarfile.open(sdist) as outer:
            inner = next((m for m in outer.getmembers() if m.name.endswith(INNER_ARCHIVE)), None)
            if inner is None:
                raise KeyError(INNER_ARCHIVE)
            with tarfile.open(fileobj=io.BytesIO(outer.extractfile(inner).read())) as tar:
                member = next((m for m in tar.getmembers() if m.name.endswith("/" + SENTENCES_FILE)), None)
                if member is None:
                    raise KeyError(SENTENCES_FILE)
                return tar.extractfile(member).read()
    except (KeyError, tarfile.TarError, OSError) as exc:
        raise UserFacingError(f"{sdist.name} does not hold {INNER_ARCHIVE} -> {SENTENCES_FILE} ({exc}); "
                              f"place {SENTENCES_FILE} in --data-dir") from None


# ---------------------------------------------------------------- GLUE-style TSV files

def load_glue_tsv(folder: Path) -> TextData:
    """``train.tsv`` (training + a stratified 10 % validation part) and ``dev.tsv`` (reported)."""
    train_texts, train_raw, columns = read_glue_tsv(folder / "train.tsv")
    dev_path = folder / "dev.tsv"
    if not dev_path.is_file():
        raise UserFacingError(f"--data-dir {folder}: train.tsv found but no dev.tsv (GLUE's labelled validation file)")
    dev_texts, dev_raw, _ = read_glue_tsv(dev_path)
    names = sorted(set(train_raw))
    if len(names) < 2:
        raise UserFacingError(f"{folder / 'train.tsv'}: needs at least two labels, found {names}")
    unknown = sorted(set(dev_raw) - set(names))
    if unknown:
        raise UserFacingError(f"{dev_path}: labels {unknown} do not occur in train.tsv")
    code = {n: i for i, n in enumerate(names)}
    train_labels = np.array([code[x] for x in train_raw], dtype=np.int64)
    from sklearn.model_selection import train_test_split

    idx_train, idx_val = train_test_split(np.arange(len(train_texts)), test_size=VALIDATION_FRACTION,
                                          stratify=train_labels, random_state=SPLIT_SEED)
    idx_train, idx_val = np.sort(idx_train), np.sort(idx_val)
    train = Split([train_texts[i] for i in idx_train], train_labels[idx_train])
    val = Split([train_texts[i] for i in idx_val], train_labels[idx_val])
    test = Split(dev_texts, np.array([code[x] for x in dev_raw], dtype=np.int64))
    source = (f"GLUE-style TSVs in {folder} (text columns {', '.join(columns)}); train.tsv split into train and a "
              f"stratified {VALIDATION_FRACTION:.0%} validation part (seed {SPLIT_SEED}) for choosing the learning "
              f"rate; dev.tsv reported as the test set (as the paper reports GLUE dev accuracy)")
    return TextData(folder.name, train, val, test, names, source)


def read_glue_tsv(path: Path) -> Tuple[List[Tuple[str, ...]], List[str], Tuple[str, ...]]:
    """(texts, raw labels, text column names); rows with a missing field are skipped (QQP has a few)."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise UserFacingError(f"{path} is empty")
    header = rows[0]
    label_col = next((c for c in GLUE_LABEL_COLUMNS if c in header), None)
    text_cols = next((cols for cols in GLUE_TEXT_COLUMNS if all(c in header for c in cols)), None)
    if label_col is None or text_cols is None:
        raise UserFacingError(f"{path}: header {header} has no known GLUE text column ({GLUE_TEXT_COLUMNS}) "
                              f"or label column ({GLUE_LABEL_COLUMNS})")
    where = [header.index(c) for c in text_cols]
    at = header.index(label_col)
    texts, labels = [], []
    for row in rows[1:]:
        if len(row) < len(header) or not row[at].strip():
            continue
        texts.append(tuple(row[i] for i in where))
        labels.append(row[at].strip())
    if not texts:
        raise UserFacingError(f"{path}: no complete rows")
    return texts, labels, text_cols
