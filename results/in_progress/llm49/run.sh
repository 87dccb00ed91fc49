#!/bin/bash
# Issue 49 item 5: the llm decisive runs judging the claims registered in commit 66a5f7c (code: 8132d9d).
# Resumable: finished jobs are cached in /work/runs/llm49/<text>/llm/runs/; rerun this script to continue.
cd /work/runs/code; export PYTHONPATH=/work/runs/code  # the code frozen at the commit the session began with (git worktree)
echo "=== austen start $(date -u +%FT%TZ)"
OMP_NUM_THREADS=1 /work/main/.venv/bin/sparsenorm reproduce llm --decisive --out /work/runs/llm49/austen 2>&1 | tr '\r' '\n' | grep -v "it/s\]\|s/it\]"
echo "=== austen end rc=${PIPESTATUS[0]} $(date -u +%FT%TZ)"
echo "=== debian-policy start $(date -u +%FT%TZ)"
OMP_NUM_THREADS=1 /work/main/.venv/bin/sparsenorm reproduce llm --decisive --text debian-policy --out /work/runs/llm49/policy 2>&1 | tr '\r' '\n' | grep -v "it/s\]\|s/it\]"
echo "=== debian-policy end rc=${PIPESTATUS[0]} $(date -u +%FT%TZ)"
