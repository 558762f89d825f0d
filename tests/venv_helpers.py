"""Fresh virtual environments outside the checkout, for the tests of an installed albert-dist: torch's CPU wheel
from PyPI, then what the test installs (pip's cache makes a second build quick); nothing of this checkout or of
this virtualenv leaks in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"  # the CPU wheel: a bare requirement would take CUDA's


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """`command`'s stdout; a failure shows the end of its output."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment less what would lead another Python to the checkout or this virtualenv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


def fresh_venv(venv: Path, env: dict[str, str], cwd: Path) -> list[str]:
    """A virtual environment at `venv` holding torch's CPU wheel; returns its `pip install` command."""
    run([sys.executable, "-m", "venv", str(venv)], cwd, env, 300)
    # bytecode compiled at first import rather than for every file installed: 3 times faster on 2 cores
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    run([*pip, TORCH], cwd, env, 900)
    return pip
