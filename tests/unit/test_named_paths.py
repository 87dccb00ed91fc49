"""Every path a comment or docstring of the library names exists (issue 51): a file or folder of the
repository (``sparsenorm/...``, ``tests/...``, ``kernels/...`` relative to the package, ...), a
``module.attribute`` whose module exists, or a bare ``name.py`` that some file of the repository has.
Read from the text of every Python and C++ file under ``sparsenorm/``, so a stale pointer left by a
move or a rename fails here."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparsenorm"
SOURCES = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cpp")])
PATH = re.compile(r"(?<![\w/.-])((?:sparsenorm|tests|scripts|benchmarks|docs|results|kernels|experiments)/[\w./-]*\w)")
BARE = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*\.(?:py|cpp))\b")
BASENAMES = {p.name for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts}
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
