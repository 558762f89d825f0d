"""`albert-dist submit` and `albert-dist jobs`: run a job's command (`python -m albert_dist.cli <command>`) on a Ray
cluster.

The job runs in a copy of the files git tracks in this checkout, plus its config (the runtime env's
`working_dir`), that Ray deletes afterwards, so the submission sets `ALBERT_DIST_HOME` to an absolute output root on
the cluster and forwards the MLflow tracking variables. Secrets travel only where they are needed: the Ray token
goes into the request header (never into the job's runtime env), MLflow passwords stay on the cluster's nodes, and
nothing here prints a token or a password.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from albert_dist.cluster.ray_init import CLUSTER_WORKER_HOOK, WORKER_ENV
from albert_dist.errors import AlbertDistError
from albert_dist.redaction import is_secret_name, redact_url

REPO_ROOT = Path(__file__).resolve().parents[2]
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
        args += ["--config", _relative_to_repo(config)]
    for item in overrides:
        if redact_url(item) != item:
            raise AlbertDistError(
                f"--set {redact_url(item)}: Ray logs a job's command line, so a URL with a user "
                "name or password cannot go in it; give the cluster's nodes the credentials "
                "(e.g. MLFLOW_TRACKING_USERNAME/PASSWORD) and pass the URL without them"
            )
        args += ["--set", item]
    return shlex.join(args)


def _relative_to_repo(config: str) -> str:
    """The config's path inside the uploaded checkout; a config from elsewhere would not exist on the cluster."""
    path = Path(config).resolve()
    if not path.is_file():
        raise AlbertDistError(f"config file not found: {config}")
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        raise AlbertDistError(
            f"{config} is outside the checkout {REPO_ROOT}, which is what the job receives: "
            "put the config under albert_dist/configs/ or pass fields with --set"
        ) from None


def tracked_files(root: Path = REPO_ROOT) -> list[str]:
    """The files git tracks in the checkout `root`, relative to it."""
    try:
        listing = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise AlbertDistError(
            f"albert-dist submit uploads the files git tracks in {root}, and git cannot list "
            f"them: {getattr(err, 'stderr', '') or err}".strip()
        ) from None
    return [path for path in listing.split("\0") if path]


@contextlib.contextmanager
def staged_checkout(extra: list[str], root: Path = REPO_ROOT) -> Iterator[Path]:
    """A temporary copy of the files git tracks in `root` plus `extra` (paths relative to it): the job's
    working_dir. An allowlist, so that a `.env`, a tokenizer or a corpus lying in the checkout never reaches the
    cluster. Left out: symbolic links (one could point anywhere on this machine) and the .gitignore files, which
    Ray would apply to what was chosen here (dropping a gitignored --config). The .rayignore files stay: Ray's
    packaging leaves out what they name, as it does for any working_dir."""
    with tempfile.TemporaryDirectory(prefix="albert-submit-") as stage:
        for relative in dict.fromkeys([*tracked_files(root), *extra]):
            source, target = root / relative, Path(stage) / relative
            if source.name == ".gitignore" or source.is_symlink():
                continue
            if source.is_file():  # a tracked file deleted here is not sent
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
    with staged_checkout([_relative_to_repo(config)] if config else []) as working_dir:
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
