"""No test reads or writes the user's caches (issue 50, item 6; tests/conftest.py): each test has an
empty sparsenorm cache of its own, the session its own Hugging Face home, and the C++ kernels are
still found where they are built."""
import os
from pathlib import Path

from sparsenorm._cache import cache_dir
from sparsenorm.experiments._shared.provenance import artifact_dir


def test_each_test_has_an_empty_cache_of_its_own():
    user = Path(os.environ["SPARSENORM_TEST_USER_CACHE"])
    mine = cache_dir()
    assert mine != user and user not in mine.parents
    assert not mine.exists()  # nothing from the main job, nor from another test
    assert artifact_dir().parent == mine  # where fetched packages would go
    (mine / "artifacts").mkdir(parents=True)  # written here, gone for the next test: test_the_next_test_starts_empty


def test_the_next_test_starts_empty():
    assert not cache_dir().exists()


def test_hugging_face_home_is_not_the_users():
    home = Path(os.environ["HF_HOME"])
    assert home != Path.home() / ".cache" / "huggingface"
    assert home.parent == cache_dir().parent.parent  # the session's temporary folder


def test_the_kernels_stay_where_they_are_built():
    from sparsenorm.kernels import cpu

    assert cpu._build_directory() == Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert cache_dir() not in cpu._build_directory().parents
