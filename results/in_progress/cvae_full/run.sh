#!/bin/bash
# Issue 49 item 4, full mode: the CVAE with Adam on the prior (lead), 10 seeds, 20 epochs, the KL-weight / optimizer
# sweep (3 seeds each). Frozen code (worktree /work/runs/code). Resumable through /work/runs/cvae49-full/cvae/runs/.
cd /work/runs/code; export PYTHONPATH=/work/runs/code
echo "=== cvae full start $(date -u +%FT%TZ)"
OMP_NUM_THREADS=1 /work/main/.venv/bin/sparsenorm reproduce cvae --prior-optimizer adam --prior-lr 1e-3 \
  --stack-seeds 4 --workers 2 --device cpu --out /work/runs/cvae49-full 2>&1 | tr '\r' '\n' | grep -v "it/s\]\|s/it\]"
echo "=== cvae full end rc=${PIPESTATUS[0]} $(date -u +%FT%TZ)"
