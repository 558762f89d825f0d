"""A flaky object store, injected for real: the moto S3 server behind `fault_proxy.FaultProxy`, which answers
503 SlowDown, resets connections or delays a share of the requests, refuses every request for a time window, or
refuses access (403) to everything. Data preparation and pretraining talk to the store through the proxy only.

The refusal windows are as long as the tests' retry budget (`BUDGET_S`), spent on one request retried with a
doubling backoff: the default budget (`DEFAULT_RETRY_S`) rides out windows as long as itself by the same code,
and the 60 s one it is meant for is measured in benchmarks/bench_s3_refusal.py (a test would wait minutes)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import test_s3
from fault_proxy import FaultProxy
from process_helpers import train_workers_of, wait_until_gone
from s3_server import write_through_a_refusal
from test_s3 import BUCKET, TINY_MODEL, cli_args, s3_client

from albert_dist import storage
from albert_dist.errors import StorageError
from albert_dist.storage import RETRY_ENV, publish_bytes, read_bytes

#: the tests' retry budget (seconds), and the refusal windows they ride out
BUDGET_S = 10
#: a refusal outlasts several retries: at least this many attempts of one request refused, spread over at least
#: half the window (pyarrow's own client gives up within the first seconds: `test_without_the_retry_strategy…`)
SEVERAL = 5
#: the share of a faulted run's requests answered 503 SlowDown, and of those reset or delayed on top
SLOWDOWN_SHARE, RESET_SHARE, DELAY_SHARE = 0.2, 0.05, 0.05
s3_env = test_s3.s3_env  # the moto server (a module's fixture: this module gets its own)


def objects(s3, prefix: str) -> dict[str, bytes]:
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for o in page.get("Contents", [])
        if not o["Key"].endswith("/")
    ]
    return {key[len(prefix) :]: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in keys}


def checkpoint_names(stored: dict[str, bytes], run: str) -> set[str]:
    """The checkpoint directories of `run` with at least one file stored on the server."""
    prefix = f"ray/{run}/"
    return {key[len(prefix) :].split("/")[0] for key in stored if re.match(f"{prefix}checkpoint_[^/]+/", key)}


def verified_checkpoints(stored: dict[str, bytes], run: str) -> dict[str, int]:
    """Each complete checkpoint of `run` stored on the server (name: step), every file checked against its
    manifest. A copy a fault cut off (its manifest or a listed file not there) is left out: it is never resumed
    from. A file that is there with other bytes than its manifest says fails the test."""
    prefix = f"ray/{run}/"
    steps = {}
    for name in checkpoint_names(stored, run):
        manifest_key = f"{prefix}{name}/manifest.json"
        if manifest_key not in stored:
            continue
        manifest = json.loads(stored[manifest_key])
        files = {file: stored.get(f"{prefix}{name}/{file}") for file in manifest["files"]}
        if None in files.values():
            continue
        for file, digest in manifest["files"].items():
            assert hashlib.sha256(files[file]).hexdigest() == digest, (name, file)
        steps[name] = manifest["step"]
    return steps


def refused_then_after(requests, start: float, end: float):
    """The requests refused from `start` until the first one after them that was not, and the requests from that
    one until `end`."""
    window = [r for r in requests if start <= r.at < end]
    refused = list(itertools.takewhile(lambda r: r.outcome == "refused", window))
    return refused, window[len(refused) :]


def outlasted_several_retries(refused) -> bool:
    """Whether a window's refusals were several attempts spread over at least half the window (the retries of a
    request, spaced by the backoff, not a burst of requests refused at once)."""
    return len(refused) >= SEVERAL and refused[-1].at - refused[0].at >= BUDGET_S / 2


def run_jobs(env: dict[str, str], proxy: FaultProxy, tmp_path, commands: list[list[str]], stop_on_error=True):
    """The albert-dist commands, one after the other in one process with its own local Ray, the S3 client
    pointed at the proxy. The process exits with the first failing command's status; without `stop_on_error` it
    goes on to the next command whatever stopped one (as one relaunching it), each printing "exit status: S" when
    it ends (its status, or the name of the exception it raised)."""
    run = (
        "    code = main(args)\n"
        if stop_on_error
        else "    try:\n        code = main(args)\n    except Exception as err:\n        code = type(err).__name__\n"
        "    print(f'exit status: {code}', flush=True)\n"
    )
    script = (
        "import sys\nfrom albert_dist.cli import main\n"
        f"for args in {[cli_args(c) for c in commands]!r}:\n{run}"
        + ("    if code:\n        sys.exit(code)\n" if stop_on_error else "")
    )
    job_env = (
        {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
        | env
        | {"AWS_ENDPOINT_URL": proxy.url, "ALBERT_DIST_STAGING": str(tmp_path / "staging"), RETRY_ENV: str(BUDGET_S)}
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        env=job_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


def pretrain(tmp_path, run: str, steps: int, *more: str) -> list[str]:
    return [
        "pretrain",
        f"run.output_dir=s3://{BUCKET}/runs",
        f"run.name={run}",
        f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"data.output=s3://{BUCKET}/prepared",
        *TINY_MODEL,
        "scaling.num_workers=1",
        "train.precision=fp32",
        f"train.max_steps={steps}",
        "train.warmup_steps=1",
        "train.batch_size=8",
        "train.log_every=2",
        "train.eval_every=10",
        "train.checkpoint_every=10",
        "train.eval_batches=2",
        "train.max_failures=0",
        *more,
    ]


@pytest.fixture(scope="module")
def prepared(s3_env, stdlib_corpus, tmp_path_factory):
    """The bucket with a dataset prepared into it through the proxy, 20 % of the requests faulted (503 SlowDown,
    a connection reset while uploading, a delay): a flaky store for data preparation's reads and writes."""
    s3 = s3_client(s3_env)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="corpus/stdlib.txt", Body=stdlib_corpus.read_bytes()[:80_000])
    tmp_path = tmp_path_factory.mktemp("prepare")
    proxy = FaultProxy(
        s3_env["AWS_ENDPOINT_URL"], shares={"slowdown": 0.1, "reset": 0.05, "delayed": 0.05}, delay_s=0.5, seed=30
    )
    # whatever the share picks: the corpus read throttled, the dataset's first upload reset
    proxy.force(lambda method, path: method == "GET" and "/corpus/" in path, "slowdown")
    proxy.force(lambda method, path: method in ("PUT", "POST") and "/prepared/" in path, "reset")
    try:
        out = run_jobs(
            s3_env,
            proxy,
            tmp_path,
            [
                [
                    "data",
                    "prepare",
                    f"run.output_dir={tmp_path / 'runs'}",
                    f"data.output=s3://{BUCKET}/prepared",
                    f"data.inputs=[s3://{BUCKET}/corpus]",
                    "tokenizer.vocab_size=300",
                    "data.eval_fraction=0.1",
                    "data.max_seq_length=64",
                ]
            ],
        )
    finally:
        proxy.close()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    assert any(r.outcome == "slowdown" and "/corpus/" in r.path for r in proxy.requests)
    assert any(r.outcome == "reset" and "/prepared/" in r.path for r in proxy.requests)
    assert sum(n for outcome, n in proxy.outcomes().items() if outcome != "forwarded") >= 3, proxy.outcomes()
    return s3


@pytest.mark.slow
def test_training_rides_out_a_flaky_store_then_two_refusal_windows(s3_env, prepared, tmp_path):
    """A pretraining run with 20 % of its requests answered 503 SlowDown from start to end, and 5 % reset and 5 %
    delayed besides; then its relaunch (more steps,
    resumed from the checkpoint on the server) with every request refused twice for as long as the retry budget:
    from its first request for the MLflow run id, and from Ray Train's first checkpoint upload. With no worker
    restart allowed, both finish; every checkpoint on the server verifies, every logged step reached MLflow once,
    and the published models match their published.json."""
    from mlflow.tracking import MlflowClient

    proxy = FaultProxy(
        s3_env["AWS_ENDPOINT_URL"],
        shares={"slowdown": SLOWDOWN_SHARE, "reset": RESET_SHARE, "delayed": DELAY_SHARE},
        delay_s=0.5,
        seed=31,
    )
    windows: list[float] = []

    def refuse():
        windows.append(time.monotonic())
        proxy.refuse_for(BUDGET_S)

    try:
        out = run_jobs(s3_env, proxy, tmp_path, [pretrain(tmp_path, "flaky", 20)])
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        relaunch = time.monotonic()  # the relaunch gets the windows, no scattered faults
        proxy.shares = {}
        proxy.after(lambda method, path: path.endswith("/runs/flaky/mlflow_run_id"), refuse, any_status=True)
        proxy.after(lambda method, path: method == "PUT" and "/ray/flaky/checkpoint_" in path, refuse)
        relaunched = run_jobs(s3_env, proxy, tmp_path, [pretrain(tmp_path, "flaky", 40, "run.resume_changes=allow")])
    finally:
        proxy.close()
    assert relaunched.returncode == 0, relaunched.stdout[-3000:] + relaunched.stderr[-3000:]
    assert "done: step 20" in out.stdout and "done: step 40" in relaunched.stdout
    assert "Traceback" not in out.stdout + out.stderr + relaunched.stdout + relaunched.stderr
    # the faults hit these runs: in the first, a fifth of its requests answered SlowDown (counted, not drawn), and
    # resets and delays; both windows refused what they were meant to hit
    first_run = [r for r in proxy.requests if r.at < relaunch]
    outcomes = proxy.outcomes()
    slowdowns = sum(r.outcome == "slowdown" for r in first_run)
    assert len(first_run) >= 100 and 0.15 <= slowdowns / len(first_run) <= 0.25, (slowdowns, len(first_run))
    assert all(outcomes.get(kind, 0) >= 3 for kind in ("reset", "delayed")), outcomes
    assert not set(proxy.outcomes(relaunch)) & {"slowdown", "reset", "delayed"}
    assert len(windows) == 2, windows
    # each window refused the request after the one that opened it, retried through the window until it went
    # through (the S3 client's backoff doubles: a window is spent on one request): first the read of the run id,
    # then the checkpoint upload that the opening PUT began, every file of which was uploaded after the window
    first, through_first = refused_then_after(proxy.requests, windows[0], windows[1])
    assert outlasted_several_retries(first), first
    assert {(r.method, r.path) for r in first} == {("HEAD", f"/{BUCKET}/runs/flaky/mlflow_run_id")}, first
    assert through_first[0].path.endswith("/runs/flaky/mlflow_run_id") and through_first[0].status == 200
    opening = [r for r in proxy.requests if r.at < windows[1] and r.method == "PUT" and "/checkpoint_" in r.path][-1]
    checkpoint = opening.path.split("/checkpoint_")[1].split("/")[0]
    second, through_second = refused_then_after(proxy.requests, windows[1], float("inf"))
    assert outlasted_several_retries(second), second
    uploaded = {
        r.path.rsplit("/", 1)[1] for r in through_second if f"/checkpoint_{checkpoint}/" in r.path and r.status == 200
    }
    assert {"model.safetensors", "manifest.json"} <= uploaded, uploaded

    stored = objects(prepared, "runs/flaky/")
    verified = verified_checkpoints(stored, "flaky")
    # the run finished: every checkpoint it stored is complete and verifies, the last two among them
    assert set(verified) == checkpoint_names(stored, "flaky") and set(verified.values()) >= {30, 40}, verified
    for model in ("model", "best_model"):
        published = json.loads(stored[f"{model}/published.json"])["files"]
        assert {"config.json", "model.safetensors", "spiece.model"} <= set(published)
        assert all(
            hashlib.sha256(stored[f"{model}/{name}"]).hexdigest() == digest for name, digest in published.items()
        )
    run_id = stored["mlflow_run_id"].decode().strip()
    assert [
        m.step for m in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(run_id, "loss")
    ] == list(range(2, 41, 2))
    assert json.loads(stored["ray/flaky/tracked_metrics.json"])["pending"] == []


@pytest.mark.slow
def test_credentials_refused_mid_run_stop_it_with_one_message_and_keep_the_last_checkpoint(s3_env, prepared, tmp_path):
    """Once the first checkpoint is stored and registered, every request is refused 403 AccessDenied (revoked
    credentials): the run stops with one line naming the object store's refusal, not retried for minutes, and
    the checkpoint stored before verifies on the server."""
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"])
    revoked: list[float] = []

    def revoke():
        revoked.append(time.monotonic())
        proxy.deny = True

    proxy.after(
        lambda method, path: method == "PUT" and path.endswith("/ray/revoked/checkpoint_manager_snapshot.json"), revoke
    )
    try:
        out = run_jobs(s3_env, proxy, tmp_path, [pretrain(tmp_path, "revoked", 30)])
    finally:
        proxy.close()
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert revoked and proxy.outcomes(revoked[0]).get("denied", 0) >= 1
    [error] = [line for line in out.stderr.splitlines() if line.startswith("albert-dist: error:")]
    assert "the object store refused access to" in error and "ACCESS_DENIED" in error, error
    assert "Traceback" not in out.stdout + out.stderr[out.stderr.index(error) :]
    assert 10 in verified_checkpoints(objects(prepared, "runs/revoked/"), "revoked").values()


@pytest.mark.slow
def test_uploads_cut_off_by_killing_the_uploader_are_never_resumed_from_nor_taken_for_published(
    s3_env, prepared, tmp_path
):
    """The training worker that uploads (rank 0, the only one) SIGKILLed twice, each time when the server has
    stored the first file of an upload and before the worker has the answer: in the first run, the checkpoint of
    step 20 (the one of step 10 stored); in its relaunch, the final model. Each relaunch resumes from the newest
    checkpoint stored whole when the uploader died (never a cut-off one); a cut-off model has no published.json and
    keeps the upload's marker, so no reader takes it for published; the last relaunch publishes the model whole."""
    from albert_dist.storage import PUBLISHED, UPLOADING

    s3 = prepared
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"])
    checkpoint_put = re.compile(rf"/{BUCKET}/runs/cut/ray/cut/(checkpoint_[^/]+)/")
    uploads: list[str] = []  # the checkpoints, in the order their first file went up
    uploader: list[int] = []  # the worker that uploads, in each run
    cut: list[dict] = []  # what each kill left on the server

    # pyarrow writes each file as a multipart upload: it is stored once the upload's completion (a POST whose body
    # says CompleteMultipartUpload) has its answer. The proxy's matches run under its lock: they only note what
    # they see; its actions do the rest
    def new_checkpoint(method: str, path: str) -> bool:
        match = checkpoint_put.search(path)
        if method == "POST" and match and match[1] not in uploads:
            uploads.append(match[1])
            return True
        return False

    def model_file(method: str, path: str) -> bool:
        return method == "POST" and "/runs/cut/model/" in path and not path.endswith(f"/{UPLOADING}")

    def note_the_uploader(then) -> None:
        uploader.append(train_workers_of(os.getpid())[0])
        then()

    def kill_the_uploader(then=None) -> None:
        """SIGKILL the worker: it waits for the answer to this request, so its upload ends at the file stored."""
        os.kill(uploader[-1], signal.SIGKILL)
        assert not wait_until_gone(uploader[-1:]), "the uploader outlived its SIGKILL"
        cut.append(objects(s3, "runs/cut/"))
        if then:
            then()

    def stored(match, action) -> None:
        proxy.after(match, action, body_has=b"CompleteMultipartUpload")

    def at_the_next_checkpoint_kill() -> None:
        stored(new_checkpoint, lambda: kill_the_uploader(then=in_the_relaunch_kill_at_the_model))

    def in_the_relaunch_kill_at_the_model() -> None:
        stored(new_checkpoint, lambda: note_the_uploader(lambda: stored(model_file, kill_the_uploader)))

    stored(new_checkpoint, lambda: note_the_uploader(at_the_next_checkpoint_kill))
    run = pretrain(tmp_path, "cut", 30)
    try:
        out = run_jobs(s3_env, proxy, tmp_path, [run, run, run], stop_on_error=False)
    finally:
        proxy.close()
    output = out.stdout + out.stderr
    statuses = re.findall(r"^exit status: (\S+)$", out.stdout, re.M)
    assert len(cut) == 2 and len(statuses) == 3, (cut, statuses, output[-3000:])
    assert "0" not in statuses[:2] and statuses[2] == "0", (statuses, output[-3000:])
    # each killed run ends on one line saying so (max_failures 0), not on Ray's traceback
    lost = re.findall(r"^albert-dist: error: a training worker died \(.*\) with no restart left", output, re.M)
    assert len(lost) == 2, (statuses, out.stderr[-3000:])

    # the first kill: the checkpoint of step 10 whole, the one being uploaded cut off (on the server, not whole)
    whole = verified_checkpoints(cut[0], "cut")
    assert set(whole.values()) == {10} and uploads[1] in checkpoint_names(cut[0], "cut") and uploads[1] not in whole
    # the second: the model's upload cut off after its first file: its marker there, no published.json
    model = {key.split("/", 1)[1] for key in cut[1] if key.startswith("model/")}
    assert UPLOADING in model and PUBLISHED not in model and len(model) >= 2, model
    # each relaunch resumed from the newest checkpoint whole on the server when the uploader died: 10, then 20 or
    # 30 (the last step's checkpoint is stored before or beside the model's upload)
    newest = [max(verified_checkpoints(state, "cut").values()) for state in cut]
    resumed = [int(step) for step in re.findall(r"resumed from \S+ at step (\d+)", out.stdout)]
    assert resumed == newest and newest[1] >= 20, (resumed, newest, output[-3000:])
    assert "done: step 30" in out.stdout

    stored = objects(s3, "runs/cut/")
    published = json.loads(stored[f"model/{PUBLISHED}"])["files"]
    assert f"model/{UPLOADING}" not in stored and {"config.json", "model.safetensors"} <= set(published)
    assert all(hashlib.sha256(stored[f"model/{name}"]).hexdigest() == digest for name, digest in published.items())
    assert uploads[1] not in verified_checkpoints(stored, "cut"), "the cut-off checkpoint was completed"


@pytest.fixture
def budget_store(s3_env, monkeypatch):
    """A bucket behind a fault proxy, the S3 client of this process pointed at the proxy with the tests' budget;
    yields the proxy and an object's URI there."""
    s3_client(s3_env).create_bucket(Bucket="albert-budget")
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"])
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(RETRY_ENV, str(BUDGET_S))
    try:
        yield proxy, "s3://albert-budget/state.json"
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_request_is_retried_for_the_budget_then_fails_in_one_line_naming_the_object(budget_store):
    """The retry budget on the real client: a write refused for a window as long as the budget is ridden out,
    retried several times across it; a store refusing for longer fails once the budget is spent (not before, and
    before twice the budget and the attempts' own time), with one StorageError naming the object; a refused access
    (403) fails at once."""
    proxy, uri = budget_store
    through = write_through_a_refusal(proxy, uri, BUDGET_S)
    assert through["written"], through
    assert through["refused"] >= SEVERAL and through["last_refused_s"] - through["first_refused_s"] >= BUDGET_S / 2
    assert through["next_attempt_s"] >= BUDGET_S and through["next_status"] == 200, through

    proxy.refuse_for(6 * BUDGET_S)
    started = time.monotonic()
    with pytest.raises(
        StorageError,
        match=rf"^the object store failed a request on {uri} after retrying for {BUDGET_S} "
        rf"s at least \({RETRY_ENV}\): .*'state.json'.*SLOW_DOWN",
    ):
        publish_bytes(uri, b"never")
    assert BUDGET_S <= time.monotonic() - started < 2 * BUDGET_S + 10
    proxy.refuse_for(0)
    proxy.deny = True
    started = time.monotonic()
    with pytest.raises(StorageError, match=rf"^the object store refused access to {uri}: .*ACCESS_DENIED"):
        read_bytes(uri)
    assert time.monotonic() - started < 2


@pytest.mark.slow
def test_without_the_retry_strategy_the_same_refusal_fails_the_write(budget_store, monkeypatch):
    """The retry test on a copy without the retry strategy (`storage.retrying_s3` left out: the S3 client as
    pyarrow makes it): the same window fails the write with SlowDown before the window ends. The fault bites; the
    strategy is what rides it out."""
    proxy, uri = budget_store
    monkeypatch.setattr(storage, "retrying_s3", lambda fs: fs)
    through = write_through_a_refusal(proxy, uri, BUDGET_S)
    assert not through["written"] and "SLOW_DOWN" in through["error"], through
    assert through["wall_s"] < BUDGET_S and through["next_attempt_s"] is None, through
