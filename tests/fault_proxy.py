"""A fault-injecting HTTP proxy for an S3-compatible server (the moto server of the S3 tests), on 127.0.0.1.

It reads each request whole (head and body: `Content-Length` or chunked, as the S3 client streams parts; an
`Expect: 100-continue` it answers itself), then decides what happens to it:

- forwarded to the server on a connection of its own (`Connection: close`) and the answer relayed back;
- answered 503 SlowDown (the store throttling), for a chosen share of requests or for every request during a
  refusal window;
- the connection reset (RST) while the client is still uploading, for a chosen share;
- delayed, then forwarded, for a chosen share;
- answered 403 AccessDenied (credentials revoked), for every request once `deny` is set.

Every request is recorded with what was done to it, so that a test can show its fault hit its own run; a trigger
can start a refusal window when a chosen request has gone through, before its client has the answer (mid-run by
construction, however fast the run).
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your '
    b"request rate.</Message><RequestId>fault-proxy</RequestId></Error>"
)
DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied'
    b"</Message><RequestId>fault-proxy</RequestId></Error>"
)


@dataclass
class Request:
    at: float  # time.monotonic() when its head arrived
    method: str
    path: str  # without its query: a multipart upload's parts (`?partNumber=1&uploadId=…`) name their object
    outcome: str  # forwarded, slowdown, refused (a refusal window's 503), reset, delayed, denied
    status: int | None = None  # the server's status for a forwarded one


class FaultProxy:
    """Listens on 127.0.0.1 (`url`) and proxies to `upstream` ("http://127.0.0.1:PORT").

    `shares` maps an outcome ("slowdown", "reset", "delayed") to the share of the requests that get it, each
    request drawing once from a seeded generator (`{"slowdown": 0.2, "reset": 0.05}`: a fifth of the requests
    answered 503, one in twenty reset, the others forwarded). `refuse_for(seconds)` answers every request 503 SlowDown for that long; `deny = True` answers every
    request 403 AccessDenied. `after(match, action)` runs `action()` once, after the first forwarded request with
    a 2xx answer (any answer with `any_status`) for which `match(method, path)` is true and whose body holds
    `body_has`."""

    def __init__(
        self,
        upstream: str,
        *,
        shares: dict[str, float] | None = None,
        delay_s: float = 1.0,
        seed: int = 0,
    ):
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.shares, self.delay_s = dict(shares or {}), delay_s
        assert set(self.shares) <= {"slowdown", "reset", "delayed"} and sum(self.shares.values()) <= 1, self.shares
        self.deny = False
        self.requests: list[Request] = []
        self._refuse_until = 0.0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._triggers: list[tuple[Callable[[str, str], bool], Callable[[], None], bool, bytes]] = []
        self._forced: list[tuple[Callable[[str, str], bool], str]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def refuse_for(self, seconds: float) -> None:
        with self._lock:
            self._refuse_until = time.monotonic() + seconds

    def force(self, match: Callable[[str, str], bool], outcome: str) -> None:
        """The next request for which `match(method, path)` is true gets `outcome` ("slowdown", "reset", "delayed",
        "refused", "denied") whatever the share says."""
        with self._lock:
            self._forced.append((match, outcome))

    def after(
        self,
        match: Callable[[str, str], bool],
        action: Callable[[], None],
        any_status: bool = False,
        body_has: bytes = b"",
    ) -> None:
        with self._lock:
            self._triggers.append((match, action, any_status, body_has))

    def outcomes(self, since: float = 0.0) -> dict[str, int]:
        """How many requests got each outcome (since a time.monotonic() value)."""
        counts: dict[str, int] = {}
        with self._lock:
            for request in self.requests:
                if request.at >= since:
                    counts[request.outcome] = counts.get(request.outcome, 0) + 1
        return counts

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while True:
                head = _read_head(reader)
                if head is None:
                    return
                method, target = head[0].decode().split(" ")[:2]
                path = target.partition("?")[0]
                request = Request(time.monotonic(), method, path, self._decide(method, path))
                with self._lock:
                    self.requests.append(request)
                if request.outcome == "reset":  # while the client is still sending its body
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                headers = _headers(head)
                if headers.get("expect", "").lower() == "100-continue":
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(reader, headers)
                if request.outcome in ("slowdown", "refused", "denied"):
                    status, text = (
                        (b"403 Forbidden", DENIED) if request.outcome == "denied" else (b"503 Slow Down", SLOWDOWN)
                    )
                    client.sendall(
                        b"HTTP/1.1 "
                        + status
                        + b"\r\nContent-Type: application/xml\r\nContent-Length: "
                        + str(0 if method == "HEAD" else len(text)).encode()
                        + b"\r\n\r\n"
                        + (b"" if method == "HEAD" else text)
                    )
                    continue  # the connection stays usable, as a real server's after an error
                if request.outcome == "delayed":
                    time.sleep(self.delay_s)
                self._forward(client, request, head, body)
                return  # the server closed its connection: so does the proxy (its answer said Connection: close)
        except OSError:
            return
        finally:
            reader.close()
            client.close()

    def _decide(self, method: str, path: str) -> str:
        with self._lock:
            for forced in self._forced:
                if forced[0](method, path):
                    self._forced.remove(forced)
                    return forced[1]
            if self.deny:
                return "denied"
            if time.monotonic() < self._refuse_until:
                return "refused"
            draw = self._random.random()
            for outcome, share in self.shares.items():
                if draw < share:
                    return outcome
                draw -= share
        return "forwarded"

    def _forward(self, client: socket.socket, request: Request, head: list[bytes], body: bytes) -> None:
        """Relays the request and the server's answer; the triggers it fires run before the client has the answer,
        so that what they change holds for every request the client sends after this one."""
        kept = [line for line in head[1:] if line.split(b":")[0].strip().lower() not in (b"connection", b"expect")]
        with socket.create_connection(self.upstream) as server:
            server.sendall(b"\r\n".join([head[0], *kept, b"Connection: close", b"", b""]) + body)
            answer = b""
            while chunk := server.recv(1 << 16):
                answer += chunk
        request.status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
        self._fire_triggers(request, body)
        client.sendall(answer)

    def _fire_triggers(self, request: Request, body: bytes) -> None:
        succeeded = request.status is not None and 200 <= request.status < 300
        with self._lock:
            due = [
                t for t in self._triggers if (succeeded or t[2]) and t[3] in body and t[0](request.method, request.path)
            ]
            self._triggers = [t for t in self._triggers if t not in due]
        for _, action, _, _ in due:
            action()


def _read_head(reader) -> list[bytes] | None:
    lines = []
    while True:
        line = reader.readline(1 << 16)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return lines if lines else None
        lines.append(line.rstrip(b"\r\n"))


def _headers(head: list[bytes]) -> dict[str, str]:
    return {k.strip().lower().decode(): v.strip().decode() for k, _, v in (line.partition(b":") for line in head[1:])}


def _read_body(reader, headers: dict[str, str]) -> bytes:
    """The body exactly as sent (a chunked one with its chunk framing and trailers)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size_line = reader.readline(1 << 16)
            body += size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (trailer := reader.readline(1 << 16)) not in (b"\r\n", b"\n", b""):
                    body += trailer
                return body + b"\r\n"
            body += reader.read(size + 2)  # the chunk and its CRLF
    return reader.read(int(headers.get("content-length", 0)))
