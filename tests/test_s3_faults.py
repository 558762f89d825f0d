"""A flaky object store, injected for real: the moto S3 server behind `fault_proxy.FaultProxy`, which answers
503 SlowDown, resets connections or delays a share of the requests, refuses every request for a time window, or
refuses access (403) to everything. Data preparation and pretraining talk to the store through the proxy only."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import time

import pytest
import test_s3
from fault_proxy import FaultProxy
from test_s3 import BUCKET, TINY_MODEL, cli_args, s3_client

from albert_dist.errors import StorageError
from albert_dist.storage import DEFAULT_RETRY_S, RETRY_ENV, publish_bytes, read_bytes

#: the tests' retry budget (seconds), and the refusal windows they ride out: the default budget's behaviour by the
#: same code, shorter (the default survives windows of DEFAULT_RETRY_S)
BUDGET_S = 10
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
    """The (method, path) of the requests refused from `start` until the first one after them that was not, and the
    requests from that one until `end`."""
    window = [r for r in requests if start <= r.at < end]
    refused = list(itertools.takewhile(lambda r: r.outcome == "refused", window))
    return [(r.method, r.path) for r in refused], window[len(refused) :]


def run_jobs(env: dict[str, str], proxy: FaultProxy, tmp_path, commands: list[list[str]]):
    """The albert-dist commands, one after the other in one process with its own local Ray, the S3 client
    pointed at the proxy."""
    script = (
        "import sys\nfrom albert_dist.cli import main\n"
        f"for args in {[cli_args(c) for c in commands]!r}:\n    code = main(args)\n"
        "    if code:\n        sys.exit(code)\n"
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
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"], share=0.2, delay_s=0.5, seed=30)
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
    """A pretraining run with 20 % of its requests faulted from start to end; then its relaunch (more steps,
    resumed from the checkpoint on the server) with every request refused twice for as long as the retry budget:
    from its first request for the MLflow run id, and from Ray Train's first checkpoint upload. With no worker
    restart allowed, both finish; every checkpoint on the server verifies, every logged step reached MLflow once,
    and the published models match their published.json."""
    from mlflow.tracking import MlflowClient

    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"], share=0.2, delay_s=0.5, seed=31)
    windows: list[float] = []

    def refuse():
        windows.append(time.monotonic())
        proxy.refuse_for(BUDGET_S)

    try:
        out = run_jobs(s3_env, proxy, tmp_path, [pretrain(tmp_path, "flaky", 20)])
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        relaunch = time.monotonic()  # the relaunch gets the windows, no scattered faults
        proxy.share = 0
        proxy.after(lambda method, path: path.endswith("/runs/flaky/mlflow_run_id"), refuse, any_status=True)
        proxy.after(lambda method, path: method == "PUT" and "/ray/flaky/checkpoint_" in path, refuse)
        relaunched = run_jobs(s3_env, proxy, tmp_path, [pretrain(tmp_path, "flaky", 40, "run.resume_changes=allow")])
    finally:
        proxy.close()
    assert relaunched.returncode == 0, relaunched.stdout[-3000:] + relaunched.stderr[-3000:]
    assert "done: step 20" in out.stdout and "done: step 40" in relaunched.stdout
    assert "Traceback" not in out.stdout + out.stderr + relaunched.stdout + relaunched.stderr
    # the faults hit these runs: each kind in the first, and both windows refused what they were meant to hit
    outcomes = proxy.outcomes()
    assert all(outcomes.get(kind, 0) >= 3 for kind in ("slowdown", "reset", "delayed")), outcomes
    assert not set(proxy.outcomes(relaunch)) & {"slowdown", "reset", "delayed"}
    assert len(windows) == 2, windows
    # each window refused the request after the one that opened it, retried through the window until it went
    # through (the S3 client's backoff doubles: a window is spent on one request): first the read of the run id,
    # then the checkpoint upload that the opening PUT began, every file of which was uploaded after the window
    first, through_first = refused_then_after(proxy.requests, windows[0], windows[1])
    assert len(first) >= 3 and set(first) == {("HEAD", f"/{BUCKET}/runs/flaky/mlflow_run_id")}, first
    assert through_first[0].path.endswith("/runs/flaky/mlflow_run_id") and through_first[0].status == 200
    opening = [r for r in proxy.requests if r.at < windows[1] and r.method == "PUT" and "/checkpoint_" in r.path][-1]
    checkpoint = opening.path.split("/checkpoint_")[1].split("/")[0]
    second, through_second = refused_then_after(proxy.requests, windows[1], float("inf"))
    assert len(second) >= 3, second
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
def test_a_request_is_retried_for_the_budget_then_fails_in_one_line_naming_the_object(s3_env, monkeypatch):
    """The retry budget on the real client: a write refused for a window shorter than the budget is ridden out;
    a store refusing for longer fails once the budget is spent (not before), with one StorageError naming the
    object; a refused access (403) fails at once. The default budget rides out a minute or more."""
    s3_client(s3_env).create_bucket(Bucket="albert-budget")
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"])
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(RETRY_ENV, "12")
    uri = "s3://albert-budget/state.json"
    try:
        publish_bytes(uri, b"first")  # pyarrow loaded and its client up: the window starts at the next write
        proxy.refuse_for(10)  # the S3 client's own retries give up after about 7 s
        publish_bytes(uri, b"written through a refusal")
        assert read_bytes(uri) == b"written through a refusal"
        assert proxy.outcomes().get("refused", 0) >= 3
        proxy.refuse_for(60)
        started = time.monotonic()
        with pytest.raises(
            StorageError,
            match=rf"^the object store failed a request on {uri} after retrying for 12 "
            rf"s at least \({RETRY_ENV}\): .*'state.json'.*SLOW_DOWN",
        ):
            publish_bytes(uri, b"never")
        assert 12 <= time.monotonic() - started < 60
        proxy.refuse_for(0)
        proxy.deny = True
        started = time.monotonic()
        with pytest.raises(StorageError, match=rf"^the object store refused access to {uri}: .*ACCESS_DENIED"):
            read_bytes(uri)
        assert time.monotonic() - started < 2
    finally:
        proxy.close()
    assert DEFAULT_RETRY_S >= 60
