"""The OS's view of test processes: a process tree, the TCP listeners its processes hold, whether a process is
gone, and what a test does when the OS refuses the fault it sets up."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp*


def listening_sockets() -> dict[int, tuple[str, int]]:
    """Socket inode -> (IP, port) of every TCP listener on the machine, IPv4 and IPv6."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            # the kernel prints each 32-bit word of the address in host (little-endian) byte order
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8))
            found[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(port, 16))
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)


def beyond_loopback(listeners) -> list:
    """The (IP, port, command line) listeners not on a loopback address, sorted."""
    return sorted(listener for listener in listeners if not is_loopback(listener[0]))


def process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()  # "pid (command) state ppid ..."
        except OSError:
            continue  # the process ended meanwhile
        children.setdefault(int(text.rsplit(") ", 1)[1].split()[1]), []).append(int(text.split(" ", 1)[0]))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def train_workers_of(root: int) -> list[int]:
    """The Ray Train workers in the process tree of `root` (another pytest process runs its own Ray and runs)."""
    mine = process_tree(root)
    out = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) in mine]


def listeners_of(pids: set[int]) -> set[tuple[str, int, str]]:
    """(IP, port, process command line) of each TCP listener that one of `pids` holds."""
    sockets = listening_sockets()
    held = set()
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and int(target[8:-1]) in sockets:
                    held.add((*sockets[int(target[8:-1])], name))
        except OSError:
            continue  # the process ended meanwhile
    return held


@contextmanager
def listeners_sampled(pids: Callable[[], set[int]], every: float = 0.5) -> Iterator[set[tuple[str, int, str]]]:
    """While the block runs, the listeners of the processes `pids()` names, sampled every `every` seconds into the
    set it yields (a listener can live for part of a run only, as a training rendezvous does)."""
    listeners: set[tuple[str, int, str]] = set()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            listeners.update(listeners_of(pids()))
            done.wait(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield listeners
    finally:
        done.set()
        sampler.join(timeout=30)


RUNNING_TEST_MARKS: set[str] | None = None  # set by conftest in a pytest process: the running test's marks


def require_mark(mark: str, what: str) -> None:
    """Fail the running test unless it carries `mark`, before it starts `what`: `-m "not slow"` is a quick run
    only if nothing slow hides in it. Outside a pytest process (a script a test runs) nothing is checked."""
    if RUNNING_TEST_MARKS is not None and mark not in RUNNING_TEST_MARKS:
        pytest.fail(f"this test starts {what} but is not marked {mark}")


def fault_unavailable(reason: str) -> None:
    """A fault the test could not set up (a mount, a network namespace): a failure for root, who can set up any
    (CI runs as root), else a skip that says why."""
    if os.geteuid() == 0:
        pytest.fail(f"cannot set up the fault, as root: {reason}")
    pytest.skip(reason)


def wait_until_gone(pids: set[int] | list[int], timeout: float = 60) -> set[int]:
    """Wait for `pids` to end (and be reaped); returns those still there after `timeout` seconds."""
    deadline = time.time() + timeout
    while True:
        alive = {pid for pid in pids if _running(pid)}
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended: only its exit status is left for its parent
