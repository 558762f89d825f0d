"""Connecting to Ray the same way from every command.

A Ray that albert-dist starts by itself (the demo, CLI jobs without $RAY_ADDRESS, the tests) listens on
127.0.0.1 only and requires a token generated for that start: whoever reaches a Ray without auth can run code on
it (CVE-2023-48022).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import ipaddress
import json
import os
import secrets
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from albert_dist.console import quiet_ray
from albert_dist.storage import private_file

# Ray Train 2.60 sends a worker's print both to Ray's stdout wrapper and to its logger, so every progress line
# would reach the console twice; with the redirection off it reaches it once, through Ray's usual log forwarding.
WORKER_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
# Ray's single-machine mode: node IP 127.0.0.1, the only setting that keeps GCS, raylet, agents and workers off
# the machine's other interfaces (a plain local Ray binds them to all of them, whatever the dashboard host).
LOOPBACK_FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's raylet gives its dashboard agent a fixed 15 s to come up and exits otherwise (ray-project/ray#65983): on a
# busy small machine a local start can fail that way, so it is tried this many times.
STARTS = 3


def ensure_ray() -> None:
    """Join the cluster named by $RAY_ADDRESS (set for Ray jobs and by `cluster/local` scripts), else start a
    private local Ray: never silently attach to some other cluster running on the machine."""
    import ray

    if ray.is_initialized():
        return
    os.environ.update(WORKER_ENV)  # a local Ray's workers inherit it; jobs and cluster scripts set it themselves
    address = os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        # a local Ray of another process (127.0.0.1:PORT) is joined in its single-machine mode: otherwise Ray
        # swaps the loopback address for the machine's own one, where that Ray does not listen
        with _loopback_only() if _is_loopback(_host_of(address)) else contextlib.nullcontext():
            ray.init(address=address, configure_logging=False, runtime_env=_joining_runtime_env())
    else:
        # a local Ray gets its dashboard: Ray Train's placement-group cleaner asks the state API it serves whether
        # the training controller is alive, and logs a warning every second while it cannot
        context = start_local_ray(configure_logging=False)
        print(
            f"local Ray: dashboard http://{context.dashboard_url}, 127.0.0.1 only, token auth (the token is in "
            f"{os.environ['RAY_AUTH_TOKEN_PATH']} while this command runs)",
            flush=True,
        )
    quiet_ray()  # Ray's own log lines to a file unless --verbose


def _joining_runtime_env() -> dict[str, Any]:
    """The runtime env of a driver that joins a running cluster: its workers' rendezvous on their node's address. A
    driver that Ray's job manager started has its job's runtime env already, and Ray refuses a field given twice:
    where the job names a setup hook (`albert-dist submit` names this one), that hook stands."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    job = json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}")
    if "worker_process_setup_hook" in (job.get("runtime_env") or {}):
        return {}
    return {"worker_process_setup_hook": CLUSTER_WORKER_HOOK}


def start_local_ray(**init_kwargs: Any):
    """Start a private Ray on this machine, loopback only, token auth on; returns ray.init's context.

    The token is new for each start, in a file only this user can read (removed when the process exits); the
    process and its children find it in $RAY_AUTH_TOKEN_PATH, e.g. for JobSubmissionClient or `ray` commands.
    """
    import ray
    from ray._raylet import AuthenticationTokenLoader, Config

    token_path = private_file(secrets.token_urlsafe(32), "albert-ray-auth-")
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path))
    # Ray reads its auth mode and token once per process: make it read them again (as its own default-auth
    # path does), so that a shell's RAY_AUTH_MODE=disabled or an earlier start's token cannot win
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    runtime_env = init_kwargs.pop("runtime_env", {})
    runtime_env = {
        **runtime_env,
        "env_vars": {**_local_train_settings(), **runtime_env.get("env_vars", {})},
        "worker_process_setup_hook": LOCAL_WORKER_HOOK,
    }
    for attempt in range(STARTS):
        try:
            with _loopback_only():
                return ray.init(address="local", runtime_env=runtime_env, **init_kwargs)
        except Exception as err:  # noqa: BLE001 - only Ray's start-up timeout is retried
            if attempt == STARTS - 1 or "timed out during startup" not in str(err):
                raise
            ray.shutdown()
            print("local Ray: its node did not come up in time (a busy machine?); starting it again", flush=True)


#: Ray Train's switch for its preemption watcher, the actor that tells the workers of a node's drain notice
PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def _local_train_settings() -> dict[str, str]:
    """Ray Train settings for a Ray on one machine, unless the caller's environment sets them: no preemption
    watcher, an actor per training run that polls for node drains, which one machine never has (it costs ~5 CPU
    seconds to start each run, a seventh of a small run's start-up on 2 cores)."""
    settings = {PREEMPTION_WATCHER: "0"}
    return {name: value for name, value in settings.items() if name not in os.environ}


def prepare_local_worker() -> None:
    """Worker setup hook of a local Ray."""
    _state_api_on_own_cluster()
    keep_rendezvous_on_its_address()


def _state_api_on_own_cluster() -> None:
    """Point the worker's $RAY_ADDRESS at its own cluster. Ray Train's placement-group cleaner asks the state API,
    without an address, whether the training controller lives; with "local" (or nothing) that API looks for *the*
    Ray on the machine and fails where a second local Ray runs (two jobs, two test processes), so a stopped trial's
    worker group stayed reserved and an ASHA sweep hung."""
    import ray

    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def keep_rendezvous_on_its_address() -> None:
    """torch's TCPStore, the rendezvous rank 0 of Ray Train serves, listens on every interface whatever the address
    it is given: hand it a socket bound to that address instead (the node's own IP on a cluster, 127.0.0.1 on one
    machine). The worker setup hook of a local Ray and of every job `albert-dist submit` sends. Patched when a worker
    imports the rendezvous module: importing torch here would cost every worker (data tasks, actors) ~2 CPU seconds
    it may never need."""
    _after_import("torch.distributed.rendezvous", _patch_rendezvous)


#: the worker setup hooks, as Ray's runtime env names them: a local Ray's, and every submitted job's
LOCAL_WORKER_HOOK = f"{__name__}.{prepare_local_worker.__name__}"
CLUSTER_WORKER_HOOK = f"{__name__}.{keep_rendezvous_on_its_address.__name__}"


def _patch_rendezvous(rendezvous) -> None:
    from torch.distributed import TCPStore

    create_store = rendezvous._create_c10d_store

    def create_bound_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or not _is_ip(hostname):
            return create_store(hostname, port, rank, world_size, timeout, use_libuv)
        listener = socket.create_server((hostname, port), family=socket.AF_INET6 if ":" in hostname else socket.AF_INET)
        return TCPStore(
            host_name=hostname,
            port=port,
            world_size=world_size,
            is_master=True,
            timeout=timeout,
            multi_tenant=True,
            master_listen_fd=listener.detach(),
            use_libuv=use_libuv,
        )

    rendezvous._create_c10d_store = create_bound_store


def _after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call `then(module)` once module `name` has been imported (at once if it already is)."""
    if name in sys.modules:
        then(sys.modules[name])
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            exec_module = spec.loader.exec_module

            def exec_then(module):
                exec_module(module)
                then(module)

            spec.loader.exec_module = exec_then
            return spec

    sys.meta_path.insert(0, Finder())


def _host_of(address: str) -> str:
    """The host of a Ray address: "HOST:PORT", "[IPv6]:PORT", "ray://HOST:PORT" or a bare host."""
    return urllib.parse.urlsplit("//" + address.split("://", 1)[-1]).hostname or ""


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray's single-machine mode while the local Ray starts (its processes keep node IP 127.0.0.1 afterwards).

    Ray reads the flag when it is imported, so its constant is set too; both are restored afterwards so that
    processes started later from here (a multi-node `ray start`, a cluster's driver) are not confined to loopback.
    """
    from ray._private import ray_constants

    saved_env, saved_flag = os.environ.get(LOOPBACK_FLAG), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_FLAG], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(LOOPBACK_FLAG, None)
        else:
            os.environ[LOOPBACK_FLAG] = saved_env
