"""A real two-host Ray cluster on this machine: network namespaces joined by a veth pair, one Ray node in each.

The head (10.201.0.1) runs the driver and an MLflow server; the worker node (10.201.0.2) is another network host.
A 2-worker pretraining run with STRICT_SPREAD puts one DDP (gloo) rank on each and checkpoints to a directory both
see (same filesystem). Ray wants its token on both hosts and the MLflow server its password, as on a real cluster.
Needs root for `ip netns`: skipped where namespaces are refused, failed if refused to root (CI).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from cluster_helpers import prepare_args, pretrain_args, sets
from process_helpers import fault_unavailable

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HEAD_IP, WORKER_IP = "10.201.0.1", "10.201.0.2"
GCS_PORT, MLFLOW_PORT = 6379, 5000  # inside the namespaces: no collision with anything on the host
NIC = "albert0"  # each host's end of the veth pair, same name on both


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Hosts:
    """Namespaces `<tag>h` and `<tag>w` joined by a veth pair; `close()` kills what runs in them, deletes them."""

    def __init__(self) -> None:
        self.tag = tag = "ad" + uuid.uuid4().hex[:6]
        self.head, self.worker = f"{tag}h", f"{tag}w"
        self.created: list[str] = []

    def create(self) -> None:
        tag = self.tag
        for ns in (self.head, self.worker):
            ip("netns", "add", ns)
            self.created.append(ns)
        ip("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        for ns, dev, addr in ((self.head, f"{tag}a", HEAD_IP), (self.worker, f"{tag}b", WORKER_IP)):
            ip("link", "set", dev, "netns", ns, "name", NIC)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", NIC)
            ip("-n", ns, "link", "set", NIC, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def run(self, ns: str, args: list[str], env: dict[str, str], timeout: float, log: Path, **kwargs) -> str:
        """Run in namespace `ns`, output to `log`; returns the output, fails the test with its tail on error."""
        with open(log, "w") as out:
            try:
                code = subprocess.run(
                    ["ip", "netns", "exec", ns, *args],
                    env=env,
                    timeout=timeout,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    **kwargs,
                ).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        text = log.read_text(errors="replace")
        assert code == 0, f"{' '.join(args[:4])}: exit {code}\n{text[-5000:]}"
        return text

    def close(self) -> None:
        while self.created:
            ns = self.created.pop()
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for sig in ("TERM", "KILL"):
                for pid in pids:
                    subprocess.run(["kill", f"-{sig}", pid], capture_output=True)
                time.sleep(1 if sig == "TERM" else 0)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{self.tag}a"], capture_output=True)  # only if never moved


def write_secret(path: Path) -> str:
    """A fresh secret in a file only this user can read."""
    secret = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(secret + "\n")
    return secret


def basic_auth_config(root: Path, password: str) -> Path:
    """MLflow's basic-auth settings: nobody but the admin may read or write (cluster/local/start.sh's)."""
    config = root / "mlflow_auth.ini"
    config.write_text(
        f"[mlflow]\ndefault_permission = NO_PERMISSIONS\ndatabase_uri = sqlite:///{root}/basic_auth.db\n"
        f"admin_username = admin\nadmin_password = {password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return config


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or not shutil.which("ip"):
        fault_unavailable("network namespaces need root and iproute2")
    h = Hosts()
    try:
        h.create()
    except (subprocess.CalledProcessError, OSError) as err:
        h.close()
        fault_unavailable(f"ip netns / veth refused here: {getattr(err, 'stderr', '') or err}")
    try:
        yield h
    finally:
        h.close()


def test_pretraining_spans_two_network_hosts(hosts, stdlib_corpus):
    root = Path(tempfile.mkdtemp(prefix="adn-", dir="/tmp"))  # short: Ray's socket paths live below it
    # both hosts' Ray wants its token, the tracking server its password, as cluster/local/start.sh sets them up
    token, password = write_secret(root / "ray_auth_token"), write_secret(root / "mlflow_admin_password")
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(root / "ray_auth_token"),
        "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": password,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        "ALBERT_DIST_HOME": str(root / "out"),
        "MLFLOW_TRACKING_URI": f"http://{HEAD_IP}:{MLFLOW_PORT}",
        "PYTHONPATH": str(REPO),
        # this machine's hostname resolves to 127.0.0.1: name the interface Gloo should use between hosts
        "GLOO_SOCKET_IFNAME": NIC,
        # Ray Train's worker-group listing (ranks and IPs, read below) is one of Ray's log lines
        "ALBERT_DIST_VERBOSE": "1",
    }
    env.pop("RAY_ADDRESS", None)
    try:
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                hosts.head,
                str(BIN / "mlflow"),
                "server",
                "--host",
                HEAD_IP,
                "--port",
                str(MLFLOW_PORT),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{root}/mlflow.db",
                "--artifacts-destination",
                str(root / "artifacts"),
                "--app-name",
                "basic-auth",
            ],
            env={
                **env,
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                "MLFLOW_AUTH_CONFIG_PATH": str(basic_auth_config(root, password)),
                "MLFLOW_FLASK_SERVER_SECRET_KEY": write_secret(root / "mlflow_secret_key"),
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # 2 logical CPUs a node: one Train worker (0.5) each, and room for the Ray Data tasks that feed it
        node = ["--num-cpus", "2", "--object-store-memory", "300000000", "--disable-usage-stats"]
        logs = root / "logs"
        logs.mkdir()
        hosts.run(
            hosts.head,
            [
                "ray",
                "start",
                "--head",
                "--node-ip-address",
                HEAD_IP,
                "--port",
                str(GCS_PORT),
                "--dashboard-host",
                "127.0.0.1",
                "--temp-dir",
                str(root / "rh"),
                *node,
            ],
            env,
            180,
            logs / "head.log",
        )
        hosts.run(
            hosts.worker,
            [
                "ray",
                "start",
                "--address",
                f"{HEAD_IP}:{GCS_PORT}",
                "--node-ip-address",
                WORKER_IP,
                "--temp-dir",
                str(root / "rw"),
                *node,
            ],
            env,
            180,
            logs / "worker.log",
        )

        driver = {**env, "RAY_ADDRESS": f"{HEAD_IP}:{GCS_PORT}"}
        hosts.run(
            hosts.head,
            ["python", "-m", "albert_dist.cli", "data", "prepare", *prepare_args(stdlib_corpus)],
            driver,
            300,
            logs / "prepare.log",
            cwd=REPO,
        )
        trained = hosts.run(
            hosts.head,
            [
                "python",
                "-m",
                "albert_dist.cli",
                "pretrain",
                *pretrain_args("two-hosts", steps=12),
                *sets("scaling.placement_strategy=STRICT_SPREAD"),
            ],
            driver,
            400,
            logs / "pretrain.log",
            cwd=REPO,
        )

        # Ray Train lists its worker group: "- (ip=10.201.0.2, pid=123) world_rank=0, local_rank=0, node_rank=0"
        ranks = dict(re.findall(r"\(ip=([\d.]+), pid=\d+\) world_rank=(\d+)", trained))
        assert set(ranks) == {HEAD_IP, WORKER_IP} and sorted(ranks.values()) == ["0", "1"], ranks

        run_dir = root / "out" / "runs" / "two-hosts"
        checkpoints = sorted((run_dir / "ray" / "two-hosts").glob("checkpoint_*"))
        assert checkpoints and (run_dir / "model" / "config.json").is_file()
        run_id = (run_dir / "mlflow_run_id").read_text().strip()
        in_head = hosts.run(
            hosts.head,
            [
                "python",
                "-c",
                (
                    "import json, sys; from mlflow.tracking import MlflowClient; r = MlflowClient().get_run(sys.argv[1]); "
                    "print(json.dumps({'status': r.info.status, 'metrics': sorted(r.data.metrics), "
                    "'world_size': r.data.params.get('world_size')}))"
                ),
                run_id,
            ],
            env,
            120,
            logs / "mlflow.json",
        )
        run = json.loads(in_head.strip().splitlines()[-1])
        assert run["status"] == "FINISHED" and run["world_size"] == "2"
        assert {"loss", "mlm_accuracy"} <= set(run["metrics"])
        # the run went through the password: the tracking server refuses a request without it, from either host
        unauthenticated = {k: v for k, v in env.items() if not k.startswith("MLFLOW_TRACKING_")}
        refused = hosts.run(
            hosts.worker,
            [
                "python",
                "-c",
                (
                    "import sys, urllib.error, urllib.request\n"
                    "try: urllib.request.urlopen(sys.argv[1], timeout=30); print('status 200')\n"
                    "except urllib.error.HTTPError as err: print('status', err.code)"
                ),
                f"http://{HEAD_IP}:{MLFLOW_PORT}/api/2.0/mlflow/runs/get?run_id={run_id}",
            ],
            unauthenticated,
            120,
            logs / "refused.txt",
        )
        assert refused.strip().splitlines()[-1] == "status 401", refused
        assert token not in trained and password not in trained
    finally:
        hosts.close()  # before removing the directories its processes write to
        shutil.rmtree(root, ignore_errors=True)
