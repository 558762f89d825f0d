"""The cluster files as their tools read them: the KubeRay manifests against KubeRay's CRD schemas (strict: an
unknown or misplaced key fails) and their pod templates and other objects against Kubernetes' own, the Dockerfile
through hadolint, the launcher config for what a spot cluster needs; and the Ray APIs they and the preemption
watcher rely on, which Ray does not promise to keep (the pin in pyproject.toml), checked against the Ray installed."""

from __future__ import annotations

import functools
import gzip
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "cluster"
CRDS = Path(__file__).resolve().parent / "schemas" / "kuberay-v1.7.0"
KUBERNETES = "1.33"  # the oldest minor GKE and EKS still offer


def strict(schema):
    """kubeconform's openapi2jsonschema rules: an object with properties takes no other key (as `kubectl
    --validate=strict` and the API server's field validation), int-or-string is either."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@functools.cache
def crd_schema(kind: str) -> dict:
    crd = yaml.load(gzip.decompress((CRDS / f"ray.io_{kind.lower()}s.yaml.gz").read_bytes()), Loader=yaml.CSafeLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict(version["schema"]["openAPIV3Schema"])


def manifest(name: str) -> dict:
    return yaml.safe_load((CLUSTER / "kuberay" / name).read_text())


def pod_templates(doc: dict) -> list[dict]:
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob-pretrain.yaml"])
def test_kuberay_manifests_validate_against_the_crds_and_their_pods_against_kubernetes(name):
    doc = manifest(name)
    jsonschema.validate(doc, crd_schema(doc["kind"]))
    for template in pod_templates(doc):
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


def test_the_strict_schemas_catch_a_misplaced_key():
    doc = manifest("rayjob-pretrain.yaml")
    doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["terminationGracePeriodSeconds"] = 120  # belongs in the pod
    with pytest.raises(jsonschema.ValidationError, match="terminationGracePeriodSeconds"):
        jsonschema.validate(doc, crd_schema("RayJob"))
    template = pod_templates(manifest("raycluster.yaml"))[1]
    template["spec"]["containers"][1]["comand"] = ["albert-dist"]
    pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


def test_the_kubernetes_objects_validate_and_share_one_read_write_many_claim():
    for path in sorted((CLUSTER / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["apiVersion"] != "ray.io/v1":
                kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    claim = manifest("shared-pvc.yaml")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    mlflow, service = yaml.safe_load_all((CLUSTER / "kuberay" / "mlflow.yaml").read_text())
    assert service["spec"]["type"] == "ClusterIP"  # reached by port-forward, never from outside
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for name in ["raycluster.yaml", "rayjob-pretrain.yaml"]
        for t in pod_templates(manifest(name))
        for v in t["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    } | {v["persistentVolumeClaim"]["claimName"] for v in mlflow["spec"]["template"]["spec"]["volumes"]}
    assert claims == {claim["metadata"]["name"]}


def labels_required(affinity: dict) -> list[list[tuple]]:
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [[(e["key"], e["operator"], tuple(e.get("values", ()))) for e in t["matchExpressions"]] for t in terms]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob-pretrain.yaml"])
def test_kuberay_spot_workers_drain_before_they_go_and_the_head_stays_on_demand(name):
    doc = manifest(name)
    ray_version = doc["spec"].get("rayClusterSpec", doc["spec"])["rayVersion"]
    head, *workers = pod_templates(doc)
    # the head: never on a node GKE, EKS or Karpenter labels spot
    (head_terms,) = labels_required(head["spec"]["affinity"])
    assert ("cloud.google.com/gke-spot", "DoesNotExist", ()) in head_terms
    assert ("eks.amazonaws.com/capacityType", "NotIn", ("SPOT",)) in head_terms
    for worker in workers:
        spec = worker["spec"]
        assert [("cloud.google.com/gke-spot", "In", ("true",))] in labels_required(spec["affinity"])
        assert any(t["key"] == "cloud.google.com/gke-spot" for t in spec["tolerations"])
        ray_container, watcher = spec["containers"]
        env = {e["name"]: e.get("value") for e in ray_container["env"]}
        # SIGTERM: `ray start --block` drains for this long, inside the pod's grace period
        assert 0 < float(env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"]) < spec["terminationGracePeriodSeconds"]
        # the watcher reads the GCS address `ray start` writes under /tmp/ray, and runs albert-dist's command
        assert watcher["command"][:3] == ["albert-dist", "cluster", "watch-preemption"]
        mounts = lambda c: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}  # noqa: E731
        assert mounts(ray_container)["/tmp/ray"] == mounts(watcher)["/tmp/ray"]
        assert {e["name"] for e in watcher["env"]} >= {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}
        assert ray_container["image"] == watcher["image"] == "albert-dist:0.1.0-cuda"
    assert head["spec"]["containers"][0]["image"] == "albert-dist:0.1.0-cpu"
    assert ray_version == ray_pin()
    if doc["kind"] == "RayJob":
        assert doc["spec"]["backoffLimit"] >= 1
        assert "working_dir" not in yaml.safe_load(doc["spec"]["runtimeEnvYAML"])  # the image carries the code


def ray_pin() -> str:
    """The one Ray release pyproject.toml allows."""
    pyproject = (REPO / "pyproject.toml").read_text()
    low, high = re.search(r'"ray\[[\w,]+\]>=([\d.]+),<([\d.]+)"', pyproject).groups()
    assert low.count(".") == 2 and high.split(".")[:2] == [low.split(".")[0], str(int(low.split(".")[1]) + 1)]
    return low


def test_the_launcher_config_runs_spot_workers_with_the_watcher_and_the_pinned_ray():
    cfg = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    nodes = cfg["available_node_types"]
    head = nodes.pop(cfg["head_node_type"])
    assert "InstanceMarketOptions" not in head["node_config"]  # on demand
    assert nodes and all(n["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"} for n in nodes.values())
    for commands in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert "albert-dist cluster watch-preemption --cloud aws" in cfg[commands][-1]
    setup = "\n".join(cfg["setup_commands"])
    assert f"ray[default]=={ray_pin()}" in setup and f"ray=={ray_pin()}" in setup
    # the file system id travels as a file the launcher copies (it expands no ${VAR}: ray-project/ray#29016)
    assert "${" not in yaml.safe_dump(cfg)
    assert cfg["file_mounts"]["/home/ubuntu/.ray/efs_id"] == "~/.ray/albert_efs_id" and "~/.ray/efs_id" in setup


def test_the_dockerfile_lints_clean_and_pins_the_ray_of_pyproject():
    dockerfile = CLUSTER / "docker" / "Dockerfile"
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    lint = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = dockerfile.read_text()
    assert f"ARG RAY_VERSION={ray_pin()}" in text
    assert (
        "FROM rayproject/ray:${RAY_VERSION}-py311 " in text and "FROM rayproject/ray:${RAY_VERSION}-py311-gpu " in text
    )


def test_the_ray_apis_albert_dist_relies_on_are_those_of_the_pinned_ray():
    """Each of these is private or alpha in Ray, and moved between releases: a Ray that changed one fails here
    (raise the pin only with this test passing)."""
    import ray
    from ray._private import ray_constants, services
    from ray.core.generated import autoscaler_pb2, gcs_pb2

    assert ray.__version__ == ray_pin()
    # the preemption watcher's drain: the call of `ray drain-node` and of the SIGTERM handler
    drain = inspect.signature(ray._raylet.InnerGcsClient.drain_node)
    assert list(drain.parameters)[1:] == ["node_id", "reason", "reason_message", "deadline_timestamp_ms", "timeout"]
    assert autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    assert "timeout" in inspect.signature(ray._raylet.InnerGcsClient.get_all_node_info).parameters
    assert gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE") is not None
    assert callable(services.canonicalize_bootstrap_address)
    # what the manifests' SIGTERM drain and the run's notice checkpoint read
    assert ray_constants.RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S >= 0
    # (tests/test_faults_sigterm.py runs it; its drain reason, which the GCS does not report back, read here)
    assert "DRAIN_NODE_REASON_PREEMPTION" in inspect.getsource(ray._private.node.Node._drain_node_before_shutdown)
    assert callable(ray.train.get_preemption_info)
