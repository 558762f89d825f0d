"""The cluster manifests parse, hold the keys their tools need, and name entry points and configs that work."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_jobs_entrypoints import config_class

from albert_dist.config import PACKAGED_CONFIGS, config_path, load_config
from albert_dist.jobs.registry import JOBS

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "cluster"


def load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def test_cluster_launcher_config():
    cfg = load("aws.yaml")
    assert {
        "cluster_name",
        "provider",
        "auth",
        "available_node_types",
        "head_node_type",
        "file_mounts",
        "setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    } <= set(cfg)
    nodes = cfg["available_node_types"]
    assert cfg["head_node_type"] in nodes and nodes[cfg["head_node_type"]]["resources"] == {"CPU": 0}
    assert any(node["node_config"]["InstanceType"].startswith(("g", "p")) for node in nodes.values())
    setup = " ".join(cfg["setup_commands"])
    assert "/mnt/shared" in setup and "efs" in setup and "pip install -e" in setup
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "RAY_AUTH_MODE=token" in head
    assert "RAY_AUTH_MODE=token" in " ".join(cfg["worker_start_ray_commands"])


def ray_cluster_spec(spec: dict) -> None:
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in head["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    for secret in ("RAY_AUTH_TOKEN", "MLFLOW_TRACKING_PASSWORD"):  # from Secrets, never literal
        assert "secretKeyRef" in env[secret]["valueFrom"]
    workers = spec["workerGroupSpecs"]
    assert any(g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu") for g in workers)
    mounts = {m["mountPath"] for m in head["volumeMounts"]}
    assert "/mnt/shared" in mounts


def test_raycluster():
    doc = load("kuberay/raycluster.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayCluster")
    ray_cluster_spec(doc["spec"])


def test_rayjob():
    doc = load("kuberay/rayjob-pretrain.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    spec = doc["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["ALBERT_DIST_HOME"].startswith("/mnt/shared")
    ray_cluster_spec(spec["rayClusterSpec"])
    assert spec["entrypoint"] == (
        "python -m albert_dist.cli pretrain --config pretrain_base --set train.resource_wait_attempts=-1"
    )


def expand(text: str) -> list[str]:
    """Brace alternatives as a shell expands them: `a_{x,y}.yaml` -> [a_x.yaml, a_y.yaml]."""
    match = re.search(r"\{([^}]*)\}", text)
    if not match:
        return [text]
    return [
        t for option in match.group(1).split(",") for t in expand(text[: match.start()] + option + text[match.end() :])
    ]


def entrypoints() -> list[str]:
    """Every `python -m albert_dist.cli COMMAND --config Y` the manifests and docs name."""
    texts = [p.read_text() for p in [*CLUSTER.rglob("*.yaml"), REPO / "docs" / "cluster.md"]]
    found = set()
    for text in texts:
        for m in re.finditer(r"python -m albert_dist\.cli [\w-]+(?: [\w{},-]+)?\s+--config [\w/.{},]+", text):
            found |= set(expand(" ".join(m.group(0).split())))
    return sorted(found)


@pytest.mark.parametrize("command", entrypoints())
def test_named_entry_points_exist_and_their_configs_validate(command, monkeypatch):
    monkeypatch.chdir(REPO)
    *words, flag, config = shlex.split(command)[3:]
    assert tuple(words) in [job.command for job in JOBS.values()] and flag == "--config"
    path = config_path(config)  # a packaged config's name: the cluster's installed package has it
    assert path.is_relative_to(PACKAGED_CONFIGS), config
    load_config(config_class(path.stem), config)
    help_text = subprocess.run(
        [sys.executable, "-m", "albert_dist.cli", *words, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert help_text.returncode == 0 and "--config" in help_text.stdout, help_text.stderr
