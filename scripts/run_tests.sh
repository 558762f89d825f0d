#!/usr/bin/env bash
# Sets up .venv if needed, then runs the test suite. Extra arguments go to pytest (e.g. -k tokenizer).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# Two processes, one test file each at a time: most of the suite waits on Ray, MLflow and cluster start-up. Files go
# out in collection order (tests/conftest.py puts the longest first); xdist's own reorder, by number of tests, sent
# the long files of few tests (demo, local cluster) last, and one process ran them alone at the end.
processes="${ALBERT_DIST_TEST_PROCESSES:-2}"
# One share of the cores per pytest process for the torch work done in-process (and in the drivers they start):
# torch's default of every core in each process oversubscribes the machine, and its idle OpenMP threads spin. Two
# processes running the model tests side by side took 29-32 s with the default and 19-20 s with one thread each, on
# 2 cores. Ray Train workers set their own thread count (train/ray_runner.py: torch_threads).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / processes > 0 ? $(nproc) / processes : 1 ))}"
exec "$root/.venv/bin/python" -m pytest -n "$processes" --dist loadfile --no-loadscope-reorder "$@"
