"""A real two-host Ray cluster on this machine: network namespaces joined by a veth pair, one Ray node in each.

The head (10.201.0.1) runs the driver and an MLflow server; the worker node (10.201.0.2) is another network host.
A 2-worker pretraining run with STRICT_SPREAD puts one DDP (gloo) rank on each and checkpoints to a directory both
see (same filesystem). Needs root for `ip netns`; skipped where namespaces are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HEAD_IP, WORKER_IP = "10.201.0.1", "10.201.0.2"
GCS_PORT, MLFLOW_PORT = 6379, 5000  # inside the namespaces: no collision with anything on the host
NIC = "albert0"  # each host's end of the veth pair, same name on both


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Hosts:
    """Two namespaces `<tag>h` and `<tag>w` joined by a veth pair; `close()` kills what runs in them and deletes them."""

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
                code = subprocess.run(["ip", "netns", "exec", ns, *args], env=env, timeout=timeout, stdout=out,
                                      stderr=subprocess.STDOUT, **kwargs).returncode
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


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    h = Hosts()
    try:
        h.create()
    except (subprocess.CalledProcessError, OSError) as err:
        h.close()
        pytest.skip(f"ip netns / veth refused here: {getattr(err, 'stderr', '') or err}")
    try:
        yield h
    finally:
        h.close()


def test_pretraining_spans_two_network_hosts(hosts, stdlib_corpus):
    root = Path(tempfile.mkdtemp(prefix="adn-", dir="/tmp"))  # short: Ray's socket paths live below it
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", "ALBERT_DIST_HOME": str(root / "out"),
           "MLFLOW_TRACKING_URI": f"http://{HEAD_IP}:{MLFLOW_PORT}", "PYTHONPATH": str(REPO),
           # this machine's hostname resolves to 127.0.0.1: name the interface Gloo should use between hosts
           "GLOO_SOCKET_IFNAME": NIC}
    env.pop("RAY_ADDRESS", None)
    try:
        subprocess.Popen(
            ["ip", "netns", "exec", hosts.head, str(BIN / "mlflow"), "server", "--host", HEAD_IP, "--port",
             str(MLFLOW_PORT), "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
             "--artifacts-destination", str(root / "artifacts")],
            env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        node = ["--num-cpus", "1", "--object-store-memory", "300000000", "--disable-usage-stats"]
        logs = root / "logs"
        logs.mkdir()
        hosts.run(hosts.head, ["ray", "start", "--head", "--node-ip-address", HEAD_IP, "--port",
                                         str(GCS_PORT), "--dashboard-host", "127.0.0.1", "--temp-dir",
                                         str(root / "rh"), *node], env, 180, logs / "head.log")
        hosts.run(hosts.worker, ["ray", "start", "--address", f"{HEAD_IP}:{GCS_PORT}", "--node-ip-address",
                                          WORKER_IP, "--temp-dir", str(root / "rw"), *node], env, 180, logs / "worker.log")

        driver = {**env, "RAY_ADDRESS": f"{HEAD_IP}:{GCS_PORT}"}
        hosts.run(hosts.head, [
            "python", "-m", "jobs.prepare_data", "--config", "jobs/configs/prepare_data.yaml",
            "--set", f"data.inputs=[{stdlib_corpus}]", "--set", "data.format=blocks", "--set", "data.max_seq_length=64",
            "--set", "data.dupe_factor=1", "--set", "data.eval_fraction=0.1", "--set", "data.tokenizer_actors=1",
            "--set", "tokenizer.vocab_size=1000"], driver, 300, logs / "prepare.log", cwd=REPO)

        hosts.run(hosts.head, [
            "python", "-m", "jobs.pretrain", "--config", "jobs/configs/pretrain_tiny.yaml",
            "--set", "run.name=two-hosts", "--set", "scaling.num_workers=2", "--set", "scaling.cpus_per_worker=0.5",
            "--set", "scaling.placement_strategy=STRICT_SPREAD", "--set", "model.hidden_size=64",
            "--set", "model.num_hidden_layers=2", "--set", "model.num_attention_heads=2",
            "--set", "model.intermediate_size=128", "--set", "train.precision=fp32", "--set", "train.max_steps=12",
            "--set", "train.warmup_steps=2", "--set", "train.batch_size=8", "--set", "train.log_every=4",
            "--set", "train.eval_every=12", "--set", "train.checkpoint_every=6", "--set", "train.eval_batches=2"],
            driver, 400, logs / "pretrain.log", cwd=REPO)

        workers = hosts.run(hosts.head, ["ray", "list", "actors", "--detail", "--format", "json", "--limit", "1000",
                                         "--filter", "class_name=RayTrainWorker"],
                            {**env, "RAY_ADDRESS": "http://127.0.0.1:8265"}, 120, logs / "actors.json")
        ips = {actor["address"]["ip_address"] for actor in json.loads(workers[workers.index("["):])}
        assert ips == {HEAD_IP, WORKER_IP}, ips  # one DDP rank on each host

        run_dir = root / "out" / "runs" / "two-hosts"
        checkpoints = sorted((run_dir / "ray" / "two-hosts").glob("checkpoint_*"))
        assert checkpoints and (run_dir / "model" / "config.json").is_file()
        run_id = (run_dir / "mlflow_run_id").read_text().strip()
        in_head = hosts.run(hosts.head, ["python", "-c", (
            "import json, sys; from mlflow.tracking import MlflowClient; r = MlflowClient().get_run(sys.argv[1]); "
            "print(json.dumps({'status': r.info.status, 'metrics': sorted(r.data.metrics), "
            "'world_size': r.data.params.get('world_size')}))"), run_id], env, 120, logs / "mlflow.json")
        run = json.loads(in_head.strip().splitlines()[-1])
        assert run["status"] == "FINISHED" and run["world_size"] == "2"
        assert {"loss", "mlm_accuracy"} <= set(run["metrics"])
    finally:
        hosts.close()  # before removing the directories its processes write to
        shutil.rmtree(root, ignore_errors=True)
