#!/bin/bash
# Issue 49 item 4: the CVAE with Adam on the prior alone (the setup in which the softmax prior learns), decisive mode
# (8 seeds, 10 epochs), measuring the new gate. Code: commit 2d70b72. Resumable through the job cache in
# /work/runs/cvae49/cvae/runs/: rerun this script. Full mode (the ask): drop --decisive (10 seeds, 20 epochs,
# the sweep with the same setting as lead).
cd /work/runs/code; export PYTHONPATH=/work/runs/code  # the code frozen at the commit the session began with (git worktree)
echo "=== cvae start $(date -u +%FT%TZ)"
OMP_NUM_THREADS=1 /work/main/.venv/bin/sparsenorm reproduce cvae --decisive --prior-optimizer adam --prior-lr 1e-3 \
  --stack-seeds 4 --workers 1 --device cpu --out /work/runs/cvae49 2>&1 | tr '\r' '\n' | grep -v "it/s\]\|s/it\]"
echo "=== cvae end rc=${PIPESTATUS[0]} $(date -u +%FT%TZ)"
