#!/usr/bin/env bash
# Create .venv at the repository root and install sparsenorm with its extras (docs: tests/unit/test_docs.py builds the site);
# with the argument `docs`, only what the documentation build needs (make docs).
# Torch goes in first, pinned to the local CPU wheel, so that no later requirement pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install --quiet "torch==2.13.0"
fi
# `bootstrap.sh docs` (make docs): only what the documentation build needs -- torch, the library and the
# docs extra (MkDocs, Material, mkdocstrings); no other extra, no kernel build.
if [ "${1:-}" = "docs" ]; then
    if ! .venv/bin/python -c "import mkdocs, material, mkdocstrings, mkdocstrings_handlers.python, sparsenorm" \
            2>/dev/null; then
        .venv/bin/pip install --quiet -e ".[docs]"
    fi
    exit 0
fi
stamp=.venv/.sparsenorm-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install --quiet -e ".[test,experiments,fast,hf,mt,gpu,docs,llm]"
    touch "$stamp"
fi
# Build the C++ CPU kernels once into the cache (a no-op when built; on failure one warning line,
# and the pure-PyTorch path is used).
.venv/bin/python -c "import sparsenorm.kernels as k; k.build()" || true
