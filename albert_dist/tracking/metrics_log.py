"""Training metrics on their way to MLflow: batched, buffered while the server is unreachable or refuses our
credentials, kept on disk.

Rank 0 of a training run logs through one `MetricsLogger`. A down tracking server, or one that turns us away
(credentials expired, a permission removed), must neither stop training nor lose a metric: what could not be
sent stays pending and is retried at the next log step. The logger also writes its state (the last step handed
to it and what is still pending) to a file in the run's storage, after every step it logs, so that

- a worker killed while the server is down loses nothing: the restarted worker's logger reads the pending
  metrics back and sends them when it can, and the driver sends what a worker left behind when training ends;
- a worker restarted from a checkpoint trains the steps after that checkpoint again, and their metrics, logged
  the first time, are not logged twice (the state says up to which step), even when the server is down at the
  restart and cannot be asked.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from albert_dist.errors import AlbertDistError
from albert_dist.storage import publish_text, read_bytes

#: the logger's state file, in the run's storage directory (a local path, or a URI: where a worker restarted on
#: another node finds it)
STATE_FILE = "tracked_metrics.json"

#: MLflow error codes of a request that will never succeed however often it is retried
REFUSED_FOR_GOOD = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE", "BAD_REQUEST"}
#: MLflow error codes of a request the server turned away for its credentials (expired, a password changed, a
#: permission removed): access can come back, so the metrics are kept as while the server is unreachable
ACCESS_REFUSED = {"PERMISSION_DENIED", "UNAUTHENTICATED"}


class MetricsLogger:
    """Logs metric batches to the MLflow run `run_id`, buffering them while the server is unreachable.

    `state_file` (optional) keeps the pending metrics and the last step across a worker's death. With
    `skip_replayed`, steps up to the last one already handed over (the state file's, else the last the run has of
    `progress_metric`) are not logged again.
    """

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        max_buffer: int = 100_000,
        skip_replayed: bool = False,
        progress_metric: str = "loss",
        state_file: Path | str | None = None,
    ):
        from albert_dist.tracking.run import mlflow_client

        self.tracking_uri, self.run_id, self.max_buffer = tracking_uri, run_id, max_buffer
        self.state_file = state_file
        self._client = lambda: mlflow_client(tracking_uri)
        self._warned = self._state_warned = False
        state = self._read_state()
        self.pending: list[Any] = state["pending"]
        self.last_step: int = state["last_step"]
        self.resume_after = -1
        if skip_replayed:
            self.resume_after = self.last_step if state["found"] else self._last_logged_step(progress_metric)

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if step <= self.resume_after:
            return
        now = int(time.time() * 1000)
        self.pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items() if isinstance(v, (int, float)))
        self.last_step = max(self.last_step, step)
        self.flush()

    def flush(self) -> bool:
        """Save the state, try to send what is pending, save the state again; True when nothing is left.

        The state is written ahead of sending: a worker killed after a batch reached the server but before the second
        save leaves that batch pending, and its successor sends it again with the same timestamps, which MLflow's store
        keeps once. A batch the store refuses for good (a deleted run, an invalid value) is reported and dropped: kept,
        it would block every later one. One the server turns away for its credentials (401, 403) is kept like one it
        could not reach: the access may come back."""
        self._save_state()
        try:
            self._send()
        except Exception as err:  # noqa: BLE001 - tracking must never stop training
            if not self._warned:
                from albert_dist.redaction import redact_url

                code = getattr(err, "error_code", None)
                why = (
                    f"refused our credentials ({code}"
                    if code in ACCESS_REFUSED
                    else f"unreachable ({type(err).__name__}"
                )
                kept = f" (saved in {self.state_file})" if self.state_file else ""
                print(
                    f"warning: MLflow {why}: {redact_url(str(err))[:200]}); buffering metrics{kept} and retrying "
                    f"at the next log step"
                )
                self._warned = True
            del self.pending[: -self.max_buffer]
        else:
            if self._warned:
                print("MLflow accepts our metrics again: buffered metrics flushed")
                self._warned = False
        self._save_state()
        return not self.pending

    def _send(self) -> None:
        from albert_dist.redaction import redact_url

        client = self._client()
        while self.pending:
            batch = self.pending[:1000]
            try:
                client.log_batch(self.run_id, metrics=batch)
            except Exception as err:  # noqa: BLE001 - sorted here: refused for good, or unreachable
                if getattr(err, "error_code", None) not in REFUSED_FOR_GOOD:
                    raise
                print(
                    f"warning: MLflow refused {len(batch)} metric value(s) of steps {batch[0].step}-"
                    f"{batch[-1].step} for good ({err.error_code}: {redact_url(str(err))[:200]}); dropped"
                )
            del self.pending[: len(batch)]

    def _last_logged_step(self, metric: str) -> int:
        try:
            history = self._client().get_metric_history(self.run_id, metric)
        except Exception:  # noqa: BLE001 - unreachable now: nothing to skip, duplicates are the lesser evil
            return -1
        return max((m.step for m in history), default=-1)

    def _read_state(self) -> dict[str, Any]:
        """The state a logger of this run saved last (a state of another MLflow run counts as none)."""
        from mlflow.entities import Metric

        empty = {"found": False, "pending": [], "last_step": -1}
        if self.state_file is None:
            return empty
        try:
            state = json.loads(read_bytes(self.state_file))
        except (OSError, ValueError):
            return empty  # none yet; published atomically, so an unreadable one is a foreign file
        if state.get("run_id") != self.run_id:
            return empty
        return {
            "found": True,
            "last_step": int(state["last_step"]),
            "pending": [Metric(key, value, timestamp, step) for key, value, timestamp, step in state["pending"]],
        }

    def _save_state(self) -> None:
        if self.state_file is None:
            return
        try:
            publish_text(
                self.state_file,
                json.dumps(
                    {
                        "run_id": self.run_id,
                        "last_step": self.last_step,
                        "pending": [[m.key, m.value, m.timestamp, m.step] for m in self.pending],
                    }
                ),
            )
        except (OSError, AlbertDistError) as err:  # tracking must never stop training (a full disk stops it anyway)
            if not self._state_warned:
                print(
                    f"warning: could not save the metrics logger's state to {self.state_file} ({err}): metrics "
                    f"pending when this worker dies would be lost"
                )
                self._state_warned = True


def quick_failing_requests() -> None:
    """MLflow's default retries back off for minutes: a down server must cost a training step seconds at most.
    For a training worker's process (the environment is the process's own)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def send_left_behind(tracking_uri: str, run_id: str, state_file: Path | str, patience_s: float = 180) -> None:
    """Send the metrics a training worker could not (the server was down when training ended, or when the worker
    died), retrying for up to `patience_s` while the server is unreachable; what still cannot be sent stays in
    `state_file` for a later relaunch."""
    try:
        read_bytes(state_file)
    except OSError:  # none (or unreadable: the logger would find no state either)
        return
    logger = MetricsLogger(tracking_uri, run_id, state_file=state_file)
    deadline = time.monotonic() + patience_s
    while logger.pending and not logger.flush() and time.monotonic() < deadline:
        time.sleep(5)
    if logger.pending:
        print(
            f"warning: {len(logger.pending)} metric value(s) could not reach MLflow; they stay in {state_file} "
            f"and are sent when this run is relaunched"
        )
