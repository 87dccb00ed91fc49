"""The kernel build cache (sparsenorm/kernels/cpu/__init__.py) under real concurrent processes.

Two processes building the same kernel at once both get a working library and leave one complete
build; a builder killed mid-compile leaves nothing that is ever loaded; a folder without its
BUILD_COMPLETE marker is never loaded; without a compiler the reference path runs after one
warning. The concurrency tests build a tiny pybind11 source (seconds) into a private cache.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sparsenorm.kernels.cpu import _COMPLETE, Extension

TINY_SOURCE = textwrap.dedent("""\
    #include <pybind11/pybind11.h>
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", [] { return 42; }); }
""")

# run in a child: build (or load) the tiny extension and print what it answers and where it lives
BUILD = textwrap.dedent("""\
    import sys, warnings
    from sparsenorm.kernels.cpu import Extension
    warnings.simplefilter("error")  # a failed build must fail the child, not fall back quietly
    module = Extension("tiny", "a test", source_dir=sys.argv[1]).build()
    print(module.answer(), module.__file__)
""")

LOAD_IF_BUILT = textwrap.dedent("""\
    import sys, warnings
    from sparsenorm.kernels.cpu import Extension
    warnings.simplefilter("error")
    print(Extension("tiny", "a test", source_dir=sys.argv[1]).get())
""")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """(source folder, private TORCH_EXTENSIONS_DIR, environment for children)."""
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    (source_dir / "tiny.cpp").write_text(TINY_SOURCE)
    root = tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(root), SPARSENORM_CPU_KERNELS="")
    return source_dir, root, env


def child(code, source_dir, env, **kw):
    return subprocess.Popen([sys.executable, "-c", code, str(source_dir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def final_folder(source_dir, root) -> Path:
    name, _ = Extension("tiny", "a test", source_dir=source_dir)._name_and_flags()
    return root / name


@pytest.mark.slow
def test_two_processes_building_at_once_both_get_one_complete_build(cache):
    source_dir, root, env = cache
    builders = [child(BUILD, source_dir, env) for _ in range(2)]
    results = [b.communicate(timeout=300) for b in builders]
    for builder, (out, err) in zip(builders, results):
        assert builder.returncode == 0, err[-3000:]
        assert out.split()[0] == "42"
    final = final_folder(source_dir, root)
    assert (final / _COMPLETE).exists()
    assert not list(root.glob(".sparsenorm_tiny_*")), "a temporary build folder was left behind"
    loaded = child(LOAD_IF_BUILT, source_dir, env)
    out, err = loaded.communicate(timeout=120)
    assert loaded.returncode == 0 and str(final) in out, err[-2000:]


@pytest.mark.slow
def test_a_build_killed_midway_is_never_loaded(cache):
    source_dir, root, env = cache
    builder = child(BUILD, source_dir, env, start_new_session=True)  # its own group: kill ninja and the compiler too
    deadline = time.monotonic() + 120
    while not list(root.glob(".sparsenorm_tiny_*/*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert builder.poll() is None, "the build finished before it could be interrupted"
    os.killpg(builder.pid, signal.SIGKILL)
    builder.wait()
    final = final_folder(source_dir, root)
    assert not final.exists()
    loaded = child(LOAD_IF_BUILT, source_dir, env)
    out, err = loaded.communicate(timeout=120)
    assert loaded.returncode == 0 and out.strip() == "None", err[-2000:]  # the reference path, no warning
    rebuilt = child(BUILD, source_dir, env)
    out, err = rebuilt.communicate(timeout=300)
    assert rebuilt.returncode == 0 and out.split()[0] == "42", err[-3000:]
    assert (final / _COMPLETE).exists() and not list(root.glob(".sparsenorm_tiny_*"))


def test_a_folder_without_the_completion_marker_is_not_loaded(cache):
    source_dir, root, env = cache
    final = final_folder(source_dir, root)
    final.mkdir(parents=True)
    library = Extension("tiny", "a test", source_dir=source_dir)._library_path(final.name)
    library.write_bytes(b"half a library")  # loading this would raise
    loaded = child(LOAD_IF_BUILT, source_dir, env)
    out, err = loaded.communicate(timeout=120)
    assert loaded.returncode == 0 and out.strip() == "None", err[-2000:]


def test_without_a_compiler_the_reference_path_runs_after_one_warning(cache):
    _, root, env = cache
    code = textwrap.dedent("""\
        import warnings, torch
        import sparsenorm
        from sparsenorm import kernels
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.randn(5, 9, generator=torch.Generator().manual_seed(0))
            got = sparsenorm.ev_softmax(x)
            again = sparsenorm.ev_softmax(x)
        with kernels.disabled():
            assert torch.equal(got, sparsenorm.ev_softmax(x)) and torch.equal(again, got)
        runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(runtime) == 1, [str(w.message) for w in runtime]
        assert "reference path" in str(runtime[0].message)
        print("ok")
    """)
    env = dict(env, CXX="/bin/false", SPARSENORM_CPU_KERNELS="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
