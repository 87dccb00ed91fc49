"""Packaging promises (issue 50, item 5): `sparsenorm --version`, an SPDX licence with a setuptools
that takes it, and one torch floor said alike in pyproject.toml, the README and the floor check."""
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
import torch

import sparsenorm
from sparsenorm import cli

ROOT = Path(__file__).resolve().parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_option_prints_the_package_and_torch_versions(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sparsenorm {sparsenorm.__version__} (torch {torch.__version__})"


def test_one_version_everywhere():
    assert sparsenorm.__version__ == _pyproject()["project"]["version"]
    try:
        installed = importlib.metadata.version("sparsenorm")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        pytest.skip("sparsenorm is not installed")
    assert installed == sparsenorm.__version__


def test_spdx_licence_with_a_setuptools_that_takes_it():
    project = _pyproject()
    assert project["project"]["license"] == "MIT"  # PEP 639 expression, not the deprecated table
    assert all((ROOT / f).is_file() for f in project["project"]["license-files"])
    (requirement,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    floor = tuple(int(p) for p in re.fullmatch(r"setuptools>=([\d.]+)", requirement).group(1).split("."))
    assert floor >= (77, 0, 3)  # the first setuptools with license expressions and license-files


def test_one_torch_floor_everywhere():
    """pyproject.toml, the README and the floor check name one floor, and CI runs the check (the floor's
    proof); the floor is a torch CI can install without CUDA packages: the CPU build bootstrap pins."""
    (torch_requirement,) = [d for d in _pyproject()["project"]["dependencies"] if d.startswith("torch")]
    floor = re.fullmatch(r"torch>=([\d.]+)", torch_requirement).group(1)
    assert f"torch >= {floor}" in (ROOT / "README.md").read_text()
    assert f"TORCH_FLOOR={floor}" in (ROOT / "scripts" / "torch_floor_check.sh").read_text()
    ci_steps = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "scripts/torch_floor_check.sh" in ci_steps
    assert f'"torch=={floor}"' in (ROOT / "scripts" / "bootstrap.sh").read_text()
