"""Final models as MLflow models: a `pyfunc` model whose artifact is the published model directory (transformers
layout, tokenizer included), logged to the job's run (a LoggedModel, in the UI's Models tab), linked to the run's
final metrics and, with `tracking.register_model`, registered.

`mlflow.pyfunc.load_model(uri).predict(frame)` takes a DataFrame with a `text` column (and `text_pair` for pair
tasks) and returns, for a classifier, what `albert-dist predict` adds to each row; for a pretrained encoder, each
text's embedding (the mean of the last hidden states). Loading needs the albert-dist package.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import mlflow.pyfunc

from albert_dist.console import mlflow_muted

MODEL_ARTIFACT = "model_dir"
TEXT, TEXT_PAIR = "text", "text_pair"
BATCH_SIZE = 64


class DataFrameModel(mlflow.pyfunc.PythonModel):
    """`predict` takes a DataFrame, described by the signature given at logging: MLflow's type-hint checks (and
    their advice, printed when a subclass is defined) do not apply."""

    _skip_type_hint_validation = True


def log_model(
    tracking_uri: str,
    run_id: str,
    model_dir: str | Path,
    python_model: mlflow.pyfunc.PythonModel,
    name: str,
    *,
    step: int,
    register_as: str | None = None,
) -> str:
    """Log `model_dir` as the run's MLflow model `name`, linked to the run's metrics of `step` (its final evaluation)
    and registered under `register_as` when given; returns its model id."""
    from mlflow.models import Model, ModelSignature
    from mlflow.types import ColSpec, Schema

    columns = [TEXT, TEXT_PAIR] if getattr(python_model, "pair", False) else [TEXT]
    with _fluent_api_on(tracking_uri, run_id), mlflow_muted():
        # Model.log rather than pyfunc.log_model: it takes the run id, so no fluent run is opened (and ended) here
        info = Model.log(
            artifact_path=None,
            name=name,
            flavor=mlflow.pyfunc,
            run_id=run_id,
            step=step,
            registered_model_name=register_as or None,
            python_model=python_model,
            artifacts={MODEL_ARTIFACT: str(model_dir)},
            signature=ModelSignature(inputs=Schema([ColSpec("string", c) for c in columns])),
            pip_requirements=_requirements(),
        )
    return info.model_id


@contextlib.contextmanager
def _fluent_api_on(tracking_uri: str, run_id: str):
    """MLflow's fluent API (which Model.log uses: the model is created in the current experiment, not in its run's)
    on the run's store and experiment for the block, then restored. `set_tracking_uri` and `set_experiment` also
    export $MLFLOW_TRACKING_URI and $MLFLOW_EXPERIMENT_ID: left set, they became the default store of every later
    job of the process and of its subprocesses (a test's MLflow server became the demo's)."""
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    saved_env = {name: os.environ.get(name) for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    saved_uri, saved_experiment = utils._tracking_uri, fluent._active_experiment_id
    mlflow.set_tracking_uri(tracking_uri)
    try:
        mlflow.set_experiment(experiment_id=mlflow.MlflowClient(tracking_uri).get_run(run_id).info.experiment_id)
        yield
    finally:
        mlflow.set_tracking_uri(saved_uri)
        fluent._active_experiment_id = saved_experiment
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _requirements() -> list[str]:
    """The package's own runtime requirements (given, so MLflow does not load the model to infer them)."""
    from importlib.metadata import requires

    return [r for r in requires("albert-dist") or [] if "extra ==" not in r]
