"""Every path a comment or docstring of the library names exists (issue 51): a file or folder of the
repository (``sparsenorm/...``, ``tests/...``, ``kernels/...`` relative to the package, ...), a
``module.attribute`` whose module exists, or a bare ``name.py`` that some file of the repository has.
Read from the text of every Python and C++ file under ``sparsenorm/``, so a stale pointer left by a
move or a rename fails here. A measurement cited as ``<file>.json#<case>`` (the library states no
timings of its own: its tuning constants cite committed benchmark JSON, issue 51 item 6) must name
an entry of that file: a key of its ``cases`` object, or else a top-level key."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparsenorm"
SOURCES = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cpp")])
PATH = re.compile(r"(?<![\w/.-])((?:sparsenorm|tests|scripts|benchmarks|docs|results|kernels|experiments)/[\w./-]*\w)")
BARE = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*\.(?:py|cpp))\b")
BASENAMES = {p.name for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts}
CITATION = re.compile(r"(?<![\w/.-])((?:benchmarks|results)/[\w./-]+\.json)#([\w.-]+)")
EXTERNAL = {  # files of other projects that docstrings cite by name
    "marg.py": "the ev-softmax authors' SSVAE code",
    "archs.py": "the ev-softmax authors' SSVAE code",
    "root_finding.py": "the entmax package",
}


def resolves(path: str) -> bool:
    path = path.rstrip(".")
    for base in (ROOT, PACKAGE):
        candidate = base / path
        if candidate.exists():
            return True
        module, _, _ = path.rpartition(".")  # module.attribute
        if module and (base / f"{module}.py").exists():
            return True
    return False


def named_paths(source: Path):
    text = source.read_text()
    for match in PATH.finditer(text):
        if not any(ch in match.group(1) for ch in "*<{"):
            yield match.group(1), resolves(match.group(1))
    for match in BARE.finditer(text):
        yield match.group(1), match.group(1) in BASENAMES or match.group(1) in EXTERNAL


def test_the_checker_finds_a_stale_pointer(tmp_path):
    stale = tmp_path / "x.cpp"
    stale.write_text("// see sparsenorm/kernels/ops.py and attention_ops.py; kernels/cpu/evidential.cpp is fine\n")
    found = dict(named_paths(stale))
    assert found == {"sparsenorm/kernels/ops.py": False, "kernels/cpu/evidential.cpp": True,
                     "attention_ops.py": False}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(source):
    stale = sorted({path for path, ok in named_paths(source) if not ok})
    assert not stale, f"{source.relative_to(ROOT)} names paths that do not exist: {stale}"


def cited_measurements(source: Path):
    """``(citation, found)`` for every ``<file>.json#<case>`` in ``source``."""
    for match in CITATION.finditer(source.read_text()):
        path, case = ROOT / match.group(1), match.group(2)
        found = False
        if path.exists():
            document = json.loads(path.read_text())
            found = case in document.get("cases", {}) or case in document
        yield f"{match.group(1)}#{case}", found


def test_the_checker_finds_a_citation_of_a_missing_case(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("# benchmarks/results/tuning_cpu.json#attention_tiles, "
                      "benchmarks/results/tuning_cpu.json#no_such_case, benchmarks/results/none.json#x\n")
    assert dict(cited_measurements(source)) == {"benchmarks/results/tuning_cpu.json#attention_tiles": True,
                                                "benchmarks/results/tuning_cpu.json#no_such_case": False,
                                                "benchmarks/results/none.json#x": False}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_measurement_exists(source):
    missing = sorted({citation for citation, found in cited_measurements(source) if not found})
    assert not missing, f"{source.relative_to(ROOT)} cites measurements that the committed JSON lacks: {missing}"


LIBRARY_TIMING = re.compile(r"\d\s?(?:µs|us|ms)\b|~\d+x\b")


def test_the_library_states_no_timings():
    """Timings live in committed benchmark JSON, which the library cites (the experiments' notes on
    their own runs are theirs: results, not tuning)."""
    found = [f"{source.relative_to(ROOT)}:{number}: {line.strip()}"
             for source in SOURCES if "experiments" not in source.relative_to(PACKAGE).parts
             for number, line in enumerate(source.read_text().splitlines(), 1) if LIBRARY_TIMING.search(line)]
    assert not found, "timings in library files (move them to benchmarks/results/*.json and cite that):\n" + \
        "\n".join(found)
