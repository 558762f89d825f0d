"""`albert-dist serve`: the foreground command. Ray starts (or is joined) as for every command, Ray Serve's HTTP
proxy listens on 127.0.0.1 unless `--open`, every request needs the bearer token, and Ctrl-C (or SIGTERM) takes the
application and Serve down before the command returns."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from albert_dist.errors import ConfigError

APP_NAME = "albert-dist"
LOOPBACK, EVERY_INTERFACE = "127.0.0.1", "0.0.0.0"


@dataclass(frozen=True)
class ServeOptions:
    model_dir: str
    host: str | None = None  # LOOPBACK, or EVERY_INTERFACE with `open`
    port: int = 8000
    open: bool = False
    max_batch_size: int = 64
    batch_wait_ms: float = 10.0
    replicas: int = 1
    threads: int | None = None  # per replica; the machine's cores shared among the replicas
    pair: bool = False
    precision: str = "auto"

    def listen_host(self) -> str:
        """The address the HTTP proxy binds: loopback unless `open`; a host beyond loopback only with `open`."""
        host = self.host or (EVERY_INTERFACE if self.open else LOOPBACK)
        if not self.open and not _is_loopback(host):
            raise ConfigError(f"--host {host} is reachable from other machines: add --open to serve beyond this one")
        return host

    def replica_threads(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.replicas)

    def check(self) -> None:
        for name, value, least in [
            ("--max-batch-size", self.max_batch_size, 1),
            ("--batch-wait-ms", self.batch_wait_ms, 0),
            ("--replicas", self.replicas, 1),
            ("--threads", 1 if self.threads is None else self.threads, 1),
            ("--port", self.port, 1),
        ]:
            if value < least:
                raise ConfigError(f"{name} must be at least {least}, not {value}")
        if self.port > 65535:
            raise ConfigError(f"--port must be at most 65535, not {self.port}")
        self.listen_host()


def run_serve(options: ServeOptions) -> int:
    """Serve the model until Ctrl-C or SIGTERM; returns the exit status."""
    from albert_dist.model.checkpoint import load_config
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    options.check()
    model_dir = str(Path(options.model_dir).resolve())
    load_config(model_dir)  # a missing or unreadable model is one line here, not a replica failing three times
    load_tokenizer(model_dir)
    host = options.listen_host()
    require_free_port(host, options.port)

    from albert_dist.cluster.ray_init import ensure_ray
    from albert_dist.serve import auth
    from albert_dist.serve.deployment import ReplicaSettings, ServedModel

    token, token_file = auth.serving_token()
    threads = options.replica_threads()
    settings = ReplicaSettings(
        model_dir=model_dir,
        pair=options.pair,
        token_digest=auth.digest(token),
        max_batch_size=options.max_batch_size,
        batch_wait_s=options.batch_wait_ms / 1000,
        threads=threads,
        precision=options.precision,
    )
    ensure_ray()
    from ray import serve

    if not _is_loopback(host):
        print(
            f"albert-dist serve: warning: listening on {host}, reachable from other machines (--open); every "
            "request still needs the token",
            file=sys.stderr,
            flush=True,
        )
    # Ctrl-C and `kill` stop it alike, also where it was started in the background (whose SIGINT a shell ignores)
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.default_int_handler)
    serve.start(http_options={"host": host, "port": options.port}, logging_config=_serve_logging())
    try:
        app = ServedModel.options(
            num_replicas=options.replicas,
            ray_actor_options={"num_cpus": threads},
            # one batch running while the next one fills: a request waits in the replica, not in the proxy
            max_ongoing_requests=2 * options.max_batch_size,
        ).bind(settings)
        serve.run(app, name=APP_NAME, route_prefix="/")
        where = (
            f"the token in {token_file} (yours alone; removed when serving stops)"
            if token_file
            else "the token in $" + auth.TOKEN_ENV
        )
        print(
            f"serving {model_dir} at http://{host}:{options.port}/ ({options.replicas} replica(s), {threads} "
            f'thread(s) each): POST / with {{"texts": [...]}} and Authorization: Bearer <token>, {where}; '
            "Ctrl-C stops",
            flush=True,
        )
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        print("albert-dist serve: stopping", flush=True)
        _stop(serve)
    print("albert-dist serve: stopped", flush=True)
    return 0


def _stop(serve) -> None:
    """Take this command's application down, and Serve with it unless other applications run on it (a cluster's
    Serve that this command joined)."""
    serve.delete(APP_NAME)
    if not serve.status().applications:
        serve.shutdown()


def _serve_logging() -> dict:
    """Serve's own INFO lines (controller, proxy, replicas, access log, and this process's) in Ray's log files; the
    console shows warnings unless --verbose."""
    import logging

    from albert_dist.console import verbose

    level = "INFO" if verbose() else "WARNING"
    logging.getLogger("ray.serve").setLevel(level)
    return {"log_level": level}


def require_free_port(host: str, port: int) -> None:
    """Refuse a port already taken before Ray starts: one line here, where Serve's proxy fails with a traceback
    once Ray and Serve are up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with contextlib.closing(socket.create_server((host, port), family=family)):
            pass
    except OSError as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror} (another server? pick --port)") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
