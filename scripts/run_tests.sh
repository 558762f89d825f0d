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
exec "$root/.venv/bin/python" -m pytest -n "${ALBERT_DIST_TEST_PROCESSES:-2}" --dist loadfile --no-loadscope-reorder "$@"
