#!/usr/bin/env bash
# Sets up .venv if needed, then runs the main job end to end on embedded defaults: local Ray, MLflow in a SQLite
# file under ./runs. Extra arguments go to `albert-dist demo` (e.g. --set run.output_dir=/tmp/demo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
exec "$root/.venv/bin/albert-dist" demo "$@"
