"""EN->DE parallel text: LibreOffice's help pages (Debian packages), or the user's own files.

LibreOffice help: ``libreoffice-help-en-us`` and ``libreoffice-help-de`` ship the same HTML pages
in both languages; every paragraph and heading carries the same ``par_id...``/``hd_id...`` id in
both, so aligning by (file, id) gives sentence-like pairs (MPL-2.0; software documentation).
Pairs are whitespace-normalised, pairs with identical sides (untranslated) dropped, deduplicated,
filtered by length (:data:`MIN_WORDS`..:data:`MAX_WORDS` English words, German/English word ratio
within :data:`MAX_RATIO`) and split once with a fixed seed (:data:`SPLIT_SEED`) into
:data:`VALID_SIZE` validation and :data:`TEST_SIZE` test pairs, the rest for training. The split is
cached as ``train.en`` / ``train.de`` / ``valid.*`` / ``test.*`` in ``CACHE/libreoffice-help-en-de``.
Both packages are pinned (version and SHA-256, :mod:`.._shared.artifacts`) and verified before they
are unpacked (:func:`.._shared.provenance.fetch_artifact`); the cache carries a provenance record.

User data (``--data-dir DIR``): ``DIR`` holding ``train.en``, ``train.de``, ``valid.en``,
``valid.de``, ``test.en``, ``test.de`` (one sentence a line, line *i* of ``.en`` translating line *i*
of ``.de``; e.g. IWSLT'14 EN-DE, the paper's data). A ``--data-dir`` without ``train.en`` is the
folder where the LibreOffice data is fetched and cached.
"""
from __future__ import annotations

import random
import re
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..._cache import cache_dir
from ..._text import UserFacingError
from .._shared import provenance
from .._shared.debian import extract_deb

PACKAGES = {"en": "libreoffice-help-en-us", "de": "libreoffice-help-de"}  # also the artifacts' names
HELP_ROOTS = {"en": "usr/share/libreoffice/help/en-US", "de": "usr/share/libreoffice/help/de"}
CACHE_NAME = "libreoffice-help-en-de"
SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")
MIN_WORDS, MAX_WORDS, MAX_RATIO = 3, 60, 2.5
SPLIT_SEED, VALID_SIZE, TEST_SIZE = 1234, 1000, 1000
_ID = re.compile(r"^(par|hd)_id")
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

Pair = Tuple[str, str]


@dataclass
class ParallelData:
    """Train/valid/test lists of (English, German) pairs and where they came from."""

    train: List[Pair]
    valid: List[Pair]
    test: List[Pair]
    source: str
    """In words, for the report: the corpus, its filters and split."""

    def sizes(self) -> Dict[str, int]:
        return {s: len(getattr(self, s)) for s in SPLITS}


class _ParagraphParser(HTMLParser):
    """Text of every element whose id starts with ``par_id``/``hd_id`` (nested ids get their own text)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: List[Optional[str]] = []  # the id of each open element (None if it has none)
        self.texts: Dict[str, List[str]] = {}

    def handle_starttag(self, tag, attrs) -> None:
        if tag in _VOID:
            return
        ident = dict(attrs).get("id")
        self.stack.append(ident if ident and _ID.match(ident) else None)
        if self.stack[-1]:
            self.texts.setdefault(self.stack[-1], [])

    def handle_endtag(self, tag) -> None:
        if tag not in _VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data) -> None:
        for ident in reversed(self.stack):
            if ident:
                self.texts[ident].append(data)
                return


def paragraphs(html: str) -> Dict[str, str]:
    """``{id: text}`` of one help page's paragraphs and headings, whitespace-normalised."""
    parser = _ParagraphParser()
    parser.feed(html)
    return {k: " ".join("".join(v).split()) for k, v in parser.texts.items()}


def align_help_pages(en_root: Path, de_root: Path) -> List[Pair]:
    """Pairs of paragraphs with the same id in the same file, in file order, before any filtering."""
    pairs: List[Pair] = []
    for en_file in sorted(Path(en_root).rglob("*.html")):
        de_file = Path(de_root) / en_file.relative_to(en_root)
        if not de_file.is_file():
            continue
        en, de = paragraphs(en_file.read_text(errors="replace")), paragraphs(de_file.read_text(errors="replace"))
        pairs.extend((en[k], de[k]) for k in en if k in de and en[k] and de[k])
    return pairs


def clean_pairs(pairs: List[Pair]) -> List[Pair]:
    """Drop untranslated pairs, duplicates (first kept) and pairs outside the length filters."""
    seen, kept = set(), []
    for en, de in pairs:
        n_en, n_de = len(en.split()), len(de.split())
        if en == de or (en, de) in seen or not MIN_WORDS <= n_en <= MAX_WORDS or not 1 <= n_de <= MAX_WORDS:
            continue
        if max(n_en, n_de) / min(n_en, n_de) > MAX_RATIO:
            continue
        seen.add((en, de))
        kept.append((en, de))
    return kept


def split_pairs(pairs: List[Pair], seed: int = SPLIT_SEED) -> Dict[str, List[Pair]]:
    """A fixed seeded split; valid and test get :data:`VALID_SIZE`/:data:`TEST_SIZE` (or a tenth each
    of a small corpus). English sentences are kept within one split, so no test source is trained on."""
    sources = sorted({en for en, _ in pairs})
    random.Random(seed).shuffle(sources)
    n_valid = min(VALID_SIZE, len(sources) // 10)
    n_test = min(TEST_SIZE, len(sources) // 10)
    part = {en: ("valid" if i < n_valid else "test" if i < n_valid + n_test else "train")
            for i, en in enumerate(sources)}
    out: Dict[str, List[Pair]] = {s: [] for s in SPLITS}
    for en, de in pairs:
        out[part[en]].append((en, de))
    return out


def write_split(folder: Path, split: Dict[str, List[Pair]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        for i, lang in enumerate(LANGS):
            tmp = folder / f"{name}.{lang}.part"
            tmp.write_text("".join(p[i] + "\n" for p in split[name]))
            tmp.replace(folder / f"{name}.{lang}")  # atomic: never a half-written cache


def read_user_data(folder: Path) -> Dict[str, List[Pair]]:
    """``train/valid/test.{en,de}`` from ``folder``, checked line by line."""
    folder = Path(folder)
    missing = [f"{s}.{lang}" for s in SPLITS for lang in LANGS if not (folder / f"{s}.{lang}").is_file()]
    if missing:
        raise UserFacingError(f"--data-dir {folder}: missing {', '.join(missing)} (give train/valid/test .en and .de "
                              "files, one sentence a line, or a folder without train.en to cache the LibreOffice "
                              "data)")
    out = {}
    for s in SPLITS:
        en = (folder / f"{s}.en").read_text(encoding="utf-8").splitlines()
        de = (folder / f"{s}.de").read_text(encoding="utf-8").splitlines()
        if len(en) != len(de):
            raise UserFacingError(f"--data-dir {folder}: {s}.en has {len(en)} lines but {s}.de has {len(de)}")
        pairs = [(a.strip(), b.strip()) for a, b in zip(en, de) if a.strip() and b.strip()]
        if not pairs:
            raise UserFacingError(f"--data-dir {folder}: {s}.en/{s}.de hold no non-empty line pair")
        out[s] = pairs
    return out


def fetch_libreoffice(folder: Path) -> Path:
    """``folder/libreoffice-help-en-de`` with the cleaned, split pairs, fetching the .debs if needed
    (``*.deb`` files of both packages already in ``folder`` are used offline)."""
    target = Path(folder) / CACHE_NAME
    if all((target / f"{s}.{lang}").is_file() for s in SPLITS for lang in LANGS) and provenance.use_derived(
            target, "EN-DE split cache (--data-dir)", user_folder=Path(folder) != cache_dir()):
        return target
    how_to = (f"or download {PACKAGES['en']}_*.deb and {PACKAGES['de']}_*.deb by hand into the data folder (--data-dir "
              "DIR or $SPARSENORM_CACHE), or give your own train/valid/test.en/.de files with --data-dir DIR")
    Path(folder).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        roots, debs = {}, []
        for lang in PACKAGES:
            deb = provenance.fetch_artifact(PACKAGES[lang], Path(folder), how_to=how_to)
            debs.append(deb)
            by_hand = "or give your own train/valid/test.en/.de files with --data-dir DIR"
            root = extract_deb(deb, work / lang, by_hand) / HELP_ROOTS[lang]
            if not root.is_dir():
                raise UserFacingError(f"{deb.name} has no {HELP_ROOTS[lang]} folder; {by_hand}")
            roots[lang] = root
        pairs = clean_pairs(align_help_pages(roots["en"], roots["de"]))
    if len(pairs) < 100:
        raise UserFacingError(f"only {len(pairs)} EN-DE pairs could be aligned from the LibreOffice help pages")
    write_split(target, split_pairs(pairs))
    provenance.write_derived(target, debs)
    return target


def load_parallel(data_dir: Optional[Path] = None) -> ParallelData:
    """The user's files when ``data_dir`` holds ``train.en``; else the LibreOffice help pairs."""
    if data_dir is not None and (Path(data_dir) / "train.en").is_file():
        split = read_user_data(Path(data_dir))
        provenance.record_user_path(Path(data_dir), "EN-DE parallel files (--data-dir)",
                                    [Path(data_dir) / f"{s}.{lang}" for s in SPLITS for lang in LANGS])
        return ParallelData(**split, source=f"the user's parallel files in {data_dir}")
    folder = fetch_libreoffice(Path(data_dir) if data_dir is not None else cache_dir())
    split = read_user_data(folder)
    source = (f"LibreOffice 7.4 help pages, EN-US and DE (Debian {PACKAGES['en']}/{PACKAGES['de']}), paragraphs "
              f"aligned by file and id, untranslated and duplicate pairs dropped, {MIN_WORDS}-{MAX_WORDS} English "
              f"words, word ratio <= {MAX_RATIO}, split with seed {SPLIT_SEED} by English sentence")
    return ParallelData(**split, source=source)


def train_sentencepiece(data: ParallelData, vocab_size: int, model_path: Path, seed: int = 0):
    """A SentencePiece unigram model shared by both languages, trained on the training split only.

    Ids: 0 pad, 1 unk, 2 bos, 3 eos (the model's PAD/UNK/BOS/EOS). The vocabulary shrinks to what
    the text supports when it is small (``hard_vocab_limit=False``). Returns the loaded processor.
    """
    import io

    import sentencepiece as spm

    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    text = [s for pair in data.train for s in pair]
    random.Random(seed).shuffle(text)
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=buffer, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3, hard_vocab_limit=False,
        num_threads=1, minloglevel=2,
    )
    model_path.write_bytes(buffer.getvalue())
    return spm.SentencePieceProcessor(model_proto=buffer.getvalue())
