"""A cloud's instance metadata service on 127.0.0.1, real HTTP: AWS's IMDSv2 (a PUT for a session token, every read
refused without one) and GCE's metadata server (every read refused without `Metadata-Flavor: Google`), answering
the paths the preemption watcher reads with what the test sets."""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeMetadata:
    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.instance_action: dict | None = None  # AWS spot/instance-action, 404 while None
        self.rebalance: dict | None = None  # AWS events/recommendations/rebalance
        self.preempted = "FALSE"  # GCE instance/preempted
        self.maintenance_event = "NONE"  # GCE instance/maintenance-event
        self.tokens: set[str] = set()
        self.refused = 0  # reads without a valid token or header
        self._server = ThreadingHTTPServer(address, self._handler())
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeMetadata:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _answer(self, path: str, headers) -> tuple[int, str]:
        if path == "/latest/api/token":
            return 405, ""  # IMDSv2 hands tokens out on PUT only
        if path.startswith("/latest/meta-data/"):
            if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
                self.refused += 1
                return 401, ""
            value = {
                "/latest/meta-data/spot/instance-action": self.instance_action,
                "/latest/meta-data/events/recommendations/rebalance": self.rebalance,
            }.get(path)
            return (200, json.dumps(value)) if value else (404, "")
        if path.startswith("/computeMetadata/v1/instance/"):
            if headers.get("Metadata-Flavor") != "Google":
                self.refused += 1
                return 403, ""
            value = {"id": "1234567890", "preempted": self.preempted, "maintenance-event": self.maintenance_event}
            found = value.get(path.removeprefix("/computeMetadata/v1/instance/"))
            return (200, found) if found else (404, "")
        return 404, ""

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's name
                self._send(*fake._answer(self.path, self.headers))

            def do_PUT(self):  # noqa: N802
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400, "")
                token = secrets.token_urlsafe(16)
                fake.tokens.add(token)
                self._send(200, token)

            def log_message(self, *args):
                pass

        return Handler
