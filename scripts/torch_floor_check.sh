#!/usr/bin/env bash
# The torch floor (issue 50 item 5): `torch>=TORCH_FLOOR` in pyproject.toml and the README is the oldest torch
# the tests pass on. This installs that torch in a second, throwaway venv (never .venv) with the test and
# experiments extras, and runs the suites that exercise every registered operator (`sparsenorm::*`: its
# kernel, fake/shape function, autograd, vmap rule and torch.compile; tests/unit, tests/kernels, tests/attention)
# against the source tree, with the C++ kernels built for that torch in a kernel cache of its own.
#
# Why the floor is what it is: the oldest torch CI can install as a CPU build. PyPI has no CPU-only Linux
# x86-64 wheel of an older torch (those live on PyTorch's own index, which this project's machines cannot
# reach): PyPI's is the CUDA build, about 3.5 GB with NVIDIA's runtime packages, which CI must not download.
# With TORCH_FLOOR=2.7.0 this script passed by hand (commit e3c281b; then it also removes the CUDA build's triton,
# below); 2.5.1 and 2.6.0 fail at `import sparsenorm` (their custom_op evaluates the string annotations of
# `from __future__ import annotations` in its own namespace); register_fake/register_autograd need 2.4,
# register_vmap and SDPA's enable_gqa 2.5. The floor stays at what CI proves.
set -euo pipefail
TORCH_FLOOR=2.13.0
repo=$(cd "$(dirname "$0")/.." && pwd)
BASE=${PYTHON:-python3}
work=${TORCH_FLOOR_WORK:-$(mktemp -d)}
trap 'rm -rf "$work"' EXIT
export TORCH_EXTENSIONS_DIR=$work/extensions  # kernels built against this torch, apart from .venv's

echo "=== torch $TORCH_FLOOR (the floor) in a second venv"
"$BASE" -m venv "$work/venv"
py=$work/venv/bin/python
"$py" -m pip install --quiet "torch==$TORCH_FLOOR"
# The library's, the test extra's and the experiments extra's requirements (torch>=floor is satisfied: no other
# torch comes in); the library itself is imported from the source tree, so nothing is built in it.
mapfile -t requirements < <("$py" - "$repo/pyproject.toml" <<'PY'
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["test"] + extras["experiments"]))
PY
)
"$py" -m pip install --quiet "${requirements[@]}"
# A CUDA build of torch (an older floor from PyPI) brings the triton it was built with; the CPU suite has no use
# for it (the Triton kernels are tested under the interpreter with the gpu extra's triton in .venv), and without a
# GPU it fails at import. (The CPU build brings none: then this only says so.)
"$py" -m pip uninstall --quiet --yes triton
"$py" -c "import torch; v = torch.__version__.split('+')[0]; assert v == '$TORCH_FLOOR', torch.__version__; print('torch', torch.__version__)"

echo "=== the C++ kernels, built for torch $TORCH_FLOOR"
(cd "$repo" && "$py" -c "import sparsenorm.kernels as k; failed = {n: e for n, e in k.build().items() if e}; print('kernels built' if not failed else f'kernels NOT built: {failed}')")

echo "=== every registered operator's tests on torch $TORCH_FLOOR"
cd "$repo"
# -p no:cacheprovider: nothing written into the source tree; the suite's own conftest isolates the caches.
"$py" -m pytest -q -n 2 -p no:randomly -p no:cacheprovider tests/unit tests/kernels tests/attention
