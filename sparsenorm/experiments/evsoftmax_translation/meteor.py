"""METEOR (Table 4's METEOR column) per sentence: NLTK's ``meteor_score`` with WordNet 3.0 from Debian.

NLTK's implementation matches exact words, then stems, then WordNet synonyms. Here:

* Tokens: sacrebleu's 13a tokenizer, lowercased, as ROUGE (:func:`.evaluate.rouge`).
* Stems: the German Snowball stemmer (the outputs are German; NLTK's default, Porter, is English).
* Synonyms: WordNet 3.0 from Debian's ``wordnet-base`` package (the pinned file of
  ``_shared/artifacts.py``, fetched and verified by :func:`.provenance.fetch_artifact`, unpacked,
  never installed: :func:`fetch_wordnet`), read by NLTK's ``WordNetCorpusReader``. WordNet is English, so on
  German output its synonym stage rarely fires (only on words spelled alike in both languages): the
  score is close to a stem-level METEOR, which the report says.
* When WordNet cannot be fetched (no apt-get, offline), the synonym stage is empty ("stem-only METEOR")
  and the result says so (``method``).

The paper's METEOR (Table 4, :data:`.paper.PAPER_TABLE`) is on IWSLT's English-side tools and is not comparable.
"""
from __future__ import annotations

import shutil
import warnings
import tempfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..._text import UserFacingError
from .._shared import provenance
from .._shared.debian import extract_deb

WORDNET_PACKAGE = "wordnet-base"
WORDNET_DIR = "wordnet-3.0"
STEM_ONLY = "stem-only METEOR (exact and German Snowball stem matches; no WordNet)"
WITH_WORDNET = ("METEOR of NLTK with WordNet 3.0 (Debian wordnet-base; English synonyms, so on German output close "
                "to stem-level) and the German Snowball stemmer")
_SYNTACTIC = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}


def fetch_wordnet(folder: Path) -> Path:
    """``folder/wordnet-3.0``: WordNet 3.0's database files from Debian's ``wordnet-base`` (the pinned
    artifact, verified before use; a ``wordnet-base_*.deb`` already in ``folder`` is used offline), with
    the ``lexnames`` file NLTK reads written from the package's own ``lexnames(5WN)`` manual page
    (Debian ships the table there, not as a file). The unpacked folder is a derived cache: used only
    while its provenance record names the pinned package and its digest matches."""
    target = Path(folder) / WORDNET_DIR
    if (target / "data.noun").is_file() and (target / "lexnames").is_file() and provenance.use_derived(
            target, "WordNet 3.0 folder", user_folder=False):
        return target
    how_to = f"or put {WORDNET_PACKAGE}_*.deb into {folder} ($SPARSENORM_CACHE) by hand"
    Path(folder).mkdir(parents=True, exist_ok=True)
    deb = provenance.fetch_artifact(WORDNET_PACKAGE, Path(folder), how_to=how_to)
    with tempfile.TemporaryDirectory() as tmp:
        root = extract_deb(deb, Path(tmp) / "x", f"extract usr/share/wordnet from {deb.name} yourself")
        source, page = root / "usr/share/wordnet", root / "usr/share/man/man5/lexnames.5WN.gz"
        if not (source / "data.noun").is_file() or not page.is_file():
            raise UserFacingError(f"{deb.name} has no usr/share/wordnet/data.noun or lexnames(5WN) page")
        staging = Path(tmp) / WORDNET_DIR
        shutil.copytree(source, staging)
        manpage = zlib.decompress(page.read_bytes(), 31).decode("latin-1")
        (staging / "lexnames").write_text(lexnames_from_manpage(manpage))
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(staging, target)
    provenance.write_derived(target, [deb])
    return target


def lexnames_from_manpage(text: str) -> str:
    """The ``lexnames`` database file (``NN<TAB>name<TAB>syntactic category``) from the ``lexnames(5WN)`` page's
    table rows (``NN<TAB>name<TAB>description``); the category follows from the name's part of speech."""
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0].strip().isdigit() and "." in parts[1]:
            name = parts[1].strip()
            rows.append(f"{parts[0].strip()}\t{name}\t{_SYNTACTIC[name.split('.')[0]]}")
    if len(rows) != 45:  # WordNet 3.0 has 45 lexicographer files (00-44)
        raise UserFacingError(f"the lexnames(5WN) page gave {len(rows)} lexicographer files, expected 45")
    return "\n".join(rows) + "\n"


class _NoSynonyms:
    """A stand-in for WordNet with no synsets: METEOR's synonym stage matches nothing (stem-only METEOR)."""

    @staticmethod
    def synsets(*_args, **_kwargs) -> list:
        return []


def load_wordnet(folder: Optional[Path]) -> Tuple[Any, str]:
    """(WordNet reader, method): WordNet 3.0 from :func:`fetch_wordnet` under ``folder`` (default: the cache), or,
    when it cannot be fetched, a reader without synonyms and :data:`STEM_ONLY`."""
    from ..._cache import cache_dir

    try:
        path = fetch_wordnet(Path(folder) if folder is not None else cache_dir())
    except UserFacingError:
        return _NoSynonyms(), STEM_ONLY
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class Reader(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):  # the map to another WordNet's ids serves only OMW; none is loaded
            return None

    if str(path.parent) not in nltk.data.path:  # NLTK reads corpora only under its data path
        nltk.data.path.append(str(path.parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "multilingual functions are not available": none are used
        return Reader(str(path), None), WITH_WORDNET


def meteor(hypotheses: List[str], references: List[str], wordnet: Any) -> List[float]:
    """METEOR x 100 per sentence (NLTK's defaults alpha 0.9, beta 3, gamma 0.5), 13a tokens, lowercased."""
    from nltk.stem.snowball import SnowballStemmer
    from nltk.translate.meteor_score import meteor_score
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references must pair up, got {len(hypotheses)} and {len(references)}")
    tok, stemmer = Tokenizer13a(), SnowballStemmer("german")
    return [100.0 * meteor_score([tok(r.lower()).split()], tok(h.lower()).split(), stemmer=stemmer, wordnet=wordnet)
            for h, r in zip(hypotheses, references)]


def meteor_of_records(records: List[Dict[str, Any]],
                      folder: Optional[Path] = None) -> Tuple[Dict[str, Dict[int, float]], str]:
    """``{normalizer: {seed: corpus METEOR}}`` (the mean of the sentences' METEOR) from the beam hypotheses stored in
    the job records, and the method; scores already in a record (``beam.meteor``) are used as they are."""
    reader, method = None, ""
    out: Dict[str, Dict[int, float]] = {}
    for rec in records:
        for name, ev in rec["evaluations"].items():
            beam = ev["beam"]
            if "meteor" in beam:
                value, method = beam["meteor"], beam.get("meteor_method", method)
            else:
                if reader is None:
                    reader, method = load_wordnet(folder)
                scores = meteor(beam["hypotheses"], rec["references"], reader)
                value = sum(scores) / max(len(scores), 1)
            out.setdefault(name, {})[rec["seed"]] = float(value)
    return out, method
