#!/usr/bin/env bash
# Creates .venv (once) and installs albert-dist with its dev extras. Idempotent: a second run only checks.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ALBERT_DIST_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtualenv $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.albert-dist-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  # A bare `torch` would pull a multi-GB CUDA build: install the CPU 2.13.0 wheel first when no torch is present.
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0"
    "${pip[@]}" install "torch==2.13.0"
  fi
  echo "[setup] installing albert-dist and its dependencies (a few minutes the first time)"
  "${pip[@]}" install -e "$root[dev]"
  touch "$stamp"
fi
