#!/usr/bin/env bash
# CI: compile every Triton kernel ahead of time (sm_90, no GPU needed) with the OLDEST triton we
# support, 3.6.0 (the lent GPU machine's, beside its torch 2.11), as well as with the venv's
# (make test runs that one). triton has no dependencies, so it goes into its own folder, put first
# on PYTHONPATH beside the venv's CPU torch: no second torch, no CUDA wheels. The folder is cached
# under build/ (git-ignored) across runs.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${TRITON_COMPAT_VERSION:-3.6.0}"
python="${PYTHON:-.venv/bin/python}"
target="build/triton-$version"
if [ ! -f "$target/triton/__init__.py" ]; then
    rm -rf "$target"
    "$python" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$target" "triton==$version"
fi
export PYTHONPATH="$PWD/$target${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
found="$("$python" -c 'import triton; print(triton.__version__)')"
if [ "$found" != "$version" ]; then
    echo "triton_compat_check: expected triton $version first on the path, found $found" >&2
    exit 1
fi
echo "triton_compat_check: triton $found, torch $("$python" -c 'import torch; print(torch.__version__)')"
"$python" -m sparsenorm.kernels.triton.compile_check --arch 90 ${TRITON_COMPAT_ARGS:---quick}
