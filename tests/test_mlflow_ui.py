"""What the MLflow UI shows of albert-dist's jobs, read back through MLflow's own client from a real `mlflow server`:
a model-training experiment, runs with their source and datasets, final models as LoggedModels (linked to the
run and its final metrics, registered) that `mlflow.pyfunc` loads and predicts with like `albert-dist predict`."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from finetune_helpers import FILLER, KEYWORDS, single_rows, write_csv
from mlflow_server import free_port, start_server, stop_server

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.storage import sha256_file

pytestmark = pytest.mark.slow

EXPERIMENT = "ui-check"
TINY_TRAIN = {
    "precision": "fp32",
    "learning_rate": 1e-3,
    "batch_size": 16,
    "log_every": 8,
    "eval_every": 16,
    "checkpoint_every": 1000,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    process = start_server(store, port)
    yield f"http://127.0.0.1:{port}"
    stop_server(process)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, server, ray_session):
    """Prepare → pretrain (a few steps) → fine-tune → distill, all tracked in the server and registered."""
    from albert_dist.data.prepare import prepare_dataset
    from albert_dist.finetune.distill import DISTILL
    from albert_dist.finetune.job import FINETUNE
    from albert_dist.pretrain.job import PRETRAIN

    root = tmp_path_factory.mktemp("ui")
    defaults = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")  # what a later job would take as its store
    before = {name: os.environ.get(name) for name in defaults}
    rng = random.Random(0)
    corpus = root / "corpus.txt"
    corpus.write_text(
        "\n\n".join(
            ". ".join(" ".join(rng.choices(FILLER + list(KEYWORDS), k=8)) for _ in range(3)) for _ in range(400)
        )
    )
    common = [f"run.output_dir={root}", "data.output=prepared"]
    prepare_dataset(
        load_config(
            DataJobConfig,
            None,
            common
            + [
                f"data.inputs=[{corpus}]",
                "data.max_seq_length=32",
                "data.eval_fraction=0.1",
                "tokenizer.vocab_size=64",
            ],
        )
    )
    tracking = [f"tracking.tracking_uri={server}", f"tracking.experiment={EXPERIMENT}"]
    pretrained = PRETRAIN.run(
        load_config(
            PretrainJobConfig,
            None,
            common
            + tracking
            + [
                "run.name=pre",
                "model.embedding_size=16",
                "model.hidden_size=32",
                "model.num_hidden_layers=1",
                "model.num_attention_heads=2",
                "model.intermediate_size=64",
                "scaling.num_workers=1",
                "scaling.cpus_per_worker=0.5",
                "train.precision=fp32",
                "train.max_steps=4",
                "train.batch_size=8",
                "train.warmup_steps=1",
                "train.eval_every=4",
                "train.eval_batches=1",
                "tracking.register_model=ui-pretrained",
            ],
        )
    )
    write_csv(root / "train.csv", single_rows(128, seed=1))
    write_csv(root / "dev.csv", single_rows(32, seed=2))
    task = {
        "run": {"output_dir": str(root)},
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.5},
        "data": {"train": str(root / "train.csv"), "dev": str(root / "dev.csv"), "max_seq_length": 32},
        "finetune": {"epochs": 2},
        "train": TINY_TRAIN,
    }
    tuned = FINETUNE.run(
        FinetuneJobConfig.model_validate(
            {
                **task,
                "run": {**task["run"], "name": "tune"},
                "model": {"init_from": str(pretrained.model_dir)},
                "tracking": {"tracking_uri": server, "experiment": EXPERIMENT, "register_model": "ui-classifier"},
            }
        )
    )
    distilled = DISTILL.run(
        DistillJobConfig.model_validate(
            {
                **task,
                "run": {**task["run"], "name": "distill"},
                "student": {"num_hidden_layers": 1},
                "distill": {"teacher": str(tuned.model_dir), "speed_repeats": 2},
                "tracking": {"tracking_uri": server, "experiment": EXPERIMENT, "register_model": "ui-student"},
            }
        )
    )
    # logging models through MLflow's fluent API left the server in $MLFLOW_TRACKING_URI for every later job of
    # the process and its subprocesses (the demo test, run next, tracked to this server after it had stopped)
    assert {name: os.environ.get(name) for name in defaults} == before
    return {"root": root, "pretrain": pretrained, "finetune": tuned, "distill": distilled}


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def git_head() -> str | None:
    found = subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else None


def test_experiment_opens_on_runs_with_source_and_datasets(jobs, server):
    c = client(server)
    experiment = c.get_experiment_by_name(EXPERIMENT)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    for job in ("pretrain", "finetune", "distill"):
        run = c.get_run(jobs[job].run_id)
        assert run.data.tags["mlflow.source.name"] == f"albert-dist {job}"
        assert run.data.tags.get("mlflow.source.git.commit") == git_head()

    def inputs(job):
        return {d.tags[0].value: d.dataset for d in c.get_run(jobs[job].run_id).inputs.dataset_inputs}

    root = jobs["root"]
    prepared = inputs("pretrain")["training"]
    manifest = json.loads((root / "prepared" / "manifest.json").read_text())
    assert prepared.name == "prepared"
    assert prepared.digest == hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]
    assert json.loads(prepared.source)["uri"] == str(root / "prepared")
    assert json.loads(prepared.profile)["train_rows"] == manifest["splits"]["train"]["rows"] > 0
    for job in ("finetune", "distill"):
        files = inputs(job)
        assert set(files) == {"training", "validation"}
        for context, name in (("training", "train.csv"), ("validation", "dev.csv")):
            assert files[context].name == name
            assert files[context].digest == sha256_file(root / name)[:12]
            assert json.loads(files[context].source)["uri"] == str(root / name)
        assert json.loads(files["training"].profile)["num_rows"] == 128


@pytest.mark.parametrize(
    "job, registered, final_metric",
    [
        ("pretrain", "ui-pretrained", "eval_mlm_accuracy"),
        ("finetune", "ui-classifier", "dev_accuracy"),
        ("distill", "ui-student", "student_dev_accuracy"),
    ],
)
def test_final_models_are_logged_linked_and_registered(jobs, server, job, registered, final_metric):
    c = client(server)
    run_id = jobs[job].run_id
    experiment_id = c.get_run(run_id).info.experiment_id
    models = [m for m in c.search_logged_models([experiment_id]) if m.source_run_id == run_id]
    assert len(models) == 1
    model = models[0]
    kind = {"pretrain": "pretrained", "finetune": "finetuned", "distill": "distilled"}[job]
    assert model.name == f"{c.get_run(run_id).info.run_name}-{kind}"  # the Models page tells the jobs apart
    assert str(model.status) == "READY"
    assert final_metric in {m.key for m in model.metrics}  # the Models tab shows the final metrics
    versions = c.search_model_versions(f"name='{registered}'")
    assert [v.source for v in versions] == [f"models:/{model.model_id}"]


def test_pyfunc_predicts_the_same_labels_as_our_predictor(jobs, server, monkeypatch):
    import mlflow.pyfunc

    from albert_dist.finetune.predict import Predictor

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)  # where a user's `models:/` URIs resolve

    texts = [row["text"] for row in single_rows(24, seed=7)]
    model = mlflow.pyfunc.load_model("models:/ui-classifier/1")
    through_mlflow = model.predict(pd.DataFrame({"text": texts}))
    ours = Predictor(jobs["finetune"].model_dir, "text", None, 64)({"text": pd.Series(texts).to_numpy()})
    expected = pd.DataFrame({k: v for k, v in ours.items() if k != "text"})
    assert list(through_mlflow.columns) == list(expected.columns)
    label = next(c for c in expected.columns if not c.startswith("prob_"))
    assert through_mlflow[label].tolist() == expected[label].tolist()
    pd.testing.assert_frame_equal(through_mlflow, expected)

    encoder = mlflow.pyfunc.load_model("models:/ui-pretrained/1")
    embeddings = encoder.predict(pd.DataFrame({"text": texts[:2]}))["embedding"]
    assert [len(e) for e in embeddings] == [32, 32] and (embeddings[0] != embeddings[1]).any()
