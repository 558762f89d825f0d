"""`albert-dist submit` and `albert-dist jobs`: run a job's command (`python -m albert_dist.cli <command>`) on a Ray
cluster.

The job runs the package as installed here (its modules and packaged configs) plus its config file, sent as the
runtime env's `working_dir` that Ray deletes afterwards, so the submission sets `ALBERT_DIST_HOME` to an absolute
output root on the cluster and forwards the MLflow tracking variables. A wheel's install submits as well as a
checkout: nothing of a checkout is read. Secrets travel only where they are needed: the Ray token
goes into the request header (never into the job's runtime env), MLflow passwords stay on the cluster's nodes, and
nothing here prints a token or a password.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from albert_dist.cluster.ray_init import CLUSTER_WORKER_HOOK, WORKER_ENV
from albert_dist.config import config_path
from albert_dist.errors import AlbertDistError
from albert_dist.redaction import is_secret_name, redact_url

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # albert_dist/, where it is installed (or a checkout's)
# Beside the package in a source tree only: a model logged by the job then carries a wheel of these sources
# (tracking.models), as it would logged here.
SOURCE_FILES = ("pyproject.toml", "README.md")
JOB_CONFIG_DIR = "job_config"  # where a --config file travels in the job's working_dir
DEFAULT_OUTPUT_ROOT = "/mnt/shared/albert-dist"
# Exit status of `submit --follow` and `jobs status` for each final job status.
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 2}
TERMINAL = set(EXIT_CODES)


def auth_headers(env: os._Environ | dict[str, str] = os.environ) -> dict[str, str]:
    """The dashboard's bearer header from $RAY_AUTH_TOKEN or the file $RAY_AUTH_TOKEN_PATH, if either is set.

    Built here rather than left to Ray because Ray reads the auth mode once per process: a process that has
    already started a local Ray without auth would otherwise send no token.
    """
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    if not token and env.get("RAY_AUTH_TOKEN_PATH"):
        path = Path(env["RAY_AUTH_TOKEN_PATH"]).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as err:
            raise AlbertDistError(
                f"cannot read the Ray auth token file $RAY_AUTH_TOKEN_PATH ({path}): {err.strerror}"
            ) from None
    return {"Authorization": f"Bearer {token}"} if token else {}


def client(address: str | None):
    """A `JobSubmissionClient` for `address` (default $RAY_ADDRESS), authenticated when a token is configured."""
    from ray.job_submission import JobSubmissionClient

    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise AlbertDistError("no cluster address: pass --address http://127.0.0.1:8265 or set RAY_ADDRESS")
    try:
        return JobSubmissionClient(address, headers=auth_headers())
    except (ConnectionError, RuntimeError) as err:
        raise AlbertDistError(f"cannot reach the Ray dashboard at {address}: {err}") from None


def entrypoint(command: Sequence[str], config: str | None, overrides: list[str]) -> str:
    """The job's command line: the CLI's `command` (e.g. `data prepare`) with the config and overrides."""
    import shlex

    args = ["python", "-m", "albert_dist.cli", *command]
    if config:
        args += ["--config", job_config(config)[0]]
    for item in overrides:
        if redact_url(item) != item:
            raise AlbertDistError(
                f"--set {redact_url(item)}: Ray logs a job's command line, so a URL with a user "
                "name or password cannot go in it; give the cluster's nodes the credentials "
                "(e.g. MLFLOW_TRACKING_USERNAME/PASSWORD) and pass the URL without them"
            )
        args += ["--set", item]
    return shlex.join(args)


def job_config(config: str) -> tuple[str, Path | None]:
    """The job's `--config` argument and the file to send for it: a file travels as job_config/<its name>; a
    packaged config's name stays a name (the package sent with the job holds it)."""
    path = Path(config)
    if path.is_file():
        return f"{JOB_CONFIG_DIR}/{path.name}", path
    config_path(config)  # a packaged config, else a ConfigError naming the file and the packaged names
    return config, None


def package_files(package: Path = PACKAGE_DIR) -> list[str]:
    """What of this install a job runs, relative to the package's parent: its modules, its packaged configs and,
    in a source tree, `SOURCE_FILES`. No symbolic link, no cache."""
    files = [*package.rglob("*.py"), *(package / "configs").glob("*.yaml")]
    files += [package.parent / name for name in SOURCE_FILES]
    return sorted(
        str(path.relative_to(package.parent))
        for path in files
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts
    )


@contextlib.contextmanager
def staged_job(config: str | None, package: Path = PACKAGE_DIR) -> Iterator[Path]:
    """A temporary directory holding the package (`package_files`) and the job's config file: the job's
    working_dir. An allowlist, so that a `.env`, a tokenizer or a corpus lying beside the package or in the
    directory `submit` runs from never reaches the cluster."""
    with tempfile.TemporaryDirectory(prefix="albert-submit-") as stage:
        sent = [(package.parent / relative, relative) for relative in package_files(package)]
        if config and (file := job_config(config))[1] is not None:
            sent.append((file[1], file[0]))
        for source, relative in sent:
            target = Path(stage) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        yield Path(stage)


def runtime_env(output_root: str, working_dir: Path, env: os._Environ | dict[str, str] = os.environ) -> dict[str, Any]:
    """`working_dir`, the output root and the MLflow tracking variables that are not credentials.

    Ray writes runtime envs, env_vars included, to its logs, so MLFLOW_TRACKING_PASSWORD/TOKEN, the user info of
    a tracking URI, the Ray token and cloud keys are never sent with a job: the cluster's nodes have them in their
    own environment. The username stays behind with its password: a job logs as the nodes' MLflow user (on the
    local cluster a user of its own, not the submitter's admin account).
    """
    forwarded = {
        k: redact_url(v, mask="") for k, v in env.items() if k.startswith("MLFLOW_TRACKING_") and not _is_credential(k)
    }
    forwarded |= {"ALBERT_DIST_HOME": output_root, "PYTHONUNBUFFERED": "1", **WORKER_ENV}
    # the job's training rendezvous listens on its node's address, not on every interface
    return {
        "working_dir": str(working_dir),
        "env_vars": forwarded,
        "worker_process_setup_hook": CLUSTER_WORKER_HOOK,
    }


def _is_credential(name: str) -> bool:
    return is_secret_name(name) or name == "MLFLOW_TRACKING_USERNAME"


def withheld_secrets(env: os._Environ | dict[str, str] = os.environ) -> list[str]:
    """What of the MLflow credentials set here the job will not receive (see `runtime_env`)."""
    names = sorted(k for k in env if k.startswith("MLFLOW_TRACKING_") and _is_credential(k))
    uri = env.get("MLFLOW_TRACKING_URI", "")
    return names + (["the user info of MLFLOW_TRACKING_URI"] if redact_url(uri) != uri else [])


def submit(
    job: str,
    command: Sequence[str],
    config: str | None,
    overrides: list[str],
    address: str | None,
    name: str | None = None,
    output_root: str | None = None,
    follow: bool = False,
) -> int:
    """Submit the job named `job` (kept in the submission's metadata) as its CLI `command`; with `follow`, stream
    its logs and return the exit status of its final state."""
    root = output_root or os.environ.get("ALBERT_DIST_HOME") or DEFAULT_OUTPUT_ROOT
    if not os.path.isabs(root) and "://" not in root:
        raise AlbertDistError(f"the output root must be absolute (a path every node sees), got {root!r}")
    line = entrypoint(command, config, overrides)
    jobs = client(address)
    if name:
        name = unused_submission_id(jobs, name)
    with staged_job(config) as working_dir:
        submission_id = jobs.submit_job(
            entrypoint=line,
            runtime_env=runtime_env(root, working_dir),
            submission_id=name,
            metadata={"albert_dist.job": job},
        )
    print(f"submitted {submission_id}: {line}", flush=True)
    print(f"outputs under {root} on the cluster", flush=True)
    if withheld := withheld_secrets():
        print(
            f"not sent with the job (Ray logs job environments): {', '.join(withheld)}; the job uses the "
            "MLflow credentials of the cluster's nodes",
            flush=True,
        )
    if not follow:
        return 0
    return follow_logs(jobs, submission_id)


def unused_submission_id(jobs, name: str) -> str:
    """`name`, or `name-2`, `name-3`… when jobs of that name have ended, so a stopped or failed job can be
    submitted again under its name (its run resumes from its checkpoints: that is keyed by run.name) while the
    earlier attempts keep their logs. A job of that name still running is an error: two drivers would share a run.
    """
    candidate, attempt = name, 1
    while (state := _job_status(jobs, candidate)) is not None:
        if state not in TERMINAL:
            raise AlbertDistError(
                f"job {candidate} is still {state}: stop it first "
                f"(albert-dist jobs stop {candidate}) or submit under another --name"
            )
        attempt += 1
        candidate = f"{name}-{attempt}"
    if candidate != name:
        print(f"job {name} already ran; submitting this attempt as {candidate}", flush=True)
    return candidate


def _job_status(jobs, submission_id: str) -> str | None:
    """The job's status, or None when the cluster has no job of that id."""
    try:
        return str(jobs.get_job_info(submission_id).status.value)
    except RuntimeError as err:  # the dashboard answers 404 for an unknown id
        if "does not exist" in str(err) or "404" in str(err):
            return None
        raise


def follow_logs(jobs, submission_id: str) -> int:
    """Stream the job's logs until it ends; the exit code reflects its final status."""

    async def tail() -> None:
        async for chunk in jobs.tail_job_logs(submission_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        print(f"\nstopped following; the job keeps running (albert-dist jobs stop {submission_id})", file=sys.stderr)
        return 130
    status = wait_until_done(jobs, submission_id)
    print(f"job {submission_id} {status}", flush=True)
    return exit_code(status)


def wait_until_done(jobs, submission_id: str, poll_s: float = 1.0) -> str:
    import time

    while (status := str(jobs.get_job_status(submission_id).value)) not in TERMINAL:
        time.sleep(poll_s)
    return status


def exit_code(status: str) -> int:
    return EXIT_CODES.get(status, 3)


def list_jobs(address: str | None) -> int:
    for job in sorted(client(address).list_jobs(), key=lambda j: j.start_time or 0):
        print(f"{job.submission_id or job.job_id}\t{job.status.value}\t{job.entrypoint}")
    return 0


def status(address: str | None, submission_id: str) -> int:
    info = client(address).get_job_info(submission_id)
    print(f"{submission_id}\t{info.status.value}" + (f"\t{info.message}" if info.message else ""))
    return exit_code(str(info.status.value)) if info.status.value in TERMINAL else 0


def stop(address: str | None, submission_id: str) -> int:
    stopped = client(address).stop_job(submission_id)
    print(f"{submission_id}: {'stop requested' if stopped else 'already finished'}")
    return 0


def logs(address: str | None, submission_id: str, follow: bool = False) -> int:
    jobs = client(address)
    if follow:
        return follow_logs(jobs, submission_id)
    sys.stdout.write(jobs.get_job_logs(submission_id))
    return 0
