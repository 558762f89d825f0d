"""A real `mlflow server` on 127.0.0.1 (SQLite store, proxied artifacts) for the tracking tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(store: Path, port: int) -> subprocess.Popen:
    mlflow = Path(sys.executable).with_name("mlflow")
    process = subprocess.Popen(
        [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination",
         str(store / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        try:  # ready when the app answers, not when the port opens
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return process
        except OSError:
            assert process.poll() is None, "mlflow server exited"
            time.sleep(0.5)
    stop_server(process)  # its whole process group: the server's workers too
    pytest.fail("mlflow server did not start")


def stop_server(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
