"""Safe by default: a Ray that albert-dist starts by itself listens on loopback only and wants its token; a
password in the tracking URI is found nowhere afterwards.

One real `albert-dist pretrain` (its own local Ray, two Ray Train workers, a real `mlflow server` reached through
a URI with a canary password) is watched while it trains: the socket table of the OS (/proc/net/tcp, /proc/net/tcp6)
for every process of its tree, and its dashboard's job API asked with and without the token. Afterwards the canary
is searched for in its output, its MLflow params, tags and artifacts, and every file it or its Ray wrote.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from process_helpers import beyond_loopback, is_loopback, listeners_of, listeners_sampled, process_tree
from test_tracking import free_port, start_server, stop_server

from albert_dist.cluster import submit as jobs_client
from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.data.prepare import prepare_dataset
from albert_dist.errors import AlbertDistError, ConfigError
from albert_dist.pretrain.config import PretrainJobConfig

REPO = Path(__file__).resolve().parent.parent
CANARY = f"canary-{uuid.uuid4().hex}"


def http_status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@dataclass
class WatchedJob:
    root: Path
    ray_tmp: Path
    tracking_uri: str
    output: list[str] = field(default_factory=list)
    listeners: set[tuple[str, int, str]] = field(default_factory=set)
    api_status: dict[str, int] = field(default_factory=dict)
    token_file_mode: int | None = None
    state_api_from_session_worker: str = ""  # asked while the job's Ray ran beside the session's
    returncode: int | None = None

    @property
    def log(self) -> str:
        return "".join(self.output)[-6000:]


def ask_state_api_from_a_worker() -> str:
    """What a worker of the session's Ray gets from Ray's state API asked without an address, as Ray Train's
    placement-group cleaner asks it: its own node's id, or the error."""
    import ray

    @ray.remote(num_cpus=0)
    def own_node() -> str:
        from ray.util.state import list_nodes

        try:
            return list_nodes()[0].node_id
        except Exception as err:  # noqa: BLE001 - the error is the answer
            return f"{type(err).__name__}: {err}"

    return ray.get(own_node.remote(), timeout=120)


def probe_api(job: WatchedJob, line: str) -> None:
    """Ask the job API of the Ray announced in `line` without a token, with a wrong one and with the right one."""
    url, token_path = re.search(r"dashboard (http://\S+),.* token is in (\S+) ", line).groups()
    token = Path(token_path).read_text().strip()
    job.token_file_mode = Path(token_path).stat().st_mode & 0o777
    api = f"{url}/api/jobs/"
    job.api_status = {
        "none": http_status(api, None),
        "wrong": http_status(api, "not-" + token),
        "token": http_status(api, token),
    }


@pytest.fixture(scope="module")
def watched_pretraining(tmp_path_factory, ray_session) -> WatchedJob:
    root = tmp_path_factory.mktemp("security")
    # the job's Ray writes its logs here (short: Ray's socket paths live below it), searched for the canary later
    ray_tmp = Path(tempfile.mkdtemp(prefix="sec-", dir="/tmp"))
    port = free_port()
    server = start_server(root / "mlflow", port)
    try:
        yield watch_pretraining(WatchedJob(root, ray_tmp, f"http://127.0.0.1:{port}"))
    finally:
        stop_server(server)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def watch_pretraining(job: WatchedJob) -> WatchedJob:
    """Prepare a small corpus (in the session's Ray), then run `albert-dist pretrain` tracked through a URI with
    the canary password, sampling its processes' listeners every second and probing its job API once it is up."""
    root = job.root
    corpus = root / "corpus.txt"
    corpus.write_text(
        "\n\n".join(
            f"Document {i} says one thing. Then it says another thing about {i * 7}. "
            f"Finally it ends with number {i * 13}."
            for i in range(400)
        )
    )
    prepare_dataset(
        load_config(
            DataJobConfig,
            None,
            [
                f"run.output_dir={root}",
                f"data.inputs=[{corpus}]",
                "data.format=blocks",
                "data.output=prepared",
                "data.max_seq_length=64",
                "data.dupe_factor=1",
                "data.eval_fraction=0.1",
                "data.tokenizer_actors=1",
                "tokenizer.vocab_size=200",
            ],
        ),
        log=lambda _: None,
    )
    args = [
        f"run.output_dir={root}",
        "run.name=watched",
        "data.output=prepared",
        "model.embedding_size=16",
        "model.hidden_size=32",
        "model.num_hidden_layers=1",
        "model.num_attention_heads=2",
        "model.intermediate_size=64",
        "train.precision=fp32",
        "scaling.num_workers=2",
        "scaling.cpus_per_worker=0.5",
        "train.max_steps=30",
        "train.warmup_steps=2",
        "train.batch_size=8",
        "train.log_every=10",
        "train.eval_every=30",
        "train.checkpoint_every=30",
        "train.eval_batches=1",
    ]
    args.append("tracking.tracking_uri=" + job.tracking_uri.replace("://", f"://albert:{CANARY}@"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "albert_dist.cli", "pretrain", *[a for arg in args for a in ("--set", arg)]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "RAY_ADDRESS": "local", "RAY_TMPDIR": str(job.ray_tmp)},
    )

    def read_output() -> None:
        for line in proc.stdout:
            job.output.append(line)
            if line.startswith("local Ray: dashboard"):
                probe_api(job, line)
                job.state_api_from_session_worker = ask_state_api_from_a_worker()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    with listeners_sampled(lambda: process_tree(proc.pid), every=1) as listeners:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
    job.listeners = listeners
    job.returncode = proc.wait()
    reader.join(timeout=30)
    return job


@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_only(watched_pretraining):
    job = watched_pretraining
    assert job.returncode == 0, job.log
    names = " ".join(name for _, _, name in job.listeners)
    # the sample saw the whole Ray: its servers and the training workers
    for process in ("gcs_server", "raylet", "dashboard", "RayTrainWorker"):
        assert process in names, (process, sorted(job.listeners))
    assert not beyond_loopback(job.listeners), f"listening beyond loopback: {beyond_loopback(job.listeners)}"


@pytest.mark.slow
def test_the_local_ray_job_api_needs_its_token(watched_pretraining):
    job = watched_pretraining
    assert job.api_status, job.log
    assert job.api_status["none"] in (401, 403) and job.api_status["wrong"] in (401, 403), job.api_status
    assert job.api_status["token"] == 200, job.api_status
    assert job.token_file_mode == 0o600


@pytest.mark.slow
def test_a_worker_finds_its_own_ray_beside_another(watched_pretraining, ray_session):
    """Two local Rays on one machine (two jobs, two test processes): the state API asked without an address from a
    worker answers for the worker's own cluster instead of failing on "multiple active Ray instances"."""
    assert watched_pretraining.api_status, watched_pretraining.log  # the job's Ray was up when it was asked
    assert watched_pretraining.state_api_from_session_worker == ray_session.get_runtime_context().get_node_id()


def test_the_rendezvous_patch_waits_for_torch():
    """A local Ray's worker setup keeps the training rendezvous on loopback without importing torch itself (a data
    task or an actor would pay ~2 CPU seconds for it); the patch lands when torch.distributed is imported."""
    probe = (
        "import sys; from albert_dist.cluster import ray_init; ray_init.keep_rendezvous_on_its_address(); "
        "print('torch' in sys.modules); import torch.distributed; "
        "print(sys.modules['torch.distributed.rendezvous']._create_c10d_store.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "create_bound_store"], out.stdout + out.stderr


def test_socket_table_parsing_sees_a_wildcard_listener():
    """The check above could pass by missing listeners: a socket bound to all interfaces is reported as such."""
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        mine = listeners_of({os.getpid()})
    assert ("0.0.0.0", port) in {(ip, p) for ip, p, _ in mine}
    assert not is_loopback("0.0.0.0") and is_loopback("::ffff:127.0.0.1") and is_loopback("::1")


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_is_found_nowhere(watched_pretraining):
    from mlflow.tracking import MlflowClient

    job = watched_pretraining
    assert job.returncode == 0, job.log
    client = MlflowClient(job.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("albert-dist").experiment_id])
    # the job logged through that URI, and its param shows it redacted
    assert run.data.params["tracking.tracking_uri"] == job.tracking_uri.replace("://", "://***@")
    assert "loss" in run.data.metrics
    assert CANARY not in repr(run.data.params) + repr(run.data.tags)
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(job.root / "downloaded")))
    assert (artifacts / "config" / "pretrain.yaml").is_file()
    assert CANARY not in "".join(job.output), "the console shows the password"
    # every file of the run dir, the MLflow store (database, artifacts, server log) and the job's Ray session
    written = [p for folder in (job.root, job.ray_tmp) for p in folder.rglob("*") if p.is_file()]
    assert len(written) > 50
    leaks = [str(p) for p in written if CANARY.encode() in p.read_bytes()]
    assert not leaks, leaks


def test_submit_uploads_the_package_and_the_config_only(tmp_path, monkeypatch):
    """What `submit` sends is an allowlist: the package's modules and packaged configs (of an installed package: no
    checkout is read) and the --config file; a `.env`, a tokenizer, a corpus, caches and links beside them stay."""
    from ray._private.runtime_env.packaging import create_package

    site = tmp_path / "site-packages"  # an installed package: no git, no pyproject.toml beside it
    package = site / "albert_dist"
    (package / "configs").mkdir(parents=True)
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("x = 1\n")
    (package / "configs" / "pretrain_zh.yaml").write_text("run: {name: zh}\n")
    (package / ".env").write_text(f"MLFLOW_TRACKING_PASSWORD={CANARY}\n")
    (package / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_text(CANARY)
    (package / "configs" / "notes.txt").write_text(CANARY)
    (package / "link.py").symlink_to(package / ".env")
    (site / "corpus.txt").write_text(CANARY)
    work = tmp_path / "work"  # where submit runs, with the user's config and secrets
    (work / "tokenizer").mkdir(parents=True)
    (work / "tokenizer" / "spiece.model").write_text(CANARY)
    (work / ".env").write_text(CANARY)
    (work / "mine.yaml").write_text("run: {name: x}\n")
    monkeypatch.chdir(work)

    with jobs_client.staged_job("mine.yaml", package=package) as stage:
        assert jobs_client.runtime_env("/out", stage, {})["working_dir"] == str(stage)
        archive_path = tmp_path / "package.zip"  # what Ray uploads for that working_dir
        create_package(str(stage), archive_path, include_gitignore=True)
    with zipfile.ZipFile(archive_path) as archive:
        sent = sorted(name for name in archive.namelist() if not name.endswith("/"))
        assert not [name for name in sent if CANARY.encode() in archive.read(name)]
        assert archive.read("job_config/mine.yaml") == b"run: {name: x}\n"
    assert sent == [
        "albert_dist/__init__.py",
        "albert_dist/configs/pretrain_zh.yaml",
        "albert_dist/sub/mod.py",
        "job_config/mine.yaml",
    ]
    assert not stage.exists()
    assert jobs_client.entrypoint(["pretrain"], "mine.yaml", []).endswith("--config job_config/mine.yaml")


def test_submit_from_a_source_tree_sends_its_build_files_too():
    """From a checkout, pyproject.toml and the readme travel too: a model the job logs carries a wheel of those
    sources (tracking.models), as it would logged here; nothing else of the checkout does."""
    files = jobs_client.package_files()
    assert {"pyproject.toml", "README.md", "albert_dist/cli.py", "albert_dist/configs/pretrain_zh.yaml"} <= set(files)
    assert all(name in ("pyproject.toml", "README.md") or name.startswith("albert_dist/") for name in files)


def test_a_tracking_password_is_not_sent_with_a_job():
    env = {"MLFLOW_TRACKING_URI": f"https://albert:{CANARY}@mlflow.example:5000", "MLFLOW_TRACKING_USERNAME": "a"}
    runtime = jobs_client.runtime_env("/out", REPO, env)
    assert runtime["env_vars"]["MLFLOW_TRACKING_URI"] == "https://mlflow.example:5000"
    assert CANARY not in repr(runtime)
    assert jobs_client.withheld_secrets(env) == ["MLFLOW_TRACKING_USERNAME", "the user info of MLFLOW_TRACKING_URI"]
    with pytest.raises(AlbertDistError, match="command line") as err:  # Ray logs a job's entry point too
        jobs_client.entrypoint(["pretrain"], None, [f"tracking.tracking_uri=https://a:{CANARY}@h"])
    assert CANARY not in str(err.value)


@pytest.mark.parametrize("name", ["../x", "/tmp/x", ".", "..", "a/b", "a\\b"])
def test_a_run_name_cannot_leave_the_output_dir(name):
    with pytest.raises(ConfigError, match="run.name: not a plain directory name"):
        load_config(PretrainJobConfig, None, [f"run.name={name}"])
    assert load_config(PretrainJobConfig, None, ["run.name=..a.b-c"]).run.run_dir.name == "..a.b-c"


HOLD_LOCK = """
import sys, time
from pathlib import Path
from albert_dist.train.run_lock import run_lock
with run_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_driver_of_a_run_stops_naming_the_first(tmp_path):
    run_dir = tmp_path / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for job in ("pretrain", "finetune", "distill"):  # each driver takes the lock before anything else
            second = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "albert_dist.cli",
                    job,
                    "--set",
                    "run.name=busy",
                    "--set",
                    f"run.output_dir={tmp_path}",
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert second.returncode == 2, second.stderr[-3000:]
            assert f"the run {run_dir} is in use by pid {holder.pid} on " in second.stderr, second.stderr[-3000:]
            assert "Traceback" not in second.stderr
    finally:
        holder.kill()  # a crash: the OS releases the lock
        holder.wait()
    from albert_dist.train.run_lock import run_lock

    with run_lock(run_dir):  # not stale after the crash
        assert str(os.getpid()) in (run_dir / "driver.lock").read_text()
    with run_lock(run_dir):  # released on exit
        pass
