"""Final models as MLflow models: a `pyfunc` model whose artifact is the published model directory (transformers
layout, tokenizer included), logged to the job's run (a LoggedModel, in the UI's Models tab), linked to the run's
final metrics and, with `tracking.register_model`, registered.

`mlflow.pyfunc.load_model(uri).predict(frame)` takes a DataFrame with a `text` column (and `text_pair` for pair
tasks) and returns, for a classifier, what `albert-dist predict` adds to each row; for a pretrained encoder, each
text's embedding (the mean of the last hidden states).

Loading needs the albert-dist package, so it travels with the model: logged from a source tree (a checkout, a job's
working_dir), albert-dist's wheel is built from it and logged as the model's code (`code/albert_dist-*.whl`), and its
requirements name that wheel, as MLflow documents for a library not on an index ("Use of code_paths Option for a
Custom Library"). `mlflow models serve --env-manager virtualenv` installs it with the rest (pip reads the
requirements from the model's directory); a fresh environment made from `requirements.txt` alone serves it with
`--env-manager local`. An albert-dist installed without its source logs `albert-dist==VERSION` instead: the serving
environment then needs it from an index of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow.pyfunc

from albert_dist.console import mlflow_muted

MODEL_ARTIFACT = "model_dir"
#: the model directory's folder for `code_paths`: the wheel's requirement names it relative to the model
CODE_DIR = "code"
#: a source tree holds the package and its pyproject.toml side by side
SOURCE_ROOT = Path(__file__).resolve().parents[2]
SOURCE_FILES = ("pyproject.toml", "README.md")
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
    code_paths, requirements = _package()
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
            pip_requirements=requirements,
            code_paths=code_paths,
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


def _package() -> tuple[list[str] | None, list[str]]:
    """The model's `code_paths` and pip requirements: albert-dist (its wheel, built from the source tree it runs
    from; else its version) and its runtime requirements (given, so MLflow does not load the model to infer them)."""
    from importlib.metadata import distribution

    installed = distribution("albert-dist")
    pinned = [f"albert-dist=={installed.version}", *_runtime(installed)]
    if not (SOURCE_ROOT / SOURCE_FILES[0]).is_file():
        return None, pinned
    files = _source_files()
    try:
        wheel = _wheel(_digest(files), files)
    except subprocess.CalledProcessError as err:
        print(
            f"MLflow model: albert-dist's wheel could not be built ({(err.stderr or '').strip()[-300:]}); the model "
            f"requires {pinned[0]} instead",
            flush=True,
        )
        return None, pinned
    return [str(wheel)], [f"{CODE_DIR}/{wheel.name}", *_runtime(_wheel_metadata(wheel))]


def _runtime(dist) -> list[str]:
    """A distribution's requirements without its extras'."""
    return [r for r in dist.requires or [] if "extra ==" not in r]


def _wheel_metadata(wheel: Path):
    """The metadata of a built wheel: its requirements are those of the sources it was built from (an editable
    install's metadata is as old as its last install)."""
    import zipfile
    from importlib.metadata import PathDistribution

    info = next(p for p in zipfile.Path(wheel).iterdir() if p.name.endswith(".dist-info"))
    return PathDistribution(info)


def _source_files() -> tuple[str, ...]:
    """The files a wheel is built from, relative to the source tree: pyproject.toml, the readme it names, the
    package (without caches)."""
    package = Path(__file__).resolve().parents[1]
    names = [name for name in SOURCE_FILES if (SOURCE_ROOT / name).is_file()]
    names += [
        str(path.relative_to(SOURCE_ROOT))
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]
    return tuple(sorted(names))


def _digest(files: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (SOURCE_ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache  # one build per source state and process: a process can log many models (a sweep, the tests)
def _wheel(digest: str, files: tuple[str, ...]) -> Path:
    """albert-dist's wheel built from a copy of `files` (a build leaves build/ and *.egg-info/ beside its
    sources; the source tree stays as it is); removed when the process exits."""
    out = Path(tempfile.mkdtemp(prefix="albert-dist-wheel-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="albert-dist-source-") as source:
        for name in files:
            target = Path(source) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SOURCE_ROOT / name, target)
        # the installed setuptools where there is one: building in isolation downloads it
        isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(out), source],
            check=True,
            capture_output=True,
            text=True,
        )
    return next(out.glob("*.whl"))
