"""One driver per run: a second driver of the same run directory stops at once, naming the first.

Two drivers of one run would share its checkpoints and its MLflow run. The lock is an OS file lock (flock) on
`<run dir>/driver.lock`, which also records who holds it: the OS releases it when the holder exits, however it
exits, so a crashed driver leaves no stale lock behind (only its stale description, overwritten by the next).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from albert_dist.errors import AlbertDistError

LOCK_FILE = "driver.lock"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock while the block runs; AlbertDistError naming the holder if it is taken."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise AlbertDistError(
                f"the run {run_dir} is in use by {holder}: two drivers would share its checkpoints "
                "and MLflow run. Wait for it to end or stop it, or choose another run.name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode(),
            0,
        )
        yield
    finally:
        os.close(fd)  # releases the lock
