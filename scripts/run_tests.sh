#!/usr/bin/env bash
# Sets up .venv if needed, then runs the test suite. Extra arguments go to pytest (e.g. -k tokenizer).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
exec "$root/.venv/bin/python" -m pytest "$@"
