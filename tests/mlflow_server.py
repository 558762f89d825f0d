"""A real `mlflow server` on 127.0.0.1 (SQLite store, proxied artifacts) for the tracking tests."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from process_helpers import require_mark


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(store: Path, port: int, auth_config: Path | None = None) -> subprocess.Popen:
    """Start the server and wait until it answers; its output goes to `store`/server.log, quoted on failure.
    With `auth_config` (MLflow's basic-auth settings), the server is `--app-name basic-auth`."""
    require_mark("slow", "an MLflow server")
    mlflow = Path(sys.executable).with_name("mlflow")
    store.mkdir(parents=True, exist_ok=True)
    auth = ["--app-name", "basic-auth"] if auth_config else []
    auth_env = (
        {"MLFLOW_AUTH_CONFIG_PATH": str(auth_config), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
        if auth_config
        else {}
    )
    with open(store / "server.log", "ab") as log:
        process = subprocess.Popen(
            [
                str(mlflow),
                "server",
                "--backend-store-uri",
                f"sqlite:///{store / 'mlflow.db'}",
                "--artifacts-destination",
                str(store / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                *auth,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # without the server-side job runner, as cluster/local/start.sh runs it: nothing here uses MLflow's
            # server jobs, and the runner is one more process starting on a loaded machine
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **auth_env},
        )
    deadline = time.time() + 300
    while time.time() < deadline:
        # ready when the app answers, not when the port opens; a loaded 2-core machine can take seconds to answer
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=15).close()
            return process
        except OSError:
            if process.poll() is not None:
                pytest.fail(f"mlflow server exited ({process.returncode}):\n{_tail(store / 'server.log')}")
            time.sleep(0.5)
    stop_server(process)  # its whole process group: the server's workers too
    pytest.fail(f"mlflow server did not answer within 300 s:\n{_tail(store / 'server.log')}")


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop_server(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
