"""Data and runs on object storage, end to end against a real S3-compatible server (moto's standalone server, a
process on 127.0.0.1): `albert-dist data prepare` reads the corpus from S3 and uploads the dataset there,
`albert-dist pretrain` trains from it through Ray Data with its run directory (checkpoints, models, MLflow run id,
metrics state) on S3 and resumes from the S3 checkpoint when relaunched, `albert-dist finetune` starts from the
model published on S3, reads its labelled files from S3 and publishes its model there; a shard changed on the
server is caught; URIs where only a local path works are refused at validation."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from finetune_helpers import single_rows, write_csv, write_jsonl
from process_helpers import require_mark
from s3_server import moto_server

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.storage import resolve_path

BUCKET = "albert-test"
TINY_MODEL = [
    "model.embedding_size=32",
    "model.hidden_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.intermediate_size=128",
]


@pytest.fixture(scope="module")
def s3_env():
    """A moto S3 server (`s3_server.moto_server`) for the module; the AWS_* variables that point pyarrow, boto3
    and the jobs at it (the secret key random, to search the outputs for)."""
    require_mark("slow", "an S3 server")
    with moto_server() as env:
        yield env


def s3_client(env: dict[str, str]):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def refused_without_echo(cls, override: str, message: str) -> str:
    """`override` (a URI with the secret hunter2 in it) is refused with `message`, the secret not echoed."""
    with pytest.raises(ConfigError, match=message) as err:
        load_config(cls, None, [override])
    assert "hunter2" not in str(err.value)
    return str(err.value)


def test_uris_only_where_they_work(monkeypatch):
    """run.output_dir of data preparation, distillation and sweeps (and the model/tokenizer paths they and
    pretraining read locally) refuse URIs at validation, naming the field and what works instead; pretraining's
    and fine-tuning's run.output_dir and fine-tuning's model.init_from take them; a URI with credentials in it is
    refused without echoing them; no local `s3:` folder."""
    from albert_dist.finetune.config import DistillJobConfig
    from albert_dist.tune.config import FinetuneTuneConfig

    for cls in (DataJobConfig, FinetuneTuneConfig):
        with pytest.raises(ConfigError, match=r"run\.output_dir: a URI.*local path or a mount.*data\.output may be"):
            load_config(cls, None, ["run.output_dir=s3://bucket/out"])
    with pytest.raises(ConfigError, match=r"output_dir is a URI, but distillation stages .*local path or a mount"):
        load_config(DistillJobConfig, None, ["run.output_dir=s3://bucket/out"])
    pretrain = load_config(PretrainJobConfig, None, ["run.output_dir=s3://bucket/out?region=x", "run.name=r"])
    assert pretrain.run.locate("ray") == "s3://bucket/out/r/ray?region=x"
    assert pretrain.run.run_dir.parts[-4:] == ("s3", "bucket", "out", "r")  # its local staging directory
    tuned = load_config(FinetuneJobConfig, None, ["run.output_dir=gs://bucket/out", "model.init_from=gs://b/m/model"])
    assert tuned.run.locate("model") == "gs://bucket/out/finetune/model" and tuned.model.init_from == "gs://b/m/model"
    refused_without_echo(
        PretrainJobConfig,
        "run.output_dir=s3://bucket/out?secret_key=hunter2",
        r"run\.output_dir: the URI carries credentials \(secret_key\)",
    )
    refused_without_echo(
        FinetuneJobConfig,
        "model.init_from=s3://key:hunter2@bucket/model",
        r"model\.init_from: the URI carries credentials \(user info\)",
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store, a SQLite file, cannot be on S3
    with pytest.raises(ConfigError, match=r"run\.output_dir is a URI .* no MLflow store is set"):
        pretrain.tracking.resolved_uri(pretrain.run.output_dir)
    for cls, field in (
        (PretrainJobConfig, "model.init_from"),
        (DataJobConfig, "tokenizer.path"),
        (DistillJobConfig, "distill.teacher"),
        (DistillJobConfig, "student.init_from"),
    ):
        with pytest.raises(ConfigError, match=rf"{field}: a URI, but this is read from a local or mounted path"):
            load_config(cls, None, [f"{field}=gs://bucket/model"])
    message = refused_without_echo(
        DataJobConfig,
        "data.output=s3://bucket/x?endpoint_override=h:9000&secret_key=hunter2",
        r"data\.output: the URI carries credentials \(secret_key\)",
    )
    assert "endpoint_override=h:9000" in message
    refused_without_echo(
        DataJobConfig,
        "data.inputs=[s3://key:hunter2@bucket/corpus]",
        r"data\.inputs: the URI carries credentials \(user info\)",
    )
    refused_without_echo(
        FinetuneJobConfig,
        "data.train=s3://key:hunter2@bucket/train.csv",
        r"data\.train: the URI carries credentials \(user info\)",
    )
    with pytest.raises(ConfigError, match=r"data\.output: name a prefix inside the bucket"):
        load_config(DataJobConfig, None, ["data.output=s3://bucket"])
    with pytest.raises(ConfigError, match="is a URI where a local or mounted path is needed"):
        resolve_path("s3://bucket/x")


@pytest.mark.slow
@pytest.mark.heavy
def test_prepare_and_pretrain_on_s3(s3_env, stdlib_corpus, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from albert_dist.data.loading import load_prepared

    s3 = s3_client(s3_env)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="corpus/stdlib.txt", Body=stdlib_corpus.read_bytes()[:120_000])
    data, runs = f"s3://{BUCKET}/prepared", f"s3://{BUCKET}/runs"
    # the run directories on S3, the MLflow store a local SQLite file (the default one cannot be on S3)
    tracked = [f"run.output_dir={runs}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    prepare = [
        "data",
        "prepare",
        f"run.output_dir={tmp_path / 'runs'}",
        f"data.output={data}",
        f"data.inputs=[s3://{BUCKET}/corpus]",
        "tokenizer.vocab_size=300",
        "data.eval_fraction=0.1",
        "data.max_seq_length=64",
    ]
    pretrain = [
        "pretrain",
        *tracked,
        f"data.output={data}",
        "run.name=s3run",
        *TINY_MODEL,
        "scaling.num_workers=1",
        "train.precision=fp32",
        "train.max_steps=6",
        "train.warmup_steps=1",
        "train.batch_size=8",
        "train.log_every=2",
        "train.eval_every=3",
        "train.checkpoint_every=3",
        "train.eval_batches=2",
        "train.max_failures=0",
    ]
    # relaunched longer: it resumes from the checkpoint of step 6 on S3 (the longer schedule recorded in MLflow)
    relaunch = [a for a in pretrain[1:] if not a.startswith("train.max_steps")] + [
        "train.max_steps=9",
        "run.resume_changes=allow",
    ]
    for name, rows, write in (
        ("train.csv", single_rows(64, seed=1), write_csv),
        ("dev.jsonl", single_rows(32, seed=2), write_jsonl),
    ):
        s3.put_object(Bucket=BUCKET, Key=f"task/{name}", Body=write(tmp_path / name, rows).read_bytes())
    finetune = [
        "finetune",
        *tracked,
        "run.name=s3finetune",
        f"model.init_from={runs}/s3run/model",
        f"data.train=s3://{BUCKET}/task/train.csv",
        f"data.dev=s3://{BUCKET}/task/dev.jsonl",
        "data.max_seq_length=32",
        "finetune.epochs=1",
        "scaling.num_workers=1",
        "train.batch_size=16",
        "train.precision=fp32",
        "train.eval_every=100",
    ]
    # the commands in one process, its own local Ray: the session Ray's workers were started without the
    # AWS_* variables, and a job's workers take credentials from their environment as a cluster's nodes do
    script = (
        "import sys\nfrom albert_dist.cli import main\nfrom albert_dist.config import load_config\n"
        "from albert_dist.pretrain.config import PretrainJobConfig\nfrom albert_dist.pretrain.job import PRETRAIN\n"
        f"assert not (main({cli_args(prepare)!r}) or main({cli_args(pretrain)!r}))\n"
        f"outcome = PRETRAIN.run(load_config(PretrainJobConfig, None, {relaunch!r}))\n"
        "print('relaunch:', outcome.metrics['step'], outcome.metrics['resumed_from_step'], outcome.model_dir)\n"
        f"sys.exit(main({cli_args(finetune)!r}))"
    )
    staging = tmp_path / "staging"
    env = (
        {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
        | s3_env
        | {"ALBERT_DIST_STAGING": str(staging)}
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "done: step 6" in out.stdout
    assert f"relaunch: 9 6.0 {runs}/s3run/model" in out.stdout  # resumed from the checkpoint of step 6 on S3
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "runs" / "s3:").exists()
    assert not (tmp_path / "runs" / "s3run").exists() and not (tmp_path / "runs" / "s3finetune").exists()
    # locally only the driver's staging directory: its lock, and the copy of the model MLflow logged
    assert (staging / "s3" / BUCKET / "runs" / "s3run" / "driver.lock").is_file()

    # on the server: the dataset, its shards exactly as the manifest records them, nothing left of the upload
    keys = {
        o["Key"]
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="prepared/")["Contents"]
        if not o["Key"].endswith("/")
    }  # directory markers
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="prepared/manifest.json")["Body"].read())
    shards = [s for split in ("train", "eval") for s in manifest["splits"][split]["shards"]]
    data_keys = {"prepared/manifest.json", *(f"prepared/{s['path']}" for s in shards)}
    assert data_keys <= keys and "prepared/tokenizer/spiece.model" in keys
    assert all(k.startswith("prepared/tokenizer/") for k in keys - data_keys)
    assert manifest["inputs"] == [f"s3://{BUCKET}/corpus/stdlib.txt"]
    for shard in shards:
        body = s3.get_object(Bucket=BUCKET, Key=f"prepared/{shard['path']}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == shard["sha256"]

    # the run trained from S3 and says so, without the credentials anywhere in MLflow
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    # one MLflow run for both launches: the relaunch found its id on S3
    [run] = client.search_runs(experiments, filter_string="attributes.run_name = 's3run'")
    assert run.info.status == "FINISHED" and run.data.params["run.output_dir"] == runs
    assert run.data.params["data.prepared_dir"] == data and run.data.params["data.output"] == data
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [2, 4, 6, 8, 9]
    assert any(tag.startswith("albert_dist.resume_changes.step_6") for tag in run.data.tags)

    # the runs on the server: MLflow run id, Ray Train's checkpoints (manifest and all), the metrics state, the
    # best and final models each with its published.json written last
    def objects(prefix: str) -> dict[str, bytes]:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return {
            o["Key"][len(prefix) :]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
            for o in listed
            if not o["Key"].endswith("/")
        }

    stored = objects("runs/s3run/")
    assert stored["mlflow_run_id"].decode().strip() == run.info.run_id
    checkpoints = {
        key.split("/")[2] for key in stored if key.startswith("ray/s3run/checkpoint_") and key.count("/") > 2
    }
    assert len(checkpoints) >= 2 and all(f"ray/s3run/{c}/manifest.json" in stored for c in checkpoints)
    steps = {json.loads(stored[f"ray/s3run/{c}/manifest.json"])["step"] for c in checkpoints}
    assert 9 in steps and 6 in steps
    assert json.loads(stored["ray/s3run/tracked_metrics.json"]) | {"pending": []} == {
        "run_id": run.info.run_id,
        "last_step": 9,
        "pending": [],
    }
    for model in ("model", "best_model"):
        published = json.loads(stored[f"{model}/published.json"])["files"]
        assert {"config.json", "model.safetensors", "spiece.model"} <= set(published)
        assert all(
            hashlib.sha256(stored[f"{model}/{name}"]).hexdigest() == digest for name, digest in published.items()
        )
    logged = json.dumps([run.data.params, run.data.tags]) + out.stdout + out.stderr
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in logged
    assert not any(s3_env["AWS_SECRET_ACCESS_KEY"].encode() in body for body in stored.values())
    # the fine-tuning read its files from the server, and says where they came from
    [tuned] = client.search_runs(experiments, filter_string="attributes.run_name = 's3finetune'")
    assert tuned.info.status == "FINISHED" and "dev_accuracy" in tuned.data.metrics
    assert tuned.data.params["data.train"] == f"s3://{BUCKET}/task/train.csv"
    # it started from the model on S3, found the run that made it there, and published its own model there
    assert tuned.data.tags["albert_dist.source_model"] == f"{runs}/s3run/model"
    assert tuned.data.tags["albert_dist.source_run_id"] == run.info.run_id
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in json.dumps([tuned.data.params, tuned.data.tags])
    tuned_model = objects("runs/s3finetune/model/")
    assert {"model.safetensors", "published.json"} <= set(tuned_model)
    assert (
        stored["model/spiece.model"]
        == tuned_model["spiece.model"]
        == s3.get_object(Bucket=BUCKET, Key="prepared/tokenizer/spiece.model")["Body"].read()
    )

    # a shard changed on the server after preparation is caught before any training
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    prepared = load_prepared(data)
    assert prepared.verify_shards() == len(shards)
    first = f"prepared/{shards[0]['path']}"
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=first)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=first, Body=bytes(body))
    with pytest.raises(DataError, match=rf"shard {shards[0]['path']} does not match its sha256"):
        prepared.verify_shards()


@pytest.mark.slow
def test_finetuning_files_are_read_from_s3_with_clear_errors(s3_env, tmp_path, monkeypatch):
    """CSV and JSONL labelled files straight from the server; a missing or empty object is one DataError naming
    its URI."""
    from albert_dist.finetune.data import load_splits

    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    s3 = s3_client(s3_env)
    s3.create_bucket(Bucket="albert-task")
    train, dev = single_rows(20, seed=1), single_rows(10, seed=2)
    s3.put_object(Bucket="albert-task", Key="train.csv", Body=write_csv(tmp_path / "train.csv", train).read_bytes())
    s3.put_object(Bucket="albert-task", Key="dev.jsonl", Body=write_jsonl(tmp_path / "dev.jsonl", dev).read_bytes())
    s3.put_object(Bucket="albert-task", Key="empty.csv", Body=b"")

    def data(**files):
        return load_config(FinetuneJobConfig, None, [f"data.{k}=s3://albert-task/{v}" for k, v in files.items()]).data

    splits = load_splits(data(train="train.csv", dev="dev.jsonl"))
    assert splits["train"].texts == [row["text"] for row in train] and splits["dev"].labels == [r["label"] for r in dev]
    assert splits["dev"].source == "s3://albert-task/dev.jsonl"
    with pytest.raises(DataError, match=r"^data file not found: s3://albert-task/nothing\.csv$"):
        load_splits(data(train="nothing.csv"))
    with pytest.raises(DataError, match=r"^data file is empty: s3://albert-task/empty\.csv$"):
        load_splits(data(train="train.csv", dev="empty.csv"))


def cli_args(args: list[str]) -> list[str]:
    """`albert-dist` arguments: the command words, then `--set` for each override."""
    words = [a for a in args if "=" not in a]
    return words + [item for a in args if "=" in a for item in ("--set", a)]


def test_upload_replaces_the_old_dataset_whole(tmp_path):
    """Publishing to a URI (here file://, the same code as s3://) leaves the new dataset and nothing of the old
    one: a stale shard of a bigger old dataset is gone, the manifest is the new one."""
    from albert_dist.data.loading import MANIFEST
    from albert_dist.storage import upload_dir

    target = tmp_path / "out"
    (target / "train").mkdir(parents=True)
    (target / "train" / "part-00001.parquet").write_bytes(b"old")
    (target / MANIFEST).write_text("old")
    stage = tmp_path / "stage"
    (stage / "train").mkdir(parents=True)
    (stage / "train" / "part-00000.parquet").write_bytes(b"new")
    (stage / MANIFEST).write_text("new")
    upload_dir(stage, f"file://{target}", last=MANIFEST)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == [
        MANIFEST,
        "train/part-00000.parquet",
    ]
    assert (target / MANIFEST).read_text() == "new"


def test_a_directory_published_to_a_uri_is_fetched_whole_or_refused(tmp_path, monkeypatch):
    """A model directory published to a URI (file://, the same code as s3://) carries its files' checksums in
    `published.json`, written last; `fetch_dir` downloads it into the staging directory and refuses a directory
    without the marker (an upload cut off) or with a file changed since; a republish replaces the local copy."""
    from albert_dist.errors import CheckpointError
    from albert_dist.storage import PUBLISHED, fetch_dir, publish_dir, publish_text, read_bytes

    monkeypatch.setenv("ALBERT_DIST_STAGING", str(tmp_path / "staging"))
    uri = f"file://{tmp_path}/bucket/run/model"
    publish_dir(
        uri,
        lambda d: [(d / "config.json").write_text("{}"), (d / "sub").mkdir(), (d / "sub" / "w.bin").write_bytes(b"v1")],
        marker="config.json",
    )
    local = fetch_dir(uri)
    assert local == tmp_path / "staging" / "file" / str(tmp_path).strip("/") / "bucket" / "run" / "model"
    assert (local / "sub" / "w.bin").read_bytes() == b"v1" and (local / PUBLISHED).is_file()
    publish_dir(uri, lambda d: (d / "config.json").write_text('{"v": 2}'), marker="config.json")
    assert (fetch_dir(uri) / "config.json").read_text() == '{"v": 2}' and not (local / "sub").exists()
    (tmp_path / "bucket" / "run" / "model" / "config.json").write_text("changed")
    (local / PUBLISHED).unlink()  # no local copy to reuse: downloaded again, and checked
    with pytest.raises(CheckpointError, match="config.json does not match what was published"):
        fetch_dir(uri)
    (tmp_path / "bucket" / "run" / "model" / PUBLISHED).unlink()
    with pytest.raises(CheckpointError, match=f"has no {PUBLISHED}: not published, or its upload was cut off"):
        fetch_dir(uri)
    # single files (the metrics state, the MLflow run id) are one object each, read back whole
    state = f"file://{tmp_path}/bucket/run/ray/run/tracked_metrics.json"
    publish_text(state, "{}")
    publish_text(state, '{"last_step": 3}')
    assert read_bytes(state) == b'{"last_step": 3}'
    with pytest.raises(FileNotFoundError):
        read_bytes(f"file://{tmp_path}/bucket/run/mlflow_run_id")
