"""A real S3-compatible server for the object-storage tests and benchmarks: moto's standalone server, a process on
127.0.0.1, and the AWS_* variables that point pyarrow, boto3 and the jobs at it."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator


@contextlib.contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """A moto S3 server on a free loopback port, killed at the end; yields the AWS_* variables that reach it (the
    secret key random, for tests to search the outputs for)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "moto server did not start"
                time.sleep(0.2)
        yield {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "albert-test",
            "AWS_REGION": "us-east-1",
            "AWS_SECRET_ACCESS_KEY": secrets.token_hex(16),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def write_through_a_refusal(proxy, uri: str, window_s: float) -> dict:
    """One write of `uri` (`storage.publish_bytes`, through `proxy`, a `fault_proxy.FaultProxy` the S3 client is
    pointed at) with every request refused 503 for `window_s` from its start: whether it was written, the
    error that stopped it, its wall time, and the proxy's record of it (how many attempts were refused, when the
    first and the last arrived, when the attempt after the window arrived and its status; seconds from the
    write's start)."""
    from albert_dist import storage
    from albert_dist.errors import StorageError

    storage.publish_bytes(uri, b"before")  # the client and pyarrow's S3 layer up: the window meets the write only
    seen = len(proxy.requests)
    started = time.monotonic()
    proxy.refuse_for(window_s)
    try:
        storage.publish_bytes(uri, b"after")
        error = None
    except StorageError as err:
        error = str(err)
    wall = time.monotonic() - started
    proxy.refuse_for(0)
    requests = proxy.requests[seen:]
    refused = [r for r in requests if r.outcome == "refused"]
    after = [r for r in requests if r.outcome == "forwarded"]
    return {
        "written": error is None and storage.read_bytes(uri) == b"after",
        "error": error,
        "wall_s": wall,
        "refused": len(refused),
        "first_refused_s": refused[0].at - started if refused else None,
        "last_refused_s": refused[-1].at - started if refused else None,
        "next_attempt_s": after[0].at - started if after else None,
        "next_status": after[0].status if after else None,
    }
